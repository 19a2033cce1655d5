"""The "Queries and keys" page's computations, process-wide, keyed by what names the points they come from (one
sentence's capture, the bundled corpus's documents, or a scan's sample) and the head: a head's normalised points,
their projections and trust. A scan's projections are read from its database where it kept them, and kept there
once made."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from attnviz.corpus.scan import qk_sample, store
from attnviz.pagelogic import queries_keys
from attnviz.ui.figures import framed
from attnviz.ui.scans import listed_scans, scan_folder, scan_settings
from attnviz.viz import queries_keys as figures


def _special(capture, record) -> tuple[list[bool], list[bool]]:
    """The special-token flags of a record's queries and keys (none known: all False)."""
    query, key = capture.special_of(record.query_tokens), capture.special_of(record.key_tokens)
    return (query if len(query) == record.n_q else [False] * record.n_q,
            key if len(key) == record.n_k else [False] * record.n_k)


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_points(points_key: tuple, kind: str, layer: int, head: int, values: bool,
                  _captures: list) -> queries_keys.HeadPoints:
    records = [capture.records[kind] for capture in _captures]
    return queries_keys.head_points(records, layer, head, values=values,
                             special=[_special(capture, capture.records[kind]) for capture in _captures])


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_projection(points_key: tuple, kind: str, layer: int, head: int, method: str, dims: int, seed: int,
                      values: bool, _points: queries_keys.HeadPoints):
    coordinates = queries_keys.project(_points, method, dims, seed=seed, with_values=values)
    return coordinates, queries_keys.trust(_points, coordinates)


@st.cache_resource(max_entries=16, show_spinner="Drawing every head…")
def grid_figure(points_key: tuple, kind: str, layers: tuple[int, ...], n_heads: int, whole: bool,
                _captures: list | None = None, _kept: dict | None = None):
    """The small PCA pictures of every head of ``layers``, titled with their trust, as one figure: made once per
    points and layers (a rerun only sends it). From the captures, or from a scan's kept pictures (``_kept``)."""
    pictures, labels, cells = [], [], []
    for layer in layers:
        for head in range(n_heads):
            if _kept is None:
                points = queries_keys.head_points([capture.records[kind] for capture in _captures], layer, head)
                coordinates = queries_keys.project(points, "PCA", 2)
                picture = (len(points.queries), coordinates, queries_keys.trust(points, coordinates))
            elif (layer, head) in _kept:
                picture = _kept[layer, head]
            else:
                continue
            pictures.append(picture)
            labels.append(f"L{layer} H{head}" if whole else f"head {head}")
            cells.append((layer, head))
    where = "every layer" if whole else f"layer {layers[0]}"
    return framed(figures.layer_grid([(n, c) for n, c, _ in pictures], [t[1] for _, _, t in pictures], labels=labels,
                              cells=cells, columns=min(n_heads, 12 if whole else 6),
                              title=f"{kind}, {where}: queries and keys of each head (PCA)"))


@st.cache_resource(max_entries=4, show_spinner="Running the model on each document…")
def corpus_captures(folder: str, name: str, dtype: str, documents: int, max_tokens: int, _bundle) -> list:
    """The model's captures of the bundled corpus's first ``documents`` documents (each up to ``max_tokens``)."""
    from attnviz.corpus.documents import bundled_corpus
    from attnviz.models.capture import capture

    return [capture(_bundle, document.text, max_tokens=max_tokens)
            for document in bundled_corpus().documents[:documents]]


# -- a scan's sample --------------------------------------------------------------------------------------------


def sampled_scans(model_folder: str) -> list[tuple[Path, dict]]:
    """The finished scans of this browser (and the server's) made with this model that kept queries and keys:
    (path, settings with the sample's facts), newest first."""
    found = []
    for path in listed_scans():
        try:
            said = scan_settings(path)
            if said.get("status") != store.STATUS_FINISHED or said.get("model_folder") != model_folder or \
                    not said.get("qk_points"):
                continue
            facts = sample_facts(str(path), said["key"])
        except Exception:  # noqa: BLE001 - a file being written, or not a scan: not offered
            continue
        if facts is not None:
            found.append((path, {**said, **facts}))
    return found


@st.cache_data(max_entries=32, show_spinner=False)
def sample_facts(path: str, scan: str) -> dict | None:
    """The sample's size (None if the scan kept none); ``scan`` (its key) names what the file holds."""
    with store.ScanReader(path) as reader:
        return qk_sample.sample_facts(reader.connection) if qk_sample.has_sample(reader.connection) else None


@st.cache_resource(max_entries=32, show_spinner="Reading the head's queries and keys from the scan…")
def scan_points(path: str, scan: str, layer: int, head: int, values: bool) -> queries_keys.HeadPoints:
    with store.ScanReader(path) as reader:
        return qk_sample.head_points(reader.connection, layer, head, values=values)


@st.cache_resource(max_entries=64, show_spinner=False)
def scan_projection(path: str, scan: str, layer: int, head: int, method: str, dims: int, seed: int, values: bool,
                    _points: queries_keys.HeadPoints, _kept: str | None = None):
    """A scan's projection: read where the scan kept it (its PCA) or where this browser kept it (``_kept``: its
    projections file for the scan), else made and kept there when its bytes can be reserved. The scan's own file
    is never written: it may be the server's, and is read with external access off."""
    with store.ScanReader(path) as reader:
        kept = qk_sample.stored_projection(reader.connection, layer, head, method, dims, seed, values)
    if kept is None and _kept is not None:
        kept = qk_sample.kept_projection(_kept, layer, head, method, dims, seed, values)
    if kept is not None:  # trust measured again (milliseconds, once per projection): a scan made before trust left
        # out the queries with k keys or fewer kept shares that counted them
        return kept[0], queries_keys.trust(_points, kept[0])
    started = time.perf_counter()
    coordinates = queries_keys.project(_points, method, dims, seed=seed, with_values=values)
    trusted = queries_keys.trust(_points, coordinates)
    if _kept is not None:
        keep_in_browser(Path(_kept), layer, head, method, dims, seed, values, coordinates, trusted,
                        time.perf_counter() - started)
    return coordinates, trusted


def projections_file(path: str, scan: str) -> str:
    """Where this browser keeps the projections it makes of the scan at ``path`` (``scan``: its key)."""
    return str(scan_folder().projections(path, scan))


def keep_in_browser(target: Path, *row) -> bool:
    """A projection kept in this browser's projections file, its bytes reserved first (False when there is no
    room now: it is then only shown)."""
    from attnviz.checkpoints.safety import CheckpointRefused

    folder = scan_folder()
    coordinates = row[6]
    size = int(coordinates.numel()) * 4 + 2 * 1024**2  # float32 points, and a new file's first blocks
    try:
        with folder.reserve(size, target.name, "this projection", where=target.parent):
            return qk_sample.save_projection(target, *row)
    except (CheckpointRefused, OSError):
        return False


@st.cache_data(max_entries=16, show_spinner=False)
def scan_grid(path: str, scan: str) -> dict[tuple[int, int], tuple]:
    """Every head's kept PCA picture: (layer, head) -> (number of queries, coordinates, trust)."""
    with store.ScanReader(path) as reader:
        facts = qk_sample.sample_facts(reader.connection)
        pictures = {}
        for layer in range(facts["n_layers"]):
            for head in range(facts["n_heads"]):
                kept = qk_sample.stored_projection(reader.connection, layer, head, "PCA", 2, 0, False)
                if kept is not None:
                    pictures[layer, head] = (facts["tokens"], kept[0].numpy(), kept[1])
    return pictures
