"""The corpus page's first part, "Scan a corpus": the corpus chosen (the bundled one, or a file uploaded and kept
in this browser's scan folder), the scan's limits, the button that starts, resumes or opens the scan these settings
name, and the running scan's progress (or why it failed). Widgets keyed ``corpus_*``, like the page's."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core.units import human_bytes
from attnviz.corpus import background, jobs
from attnviz.corpus.documents import FORMATS, CorpusRefused, characters_noted, max_corpus_bytes
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.scan import disk, qk_sample, store
from attnviz.corpus.scan.runner import ScanSettings, token_limit
from attnviz.pagelogic import corpus as corpus_page
from attnviz.ui.caches.store import file_stamp
from attnviz.ui.frame import setup_area
from attnviz.ui.scans import (
    corpus_columns,
    corpus_facts,
    existing_scan,
    key_for,
    readable_scans,
    session_id,
    waiting_for_turn,
)
from attnviz.ui.session_models import model_dtype

BUNDLED_CHOICE, UPLOAD_CHOICE = "Bundled: Python's documentation and docstrings", "Upload a file"


def chosen_corpus(folder: background.ScanFolder) -> tuple[str | None, str, str | None] | None:
    """(kept corpus path or None for the bundled one, txt split, field), or None until a file is given."""
    choice = st.radio("Corpus", (BUNDLED_CHOICE, UPLOAD_CHOICE), horizontal=True, key="corpus_source")
    if choice == BUNDLED_CHOICE:
        return None, "line", None
    upload = st.file_uploader(f"A corpus file ({', '.join(FORMATS)}; at most {max_corpus_bytes() / 1024**2:,.0f} "
                              "MB): read by its format's reader, never run", type=[f[1:] for f in FORMATS],
                              key="corpus_upload", max_upload_size=max(1, -(-max_corpus_bytes() // 1024**2)))
    if upload is None:
        return None
    if upload.size > max_corpus_bytes():
        st.error(f"{upload.name} is {upload.size / 1024**2:,.1f} MB; a corpus may be at most "
                 f"{max_corpus_bytes() / 1024**2:,.0f} MB here.", icon=":material/block:")
        return None
    try:
        job = folder.job()
        path = folder.keep_corpus(upload.getvalue(), upload.name, in_use=set() if job is None else {job.corpus})
        split, field = "line", None
        if path.suffix == ".txt":
            split = st.radio("One document per", ("line", "paragraph"), horizontal=True, key="corpus_split",
                             help="paragraph: blank lines separate documents")
        else:
            names = corpus_columns(str(path), file_stamp(path))
            if not names:
                st.error("No text field or column found in this file.", icon=":material/block:")
                return None
            field = st.selectbox("The text is in", names, key="corpus_field", placeholder="Choose the column",
                                 index=names.index("text") if "text" in names else 0 if len(names) == 1 else None)
            if field is None:
                st.info(f"{upload.name} has no column named text: choose the one that holds the documents.",
                        icon=":material/table_rows:")
                return None
    except (CorpusRefused, CheckpointRefused) as problem:
        st.error(f"{upload.name} cannot be used: {problem}.", icon=":material/block:")
        return None
    return str(path), split, field


def scan_limits(bundle) -> tuple[int, int, int]:
    """The scan's limits, (documents, tokens per document, queries and keys kept), with the model's name beside
    them."""
    columns = st.columns(4)
    most = background.max_page_documents()
    max_docs = int(columns[0].number_input("Documents", 1, most, min(200, most), step=100, key="corpus_docs",
                                           help=f"the corpus's first documents (the bundled one is shuffled); at "
                                                f"most {most:,} from this page"))
    longest = max(8, min(bundle.max_positions, token_limit(bundle.n_layers, bundle.n_heads)))
    max_tokens = int(columns[1].number_input("Tokens per document", 8, longest, min(128, longest), step=32,
                                             key="corpus_tokens",
                                             help=f"each document's first tokens, special tokens included (at most "
                                                  f"{longest:,} for this model: a scan reads every layer's weights "
                                                  "of a document at once)"))
    qk_points = int(columns[2].number_input(
        "Queries and keys kept", 0, qk_sample.MOST_POINTS, qk_sample.DEFAULT_POINTS, step=1024,
        key="corpus_qk_points",
        help="tokens per head whose queries, keys and values the scan keeps for the Queries and keys page: "
             "whole documents drawn evenly across the corpus (0: none)"))
    columns[3].markdown(f"**Model**  \n{bundle.name}  \n:small[(the sidebar's)]")
    return max_docs, max_tokens, qk_points


def scan_controls(folder: background.ScanFolder, bundle) -> None:
    area = (st.expander("Scan a corpus", icon=":material/play_arrow:", expanded=False) if readable_scans(folder)
            else setup_area("Scan a corpus"))  # once there are scans, their results come first
    with area:
        corpus = chosen_corpus(folder)
        max_docs, max_tokens, qk_points = scan_limits(bundle)
        if corpus is None:
            st.caption(f"Choose a file: the scan reads its first {max_docs:,} documents, at most {max_tokens} tokens "
                       f"each, and keeps the queries and keys of up to {qk_points:,} tokens a head.")
            return
        path, split, field = corpus
        try:
            facts = corpus_facts(path, 0.0 if path is None else file_stamp(path), split, field)
        except CorpusRefused as problem:
            st.error(f"The corpus cannot be read: {problem}.", icon=":material/block:")
            return
        for line in facts["report"]:
            st.caption(f":material/info: {line}")
        if not facts["documents"]:
            st.error("The corpus holds no document to scan.", icon=":material/block:")
            return
        if bundle.modality != "text":
            st.info(f"{bundle.name} reads images; a scan reads text. Choose a text model in the sidebar.",
                    icon=":material/image:")
            return
        settings = ScanSettings(max_docs=max_docs, max_tokens=max_tokens, qk_points=qk_points)
        start_button(folder, bundle, corpus, facts, settings)


def start_button(folder: background.ScanFolder, bundle, corpus: tuple[str | None, str, str | None], facts: dict,
                 settings: ScanSettings) -> None:
    """The button that scans (or resumes, or opens) the scan these settings name, and what it will do."""
    path, split, field = corpus
    max_tokens, qk_points = settings.max_tokens, settings.qk_points
    planned = min(settings.max_docs, facts["documents"])
    key = key_for(facts["fingerprint"], str(bundle.folder), settings, bundle.dtype)
    existing = folder.database(key)
    job = folder.job()
    if job is not None and job.key != key:
        st.info("The scan in progress below was started with other settings (another corpus, model or limits): "
                "these can run once it ends, or after Stop.", icon=":material/pending:")
    said = existing_scan(folder, existing) if existing.is_file() and job is None else None
    if said == "busy":
        return
    finished = said is not None and said.get("status") == store.STATUS_FINISHED
    label = ("Open the finished scan" if finished else
             "Resume the scan" if said is not None else f"Scan {planned:,} document{'s' if planned != 1 else ''}")
    characters = characters_noted(facts["chars_every"], facts["characters"], planned)
    reserved = disk.estimated_scan_bytes(planned, max_tokens, bundle.n_layers, bundle.n_heads, characters,
                                         qk_points, bundle.d_model // max(bundle.n_heads, 1))
    if st.button(label, type="primary", key="corpus_scan", disabled=job is not None, icon=":material/play_arrow:"):
        if not finished:
            try:
                folder.start(key, background.corpus_argument(path), bundle.folder, settings, split=split,
                             field_name=field, dtype=model_dtype(bundle.name), model_name=bundle.name,
                             disk_bytes=reserved, session=session_id())
            except (JobRefused, CheckpointRefused) as problem:
                st.error(f"The scan cannot start: {problem}.", icon=":material/block:")
                return
        st.session_state["corpus_chosen"] = str(existing)
        st.session_state.pop("corpus_chosen_shown", None)  # show it, even if it was shown before
        st.rerun()
    kept = (f" Then it keeps every head's queries, keys and values on documents of up to {qk_points:,} tokens in "
            "all, for the Queries and keys page." if qk_points else "")
    st.caption(f"{planned:,} of the corpus's {facts['documents']:,} documents, at most {max_tokens} tokens each, "
               f"with {bundle.name}.{kept} The scan runs in the background (at most {jobs.job_limit()} at once on "
               f"this server, the rest wait their turn) and reserves up to {human_bytes(reserved)} of disk: leave "
               "the page or reload, it goes on; the same corpus, model and limits reopen the same scan.")


@st.fragment(run_every=1.0)
def running_scan(folder: background.ScanFolder) -> None:
    """The running scan's progress (or its place in the server's queue), refreshed every second; the whole page
    reruns when it ends."""
    job = folder.job()
    if job is None:
        st.session_state["corpus_chosen"] = st.session_state.get("corpus_running") or st.session_state.get(
            "corpus_chosen")
        st.session_state.pop("corpus_running", None)
        st.rerun(scope="app")
    st.session_state["corpus_running"] = str(folder.database(job.key))
    if job.waiting:
        waiting_for_turn(folder, job, "corpus_cancel")
        return
    share, text = corpus_page.scan_progress(folder.progress(job.key) or {}, time.time() - job.started)
    st.progress(share, text=text)
    if st.button("Stop", key="corpus_stop", icon=":material/stop:",
                 help="stops after the current chunk; what was scanned is kept, and Scan resumes it"):
        folder.stop(job.key)
        st.toast("Stopping after the current chunk…")


def failed_scan_note(folder: background.ScanFolder) -> None:
    chosen = st.session_state.get("corpus_chosen")
    if not chosen:
        return
    key = Path(chosen).stem
    said = folder.progress(key)
    if said and said.get("status") == "failed":
        st.error(f"The scan failed: {said.get('error')}", icon=":material/error:")
    elif not Path(chosen).is_file() and folder.job() is None:
        tail = folder.log_tail(key)
        if tail:
            st.error(f"The scan ended without results:\n\n```\n{tail}\n```", icon=":material/error:")
