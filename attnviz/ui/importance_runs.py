"""A "Does this head matter?" map over a whole corpus, measured in the background into DuckDB
(:mod:`attnviz.corpus.importance`): its corpus and limits, the button that starts or goes on with the run these
settings name, its progress, and its results (the maps, every head with its spread and the scan's label, the
documents where a head matters most). Widgets keyed ``imp_corpus*``, like the page's."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core.units import human_bytes
from attnviz.corpus import background
from attnviz.corpus import jobs as background_jobs
from attnviz.corpus.documents import CorpusRefused
from attnviz.corpus.importance.runner import METHODS, SCAN_PREFIX, ImportanceSettings
from attnviz.corpus.importance.store import estimated_run_bytes
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.scan.runner import ScanRefused, text_as_read
from attnviz.interventions import importance as imp
from attnviz.pagelogic import importance as importance_page
from attnviz.pagelogic import importance_words as words
from attnviz.pagelogic.importance import METHOD_TITLES
from attnviz.ui.caches.importance import (
    BUNDLED_SPEC,
    importance_jobs,
    run_documents,
    run_facts,
    run_results,
    scan_top_labels,
)
from attnviz.ui.importance_maps import agreement_tables, show_maps
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.open_in_explore import ask_to_open
from attnviz.ui.scans import listed_scans, scan_title, session_id, waiting_for_turn
from attnviz.ui.session_models import model_dtype
from attnviz.viz.style import format_number

BUNDLED_CORPUS = "The bundled corpus (Python's documentation and docstrings)"


def run_settings(objective: str) -> tuple[str, ImportanceSettings] | None:
    """The run's corpus (``bundled`` or ``scan:FILE``) and settings, or None (no measure chosen: said)."""
    choices = [BUNDLED_CORPUS, *map(str, listed_scans())]  # scans only: never a corpus importance run
    columns = st.columns([4, 2, 2])
    chosen = columns[0].selectbox(
        "Corpus", choices, key="imp_corpus",
        format_func=lambda c: c if c == BUNDLED_CORPUS else f"The documents of a scan: {scan_title(c)}",
        help="The bundled corpus, or the documents a scan of the Heads across a corpus page read (scan an uploaded "
             "corpus there first to measure it here).")
    most = background.max_page_documents()
    max_docs = int(columns[1].number_input("Documents", 1, most, min(100, most), step=50, key="imp_corpus_docs",
                                           help=f"the corpus's first documents, at most {most:,} from this page"))
    max_tokens = int(columns[2].number_input("Tokens per document", 8, imp.MAX_TOKENS, 64, step=8,
                                             key="imp_corpus_tokens",
                                             help="each document's first tokens: a run is one forward of every "
                                                  "document per head"))
    offered = [method for method in METHODS if not (method == "gradient" and objective == "hidden")]
    methods = st.pills("Measures", offered, default=offered, selection_mode="multi", format_func=METHOD_TITLES.get,
                       key="imp_corpus_methods")
    if not methods:
        st.warning("Choose at least one measure.", icon=":material/checklist:")
        return None
    spec = BUNDLED_SPEC if chosen == BUNDLED_CORPUS else f"{SCAN_PREFIX}{chosen}"
    return spec, ImportanceSettings(max_docs=max_docs, max_tokens=max_tokens,
                                    methods=tuple(m for m in METHODS if m in methods))


def corpus_run_view(folder: str, name: str, tokenizer, objective: str) -> None:
    """A map over a whole corpus, measured in the background into DuckDB (attnviz.corpus.importance)."""
    jobs = importance_jobs()
    chosen = run_settings(objective)
    if chosen is None:
        return
    spec, settings = chosen
    max_docs, max_tokens = settings.max_docs, settings.max_tokens
    try:
        facts = run_facts(spec, folder, settings, model_dtype(name))
    except (CorpusRefused, ScanRefused) as problem:
        st.error(f"The corpus cannot be read: {problem}.", icon=":material/block:")
        return
    path, running = jobs.database(facts["key"]), jobs.job()
    st.session_state["imp_corpus_path"] = str(path)  # the run these settings name (its DuckDB file)
    results = None if running is not None else run_results(path)
    status = (results or {}).get("settings", {}).get("status")
    planned = min(max_docs, facts["documents"])
    label = ("Measured: see below" if status == "finished" else "Go on measuring" if results else
             f"Measure every head over {planned:,} document{'s' if planned != 1 else ''}")
    bundle = load_bundle(folder, name, model_dtype(name))
    heads = bundle.n_layers * bundle.n_heads * (3 if bundle.architecture == "encoder-decoder" else 1)
    reserved = estimated_run_bytes(planned, heads, len(settings.methods), facts["characters"], bundle.d_model)
    if st.button(label, type="primary", key="imp_corpus_run", icon=":material/play_arrow:",
                 disabled=running is not None or status == "finished"):
        try:
            jobs.start_importance(facts["key"], spec, folder, settings, dtype=model_dtype(name), model_name=name,
                                  disk_bytes=reserved, session=session_id())
        except (JobRefused, CheckpointRefused) as problem:
            st.error(f"The run cannot start: {problem}.", icon=":material/block:")
            return
        st.rerun()
    st.caption(f"{planned:,} of {facts['documents']:,} documents of {facts['name']}, at most {max_tokens} tokens "
               f"each, with {name}: each head removed in turn over every document (and a first pass for the "
               "corpus means, for mean ablation). It runs in a process of its own (the server runs at most "
               f"{background_jobs.job_limit()} at once, the rest wait their turn) and reserves up to "
               f"{human_bytes(reserved)} of disk: leave the page or reload, it goes on; the same corpus, model and "
               "limits reopen the same results.")
    if running is not None:
        if running.key != facts["key"]:
            st.info("The run in progress below was started with other settings (another model, corpus or limits): "
                    "these can run once it ends, or after Stop.", icon=":material/pending:")
        running_run(jobs)
        return
    said = jobs.progress(facts["key"])
    if said and said.get("status") == "failed":
        st.error(f"The run failed: {said.get('error')}", icon=":material/error:")
    if results is None:
        return
    corpus_results(path, results, objective)
    st.caption(f":material/start: {words.reading_words(tokenizer, objective)}")


@st.fragment(run_every=1.0)
def running_run(jobs) -> None:
    """The running job's progress, refreshed every second; the whole page reruns when it ends."""
    job = jobs.job()
    if job is None:
        st.rerun(scope="app")
    if job.waiting:
        waiting_for_turn(jobs, job, "imp_corpus_cancel")
        return
    share, text = importance_page.run_progress(jobs.progress(job.key) or {}, time.time() - job.started)
    st.progress(share, text=text)
    if st.button("Stop", key="imp_corpus_stop", icon=":material/stop:",
                 help="stops at the head being measured; every finished chunk of documents is kept, and the run "
                      "goes on from there when asked"):
        jobs.stop(job.key)
        st.toast("Stopping…")


def corpus_results(path: Path, results: dict, objective: str) -> None:
    said, modules = results["settings"], results["modules"]
    if not results["maps"]:
        return
    columns = st.columns(4)
    columns[0].metric("Documents", f"{results['documents']:,}", help=f"of {said.get('planned', 0):,} planned")
    columns[1].metric("Heads", f"{sum(m.heads for m in modules):,}", help=f"{len(modules)} attention modules")
    if objective != "hidden":
        columns[2].metric("Loss without edits", f"{format_number(results['clean'])} nats",
                          help=said.get("objective_words", ""))
    columns[3].metric("Status", str(said.get("status", "?")))
    if said.get("status") != "finished":
        st.caption(":material/pause: Stopped part way: the maps hold the documents measured so far; **Go on "
                   "measuring** finishes them.")
    maps = importance_page.run_maps(results, objective)
    labels = [module.label for module in modules]
    show_maps(maps, labels, objective, "imp_corpus_map", over="documents")
    if len(maps) > 1:
        agreement_tables(maps)
    labels_of_scan, note = scan_labels_for(said)
    rows = importance_page.run_rows(results, maps, objective, labels_of_scan)
    if note:
        st.caption(note)
    with st.expander("Every head, with its spread over the documents", icon=":material/table:"):
        st.dataframe(rows, hide_index=True, width="stretch")
    documents_of_a_head(path, modules, list(maps), said)


def scan_labels_for(said: dict) -> tuple[dict | None, str]:
    """The labels a scan gave each head over the same documents, when the run measured a scan's documents with the
    scan's own model; else None and why not (or "")."""
    source = str(said.get("source") or "")
    if not source.startswith(SCAN_PREFIX):
        return None, ""
    scan = Path(source.removeprefix(SCAN_PREFIX))
    found = scan_top_labels(scan)
    if found is None:
        return None, "The scan these documents came from cannot be read now: its labels are not shown."
    model_folder, labels = found
    if Path(model_folder).resolve() != Path(str(said.get("model_folder", ""))).resolve():
        return None, ("The scan these documents came from was made with another model: its head labels describe "
                      "that model's heads, so they are not shown beside these.")
    return labels, ("Label over the scan: each head's most frequent label on the same documents, from the scan "
                    "(where it looks, beside what removing it costs).")


def as_read(text: str, said: dict) -> str:
    """A document as the run read it: cut after its first ``max_tokens`` tokens by the run's model's tokenizer."""
    name = str(said.get("model"))
    try:
        bundle = load_bundle(str(said.get("model_folder")), name, model_dtype(name))
    except Exception:  # noqa: BLE001 - the run's model cannot be loaded now: the whole document
        return text
    return text_as_read(bundle, text, int(said.get("max_tokens") or imp.MAX_TOKENS))


def open_document(text: str, said: dict, layer: int, head: int) -> None:
    """Callback: the document, as the run read it, in Explore heads on the head, with the run's model."""
    ask_to_open(as_read(text, said), said.get("model"), layer, head)


def documents_of_a_head(path: Path, modules, methods: list[str], said: dict) -> None:
    st.subheader("Where does a head matter most?")
    columns = st.columns([3, 2, 3])
    labels = [module.label for module in modules]
    row = columns[0].selectbox("Layer", range(len(labels)), format_func=labels.__getitem__, key="imp_corpus_layer")
    head = columns[1].selectbox("Head", range(modules[row].heads), key="imp_corpus_head")
    method = columns[2].radio("Measure", methods, format_func=METHOD_TITLES.get, horizontal=True,
                              key="imp_corpus_method")
    found = run_documents(str(path), path.stat().st_mtime, method, row, head)
    if not found:
        st.caption("No document measured for this head yet.")
        return
    for rank, entry in enumerate(found):
        text_column, value_column, button_column = st.columns([8, 2, 3])
        flat = " ".join(as_read(entry["text"], said).split())  # the part measured, as plain text (not markdown)
        text_column.markdown(f"**Document {entry['doc']}**")
        text_column.text(flat[:240] + ("…" if len(flat) > 240 else ""))
        value_column.metric(METHOD_TITLES[method], format_number(entry["change"]), label_visibility="collapsed")
        if modules[row].kind == "self":  # Explore heads numbers self-attention layers as here
            button_column.button("Open in Explore heads", key=f"imp_corpus_open_{rank}", on_click=open_document,
                                 args=(entry["text"], said, modules[row].index, head), icon=":material/search:")
    st.caption("The documents where removing the head moves the objective most, either way: each as the run read "
               f"it, its first {said.get('max_tokens')} tokens at most.")
