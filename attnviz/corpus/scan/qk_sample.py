"""A scan's sample of every head's queries, keys and values, kept in its database for the Queries and keys page,
with the projections of each head made from them.

Which documents: each document has a priority, its number with its 32 bits reversed (the van der Corput sequence);
the sample is the scanned documents in priority order for as long as their tokens together fit ``qk_points``. In
that order a corpus of 1,000 documents gives 0, 512, 256, 768, 128, 640, ...: at every length the documents taken
are evenly spaced across the whole corpus (a corpus sorted by topic or date is sampled across all of it), and each
comes whole: a query's strongest keys and its mask come with it. The choice depends only on the documents' numbers
and token counts, so a scan split into chunks, stopped and resumed, or run on Ray samples the same documents. They
are read again once the scan has read every document (one forward each), one transaction per document, so a stop
loses at most one.

Vectors are kept as float16 (a picture needs no more, and the sample stays a few tens of MB); each query's strongest
keys and their weights are the model's own (fp32), so the trust measure and the lines do not depend on the rounding.

Tables (``layer``, ``head`` count from 0; arrays are row-major little-endian bytes):

* ``qk_documents``: doc, priority, n_tokens, tokens (as shown), special flags.
* ``qk_vectors``: doc, layer, head, d, d_v, queries ``[n, d]`` / keys ``[n, d]`` / values ``[n, d_v]`` (float16; a
  grouped-query head's keys and values are its K/V head's), strongest_keys ``[n, 3]`` (int32) and
  strongest_weights ``[n, 3]`` (float32).
* ``qk_masks``: doc, layer, allowed (``[n, n]`` bits, True = may attend) and translate (False where a soft-cap or a
  sink makes the translation inexact).
* ``qk_projections``: layer, head, method, dims, seed, with_values, coordinates (float32 ``[points, dims]``),
  trust (JSON: k -> share) and the seconds it took. PCA of every head is made when the sample is; t-SNE and UMAP
  when the page first asks, and kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import torch

from attnviz.core.analysis import token_categories
from attnviz.core.qk_geometry import (
    STRONGEST,
    DocumentVectors,
    HeadPoints,
    pool,
    project,
    strongest,
    translation_is_exact,
    trust,
)
from attnviz.corpus import database
from attnviz.corpus.scan import store
from attnviz.models.capture import capture
from attnviz.models.loading import ModelBundle

DEFAULT_POINTS = 2_048  # tokens per head a scan keeps (each a query, a key and a value)
MOST_POINTS = 50_000


VECTOR_COLUMNS = ("doc", "layer", "head", "d", "d_v", "queries", "keys", "values", "strongest_keys",
                  "strongest_weights")
MASK_COLUMNS = ("doc", "layer", "allowed", "translate")
PROJECTION_COLUMNS = ("layer", "head", "method", "dims", "seed", "with_values", "coordinates", "trust", "seconds")


def _insert_rows(connection: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...], rows: list[tuple],
                 verb: str = "INSERT") -> None:
    """``rows`` (tuples in ``columns``' order) inserted in one statement (about a second per dozen documents of 72
    heads saved against ``executemany``)."""
    if rows:
        database.insert_frame(connection, table, pd.DataFrame(rows, columns=list(columns)), verb)


def priority(doc: int) -> float:
    """A document's place in the drawing order, fixed by its number alone: the number's 32 bits reversed, as a
    fraction (0 -> 0, 1 -> 1/2, 2 -> 1/4, 3 -> 3/4, ...)."""
    return int(f"{doc & 0xFFFFFFFF:032b}"[::-1], 2) / 2**32


def chosen_documents(documents: list[tuple[int, int]], budget: int) -> list[int]:
    """Of ``(doc, n_tokens)`` (documents that could not be read have 0 tokens), those in priority order while
    their tokens together fit ``budget``, by number. The same documents whatever order they are given in."""
    total, picked = 0, []
    for doc, n_tokens in sorted(documents, key=lambda item: (priority(item[0]), item[0])):
        if n_tokens <= 0:
            continue
        if total + n_tokens > budget:
            break
        picked.append(doc)
        total += n_tokens
    return sorted(picked)


def _bytes(array: torch.Tensor | np.ndarray, dtype) -> bytes:
    return np.ascontiguousarray(np.asarray(array, dtype=dtype)).tobytes()


def _array(blob: bytes | None, dtype, shape: tuple[int, ...]) -> torch.Tensor | None:
    if blob is None:
        return None
    return torch.from_numpy(np.frombuffer(blob, dtype=dtype).reshape(shape).astype(
        np.float32 if np.dtype(dtype).kind == "f" else np.int64))


def document_rows(bundle: ModelBundle, kind: str, text: str, max_tokens: int) -> tuple[dict, list, list] | None:
    """One document's rows for the three tables (None if it cannot be read now)."""
    try:
        result = capture(bundle, text, max_tokens=max_tokens, check_finite=False)
    except ValueError:
        return None
    record = result.records[kind]
    if not record.replayable:
        return None
    weights = record.every_layer_weights()  # [layers, heads, n, n]
    if not bool(torch.isfinite(weights).all()):
        return None
    n = record.n_q
    document = {"n_tokens": n, "tokens": list(result.display_tokens), "special": [bool(s) for s in result.special]}
    vectors, masks = [], []
    for layer in range(record.n_layers):
        allowed = record.mask_rows(layer)  # [n, n]
        masks.append((layer, np.packbits(allowed.numpy().reshape(-1)).tobytes(), translation_is_exact(record, layer)))
        for head in range(record.n_heads):
            kv = record.kv_head(head)
            queries = record.queries[layer, head]  # [n, d]
            keys = record.keys[layer, kv]  # [n, d]
            values = record.values[layer, kv] if record.values is not None else None  # [n, d_v]
            top_keys, top_weights = strongest(weights[layer, head], allowed, STRONGEST)
            vectors.append((layer, head, queries.shape[-1], 0 if values is None else values.shape[-1],
                            _bytes(queries.float(), np.float16), _bytes(keys.float(), np.float16),
                            None if values is None else _bytes(values.float(), np.float16),
                            _bytes(top_keys, np.int32), _bytes(top_weights, np.float32)))
    return document, vectors, masks


def sampled(connection: duckdb.DuckDBPyConnection) -> set[int]:
    return {row[0] for row in connection.execute("SELECT doc FROM qk_documents").fetchall()}


def record_sample(connection: duckdb.DuckDBPyConnection, bundle: ModelBundle, kind: str, texts: dict[int, str],
                  budget: int, max_tokens: int, *, should_stop: Callable[[], bool] | None = None,
                  progress: Callable[[int, int], None] | None = None) -> bool:
    """Read the chosen documents again and keep their vectors (those already kept are skipped), then PCA of every
    head. ``texts``: doc -> text of the scanned documents. Returns False if ``should_stop`` stopped it."""
    connection.execute(store.SAMPLE_SCHEMA)
    counts = connection.execute("SELECT doc, n_tokens FROM documents WHERE problem IS NULL").fetchall()
    chosen = chosen_documents([(doc, n) for doc, n in counts if doc in texts], budget)
    todo = [doc for doc in chosen if doc not in sampled(connection)]
    kept_before = len(chosen) - len(todo)  # a resumed sample counts from what it kept before the stop
    if progress is not None:
        progress(kept_before, len(chosen))
    for done, doc in enumerate(todo, start=kept_before):
        if should_stop is not None and should_stop():
            return False
        rows = document_rows(bundle, kind, texts[doc], max_tokens)
        connection.execute("BEGIN TRANSACTION")
        if rows is not None:
            document, vectors, masks = rows
            _insert_rows(connection, "qk_vectors", VECTOR_COLUMNS, [(doc, *row) for row in vectors])
            _insert_rows(connection, "qk_masks", MASK_COLUMNS, [(doc, *row) for row in masks])
        else:  # not readable now: listed with no tokens, so it is not tried again
            document = {"n_tokens": 0, "tokens": [], "special": []}
        connection.execute("INSERT INTO qk_documents VALUES (?, ?, ?, ?, ?)",
                           [doc, priority(doc), document["n_tokens"], document["tokens"], document["special"]])
        connection.execute("COMMIT")
        if progress is not None:
            progress(done + 1, len(chosen))
    project_every_head(connection)
    return True


def has_sample(connection: duckdb.DuckDBPyConnection) -> bool:
    tables = {row[0] for row in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    return "qk_documents" in tables and bool(
        connection.execute("SELECT count(*) FROM qk_documents WHERE n_tokens > 0").fetchall()[0][0])


def sample_facts(connection: duckdb.DuckDBPyConnection) -> dict:
    """How many documents and tokens the sample holds, and its heads."""
    documents, tokens = connection.execute(
        "SELECT count(*), coalesce(sum(n_tokens), 0) FROM qk_documents WHERE n_tokens > 0").fetchall()[0]
    heads = connection.execute("SELECT max(layer) + 1, max(head) + 1, any_value(d_v) FROM qk_vectors").fetchall()[0]
    return {"documents": int(documents), "tokens": int(tokens), "n_layers": int(heads[0] or 0),
            "n_heads": int(heads[1] or 0), "values": bool(heads[2])}


def head_vectors(connection: duckdb.DuckDBPyConnection, layer: int, head: int, *, values: bool = False
                 ) -> tuple[list[DocumentVectors], bool]:
    """One head's sampled documents (by number) and whether its layer may be translated."""
    rows = connection.execute(
        'SELECT d.doc, d.n_tokens, d.tokens, d.special, v.d, v.d_v, v.queries, v.keys, v."values", '
        "v.strongest_keys, v.strongest_weights, m.allowed, m.translate FROM qk_documents d "
        "JOIN qk_vectors v USING (doc) JOIN qk_masks m ON m.doc = v.doc AND m.layer = v.layer "
        "WHERE v.layer = ? AND v.head = ? ORDER BY d.doc", [layer, head]).fetchall()
    documents, translate = [], True
    for doc, n, tokens, special, d, d_v, queries, keys, kept_values, top_keys, top_weights, allowed, exact in rows:
        mask = np.unpackbits(np.frombuffer(allowed, np.uint8))[:n * n].reshape(n, n).astype(bool)
        count = len(top_keys) // (4 * n)
        categories = token_categories(list(tokens), list(special))
        documents.append(DocumentVectors(
            _array(queries, np.float16, (n, d)), _array(keys, np.float16, (n, d)), torch.from_numpy(mask),
            _array(top_keys, np.int32, (n, count)), _array(top_weights, np.float32, (n, count)), list(tokens),
            list(tokens), _array(kept_values, np.float16, (n, d_v)) if values and d_v else None, categories,
            categories, int(doc)))
        translate = translate and bool(exact)
    return documents, translate


def head_points(connection: duckdb.DuckDBPyConnection, layer: int, head: int, *, values: bool = False) -> HeadPoints:
    documents, translate = head_vectors(connection, layer, head, values=values)
    if not documents:
        raise ValueError("this scan kept no queries and keys")
    return pool(documents, translate)


def stored_projection(connection: duckdb.DuckDBPyConnection, layer: int, head: int, method: str, dims: int,
                      seed: int, with_values: bool) -> tuple[torch.Tensor, dict[int, float]] | None:
    """A projection kept in the database (coordinates ``[points, dims]`` and trust), or None."""
    rows = connection.execute(
        "SELECT coordinates, trust FROM qk_projections WHERE layer = ? AND head = ? AND method = ? AND dims = ? "
        "AND seed = ? AND with_values = ?", [layer, head, method, dims, seed, with_values]).fetchall()
    if not rows:
        return None
    coordinates = np.frombuffer(rows[0][0], np.float32).reshape(-1, dims)
    return torch.from_numpy(coordinates.astype(np.float64)), {int(k): v for k, v in json.loads(rows[0][1]).items()}


def projection_row(layer: int, head: int, method: str, dims: int, seed: int, with_values: bool,
                   coordinates: torch.Tensor, trusted: dict[int, float], seconds: float) -> tuple:
    return (layer, head, method, dims, seed, with_values, _bytes(coordinates, np.float32),
            json.dumps({str(k): v for k, v in trusted.items()}), seconds)


def keep_projections(connection: duckdb.DuckDBPyConnection, rows: list[tuple]) -> None:
    """Projections kept (rows of :func:`projection_row`), each replacing the same one made before."""
    _insert_rows(connection, "qk_projections", PROJECTION_COLUMNS, rows, verb="INSERT OR REPLACE")


def keep_projection(connection: duckdb.DuckDBPyConnection, *row) -> None:
    """One projection kept (arguments as :func:`projection_row`'s)."""
    keep_projections(connection, [projection_row(*row)])


def project_every_head(connection: duckdb.DuckDBPyConnection) -> None:
    """PCA (2D) of every head of the sample, kept: the page's grid of heads reads them at once."""
    facts = sample_facts(connection)
    rows = []
    for layer in range(facts["n_layers"]):
        for head in range(facts["n_heads"]):
            if stored_projection(connection, layer, head, "PCA", 2, 0, False) is not None:
                continue
            started = time.perf_counter()
            points = head_points(connection, layer, head)
            coordinates = project(points, "PCA", 2)
            rows.append(projection_row(layer, head, "PCA", 2, 0, False, coordinates, trust(points, coordinates),
                                       time.perf_counter() - started))
    if rows:
        keep_projections(connection, rows)


def save_projection(path: str | Path, *args, attempts: int = 10) -> bool:
    """:func:`keep_projection` into the projections file at ``path`` (a page's: this browser's own file for one
    scan, never the scan's, which may be the server's and is opened read-only), created if need be: a short write,
    tried again while another process holds the file; False if it stayed busy (the projection is then only
    shown)."""
    for attempt in range(attempts):
        try:
            with duckdb.connect(str(path)) as connection:
                connection.execute(store.PROJECTIONS_SCHEMA)
                keep_projection(connection, *args)
            return True
        except duckdb.Error:
            time.sleep(0.05 * (attempt + 1))
    return False


def kept_projection(path: str | Path, *args) -> tuple[torch.Tensor, dict[int, float]] | None:
    """A projection a page kept in the projections file at ``path`` (arguments as :func:`stored_projection`'s),
    or None (no file, not kept, or the file busy now)."""
    if not Path(path).is_file():
        return None
    try:
        with duckdb.connect(str(path)) as connection:
            database.check_catalog(connection, store.PROJECTIONS_SCHEMA, ("qk_projections",), "a projections file")
            return stored_projection(connection, *args)
    except (duckdb.Error, database.NotAResultsFile):
        return None
