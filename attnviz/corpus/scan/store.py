"""A scan's results in DuckDB: one database file per scan, written a chunk of documents at a time in one
transaction (so a stopped scan resumes exactly where its last chunk ended), read by the page and by SQL.

Tables (``layer``, ``head`` count from 0; token ids are the tokenizer's):

* ``settings``: the scan's key, model, tokenizer, corpus, limits, versions, times and status (key -> JSON).
* ``documents``: every document scanned: its text, source, characters, tokens, whether it was truncated.
* ``tokens``: token id -> the tokenizer's piece, how pages show it, and ``word`` (lower case, without the
  tokenizer's space marks) that searches match.
* ``head_documents``: one row per document and head: each statistic's mean over the document's queries, and the
  head's label on it.
* ``query_top_keys``: one row per document, head and query: the query's strongest key and its weight.
* ``pair_parts`` / view ``token_pairs``: the weight each (query token, key token) pair received as one of a query's
  PAIR_KEYS strongest keys.
* ``key_parts`` / view ``key_tokens``: the weight each key token received in each head, and how often it occurred.
* ``head_state``, ``label_state``, ``offset_state``, ``histogram_state``, ``examples``: the running aggregate
  (sums, squares and counts; label counts; the offset profile; the largest-weight histogram; the top-example
  heaps), replaced at every chunk; view ``head_stats`` gives each statistic's mean and spread per head.
"""

from __future__ import annotations

import platform
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from attnviz.corpus import database
from attnviz.corpus.database import DatabaseFile, storable
from attnviz.corpus.scan.heads import CRITERIA, HISTOGRAM_BINS, LABELS, OFFSETS, SCAN_STATISTICS, Example, Partial

SCHEMA_VERSION = 2  # 2: duplicate and induction statistics, example windows with their key
STATUS_RUNNING, STATUS_STOPPED, STATUS_FINISHED = "running", "stopped", "finished"
TOKEN_MARKS = "Ġ▁␣Ċ "  # leading marks of a word-start piece, stripped for ``tokens.word``
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS settings (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS documents (doc INTEGER PRIMARY KEY, source VARCHAR, text VARCHAR, n_chars INTEGER,
    n_tokens INTEGER, truncated BOOLEAN, problem VARCHAR);
CREATE TABLE IF NOT EXISTS tokens (token_id BIGINT PRIMARY KEY, piece VARCHAR, readable VARCHAR, word VARCHAR);
CREATE TABLE IF NOT EXISTS head_documents (doc INTEGER, layer SMALLINT, head SMALLINT,
    {", ".join(f"{name} DOUBLE" for name in SCAN_STATISTICS)}, label VARCHAR);
CREATE TABLE IF NOT EXISTS query_top_keys (doc INTEGER, layer SMALLINT, head SMALLINT, query INTEGER,
    query_id BIGINT, key INTEGER, key_id BIGINT, weight FLOAT);
CREATE TABLE IF NOT EXISTS pair_parts (layer SMALLINT, head SMALLINT, query_id BIGINT, key_id BIGINT,
    weight DOUBLE, count BIGINT);
CREATE TABLE IF NOT EXISTS key_parts (layer SMALLINT, head SMALLINT, key_id BIGINT, weight DOUBLE,
    occurrences BIGINT);
CREATE TABLE IF NOT EXISTS head_state (layer SMALLINT, head SMALLINT, statistic VARCHAR, total DOUBLE,
    squares DOUBLE, count BIGINT, doc_total DOUBLE, doc_squares DOUBLE, doc_count BIGINT);
CREATE TABLE IF NOT EXISTS label_state (layer SMALLINT, head SMALLINT, label VARCHAR, documents BIGINT);
CREATE TABLE IF NOT EXISTS offset_state (layer SMALLINT, head SMALLINT, "offset" INTEGER, weight DOUBLE,
    rows BIGINT);
CREATE TABLE IF NOT EXISTS histogram_state (layer SMALLINT, head SMALLINT, bin INTEGER, queries BIGINT);
CREATE TABLE IF NOT EXISTS examples (layer SMALLINT, head SMALLINT, criterion VARCHAR, rank INTEGER, score DOUBLE,
    doc INTEGER, query INTEGER, key INTEGER, weight DOUBLE, window_start INTEGER, window_tokens VARCHAR[],
    window_weights DOUBLE[], window_positions INTEGER[]);
CREATE OR REPLACE VIEW head_stats AS SELECT layer, head, statistic,
    total / nullif(count, 0) AS mean,
    sqrt(greatest(squares / nullif(count, 0) - pow(total / nullif(count, 0), 2), 0)) AS spread,
    doc_total / nullif(doc_count, 0) AS document_mean,
    sqrt(greatest(doc_squares / nullif(doc_count, 0) - pow(doc_total / nullif(doc_count, 0), 2), 0))
        AS document_spread,
    count AS queries, doc_count AS documents
    FROM head_state;
CREATE OR REPLACE VIEW token_pairs AS SELECT layer, head, query_id, key_id, sum(weight) AS weight,
    sum(count) AS count FROM pair_parts GROUP BY ALL;
CREATE OR REPLACE VIEW key_tokens AS SELECT layer, head, key_id, sum(weight) AS weight,
    sum(occurrences) AS occurrences FROM key_parts GROUP BY ALL;
"""


# The sample of queries, keys and values a scan keeps (attnviz.corpus.scan.qk_sample), and the projections made of it (a
# scan's PCA, in its own file; what a page makes, in the browser's own projections file: PROJECTIONS_SCHEMA only).
SAMPLE_SCHEMA = """
CREATE TABLE IF NOT EXISTS qk_documents (doc INTEGER PRIMARY KEY, priority DOUBLE, n_tokens INTEGER,
    tokens VARCHAR[], special BOOLEAN[]);
CREATE TABLE IF NOT EXISTS qk_vectors (doc INTEGER, layer SMALLINT, head SMALLINT, d SMALLINT, d_v SMALLINT,
    queries BLOB, keys BLOB, "values" BLOB, strongest_keys BLOB, strongest_weights BLOB);
CREATE TABLE IF NOT EXISTS qk_masks (doc INTEGER, layer SMALLINT, allowed BLOB, translate BOOLEAN);
"""
PROJECTIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS qk_projections (layer SMALLINT, head SMALLINT, method VARCHAR, dims SMALLINT,
    seed INTEGER, with_values BOOLEAN, coordinates BLOB, trust VARCHAR, seconds DOUBLE,
    PRIMARY KEY (layer, head, method, dims, seed, with_values));
"""
SAMPLE_SCHEMA += PROJECTIONS_SCHEMA


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "duckdb": duckdb.__version__, "schema": str(SCHEMA_VERSION)}


def word_of(readable: str) -> str:
    """What a search matches a token by: lower case, without a word-start mark. WordPiece's ``##`` (a piece inside
    a word) stays: "in" finds the word, "##in" the piece."""
    return readable.lstrip(TOKEN_MARKS).lower()


def joined_text(readable: list[str], marks: dict[int, str] | None = None) -> str:
    """Tokens as pages show them (:mod:`attnviz.core.tokens_display`) joined into text: where tokens mark a leading
    space
    (␣), run together with the marks made spaces; else (WordPiece) with spaces, a "##" piece glued to the one
    before. ``marks``: index -> a format such as "«{}»" for that token."""
    marks = marks or {}
    spaced = any(token.startswith("␣") for token in readable)
    text = ""
    for index, token in enumerate(readable):
        glued = token.startswith("##")
        bare = token.removeprefix("##")
        lead = ""
        if spaced and bare.startswith("␣"):
            lead, bare = " ", bare[1:]
        elif not spaced and text and not glued:
            lead = " "
        text += lead + marks.get(index, "{}").format(bare)
    return text.strip()


class ScanWriter(DatabaseFile):
    """The writing side of a scan's database: created or reopened (to resume) at ``path``."""

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA)
        self.connection.execute("SET preserve_insertion_order = false")

    # -- settings and resuming ---------------------------------------------------------------------------------
    def settings(self) -> dict:
        return self.read_settings()

    def load_partial(self, n_layers: int, n_heads: int) -> Partial:
        """The aggregate as last committed (zeros for a new scan): a resumed scan adds to it."""
        partial = Partial(n_layers, n_heads)
        stat_index = {name: i for i, name in enumerate(SCAN_STATISTICS)}
        for layer, head, statistic, *values in self.connection.execute(
                "SELECT layer, head, statistic, total, squares, count, doc_total, doc_squares, doc_count "
                "FROM head_state").fetchall():
            i = stat_index[statistic]
            for name, value in zip(("sums", "squares", "counts", "doc_sums", "doc_squares", "doc_counts"), values,
                                   strict=True):
                getattr(partial, name)[layer, head, i] = value
        for layer, head, label, documents in self.connection.execute("SELECT * FROM label_state").fetchall():
            partial.labels[layer, head, LABELS.index(label)] = documents
        for layer, head, offset, weight, rows in self.connection.execute('SELECT * FROM offset_state').fetchall():
            partial.offsets[layer, head, OFFSETS.index(offset)] = weight
            partial.offset_rows[OFFSETS.index(offset)] = rows
        for layer, head, bin_, queries in self.connection.execute("SELECT * FROM histogram_state").fetchall():
            partial.histogram[layer, head, bin_] = queries
        for row in self.connection.execute(
                "SELECT layer, head, criterion, score, doc, query, key, weight, window_start, window_tokens, "
                "window_weights, window_positions FROM examples ORDER BY layer, head, criterion, rank").fetchall():
            layer, head, criterion, *fields = row
            partial.examples.setdefault((layer, head, criterion), []).append(Example(*fields))
        return partial

    # -- one chunk ---------------------------------------------------------------------------------------------
    def commit(self, partial: Partial, documents: dict[int, tuple[str, str]]) -> None:
        """Write the rows ``partial`` gathered (then forgotten there) and its aggregate, in one transaction.
        ``documents``: doc -> (source, text) of the documents in the chunk."""
        rows, tokens, scanned, changed = partial.take_rows()
        connection = self.connection
        connection.execute("BEGIN TRANSACTION")
        try:
            if scanned:
                frame = pd.DataFrame(scanned)
                frame["source"] = [documents[d][0] for d in frame["doc"]]
                frame["text"] = [storable(documents[d][1]) for d in frame["doc"]]
                frame["n_chars"] = frame["text"].str.len()
                if "problem" not in frame:
                    frame["problem"] = None
                self._insert("documents", frame[["doc", "source", "text", "n_chars", "n_tokens", "truncated",
                                                 "problem"]])
            if tokens:
                frame = pd.DataFrame([(i, piece, readable, word_of(readable))
                                      for i, (piece, readable) in tokens.items()],
                                     columns=["token_id", "piece", "readable", "word"])
                connection.register("new_tokens", frame)
                connection.execute("INSERT OR IGNORE INTO tokens SELECT * FROM new_tokens")
                connection.unregister("new_tokens")
            for table, chunks in rows.items():
                frame = pd.DataFrame({name: np.concatenate([chunk[name] for chunk in chunks])
                                      for name in chunks[0]})
                if table == "pair_parts":  # grouped per chunk: fewer rows, the same sums
                    connection.register("chunk", frame)
                    connection.execute("INSERT INTO pair_parts SELECT layer, head, query_id, key_id, sum(weight), "
                                       "count(*) FROM chunk GROUP BY ALL")
                    connection.unregister("chunk")
                elif table == "key_parts":
                    connection.register("chunk", frame)
                    connection.execute("INSERT INTO key_parts SELECT layer, head, key_id, sum(weight), "
                                       "sum(occurrences) FROM chunk GROUP BY ALL")
                    connection.unregister("chunk")
                else:
                    self._insert(table, frame)
            self._replace_state(partial, changed)
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def _replace_state(self, partial: Partial, changed: set) -> None:
        """The aggregate's tables written again; of the examples, only the heaps that changed."""
        for table, frame in state_frames(partial).items():
            self.connection.execute(f"DELETE FROM {table}")
            self._insert(table, frame)
        if changed:
            slots = pd.DataFrame(sorted(changed), columns=["layer", "head", "criterion"])
            self.connection.register("slots", slots)
            self.connection.execute("DELETE FROM examples WHERE (layer, head, criterion) IN "
                                    "(SELECT (layer, head, criterion) FROM slots)")
            self.connection.unregister("slots")
            examples = example_frame(partial, changed)
            if len(examples):
                self._insert("examples", examples)


def _grid(partial: Partial, names: list, **arrays) -> pd.DataFrame:
    """One row per layer, head and name: the columns of ``arrays`` (each ``[layers, heads, len(names)]``)."""
    layers, heads, size = partial.n_layers, partial.n_heads, len(names)
    frame = pd.DataFrame({"layer": np.repeat(np.arange(layers), heads * size).astype(np.int16),
                          "head": np.tile(np.repeat(np.arange(heads), size), layers).astype(np.int16)})
    return frame.assign(**{key: np.asarray(value).reshape(-1) for key, value in arrays.items()},
                        name=np.tile(np.asarray(names, dtype=object), layers * heads))


def state_frames(partial: Partial) -> dict[str, pd.DataFrame]:
    """The running aggregate as the rows of its tables."""
    state = _grid(partial, list(SCAN_STATISTICS), total=partial.sums, squares=partial.squares,
                  count=partial.counts, doc_total=partial.doc_sums, doc_squares=partial.doc_squares,
                  doc_count=partial.doc_counts).rename(columns={"name": "statistic"})
    labels = _grid(partial, list(LABELS), documents=partial.labels).rename(columns={"name": "label"})
    offsets = _grid(partial, list(OFFSETS), weight=partial.offsets,
                    rows=np.broadcast_to(partial.offset_rows, partial.offsets.shape)).rename(columns={"name": "offset"})
    offsets["offset"] = offsets["offset"].astype(np.int32)
    histogram = _grid(partial, list(range(HISTOGRAM_BINS)), queries=partial.histogram).rename(columns={"name": "bin"})
    histogram["bin"] = histogram["bin"].astype(np.int32)
    return {"head_state": state, "label_state": labels, "offset_state": offsets, "histogram_state": histogram}


def example_frame(partial: Partial, slots) -> pd.DataFrame:
    """The heaps of ``slots`` as rows of the examples table, best first (rank 0)."""
    return pd.DataFrame([
        (layer, head, criterion, rank, e.score, e.doc, e.query, e.key, e.weight, e.window_start, e.tokens, e.weights,
         e.positions)
        for layer, head, criterion in sorted(slots) for rank, e in enumerate(partial.examples.get(
            (layer, head, criterion), []))],
        columns=["layer", "head", "criterion", "rank", "score", "doc", "query", "key", "weight", "window_start",
                 "window_tokens", "window_weights", "window_positions"])


class ScanReader(DatabaseFile):
    """A scan's database opened read-only: what the page shows, and the searches."""

    WHAT = "a scan's database"

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA + SAMPLE_SCHEMA, read_only=True)
        self.n_layers = int(self.settings.get("n_layers", 0))
        self.n_heads = int(self.settings.get("n_heads", 0))

    def frame(self, sql: str, parameters: list | None = None) -> pd.DataFrame:
        return self.connection.execute(sql, parameters or []).df()

    @property
    def documents(self) -> int:
        return int(self.connection.execute("SELECT count(*) FROM documents").fetchone()[0])

    def top_labels(self) -> dict[tuple[int, int], tuple[str, float]]:
        """Each head's most frequent label over the documents and the share of documents where it held."""
        rows = self.connection.execute(
            "SELECT layer, head, label, documents / nullif(sum(documents) OVER (PARTITION BY layer, head), 0) "
            "AS share FROM label_state QUALIFY row_number() OVER (PARTITION BY layer, head "
            "ORDER BY documents DESC, label) = 1").fetchall()
        return {(int(layer), int(head)): (label, float(share or 0.0)) for layer, head, label, share in rows}

    def statistic_map(self, statistic: str, over: str = "queries") -> tuple[np.ndarray, np.ndarray]:
        """``(mean, spread)`` as ``[layers, heads]`` arrays. ``over`` "queries": mean over every query and the
        spread of the queries' values; "documents": mean of the documents' means and their spread. For a label
        (a name in LABELS) the share of documents where the head got it, and no spread."""
        mean = np.full((self.n_layers, self.n_heads), np.nan)
        spread = np.full_like(mean, np.nan)
        if statistic in LABELS:
            rows = self.connection.execute(
                "SELECT layer, head, share FROM (SELECT layer, head, label, documents / nullif(sum(documents) "
                "OVER (PARTITION BY layer, head), 0) AS share FROM label_state) WHERE label = ?",
                [statistic]).fetchall()
            for layer, head, share in rows:
                mean[layer, head] = np.nan if share is None else share
            return mean, spread
        columns = ("mean", "spread") if over == "queries" else ("document_mean", "document_spread")
        for layer, head, m, s in self.connection.execute(
                f"SELECT layer, head, {columns[0]}, {columns[1]} FROM head_stats WHERE statistic = ?",
                [statistic]).fetchall():
            mean[layer, head] = np.nan if m is None else m
            spread[layer, head] = np.nan if s is None else s
        return mean, spread

    def is_causal(self) -> bool:
        """Whether the scanned model reads under a causal mask: no head of it gave any later key any weight."""
        later = self.connection.execute('SELECT max(weight) FROM offset_state WHERE "offset" > 0').fetchone()[0]
        return later is not None and later == 0

    def statistics_that_apply(self) -> list[str]:
        """The statistics and labels some head of this scan has: not "next" under a causal mask (0 in every head),
        not separators or special tokens where the documents hold none, not duplicate or induction where no token
        repeats, no label that no document got."""
        present = {statistic for statistic, in self.connection.execute(
            "SELECT statistic FROM head_stats GROUP BY statistic HAVING max(mean) > 0 OR "
            "statistic IN ('entropy', 'normalised_entropy', 'mean_distance')").fetchall()}
        labels = {label for label, in self.connection.execute(
            "SELECT label FROM label_state GROUP BY label HAVING sum(documents) > 0").fetchall()}
        return [name for name in SCAN_STATISTICS if name in present] + [name for name in LABELS if name in labels]

    def offsets_map(self, offsets: list[int]) -> np.ndarray:
        """A custom detector by relative position, ``[layers, heads]``: each query's weight on the keys at
        ``offsets`` (key - query, within ±MAX_OFFSET) averaged over the queries that have at least one such key,
        exactly, from the offset profile and the documents' lengths. Under a causal mask a later key has weight 0."""
        chosen = sorted({int(o) for o in offsets if o in OFFSETS})
        total = np.zeros((self.n_layers, self.n_heads))
        if not chosen:
            return np.full_like(total, np.nan)
        marks = ", ".join("?" * len(chosen))
        for layer, head, weight in self.connection.execute(
                f'SELECT layer, head, sum(weight) FROM offset_state WHERE "offset" IN ({marks}) GROUP BY ALL',
                chosen).fetchall():
            total[layer, head] = weight
        rows = sum(count * rows_with_offsets(int(n), chosen) for n, count in self.connection.execute(
            "SELECT n_tokens, count(*) FROM documents WHERE problem IS NULL GROUP BY n_tokens").fetchall())
        return total / rows if rows else np.full_like(total, np.nan)

    def label_shares(self, layer: int, head: int) -> pd.DataFrame:
        return self.frame("SELECT label, documents, documents / nullif(sum(documents) OVER (), 0) AS share "
                          "FROM label_state WHERE layer = ? AND head = ? ORDER BY documents DESC, label",
                          [layer, head])

    def head_summary(self, layer: int, head: int) -> pd.DataFrame:
        return self.frame("SELECT statistic, mean, spread, document_mean, document_spread, queries, documents "
                          "FROM head_stats WHERE layer = ? AND head = ?", [layer, head])

    def offset_profile(self, layer: int, head: int) -> pd.DataFrame:
        """Mean weight at each offset (key - query) over the queries that have a key there."""
        return self.frame('SELECT "offset", weight / nullif(rows, 0) AS weight FROM offset_state '
                          'WHERE layer = ? AND head = ? ORDER BY "offset"', [layer, head])

    def histogram(self, layer: int, head: int) -> pd.DataFrame:
        return self.frame("SELECT bin, queries FROM histogram_state WHERE layer = ? AND head = ? ORDER BY bin",
                          [layer, head])

    def token_pairs(self, layer: int, head: int, limit: int = 20) -> pd.DataFrame:
        return self.frame(
            "SELECT q.readable AS query_token, k.readable AS key_token, p.weight, p.count, "
            "p.weight / (SELECT count FROM head_state WHERE layer = ? AND head = ? AND statistic = 'entropy') "
            "AS share FROM (SELECT query_id, key_id, sum(weight) AS weight, sum(count) AS count FROM pair_parts "
            "WHERE layer = ? AND head = ? GROUP BY ALL ORDER BY weight DESC LIMIT ?) p "
            "JOIN tokens q ON q.token_id = p.query_id JOIN tokens k ON k.token_id = p.key_id "
            "ORDER BY p.weight DESC", [layer, head, layer, head, limit])

    def key_tokens(self, layer: int, head: int, limit: int = 20, *, by: str = "weight",
                   min_occurrences: int = 5) -> pd.DataFrame:
        """The key tokens that attract most: by total weight, or by weight per occurrence (``by="per
        occurrence"``, among tokens seen ``min_occurrences`` times or more)."""
        inner, outer = (("sum(weight)", "k.weight") if by == "weight" else
                        ("sum(weight) / sum(occurrences)", "k.weight / k.occurrences"))
        return self.frame(
            "SELECT t.readable AS key_token, k.weight, k.occurrences, k.weight / k.occurrences AS per_occurrence, "
            "k.weight / (SELECT count FROM head_state WHERE layer = ? AND head = ? AND statistic = 'entropy') "
            f"AS share FROM (SELECT key_id, sum(weight) AS weight, sum(occurrences) AS occurrences FROM key_parts "
            f"WHERE layer = ? AND head = ? GROUP BY key_id HAVING sum(occurrences) >= ? ORDER BY {inner} DESC, key_id "
            f"LIMIT ?) k JOIN tokens t ON t.token_id = k.key_id ORDER BY {outer} DESC, k.key_id",
            [layer, head, layer, head, min_occurrences if by != "weight" else 1, limit])

    def criteria_with_examples(self, layer: int, head: int) -> list[str]:
        """The criteria of :data:`CRITERIA` by which this head has an example (none by "next" under a causal mask,
        none by "induction" where no token repeats)."""
        kept = {criterion for criterion, in self.connection.execute(
            "SELECT DISTINCT criterion FROM examples WHERE layer = ? AND head = ?", [layer, head]).fetchall()}
        return [criterion for criterion in CRITERIA if criterion in kept]

    def examples(self, layer: int, head: int, criterion: str) -> list[dict]:
        if criterion not in CRITERIA:
            raise ValueError(f"no criterion {criterion!r}")
        frame = self.frame("SELECT e.*, d.source, d.n_tokens, d.truncated FROM examples e JOIN documents d USING (doc) "
                           "WHERE layer = ? AND head = ? AND criterion = ? ORDER BY rank", [layer, head, criterion])
        return frame.to_dict("records")

    def document(self, doc: int) -> dict | None:
        frame = self.frame("SELECT * FROM documents WHERE doc = ?", [doc])
        return None if frame.empty else frame.iloc[0].to_dict()

    # -- searches ----------------------------------------------------------------------------------------------
    def search_queries(self, *, query_word: str | None, key_word: str | None, layer: int | None = None,
                       head: int | None = None, min_weight: float = 0.0, limit: int = 200) -> tuple[pd.DataFrame, str]:
        """Queries whose token is ``query_word`` and whose strongest key in head ``layer``.``head`` (any where
        None) is ``key_word`` with at least ``min_weight`` (under a causal mask, never the first query, which has no
        choice). Returns the rows and the SQL that found them, its
        parameters written in (:func:`attnviz.corpus.database.sql_as_run`)."""
        conditions, parameters = ["t.weight >= ?"], [float(min_weight)]
        if self.is_causal():  # the first query sees only itself: weight 1 on it, no choice
            conditions.append("t.query > 0")
        for column, value in (("t.layer", layer), ("t.head", head)):
            if value is not None:
                conditions.append(f"{column} = ?")
                parameters.append(int(value))
        for alias, word in (("q", query_word), ("k", key_word)):
            if word:
                conditions.append(f"{alias}.word = ?")
                parameters.append(word_of(word.strip()))
        sql = ("SELECT t.doc, t.layer, t.head, t.query, q.readable AS query_token, t.key, k.readable AS key_token, "
               "t.weight FROM query_top_keys t JOIN tokens q ON q.token_id = t.query_id "
               "JOIN tokens k ON k.token_id = t.key_id "
               f"WHERE {' AND '.join(conditions)} ORDER BY t.weight DESC, t.doc, t.query LIMIT {int(limit)}")
        return self.frame(sql, parameters), database.sql_as_run(sql, parameters)

    def query_contexts(self, found: list[tuple[int, int, int]], before: int = 6, after: int = 3) -> list[str]:
        """Each found (doc, query, key)'s context as text: ``before`` tokens before the query and ``after`` after
        it, the query in «», its key in ⟨⟩ (shown apart, after "…", where it lies outside)."""
        docs = sorted({int(doc) for doc, _, _ in found})
        if not docs:
            return []
        tokens: dict[int, dict[int, str]] = {}
        marks = ", ".join("?" * len(docs))
        for doc, position, readable in self.connection.execute(
                "SELECT q.doc, q.query, t.readable FROM query_top_keys q JOIN tokens t ON t.token_id = q.query_id "
                f"WHERE q.layer = 0 AND q.head = 0 AND q.doc IN ({marks})", docs).fetchall():
            tokens.setdefault(doc, {})[position] = readable
        contexts = []
        for doc, query, key in found:
            text = tokens.get(int(doc), {})
            shown = range(max(0, query - before), query + after + 1)
            marked = {query: "«{}»", key: "⟨{}⟩"} if key != query else {query: "«{}»"}
            context = joined_text([text[p] for p in shown if p in text],
                                  {i: marked[p] for i, p in enumerate(p for p in shown if p in text) if p in marked})
            if key not in shown and key in text:
                far = joined_text([text[key]], {0: "⟨{}⟩"}) + f" (position {key})"
                context = f"{far} … {context}" if key < query else f"{context} … {far}"
            contexts.append(context)
        return contexts

    def search_heads(self, key_word: str, min_share: float) -> tuple[pd.DataFrame, str]:
        """Heads where key tokens written ``key_word`` take more than ``min_share`` of all the weight (over every
        query of the scan)."""
        sql = ("SELECT k.layer, k.head, sum(k.weight) / any_value(s.count) AS share, sum(k.occurrences) AS "
               "occurrences FROM key_parts k JOIN tokens t ON t.token_id = k.key_id JOIN head_state s ON "
               "s.layer = k.layer AND s.head = k.head AND s.statistic = 'entropy' WHERE t.word = ? "
               "GROUP BY k.layer, k.head HAVING share > ? ORDER BY share DESC")
        parameters = [word_of(key_word.strip()), float(min_share)]
        return self.frame(sql, parameters), database.sql_as_run(sql, parameters)

    def export_parquet(self, table: str, target: str | Path, rows_per_batch: int = 65_536) -> Path:
        """One table (or view) of :data:`EXPORTABLE` written as a Parquet file, a batch of rows at a time (never
        the whole table in memory; DuckDB itself may not write files here)."""
        import pyarrow.parquet as pq

        if table not in EXPORTABLE:
            raise ValueError(f"no table {table!r}")
        target = Path(target)
        relation = self.connection.cursor().sql(f"SELECT * FROM {table}")  # a cursor: no other result in the way
        reader = (relation.to_arrow_reader(rows_per_batch) if hasattr(relation, "to_arrow_reader")
                  else relation.fetch_record_batch(rows_per_batch))
        with pq.ParquetWriter(target, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
        return target


def rows_with_offsets(n: int, offsets: list[int]) -> int:
    """How many of a document's ``n`` queries have a key at one of ``offsets`` (key - query) at least."""
    return sum(1 for i in range(n) if any(0 <= i + o < n for o in offsets))


EXPORTABLE = ("documents", "tokens", "head_documents", "query_top_keys", "token_pairs", "key_tokens", "head_stats",
              "label_state", "offset_state", "histogram_state", "examples", "settings")
