"""The patching experiment of the "Does this head matter?" page over a whole corpus, measured in the background into
DuckDB (:mod:`attnviz.corpus.patching`): each document's own text typed twice as the induction preset types random
tokens. Its corpus (the bundled one, an uploaded file, or a scan's documents), its settings (documents, period,
corruption, sites, and the paths into one receiver), the button that starts or goes on with the run these settings
name, its progress, and its maps drawn as the experiment draws them: the mean share over the documents with each
cell's 95 % bootstrap interval, and what they show in words. Widgets keyed ``pat_corpus*``."""

from __future__ import annotations

import time

import streamlit as st
import torch

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core import circuits
from attnviz.core.units import human_bytes
from attnviz.corpus import background
from attnviz.corpus import jobs as background_jobs
from attnviz.corpus.documents import FORMATS, CorpusRefused, characters_noted, max_corpus_bytes
from attnviz.corpus.importance.runner import SCAN_PREFIX, scan_corpus_facts
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.patching import runner as prun
from attnviz.corpus.patching.store import STATUS_FINISHED
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import path_patching as pp
from attnviz.ui.caches.store import file_stamp
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.patching_run_results import MLPS, corpus_results, run_results
from attnviz.ui.scans import (
    corpus_columns,
    corpus_facts,
    listed_scans,
    scan_folder,
    scan_title,
    session_id,
    waiting_for_turn,
)
from attnviz.ui.session_models import model_dtype
from attnviz.viz.style import format_number

BUNDLED_CHOICE = "The bundled corpus (Python's documentation and docstrings)"
UPLOAD_CHOICE = "A corpus file, uploaded"
BUNDLED_SPEC = "bundled"
CHANGES = {"copied": "the token to copy", "previous": "the token before it"}
FORM = ("pat_corpus", "pat_corpus_split", "pat_corpus_field", "pat_corpus_docs", "pat_corpus_period",
        "pat_corpus_change", "pat_corpus_sites", "pat_corpus_direction", "pat_corpus_metric", "pat_corpus_paths",
        "pat_corpus_receiver", "pat_corpus_via")


def patching_jobs() -> background.ScanFolder:
    """This browser's corpus patching runs: a folder beside its scans (one job at a time, all kinds together)."""
    scans = scan_folder()
    return background.ScanFolder(scans.folder / "patching", owner=scans.owner)


# -- the corpus -----------------------------------------------------------------------------------------------------
def chosen_corpus(jobs: background.ScanFolder) -> tuple[str, str, str | None, dict] | None:
    """``(spec as the command line takes it, txt split, field, facts)``, or None (a file still to give, or refused:
    said)."""
    choices = [BUNDLED_CHOICE, UPLOAD_CHOICE, *map(str, listed_scans())]
    chosen = st.selectbox(
        "Corpus", choices, key="pat_corpus",
        format_func=lambda c: c if c in choices[:2] else f"The documents of a scan: {scan_title(c)}",
        help="The bundled corpus, a file of yours (read by its format's reader, never run), or the documents a scan "
             "of the Heads across a corpus page read.")
    split, field = "line", None
    try:
        if chosen == BUNDLED_CHOICE:
            spec, facts = BUNDLED_SPEC, {**corpus_facts(None, 0.0, "line", None), "name": "the bundled corpus"}
        elif chosen == UPLOAD_CHOICE:
            uploaded = uploaded_corpus(jobs)
            if uploaded is None:
                return None
            spec, split, field = uploaded
            facts = corpus_facts(spec, file_stamp(spec), split, field)
        else:
            spec, facts = f"{SCAN_PREFIX}{chosen}", scan_facts(chosen)
    except (CorpusRefused, CheckpointRefused) as problem:
        st.error(f"The corpus cannot be read: {str(problem).rstrip('.')}.", icon=":material/block:")
        return None
    if not facts["documents"]:
        st.error("The corpus holds no document to patch.", icon=":material/block:")
        return None
    return spec, split, field, facts


def uploaded_corpus(jobs: background.ScanFolder) -> tuple[str, str, str | None] | None:
    """An uploaded corpus kept in this browser's folder: (its path, txt split, field), or None until it is given
    (or refused: said)."""
    most = max_corpus_bytes()
    upload = st.file_uploader(f"A corpus file ({', '.join(FORMATS)}; at most {most / 1024**2:,.0f} MB)",
                              type=[suffix[1:] for suffix in FORMATS], key="pat_corpus_upload",
                              max_upload_size=max(1, -(-most // 1024**2)))
    if upload is None:
        st.caption("Choose a file: each line (or paragraph, or record) is a document.")
        return None
    if upload.size > most:
        st.error(f"{upload.name} is {upload.size / 1024**2:,.1f} MB; a corpus may be at most {most / 1024**2:,.0f} MB "
                 "here.", icon=":material/block:")
        return None
    try:
        job = jobs.job()
        path = jobs.keep_corpus(upload.getvalue(), upload.name, in_use=set() if job is None else {job.corpus})
        if path.suffix == ".txt":
            split = st.radio("One document per", ("line", "paragraph"), horizontal=True, key="pat_corpus_split",
                             help="paragraph: blank lines separate documents")
            return str(path), split, None
        names = corpus_columns(str(path), file_stamp(path))
    except (CorpusRefused, CheckpointRefused) as problem:
        st.error(f"{upload.name} cannot be used: {str(problem).rstrip('.')}.", icon=":material/block:")
        return None
    if not names:
        st.error(f"{upload.name} has no text field or column.", icon=":material/block:")
        return None
    field = st.selectbox("The text is in", names, key="pat_corpus_field", placeholder="Choose the column",
                         index=names.index("text") if "text" in names else 0 if len(names) == 1 else None)
    if field is None:
        st.info(f"{upload.name} has no column named text: choose the one that holds the documents.",
                icon=":material/table_rows:")
        return None
    return str(path), "line", field


def scan_facts(path: str) -> dict:
    """A scan's documents as a corpus: how many, their fingerprint and characters (their texts stay in its file);
    refused in words."""
    found = _scan_facts(path, file_stamp(path))
    if "refused" in found:
        raise CorpusRefused(found["refused"])
    return found


@st.cache_data(max_entries=8, show_spinner="Reading the scan's documents…")
def _scan_facts(path: str, stamp: float) -> dict:
    try:
        corpus = scan_corpus_facts(path)
    except CorpusRefused as problem:
        return {"refused": str(problem)}
    return {"name": corpus.name, "documents": corpus.count, "fingerprint": corpus.fingerprint,
            "characters": corpus.characters, "chars_every": corpus.chars_every}


# -- the settings ---------------------------------------------------------------------------------------------------
def longest_period(positions: int, bos: bool) -> int:
    """The longest period whose prompt (BOS, the period, half of it again) fits the model's positions."""
    period = prun.MOST_PERIOD
    while period > 4 and prun.prompt_length(period, 0 if bos else None) > positions:
        period -= 1
    return period


@st.cache_resource(max_entries=4, show_spinner="Measuring each head's induction score…")
def _induction_scores(folder: str, name: str, _model, _tokens: list[int], bos: int | None) -> torch.Tensor:
    return ind.circuit_scores(_model, _tokens, period=50, seed=11, bos=bos)["induction"]


def receiver_choice(folder: str, name: str, model, tokenizer, change: str) -> str | None:
    """The receiver of the path maps, ``"LAYER.HEAD:VIA"`` (by default the head with the highest induction score,
    through its keys, as the experiment's Paths look picks it), or None (no paths)."""
    on = st.toggle("Trace the paths into a receiver", True, key="pat_corpus_paths",
                   help="Path patching: every earlier head's path into the receiver's input, with the MLPs between "
                        "them held (the direct path) and free (through the MLPs too)")
    if not on:
        return None
    columns = st.columns([3, 3, 4])
    chosen = choose_receiver(folder, name, model, tokenizer, columns, "pat_corpus")
    if chosen is None:
        return None
    receiver, via = chosen
    if change == "copied" and via == "k":
        columns[2].caption(KEYS_TIP)
    return f"{receiver[0]}.{receiver[1]}:{via}"


KEYS_TIP = (":material/lightbulb: Corrupting the token to copy leaves the token an induction head's keys look for "
            "unchanged: to test the keys' path, corrupt the token before it instead.")


def choose_receiver(folder: str, name: str, model, tokenizer, columns, prefix: str) -> tuple[tuple, str] | None:
    """The receiver head (preselected: the highest induction score, on random tokens typed twice) and the input the
    paths go through (keys by default), in the first two of ``columns``; widget keys ``PREFIX_receiver`` and
    ``PREFIX_via``. None (said) for a model of one layer."""
    scores = _induction_scores(folder, name, model, circuits.ordinary_token_ids(tokenizer), tokenizer.bos_token_id)
    receivers = [(layer, head) for layer in range(1, scores.shape[0]) for head in range(scores.shape[1])
                 if bool(torch.isfinite(scores[layer, head]))]
    if not receivers:
        st.info("Paths need two layers or more.", icon=":material/info:")
        return None
    strongest = max(receivers, key=lambda cell: float(scores[cell]))
    receiver = columns[0].selectbox(
        "Receiver", receivers, index=receivers.index(strongest), key=f"{prefix}_receiver",
        format_func=lambda cell: f"L{cell[0]} H{cell[1]} (induction score {format_number(float(scores[cell]), 2)})",
        help="Preselected: the head with the highest induction score (random tokens typed twice)")
    via = columns[1].segmented_control("Through its", list(pp.VIA), default="k", format_func=pp.VIA.get,
                                       key=f"{prefix}_via", required=True)
    return receiver, via


def run_settings(folder: str, name: str, model, tokenizer, bundle) -> prun.PatchingSettings | None:
    """The run's settings from the form, or None (nothing to measure, or refused: said)."""
    columns = st.columns([2, 2, 3])
    most = background.max_page_documents()
    max_docs = int(columns[0].number_input("Documents", 1, most, min(100, most), step=50, key="pat_corpus_docs",
                                           help=f"the corpus's first documents, at most {most:,} from this page"))
    longest = longest_period(bundle.max_positions, tokenizer.bos_token_id is not None)
    period = int(columns[1].number_input(
        "Tokens in the first copy", 4, longest, min(16, longest), step=2, key="pat_corpus_period",
        help="each document's first ordinary tokens, typed, then their first half again; a document with fewer is "
             "left out (and counted)"))
    change = columns[2].selectbox("Corrupt", list(CHANGES), format_func=CHANGES.get, key="pat_corpus_change",
                                  help="The token to copy: tells the path through an induction head's values. The "
                                       "token before it: tells the path through its keys.")
    columns = st.columns([4, 2, 2])
    sites = columns[0].pills("Sites", list(ap.SITES), default=["resid", "head"], selection_mode="multi",
                             format_func=ap.SITES.get, key="pat_corpus_sites",
                             help="each a map: every cell patched on every document")
    direction = columns[1].selectbox("Direction", list(ap.DIRECTIONS), key="pat_corpus_direction",
                                     help="; ".join(f"{k}: {v}" for k, v in ap.DIRECTIONS.items()))
    metric = columns[2].selectbox("Metric", list(ap.METRICS), key="pat_corpus_metric",
                                  help="; ".join(f"{k}: {v}" for k, v in ap.METRICS.items()))
    receiver = receiver_choice(folder, name, model, tokenizer, change)
    if not sites and receiver is None:
        st.warning("Choose a site, or trace the paths into a receiver.", icon=":material/checklist:")
        return None
    try:
        return prun.PatchingSettings(max_docs=max_docs, period=period, change=change,
                                     sites=tuple(site for site in ap.SITES if site in sites), direction=direction,
                                     metric=metric, receivers=(receiver,) if receiver else (), mlps=MLPS)
    except ScanRefused as problem:
        st.warning(f"These settings cannot run: {problem}.", icon=":material/block:")
        return None


@st.cache_data(max_entries=32, show_spinner=False)
def run_key(fingerprint: str, folder: str, settings: prun.PatchingSettings, dtype: str) -> str:
    """The run these settings name (its files' name): the same corpus, model and settings, the same run."""
    return prun.patching_key(fingerprint, folder, settings, dtype)


def estimated_run_bytes(documents: int, layers: int, heads: int, n: int, settings: prun.PatchingSettings,
                        characters: int) -> int:
    """At most what a corpus patching run's file takes on disk: a row per document and cell of every map (a
    residual map's rows counted generously), each document's text. What the page reserves before it starts."""
    cells = 0
    for site in settings.sites:
        rows = 2 * layers + 1 if site == "resid" else layers
        by_position = site not in ap.HEAD_SITES or settings.by_position
        cells += rows * (heads if site in ap.HEAD_SITES else 1) * (n if by_position else 1)
    cells += len(settings.paths) * layers * heads
    return int(documents * (cells * 48 + 512) + 4 * characters + 8 * 1024**2)


# -- the view -------------------------------------------------------------------------------------------------------
def corpus_patching_view(folder: str, name: str, model, tokenizer) -> None:
    """The patching experiment over a whole corpus, measured in the background into DuckDB."""
    st.caption(":material/info: Over a corpus, each document gives one example (its own first tokens typed twice, "
               "as the preset types random ones), and the sites and paths chosen here are measured document by "
               "document in a process of its own. The looks of the preset and of your own prompts (layer × "
               "position, heads, head inputs, paths, logit attribution, lens, composition) do not apply here.")
    jobs = patching_jobs()
    corpus = chosen_corpus(jobs)
    if corpus is None:
        return
    spec, split, field, facts = corpus
    dtype = model_dtype(name)
    bundle = load_bundle(folder, name, dtype)
    settings = run_settings(folder, name, model, tokenizer, bundle)
    if settings is None:
        return
    key = run_key(facts["fingerprint"], folder, settings, dtype)
    path, running = jobs.database(key), jobs.job()
    st.session_state["pat_corpus_path"] = str(path)  # the run these settings name (its DuckDB file)
    results = None if running is not None else run_results(path)
    status = (results or {}).get("settings", {}).get("status")
    planned = min(settings.max_docs, facts["documents"])
    label = ("Patched: see below" if status == STATUS_FINISHED else "Go on patching" if results else
             f"Patch {planned:,} document{'s' if planned != 1 else ''}")
    n = prun.prompt_length(settings.period, tokenizer.bos_token_id)
    characters = characters_noted(facts.get("chars_every") or [], facts.get("characters"), planned)
    reserved = estimated_run_bytes(planned, bundle.n_layers, bundle.n_heads, n, settings, characters)
    if st.button(label, type="primary", key="pat_corpus_run", icon=":material/play_arrow:",
                 disabled=running is not None or status == STATUS_FINISHED):
        try:
            jobs.start_patching(key, spec, folder, settings, split=split, field_name=field, dtype=dtype,
                                model_name=name, disk_bytes=reserved, session=session_id())
        except (JobRefused, CheckpointRefused) as problem:
            st.error(f"The run cannot start: {problem}.", icon=":material/block:")
            return
        st.rerun()
    maps = len(settings.sites) + len(settings.paths)
    st.caption(f"{planned:,} of {facts['documents']:,} documents of {facts['name']}, each a prompt of {n} tokens, "
               f"with {name}: {maps} map{'s' if maps != 1 else ''}, every cell patched on every document. It runs in "
               f"a process of its own (the server runs at most {background_jobs.job_limit()} at once, the rest wait "
               f"their turn) and reserves up to {human_bytes(reserved)} of disk: leave the page or reload, it goes "
               "on; the same corpus, model and settings reopen the same results.")
    if running is not None:
        if running.key != key:
            st.info("The run in progress below was started with other settings (another model, corpus or settings): "
                    "these can run once it ends, or after Stop.", icon=":material/pending:")
        running_run(jobs)
        return
    said = jobs.progress(key)
    if said and said.get("status") == "failed":
        st.error(f"The run failed: {said.get('error')}", icon=":material/error:")
    if results is None:
        return
    corpus_results(results, folder, name, model)


def run_progress(said: dict, seconds: float) -> tuple[float, str]:
    """The progress bar, ``(share done, words)``, from the run's progress record ``said`` ({} before the first)."""
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    if not said:
        return 0.0, f"Starting (loading the model, reading the corpus): {seconds:.0f} s"
    rate, eta = said.get("documents_per_second") or 0.0, said.get("eta")
    left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
    skipped = int(said.get("skipped") or 0)
    out = f" ({skipped:,} left out: too short)" if skipped else ""
    return min(1.0, done / planned), (f"Patching: {done:,} of {planned:,} documents{out} · {rate:.2f} documents/s"
                                      f"{left}")


@st.fragment(run_every=1.0)
def running_run(jobs: background.ScanFolder) -> None:
    """The running job's progress, refreshed every second; the whole page reruns when it ends."""
    job = jobs.job()
    if job is None:
        st.rerun(scope="app")
    if job.waiting:
        waiting_for_turn(jobs, job, "pat_corpus_cancel")
        return
    share, text = run_progress(jobs.progress(job.key) or {}, time.time() - job.started)
    st.progress(share, text=text)
    if st.button("Stop", key="pat_corpus_stop", icon=":material/stop:",
                 help="stops after the batch being patched; every finished chunk of documents is kept, and the run "
                      "goes on from there when asked"):
        jobs.stop(job.key)
        st.toast("Stopping…")


# -- the results ----------------------------------------------------------------------------------------------------
