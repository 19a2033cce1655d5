"""What a corpus patching run holds, read back and drawn as the experiment draws its maps: each map's per-document
shares with their mean and 95 % bootstrap interval (computed a slice of cells at a time, so that thousands of
documents stay bounded in memory), the sentences under them, and the path maps beside the weights' composition
scores. Kept by the database file's stamp, so a widget change rereads nothing. What
:mod:`attnviz.ui.patching_runs` shows once a run has results."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import streamlit as st
import torch

from attnviz.corpus.patching import runner as prun
from attnviz.corpus.patching.store import STATUS_FINISHED, PatchingReader
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import composition as comp
from attnviz.interventions import path_patching as pp
from attnviz.pagelogic import patching as words
from attnviz.ui.caches.store import file_stamp
from attnviz.ui.figures import figure_once, show_figure
from attnviz.viz import patching as figures
from attnviz.viz.style import format_number

MLPS = ("frozen", "free")  # a receiver's paths: direct (the MLPs held) and through the MLPs
DRAWS = 2000  # bootstrap draws, as activation_patching.spread makes them
MOST_GATHERED = 2**24  # values one slice of the bootstrap gathers at once (128 MiB of float64)
def spread_over_documents(shares: torch.Tensor) -> ap.Spread:
    """:func:`attnviz.interventions.activation_patching.spread` of ``shares [documents, *grid]``, a slice of cells at
    a time (each slice draws the same documents, so the numbers are those of one call) so that thousands of
    documents never gather more than :data:`MOST_GATHERED` values at once."""
    documents = shares.shape[0]
    flat = shares.reshape(documents, -1)
    step = max(1, MOST_GATHERED // max(1, DRAWS * documents))
    parts = [ap.spread(flat[:, start:start + step], draws=DRAWS) for start in range(0, flat.shape[1], step)]

    def joined(name: str) -> torch.Tensor:
        return torch.cat([getattr(part, name) for part in parts]).reshape(shares.shape[1:])

    return ap.Spread(joined("mean"), joined("std"), joined("low"), joined("high"), documents)


def position_labels(period: int, bos: bool, change: str) -> list[str]:
    """Every position of a run's prompts: BOS, the document's tokens t0… (its first copy), their repeat t0′…; ▶
    where the corrupted prompt differs."""
    changed = prun.changed_position(period, 0 if bos else None, change)
    labels = ["0 BOS"] if bos else []
    labels += [f"{len(labels) + k} t{k}" for k in range(period)]
    labels += [f"{len(labels) + k} t{k}′" for k in range(period // 2)]
    labels[changed] = f"▶ {labels[changed]}"
    return labels


def read_map(reader: PatchingReader, kind: str, name: str, axes: list[str], labels: list[str],
             positions: list[str]) -> dict:
    """One map as the figures take it: its documents' shares ``[documents, rows, columns]`` (documents with no
    gap left out), its row and column labels and its spread over the documents."""
    shares = reader.shares(name)
    kept = shares[~shares.reshape(len(shares), -1).isnan().all(-1)]
    rows = list(labels)
    if axes == ["row", "head", "position"]:  # one row per head
        documents, layers, heads, n = kept.shape
        kept, rows = kept.reshape(documents, layers * heads, n), [f"{r} H{h}" for r in labels for h in range(heads)]
    columns = positions if axes[-1] == "position" else [f"H{head}" for head in range(kept.shape[-1])]
    found = {"kind": kind, "name": name, "rows": rows, "columns": columns, "shares": kept,
             "documents": len(kept), "by_position": axes[-1] == "position"}
    if len(kept):
        found["spread"] = spread_over_documents(kept)
    return found


def run_results(path: Path) -> dict | None:
    """What a run's database holds (None if it cannot be read now), kept by the file's stamp."""
    if not path.is_file():
        return None
    try:
        return _run_results(str(path), file_stamp(path))
    except Exception:  # noqa: BLE001 - a file being written, cut short, or not a run: nothing to show
        return None


@st.cache_resource(max_entries=8, show_spinner="Reading the run's maps…")
def _run_results(path: str, stamp: float) -> dict:
    with PatchingReader(path) as reader:
        said = reader.settings
        period = int(said["period"])
        bos = int(said.get("prompt_tokens", 0)) > period + period // 2
        positions = position_labels(period, bos, str(said.get("change", "copied")))
        found = [read_map(reader, kind, name, list(axes), list(rows), positions)
                 for kind, name, axes, rows in reader.maps()[["kind", "name", "axes", "rows"]].itertuples(index=False)]
        documents = reader.documents_frame()
    for each in found:
        if each["kind"] == "map" and each["documents"]:
            each["words"] = map_sentence(each, str(said.get("direction")))
    return {"settings": said, "maps": found, "documents": documents, "path": path, "stamp": stamp}


def map_sentence(found: dict, direction: str) -> str:
    """:func:`attnviz.pagelogic.patching.map_words` of a map: its words are those of its largest cell, so they are
    told that cell alone (the same numbers, without bootstrapping every cell again)."""
    mean = found["spread"].mean.nan_to_num(0.0)
    flat = int(mean.abs().flatten().argmax())
    row, column = flat // mean.shape[-1], flat % mean.shape[-1]
    return words.map_words(found["shares"][:, row:row + 1, column:column + 1], [found["rows"][row]],
                           [found["columns"][column]], direction)


@st.cache_resource(max_entries=8, show_spinner="Reading every head's weights…")
def cached_composition(folder: str, name: str, kind: str, _model):
    """One kind of composition score between every pair of the model's heads, or why it is not read, in words."""
    try:
        return comp.composition_scores(_model, kind)
    except ValueError as problem:
        return str(problem)


def composition_or_none(folder: str, name: str, kind: str, model):
    found = cached_composition(folder, name, kind, model)
    return None if isinstance(found, str) else found


def corpus_results(results: dict, folder: str, name: str, model) -> None:
    said, documents = results["settings"], results["documents"]
    measured = documents[documents["skipped"].isna()]
    direction, metric = str(said.get("direction")), str(said.get("metric"))
    columns = st.columns(5)
    columns[0].metric("Documents", f"{len(measured):,}",
                      help=f"measured, of {len(documents):,} done and {int(said.get('planned', 0)):,} planned")
    columns[1].metric("Left out", f"{len(documents) - len(measured):,}",
                      help=f"fewer than {said.get('period')} ordinary tokens")
    if len(measured):
        clean, corrupted = float(measured["clean"].mean()), float(measured["corrupted"].mean())
        columns[2].metric(f"{metric.capitalize()}, clean", format_number(clean), help=ap.METRICS.get(metric, ""))
        columns[3].metric(f"{metric.capitalize()}, corrupted", format_number(corrupted))
    columns[4].metric("Status", str(said.get("status", "?")))
    if said.get("status") != STATUS_FINISHED:
        st.caption(":material/pause: Stopped part way: the maps hold the documents patched so far; **Go on "
                   "patching** finishes them.")
    measure = "restored share" if direction == "denoising" else "share taken away"
    meaning = ("brings the clean answer back" if direction == "denoising" else
               "breaks the answer as the corruption does")
    paths: dict[str, dict] = {}
    for number, found in enumerate(results["maps"]):
        if found["kind"] == "path":
            receiver, mlps = found["name"].split("/")
            paths.setdefault(receiver, {})[mlps] = found
            continue
        if not found["documents"]:
            st.caption(f"{ap.SITES.get(found['name'], found['name'])}: no document patched yet.")
            continue
        spread = found["spread"]
        figure = figure_once((results["path"], results["stamp"], number), lambda found=found, spread=spread: (
            figures.spread_heatmap(
                spread.mean, spread.low, spread.high, spread.std, found["rows"], found["columns"],
                examples=spread.examples, measure=measure,
                title=f"{ap.SITES.get(found['name'], found['name']).capitalize()} patched ({direction}) over "
                      f"{spread.examples:,} documents: mean share of the {metric} gap",
                x_title=("position (t0…: the document's first tokens, t0′…: their repeat; ▶ where the prompts "
                         "differ)" if found["by_position"] else "head"))))
        show_figure(figure, f"1: the patch alone {meaning}; 0: nothing. Hover: each cell's 95% interval over the "
                    "documents.", key=f"pat_corpus_map_{number}")
        st.markdown(found["words"])
    for receiver, pair in paths.items():
        path_maps(results, receiver, pair, measure, folder, name, model)
    with st.expander("Every document, with its clean and corrupted metric", icon=":material/table:"):
        shown = documents.drop(columns=["text"]).assign(start=documents["text"].map(
            lambda text: " ".join(str(text).split())[:80]))
        st.dataframe(shown, hide_index=True, width="stretch")


def path_maps(results: dict, receiver: str, pair: dict, measure: str, folder: str, name: str, model) -> None:
    """A receiver's path maps, MLPs held and free side by side, and what they show in words."""
    layer, head, via = prun.parse_receiver(receiver)
    shown = [(mlps, pair[mlps]) for mlps in MLPS if mlps in pair and pair[mlps]["documents"]]
    if not shown:
        st.caption(f"Paths into L{layer} H{head}'s {pp.VIA[via]}: no document patched yet.")
        return
    columns = st.columns(len(shown))
    titles = {"frozen": "MLPs held: the direct path", "free": "MLPs free: direct and through the MLPs"}
    for column, (mlps, found) in zip(columns, shown, strict=True):
        spread = found["spread"]
        figure = figure_once((results["path"], results["stamp"], found["name"]), lambda found=found, spread=spread,
                             mlps=mlps: figures.spread_heatmap(
            spread.mean, spread.low, spread.high, spread.std, found["rows"], found["columns"],
            examples=spread.examples, measure=measure, x_title="sender head", width=520,
            title=f"Into L{layer} H{head}'s {pp.VIA[via]}: {titles[mlps]}"))
        with column:
            show_figure(figure, "Each cell: the sender's change reaching the receiver only through this input (mean "
                        "over documents; hover: its 95% interval).", key=f"pat_corpus_path_{receiver}_{mlps}")
    if len(shown) == 2:
        frozen, free = (SimpleNamespace(receiver=(layer, head), via=via, rows=found["rows"],
                                        share_spread=found["spread"]) for _, found in shown)
        st.markdown(words.path_words(frozen, free, {}, composition_or_none(folder, name, via.upper(), model)))
