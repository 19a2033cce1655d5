"""Does this head matter? Remove heads one at a time (zero, or mean), differentiate a gate on each, and patch heads
from a clean input into a corrupted one: cause beside pattern, on any checkpoint whose attention attnviz records."""

import time
from pathlib import Path

import streamlit as st
import torch

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core import circuits
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.core.units import human_bytes, ordinal
from attnviz.corpus import background
from attnviz.corpus import jobs as background_jobs
from attnviz.corpus.documents import CorpusRefused
from attnviz.corpus.importance.runner import METHODS, SCAN_PREFIX, ImportanceSettings
from attnviz.corpus.importance.store import estimated_run_bytes
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.scan.runner import ScanRefused, text_as_read
from attnviz.interventions import importance as imp
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import patching as patch
from attnviz.interventions.edits import editable
from attnviz.models.loading import BUNDLED_GPT_NAME, architecture_of_folder
from attnviz.models.with_heads import declares_masked_lm_head
from attnviz.pagelogic import importance_words as words
from attnviz.pagelogic.explore_heads.statistics import statistics_table
from attnviz.ui.caches.importance import (
    BUNDLED_SPEC,
    WITH_LOSS,
    cached_circuit,
    cached_token_effect,
    corpus_texts,
    editable_model,
    heads_measured,
    importance_jobs,
    keep_form,
    patching,
    run_documents,
    run_facts,
    run_results,
    scan_top_labels,
    study,
)
from attnviz.ui.captures import cached_capture
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import page_intro, start_page
from attnviz.ui.loaded_models import load_bundle
from attnviz.ui.messages import problem_text
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.scans import listed_scans, scan_title, session_id, waiting_for_turn
from attnviz.ui.session_models import current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import importance as figures
from attnviz.viz.style import format_number

VIEWS = ("Induction circuit", "Importance map", "Activation patching")
TEXT_SOURCES = ("Typed", "The bundled corpus", "A corpus, in the background")
BUNDLED_CORPUS = "The bundled corpus (Python's documentation and docstrings)"
MAX_BOX_CHARS = 100_000  # what the box holds: 64 texts of 256 tokens need far less
MEASURES = {"next-token": "loss change (nats)", "seq2seq": "loss change (nats)", "masked": "loss change (nats)",
            "hidden": "hidden-state change"}
METHOD_TITLES = {"zero": "Zero ablation", "mean": "Mean ablation", "gradient": "Gradient importance"}

start_page("Does this head matter?")
switch_if_asked()
keep_form()  # the views' forms keep their values while another view is shown
page_intro(
    "Attention weights say where a head looks, not whether the model needs it. Here heads are removed one at a "
    "time (their output zeroed, or replaced by its mean) and the loss measured again; gradient importance "
    "(Michel et al., 2019) asks the same of a gate on each head with one backward pass; activation patching puts a "
    "head's output from a clean input into a corrupted one and measures how much of the answer comes back. Every "
    "edit acts on the head's output before the output projection mixes the heads, through the attention function "
    "attnviz records with."
)


def choose_model(column) -> tuple[str, str]:
    """The model this page edits: the sidebar's when it has a loss (a decoder, an encoder-decoder, or an encoder
    saved with its masked-LM head), else the bundled tiny GPT (whose circuit the first view shows); any loaded model
    can be chosen."""
    models = registered_models()
    sidebar = current_model_name()
    names = list(models)
    has_loss = architecture_of_folder(models[sidebar]) in WITH_LOSS or declares_masked_lm_head(models[sidebar])
    default = sidebar if has_loss else (BUNDLED_GPT_NAME if BUNDLED_GPT_NAME in models else sidebar)
    name = column.selectbox("Model", names, index=names.index(default), key="imp_model",
                        format_func=lambda n: f"{n} ({architecture_of_folder(models[n]) or 'model'})",
                        help="A decoder or an encoder-decoder is measured by its own loss (its language-model head "
                             "is loaded), an encoder saved with its masked-LM head by its masked-LM loss; an encoder "
                             "without one by the change of its final hidden states.")
    return name, models[name]


def progress_bar(label: str):
    bar = st.progress(0.0, text=label)
    return bar, (lambda share, what: bar.progress(min(1.0, share), text=f"{label} {what}"))


def texts_of(box: str) -> list[str]:
    return [line.strip() for line in box.splitlines() if line.strip()]


def importance_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    source = st.segmented_control("Texts", TEXT_SOURCES, default=TEXT_SOURCES[0], key="imp_source", required=True,
                                  help="A corpus in the background: thousands of documents, measured in a process "
                                       "of its own into a DuckDB file; leave the page, it goes on.")
    if source == TEXT_SOURCES[2]:
        corpus_run_view(folder, name, tokenizer, objective)
        return
    if source == TEXT_SOURCES[0]:
        box = st.text_area(
            "Texts, one per line", current_sentence(), key="imp_texts", height=110, max_chars=MAX_BOX_CHARS,
            help=f"At most {imp.MAX_TEXTS} texts, each read up to {imp.MAX_TOKENS} tokens. A map runs the model "
                 "once per head over all of them (batched), twice (zero and mean ablation), plus one backward pass.")
        texts = texts_of(box)
    else:
        count = st.slider("Documents", 4, imp.MAX_TEXTS, 16, 4, key="imp_documents",
                          help="The first documents of the bundled corpus (Python's documentation and docstrings, "
                               "the Heads across a corpus page's default), each read up to "
                               f"{imp.MAX_TOKENS} tokens.")
        texts = corpus_texts(count)
        st.caption(f"{len(texts)} documents, from “{texts[0][:60]}…” to “{texts[-1][:60]}…”")
    key = (folder, name, tuple(texts))
    kept, note = heads_measured(key), st.empty()
    pressed = st.button("Measure every head", type="primary", key="imp_run", icon=":material/play_arrow:")
    if kept and not pressed and st.session_state.get("imp_done", {}).get("key") != key:
        note.info(f"Stopped after {kept:,} head ablations: **Measure every head** goes on from there.",
                  icon=":material/pause:")
    if pressed:
        if not texts:
            st.warning("Type a text first (one per line for several).", icon=":material/edit:")
            return
        stop = st.empty()  # shown while the heads are measured, gone once they are
        stop.button("Stop", key="imp_stop", icon=":material/stop:",
                    help="Stops after the head being measured; what is measured is kept, and Measure every head "
                         "goes on from there.")
        bar, progress = progress_bar("Ablating heads:")
        started = time.perf_counter()
        try:
            study(key, model, tokenizer, texts, progress)
        except ValueError as problem:
            bar.empty()
            stop.empty()
            st.error(problem_text(problem), icon=":material/block:")
            return
        bar.empty()
        stop.empty()
        st.session_state["imp_done"] = {"key": key, "seconds": time.perf_counter() - started}
    done = st.session_state.get("imp_done")
    if not done or done["key"] != key:
        if not kept:
            st.info("Press **Measure every head**: each head is removed in turn and the model run again on the "
                    "texts.", icon=":material/info:")
        return
    result = study(key, model, tokenizer, texts, compute=False)
    if result is None:  # pushed out of the store by other sessions' maps since: measure again
        st.session_state.pop("imp_done", None)
        st.rerun()
    heads = result.modules
    labels = [module.label for module in heads]
    tokens = int(result.batch.real[: len(result.batch.texts)].sum())  # a text's copies are one text
    cut = sum(result.batch.cut)
    columns = st.columns(4)
    predicting = sum(len(text_tokens) > 1 for text_tokens in result.batch.tokens) if objective == "next-token" else \
        len(result.batch.texts)  # a one-token text has no next token: it adds nothing to the loss or the maps
    columns[0].metric("Texts", f"{predicting:,}" if predicting == len(result.batch.texts) else
                      f"{predicting:,} of {len(result.batch.texts):,}",
                      help=f"{tokens:,} tokens read in all" + ("" if predicting == len(result.batch.texts) else
                                                               "; a text of one token has no next token to predict"))
    columns[1].metric("Heads", f"{sum(m.heads for m in heads):,}", help=f"{len(heads)} attention modules")
    if objective != "hidden":
        columns[2].metric("Loss without edits", f"{format_number(result.maps['zero'].clean)} nats",
                          help=imp.OBJECTIVES[objective])
    columns[3].metric("Measured in", f"{done['seconds']:.1f} s")
    if cut:
        st.caption(f":material/content_cut: {cut} text(s) longer than {imp.MAX_TOKENS} tokens were read up to "
                   f"{imp.MAX_TOKENS}.")
    st.caption(f":material/start: {words.reading_words(tokenizer, objective)}")
    if objective == "masked":
        st.caption(f":material/content_copy: Each text is read in {result.batch.copies} copies, a different one "
                   f"in {imp.MASK_EVERY} of its ordinary tokens masked in each: every ordinary token is predicted "
                   "once, whatever the texts measured with it.")
    if objective == "hidden":
        st.info("This model has no head that gives a loss (an encoder without its language-model head): each "
                "ablation is measured by how far each token's final hidden state moves, over the mean size of its "
                "own text's unedited final states. Gradient importance needs a loss and is left out.",
                icon=":material/info:")
    show_maps(result.maps, labels, objective, "imp_map")
    if len(result.maps) > 1:
        agreement_tables(result.maps)
    heads_beside_labels(folder, name, result)
    token_effect_view(key, model, result)


def show_maps(maps: dict[str, imp.ImportanceMap], labels: list[str], objective: str, key: str,
              over: str = "texts") -> None:
    """One heatmap per measure, side by side."""
    for column, (method, one_map) in zip(st.columns(len(maps)), maps.items(), strict=True):
        with column:
            signed = method != "gradient" and objective != "hidden"  # a distance, like a gradient's size, is >= 0
            figure = figures.importance_heatmap(
                one_map.values, labels, title=METHOD_TITLES[method],
                measure="|dL/dg|" if method == "gradient" else MEASURES[objective], signed=signed,
                width=1000 // len(maps))
            caption = (f"How fast the loss moves as the head's gate leaves 1 (averaged over {over})."
                       if method == "gradient" else "How far the final states move without the head."
                       if objective == "hidden" else "Red: the loss rises without the head (it helps); blue: it falls.")
            show_figure(figure, caption, key=f"{key}_{method}")


def corpus_run_view(folder: str, name: str, tokenizer, objective: str) -> None:
    """A map over a whole corpus, measured in the background into DuckDB (attnviz.corpus.importance)."""
    jobs = importance_jobs()
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
        return
    spec = BUNDLED_SPEC if chosen == BUNDLED_CORPUS else f"{SCAN_PREFIX}{chosen}"
    settings = ImportanceSettings(max_docs=max_docs, max_tokens=max_tokens,
                                  methods=tuple(m for m in METHODS if m in methods))
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
    said = jobs.progress(job.key) or {}
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    if not said:
        text = f"Starting (loading the model, reading the corpus): {time.time() - job.started:.0f} s"
    elif said.get("phase") == "means":
        text = "First pass: each head's mean output over the corpus (for mean ablation)…"
    else:
        rate, eta = said.get("documents_per_second") or 0.0, said.get("eta")
        left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
        text = f"Removing each head: {done:,} of {planned:,} documents · {rate:.2f} documents/s{left}"
    st.progress(min(1.0, done / planned), text=text)
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
    maps = {method: imp.ImportanceMap(method, torch.tensor(mean), modules, objective, results["clean"])
            for method, (mean, _, _) in results["maps"].items()}
    labels = [module.label for module in modules]
    show_maps(maps, labels, objective, "imp_corpus_map", over="documents")
    if len(maps) > 1:
        agreement_tables(maps)
    cells = {f"{module.label}, head {head}": (row, head)
             for row, module in enumerate(modules) for head in range(module.heads)}
    labels_of_scan, note = scan_labels_for(said)
    rows = imp.head_rows(imp.Study(None, objective, modules, maps))
    for entry in rows:
        row, head = cells[entry["head"]]
        for method in maps:
            entry[f"spread ({method})"] = float(results["maps"][method][1][row, head])
        entry.pop("label", None)
        if labels_of_scan is not None:
            found = labels_of_scan.get((modules[row].index, head)) if modules[row].kind in ("self", "encoder") else None
            entry["label over the scan"] = f"{found[0]} ({found[1]:.0%} of documents)" if found else ""
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


SHOWN_STATISTICS = ("previous token", "first token", "self", "normalised entropy", "mean distance")


def heads_beside_labels(folder: str, name: str, result: imp.Study) -> None:
    """Every head's importance beside what it looks like: Explore heads' label and statistics of the head on the
    first text."""
    labels, statistics = {}, {}
    try:
        bundle = load_bundle(folder, name, model_dtype(name))
        capture = cached_capture(folder, name, result.batch.texts[0], None, bundle, max_tokens=imp.MAX_TOKENS,
                                 dtype=model_dtype(name))
        for kind, record in capture.records.items():
            if record.n_q == record.n_k:  # labels describe self-attention
                table = statistics_table(capture, kind)
                for _, found in table.iterrows():
                    cell = (kind, int(found["layer"]), int(found["head"]))
                    labels[cell] = found["label"]
                    statistics[cell] = {column: round(float(found[column]), 3) for column in SHOWN_STATISTICS}
    except (ValueError, RuntimeError) as problem:
        st.caption(f"Head labels are not available for this model: {problem_text(problem)}")
    with st.expander("Every head: what it looks like and what it costs", icon=":material/table:"):
        st.dataframe(imp.head_rows(result, labels, statistics), hide_index=True, width="stretch")
        st.caption("Label and statistics: where the head looks on the first text, as Explore heads measures it "
                   "(shares of attention weight; entropy over the keys, normalised to 0-1; distance in tokens). "
                   "Ranks: 1 is the most important by that measure. A head can look like a pattern and matter "
                   "little, and the other way round.")


def agreement_tables(maps: dict[str, imp.ImportanceMap]) -> None:
    left, right = st.columns([2, 3])
    with left:
        st.subheader("Do the measures agree?")
        rows = [{"first": METHOD_TITLES[a], "second": METHOD_TITLES[b], "Spearman's rho": round(rho, 3)}
                for a, b, rho in imp.agreement(maps)]
        st.dataframe(rows, hide_index=True, width="stretch")
        either = next(iter(maps.values())).objective != "hidden"  # a distance is never negative
        st.caption("Rank correlation over every head of the size of its effect"
                   + (", either way (removing a head can also lower the loss)" if either else "")
                   + ": 1, the same order of importance; 0, unrelated.")
    with right:
        names = list(maps)
        second = "gradient" if "gradient" in maps else names[-1]
        st.subheader(f"Where zero ablation and {METHOD_TITLES[second].lower()} disagree most")
        rows = imp.disagreements(maps["zero"], maps[second])
        names = {"zero": "rank by zero ablation", second: f"rank by {METHOD_TITLES[second].lower()}"}
        st.dataframe([{names.get(column, column): value for column, value in row.items()} for row in rows],
                     hide_index=True, width="stretch")
        st.caption("Ranks among every head (1: the largest effect by that measure"
                   + (", either way)." if either else ")."))


def token_effect_view(key: tuple, model, result: imp.Study) -> None:
    said = words.token_view(result.objective)
    st.subheader(said.heading)
    columns = st.columns([3, 2, 2, 4])
    labels = [module.label for module in result.modules]
    row = columns[0].selectbox("Layer", range(len(labels)), format_func=labels.__getitem__, key="imp_layer")
    head = columns[1].selectbox("Head", range(result.modules[row].heads), key="imp_head")
    how = columns[2].radio("Ablation", list(imp.ABLATIONS), key="imp_how", horizontal=True,
                           help="zero: the head's output set to 0; mean: to its mean over every token of the texts")
    text = 0
    if len(result.batch.texts) > 1:
        text = columns[3].selectbox("Text", range(len(result.batch.texts)), key="imp_text",
                                    format_func=lambda i: result.batch.texts[i][:60])
    targets, change = cached_token_effect(key, row, head, how, text, model, result)
    if not targets:
        st.info(said.empty, icon=":material/short_text:")
        return
    label = f"{labels[row]}, head {head}"
    tokens = result.batch.tokens[text]
    st.html(figures.token_effect_html(targets, change.tolist(),
                                      first=tokens[0] if result.objective == "next-token" else None))
    show_figure(figures.token_effect_chart(
        targets, change.tolist(), title=f"What {label} does for each token ({how} ablation)", measure=said.measure,
        axis=said.axis), said.caption, key="imp_tokens")
    st.markdown(words.token_summary(change, result.maps[how], row, head, text,
                                    "" if result.objective == "hidden" else "nats"))


PRESET = "Preset: induction, the token to copy changed"


def patching_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    if objective != "next-token":
        st.info("Activation patching here measures a decoder's next token: choose a decoder (the bundled tiny GPT "
                "has a preset).", icon=":material/info:")
        return
    source = st.segmented_control("Inputs", (PRESET, "My own prompts"), default=PRESET, key="imp_patch_source",
                                  required=True)
    bos = tokenizer.bos_token_id
    if source == PRESET:
        columns = st.columns(2)
        period = columns[0].slider("Tokens in the first copy", 8, 60, 30, key="imp_patch_period")
        seed = columns[1].number_input("Seed", 0, 10_000, 5, key="imp_patch_seed")
        prompts = patch.induction_prompts(circuits.ordinary_token_ids(tokenizer), period, seed=seed, bos=bos)
        stop = period // 2
        st.caption(f"Clean: {'the BOS token, then ' if prompts.bos else ''}{period} random tokens, then the first "
                   f"{stop} again; a model that copies continues with the {ordinal(stop + 1)} token of the first "
                   "copy (the answer). Corrupted: the same, with that token of the first copy changed (the foil): a "
                   "model that copies continues with the foil instead. Only that position differs.")
    else:
        columns = st.columns([4, 4, 2, 2])
        # names that are one token each in the bundled tiny GPT and in GPT-2 ("Mary" is two in the tiny GPT)
        clean_text = columns[0].text_input("Clean prompt", "When the boy and the girl went to the store, the girl "
                                           "gave a drink to the", key="imp_clean")
        corrupted_text = columns[1].text_input("Corrupted prompt (the same number of tokens)", "When the boy and the "
                                               "girl went to the store, the boy gave a drink to the",
                                               key="imp_corrupted")
        answer_text = columns[2].text_input("Answer (its first token)", " boy", key="imp_answer",
                                            help="what the clean prompt should lead to")
        foil_text = columns[3].text_input("Foil (its first token)", " girl", key="imp_foil",
                                          help="what the corrupted prompt leads to instead (the counterfactual "
                                               "answer); empty: the corrupted run's most likely other token")
        with_bos = bos is not None and st.checkbox(
            f"Put the BOS token `{tokenizer.bos_token}` first", True, key="imp_patch_bos",
            help="A decoder trained with a BOS token before every text reads a prompt without one as it never saw "
                 "in training")
        prompts = patch.own_prompts(tokenizer, clean_text, corrupted_text, answer_text, foil_text, with_bos)
        if isinstance(prompts, str):
            st.warning(prompts, icon=":material/edit:")
            return
    st.code(patch.prompt_lines(tokenizer, prompts), language=None)
    key = (folder, name, tuple(prompts.clean), tuple(prompts.corrupted), prompts.answer, prompts.foil)
    if st.button("Patch every head and position", type="primary", key="imp_patch_run", icon=":material/play_arrow:"):
        bar, progress = progress_bar("Patching:")
        patching(key, model, tokenizer, prompts, progress)
        bar.empty()
        st.session_state["imp_patched"] = key
    if st.session_state.get("imp_patched") != key:
        st.info("Press **Patch every head and position**: each head's output, then the residual stream at each "
                "layer and position, on the clean prompt is put into the corrupted run.", icon=":material/info:")
        return
    found = patching(key, model, tokenizer, prompts, compute=False)
    if found is None:
        st.session_state.pop("imp_patched", None)
        st.rerun()
    patched_views(found, prompts, tokenizer)


def patched_views(found: tuple, prompts: patch.Prompts, tokenizer) -> None:
    result, positions = found
    columns = st.columns(3)
    columns[0].metric("Logit difference, clean", format_number(result.clean),
                      help="logit(answer) - logit(foil) at the last position")
    columns[1].metric("Logit difference, corrupted", format_number(result.corrupted))
    columns[2].metric("Answer / foil", f"{result.answer!r} / {result.foil!r}",
                      help="The foil: " + ("as given" if prompts.foil is not None else
                                           "the corrupted run's most likely token other than the answer"))
    st.caption(f":material/start: Both prompts {patch.start_words(tokenizer, prompts.clean, several=True)}; each logit "
               "difference is read at the last position.")
    problems = patch.problems(result.clean, result.corrupted, result.answer, result.foil)
    for level, said in problems:
        (st.error if level == "error" else st.warning)(said, icon=":material/warning:")
    if any(level == "error" for level, _ in problems):
        return
    figure = figures.importance_heatmap(
        result.heads, [module.label for module in result.modules], title="Share of the answer restored by patching",
        measure="restored share", extra_column=result.layers.tolist(), extra_label="all heads",
        value_range=(-1.0, 1.0))
    show_figure(figure, "1: patching the head's output at every position (or, in the last column, every head of "
                        "the layer) restores the clean prompt's logit difference; 0: nothing.", key="imp_patching")
    if isinstance(positions, str):
        st.info(f"Patching by position: {positions}.", icon=":material/info:")
        return
    style = tokenizer_style(tokenizer)
    show_figure(figures.position_patching_heatmap(
        positions.shares, positions.rows, readable_tokens(tokenizer.convert_ids_to_tokens(prompts.clean), style),
        readable_tokens(tokenizer.convert_ids_to_tokens(prompts.corrupted), style),
        title="Share of the answer restored by patching the residual stream at one layer and position"),
        "Each cell: the clean run's residual stream at that position, entering that layer (or leaving the last), "
        "put into the corrupted run; 1: the clean logit difference comes back, 0: nothing. ▶ marks where the "
        "prompts differ.", key="imp_positions")


def circuit_view(folder: str, name: str, model, tokenizer, objective: str) -> None:
    if objective != "next-token":
        st.info("The induction circuit lives in decoders: choose one (the bundled tiny GPT shows it in two layers).",
                icon=":material/info:")
        return
    columns = st.columns([2, 2, 5])
    period = columns[0].slider("Random tokens, typed twice", 10, 100, 50, 10, key="imp_circuit_period")
    seed = columns[1].number_input("Seed", 0, 10_000, 11, key="imp_circuit_seed")
    pool = circuits.ordinary_token_ids(tokenizer)
    result, scores, composed = cached_circuit(folder, name, period, seed, tokenizer.bos_token_id, model, pool)
    labels = [f"L{module.index} H{head}" for module in result.modules for head in range(module.heads)]
    first = [float(v) for row in result.first for v in row if v == v]
    second = [float(v) for row in result.second for v in row if v == v]
    induction = scores["induction"].flatten().tolist()
    previous = scores["previous"].flatten().tolist()
    show_figure(figures.circuit_chart(labels, first, second, result.clean_first, result.clean_second,
                                      title="The loss on each copy with one head removed"),
                "A head whose removal lifts only the red bar is needed for copying; dashed: no head removed.",
                key="imp_circuit")
    bos = None if tokenizer.bos_token_id is None else tokenizer.bos_token
    st.markdown(ind.story(result, scores, period, composed=composed, bos=bos))  # the figure in words, under it
    rows = [{"head": label, "previous": round(p, 3), "induction": round(i, 3),
             "copy 1 ×": round(f / result.clean_first, 3), "copy 2 ×": round(s / result.clean_second, 2)}
            for label, p, i, f, s in zip(labels, previous, induction, first, second, strict=True)]
    helps = {"previous": "previous-token score", "induction": "induction score",
             "copy 1 ×": "loss on the first copy with the head removed, divided by the clean loss",
             "copy 2 ×": "loss on the second copy with the head removed, divided by the clean loss"}
    if composed is not None:  # where each head looks with the previous-token head that may feed them zeroed
        feeder = labels[ind.feeder(result, scores)]
        column = f"induction, {feeder} off"
        helps[column] = f"induction score with {feeder} (the previous-token head that may feed it) zeroed"
        for row, value in zip(rows, composed.flatten().tolist(), strict=True):
            row[column] = round(value, 3)
    st.dataframe(rows, hide_index=True, width="stretch",
                 column_config={name: st.column_config.NumberColumn(name, help=text) for name, text in helps.items()})
    st.caption("Pattern beside cause: where each head looks (its attention scores, Olsson et al. 2022) and what "
               "its removal costs. A head can attend like an induction head and matter less than another.")


model_column, view_column = st.columns([3, 4])  # one row: the figure of the view sits on a projector's first screen
name, folder = choose_model(model_column)
try:
    model, tokenizer, head_note = editable_model(folder, name, model_dtype(name))
except Exception as problem:  # noqa: BLE001 - a checkpoint that cannot load with its head: said, not raised
    st.error(f"**{name}** could not be loaded for editing: {problem_text(problem)}", icon=":material/block:")
    st.stop()
reason = editable(model)
if reason:
    st.warning(f"**{name}** cannot be edited here: {reason}.", icon=":material/block:")
    st.stop()
objective = imp.objective_of(model)
st.caption(f"Measured by the {imp.OBJECTIVES[objective]}.{' ' + head_note if head_note else ''}")
view = view_column.segmented_control("View", VIEWS, default=VIEWS[0], key="imp_view", required=True)
{"Induction circuit": circuit_view, "Importance map": importance_view,
 "Activation patching": patching_view}[view](folder, name, model, tokenizer, objective)
