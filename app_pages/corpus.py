"""Heads across a corpus: scan a model over many documents and see what each head does in general."""

import functools
import time
from pathlib import Path

import numpy as np
import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core.units import counted, human_bytes
from attnviz.corpus import background, database, jobs
from attnviz.corpus.documents import FORMATS, CorpusRefused, characters_noted, max_corpus_bytes
from attnviz.corpus.jobs import JobRefused
from attnviz.corpus.scan import qk_sample, store
from attnviz.corpus.scan.heads import CRITERIA, HISTOGRAM_BINS, LABELS
from attnviz.corpus.scan.runner import ScanSettings, text_as_read, token_limit
from attnviz.pagelogic.clicks import clicked_layer_head
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, page_intro, setup_area, start_page
from attnviz.ui.messages import problem_text
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.scans import (
    corpus_columns,
    corpus_facts,
    existing_scan,
    key_for,
    prepare_export,
    results_kind,
    scan_folder,
    scan_named,
    scan_read,
    session_id,
    waiting_for_turn,
)
from attnviz.ui.session_models import current_bundle, model_dtype
from attnviz.viz import corpus as figures

CUSTOM_OFFSETS = "custom offsets"
STATISTIC_NAMES = {
    "previous": "weight on the previous token", "next": "weight on the next token", "self": "weight on itself",
    "first": "weight on the first token", "separator": "weight on separators ([SEP], </s>, <|endoftext|>)",
    "special": "weight on special tokens ([UNK] not counted)", "punctuation": "weight on punctuation",
    "duplicate": "duplicate token: weight on earlier copies of the query's token",
    "induction": "induction: weight on the token after an earlier copy of the query's token",
    "max_weight": "largest weight of a query", "normalised_entropy": "normalised entropy (1 = uniform)",
    "entropy": "entropy (nats)", "mean_distance": "mean distance (tokens)",
    **{label: f"documents labelled '{label}'" for label in LABELS},
    CUSTOM_OFFSETS: "custom pattern: weight at chosen relative positions",
}
REPEAT_NOTE = ("Averaged over the queries whose token occurred earlier in the document (TransformerLens's "
               "detect_head divides by every query, so its scores are smaller by the share of such queries).")
VIEWS = ("Map", "Head", "Search", "Compare", "Export")
BUNDLED_CHOICE, UPLOAD_CHOICE = "Bundled: Python's documentation and docstrings", "Upload a file"
EXAMPLES_SHOWN = 6

start_page("Heads across a corpus")
switch_if_asked()
page_intro(
    "What does a head do in general? Scan the sidebar's model over many documents: every head's statistics with "
    "their spread, how often each label holds, where its weight goes by relative position, the token pairs it "
    "links and the examples where it does its thing most strongly. Results are kept in a DuckDB file per scan "
    "(searchable, exportable to Parquet); the same scan runs from the command line and on Ray "
    "(`python -m attnviz.corpus.scan`)."
)
folder = scan_folder()


# ---------------------------------------------------------------------------------------------------------------
# Starting a scan


def chosen_corpus() -> tuple[str | None, str, str | None] | None:
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
            names = corpus_columns(str(path), _stamp(str(path)))
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



def scan_controls(bundle) -> None:
    area = (st.expander("Scan a corpus", icon=":material/play_arrow:", expanded=False) if readable_scans()
            else setup_area("Scan a corpus"))  # once there are scans, their results come first
    with area:
        corpus = chosen_corpus()
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
        if corpus is None:
            st.caption(f"Choose a file: the scan reads its first {max_docs:,} documents, at most {max_tokens} tokens "
                       f"each, and keeps the queries and keys of up to {qk_points:,} tokens a head.")
            return
        path, split, field = corpus
        try:
            facts = corpus_facts(path, _stamp(path), split, field)
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
        planned = min(max_docs, facts["documents"])
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
        reserved = store.estimated_scan_bytes(planned, max_tokens, bundle.n_layers, bundle.n_heads, characters,
                                              qk_points, bundle.d_model // max(bundle.n_heads, 1))
        if st.button(label, type="primary", key="corpus_scan", disabled=job is not None,
                     icon=":material/play_arrow:"):
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


def _stamp(path: str | None) -> float:
    return 0.0 if path is None else Path(path).stat().st_mtime


@st.fragment(run_every=1.0)
def running_scan() -> None:
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
    said = folder.progress(job.key) or {}
    done, planned = int(said.get("done", 0)), int(said.get("planned", 0) or 1)
    rate, eta = said.get("documents_per_second") or 0.0, said.get("eta")
    left = "" if eta is None else f" · about {int(eta) // 60} min {int(eta) % 60:02d} s left"
    started = time.time() - job.started
    sampled, sample_planned = int(said.get("sampled", 0)), int(said.get("sample_planned", 0))
    if sample_planned:  # every document read: the queries and keys of the sample are being kept
        st.progress(min(1.0, sampled / sample_planned),
                    text=f"Keeping the queries, keys and values of {sample_planned:,} sampled documents for the "
                         f"Queries and keys page: {sampled:,} done")
    else:
        st.progress(min(1.0, done / planned),
                    text=f"Scanning: {done:,} of {planned:,} documents · {rate:.1f} documents/s · "
                         f"{said.get('tokens_per_second', 0):,.0f} tokens/s{left}"
                    if said else f"Starting the scan (loading the model, reading the corpus): {started:.0f} s")
    if st.button("Stop", key="corpus_stop", icon=":material/stop:",
                 help="stops after the current chunk; what was scanned is kept, and Scan resumes it"):
        folder.stop(job.key)
        st.toast("Stopping after the current chunk…")


def failed_scan_note() -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# Reading a scan


def scan_label(path: Path) -> str:
    """A scan in the page's list: model, corpus, documents and the token limit (two scans of one model differ there)."""
    return scan_named(path, lambda said: f"{said.get('model')} · {said.get('corpus')} · "
                                         f"{said.get('documents_scanned', 0):,} documents · ≤ {said.get('max_tokens')} "
                                         "tokens")


def readable_scans() -> list[Path]:
    job = folder.job()
    running = None if job is None else folder.database(job.key)
    # a corpus importance run kept beside the scans is not one; a foreign or damaged file is listed, to say so
    return [path for path in [*folder.scans(), *background.server_scans()]
            if path != running and results_kind(path) != "importance"]


def choose_scan(scans: list[Path], key: str, label: str, exclude: Path | None = None) -> Path | None:
    """A scan to show. The main choice follows a scan just opened, started or finished (``corpus_chosen``) once
    it can be read, and otherwise keeps what the reader chose."""
    choices = [path for path in scans if path != exclude]
    if not choices:
        return None
    state = st.session_state
    if state.get(key) not in choices:
        state.pop(key, None)
    if key == "corpus_scan_choice":
        wanted = state.get("corpus_chosen")
        match = next((path for path in choices if str(path) == wanted), None)
        if match is not None and state.get("corpus_chosen_shown") != wanted:
            state[key], state["corpus_chosen_shown"] = match, wanted
    return st.selectbox(label, choices, format_func=scan_label, key=key)


def map_view(path: Path, said: dict) -> None:
    columns = st.columns([3, 2])
    applying = [*scan_read(path, "statistics_that_apply"), CUSTOM_OFFSETS]
    default = "induction" if "induction" in applying else "previous"
    statistic = columns[0].selectbox("Statistic", applying, index=applying.index(default),
                                     format_func=STATISTIC_NAMES.get, key="corpus_statistic",
                                     help="Only what some head of this scan has: no next token under a causal mask, "
                                          "no separators where the documents hold none, no induction where no token "
                                          "repeats.")
    over = columns[1].radio("Mean and spread over", ("queries", "documents"), horizontal=True, key="corpus_over",
                            disabled=statistic in LABELS or statistic == CUSTOM_OFFSETS,
                            help="queries: every query of every document; documents: each document's mean")
    if statistic == CUSTOM_OFFSETS:
        offsets = custom_offsets()
        if not offsets:
            return
        mean, spread = scan_read(path, "offsets_map", offsets), None
        what = f"weight at key − query = {', '.join(f'{o:+d}' for o in offsets)}"
        note = (" Averaged over the queries that have a key at one of these offsets (exact, from the offset "
                "profile); a later key gets weight 0 under a causal mask.")
    else:
        mean, spread = scan_read(path, "statistic_map", statistic, over)
        what = STATISTIC_NAMES[statistic]
        note = f" {REPEAT_NOTE}" if statistic in ("duplicate", "induction") else ""
    title = f"{what}, every head, over {said['documents_scanned']:,} documents"
    figure = figures.statistic_map(mean, spread, statistic=statistic, title=title,
                                   highlight=(st.session_state.get("corpus_layer", 0),
                                              st.session_state.get("corpus_head", 0)))
    if np.isfinite(mean).any():
        best = np.unravel_index(np.nanargmax(mean), mean.shape)
        said_best = f"Highest: layer {best[0]}, head {best[1]} ({mean[best]:.3g})."
    else:
        said_best = "No head has this statistic in this scan."
    show_figure(figure, f"{said_best}{note} The hover gives each head's spread; click a head to open it.",
                key="corpus_map", on_select=functools.partial(open_clicked_head, said["n_layers"], said["n_heads"]))


def custom_offsets() -> list[int]:
    """The relative positions a custom detector looks at, typed as "-2" or "-3, -2" (±32 at most); [] with a
    message when the text says none."""
    typed = st.text_input("Offsets (key − query)", "-2", key="corpus_offsets_typed", max_chars=200,
                          help="Comma-separated, from −32 to 32: −1 is the previous token, 0 the query itself, −2 two "
                               "tokens back. A head's score is its weight on those keys.")
    try:
        offsets = sorted({int(part) for part in typed.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        st.warning("Type whole numbers separated by commas, such as -3, -2.", icon=":material/edit:")
        return []
    outside = [o for o in offsets if abs(o) > 32]
    if outside or not offsets:
        st.warning("Offsets go from −32 to 32 (the scan keeps the weight at each offset within that range)."
                   if outside else "Type at least one offset.", icon=":material/edit:")
        return []
    return offsets


def open_clicked_head(n_layers: int, n_heads: int) -> None:
    head = clicked_layer_head(st.session_state.get("corpus_map"), n_layers, n_heads)
    if head is not None:
        st.session_state["corpus_layer"], st.session_state["corpus_head"] = head
        st.session_state["corpus_view"] = "Head"


def head_view(path: Path, said: dict) -> None:
    for key, most in (("corpus_layer", said["n_layers"] - 1), ("corpus_head", said["n_heads"] - 1)):
        if st.session_state.get(key, 0) > most:  # a head of another scan's model
            st.session_state[key] = most
    columns = st.columns(3)
    layer = int(columns[0].number_input("Layer", 0, said["n_layers"] - 1, 0, key="corpus_layer"))
    head = int(columns[1].number_input("Head", 0, said["n_heads"] - 1, 0, key="corpus_head"))
    labels = scan_read(path, "label_shares", layer, head)
    top = labels.iloc[0]
    columns[2].metric(f"Its label on {top['share']:.0%} of the documents", top["label"],
                      help="each document's label, by Explore heads' rules on that document's means")
    left, right = figure_columns(2, key="corpus_head", min_width=400)
    with left:
        profile = scan_read(path, "offset_profile", layer, head)
        show_figure(figures.offset_profile(profile["offset"].tolist(), profile["weight"].tolist(),
                                           title=f"Layer {layer}, head {head}: mean weight by relative position"),
                    "Where its weight goes, counted from the query (0 is the query itself): a previous-token head "
                    "is one bar at −1. Keys further than ±32 away are not drawn.", key="corpus_offsets")
    with right:
        histogram = scan_read(path, "histogram", layer, head)
        show_figure(figures.largest_weight_histogram(HISTOGRAM_BINS, histogram["queries"].tolist(),
                                                     title=f"Layer {layer}, head {head}: how sharp its queries are"),
                    "Each query's largest weight: a sharp head piles up at the right, a broad one at the left.",
                    key="corpus_histogram")
    summary = scan_read(path, "head_summary", layer, head)
    summary["statistic"] = summary["statistic"].map(STATISTIC_NAMES)
    left, right = st.columns([3, 2])
    rows_high = max(len(summary), len(labels)) * 35 + 38  # every row shown, no scrollbar
    left.dataframe(summary.round(4), hide_index=True, width="stretch", height=rows_high)
    right.dataframe(labels.round(3), hide_index=True, width="stretch", height=rows_high)
    left, right = st.columns(2)
    left.markdown("**Token pairs it links most** (the weight each query gives its 3 strongest keys)")
    left.dataframe(scan_read(path, "token_pairs", layer, head, 15).round(4), hide_index=True, width="stretch")
    by = right.radio("**Key tokens that attract most**", ("weight", "per occurrence"), horizontal=True,
                     key="corpus_keys_by", help="per occurrence: among tokens seen 5 times or more")
    right.dataframe(scan_read(path, "key_tokens", layer, head, 15, by=by).round(4), hide_index=True,
                    width="stretch")
    examples_section(path, said, layer, head)


def examples_section(path: Path, said: dict, layer: int, head: int) -> None:
    criteria = scan_read(path, "criteria_with_examples", layer, head)
    if not criteria:
        st.info("No document gives this head a positive score by any criterion.", icon=":material/info:")
        return
    if st.session_state.get("corpus_criterion") not in criteria:
        st.session_state.pop("corpus_criterion", None)
    criterion = st.selectbox("Top examples by", criteria, format_func=CRITERIA.get, key="corpus_criterion",
                             help="The criteria by which this head has an example in this scan.")
    examples = scan_read(path, "examples", layer, head, criterion)
    pointed = ("the key the criterion points at" if criterion not in ("focused", "far")
               else "the query's strongest key")
    st.caption(f"Each token shaded by the weight the query (boxed) gives it; {pointed} is underlined. Hover a token "
               "for its weight; a far key is shown apart, after a gap. One example per document, and never a query "
               "with a single allowed key (it has no choice). Open in Explore heads reads the document as the scan "
               f"did (its first {said.get('max_tokens')} tokens at most).")
    for rank, example in enumerate(examples[:EXAMPLES_SHOWN]):
        text_column, button_column = st.columns([6, 1])
        query, key = example["query"], example["key"]
        cut_end = (f" · the key is the end token the tokenizer adds to a document cut at {example['n_tokens']} tokens"
                   if example["truncated"] and key == example["n_tokens"] - 1 else "")
        text_column.markdown(
            f"**{rank + 1}.** score {example['score']:.3f} · document {example['doc']} ({example['source']}) · "
            f"query {query} → key {key} (weight {example['weight']:.3f}){cut_end}")
        positions = example_positions(example)
        text_column.html(figures.example_html(list(example["window_tokens"]), list(example["window_weights"]),
                                              positions, query, key))
        button_column.button("Open in Explore heads", key=f"corpus_open_{rank}", on_click=open_in_explore,
                             args=(path, int(example["doc"]), layer, head, said), icon=":material/search:")


def example_positions(example: dict) -> list[int]:
    """The document positions of an example's window (one run from its start where the scan kept no positions)."""
    kept = example.get("window_positions")
    if kept is not None and len(kept):
        return [int(p) for p in kept]
    return list(range(example["window_start"], example["window_start"] + len(example["window_tokens"])))


def open_in_explore(path: Path, doc: int, layer: int, head: int, said: dict) -> None:
    """Callback: the document as the scan read it (its first ``max_tokens`` tokens, cut by the scan's model's
    tokenizer when the sidebar holds that model) opens in Explore heads on the head, with the scan's model when
    this session has it."""
    document = scan_read(path, "document", doc)
    if document is None:
        return
    text = str(document["text"])
    sidebar = current_bundle()
    if document["truncated"] and str(sidebar.folder) == said.get("model_folder"):
        text = text_as_read(sidebar, text, int(said["max_tokens"]))
    ask_to_open(text, said.get("model"), layer, head)


def search_view(path: Path, said: dict) -> None:
    st.markdown("**Queries**: where a head's strongest key is a given token")
    with st.form("corpus_query_search"):
        columns = st.columns(5)
        query_word = columns[0].text_input("Query token", "the", key="corpus_q_word", max_chars=100)
        key_word = columns[1].text_input("Strongest key token (any if empty)", "", key="corpus_k_word", max_chars=100)
        layer = columns[2].selectbox("Layer", ["any", *range(said["n_layers"])], key="corpus_q_layer")
        head = columns[3].selectbox("Head", ["any", *range(said["n_heads"])], key="corpus_q_head")
        min_weight = columns[4].number_input("Weight at least", 0.0, 1.0, 0.5, 0.05, key="corpus_q_min")
        st.form_submit_button("Search", icon=":material/search:")
    found, sql = scan_read(path, "search_queries", query_word=query_word or None, key_word=key_word or None,
                           layer=None if layer == "any" else layer, head=None if head == "any" else head,
                           min_weight=min_weight)
    found.insert(0, "context", scan_read(path, "query_contexts",
                                         list(zip(found["doc"], found["query"], found["key"], strict=True))))
    causal = (" The first query of a decoder (which sees only itself) is left out."
              if scan_read(path, "is_causal") else "")
    st.caption(f"{counted(len(found), 'query', 'queries')}{' (the first 200)' if len(found) == 200 else ''}: in the "
               "context the query is in «», its strongest key in ⟨⟩. Words match any case, with or without the "
               f"tokenizer's space mark; a piece inside a word keeps its ## (\"##ing\").{causal} Select a row to open "
               "its document in Explore heads.")
    picked = st.dataframe(found, hide_index=True, width="stretch", height=260, key="corpus_found",
                          on_select="rerun", selection_mode="single-row",
                          column_config={"context": st.column_config.TextColumn("context", width="large")})
    rows = picked.selection.rows if picked is not None else []
    if rows and rows[0] < len(found):
        row = found.iloc[rows[0]]
        st.button(f"Open document {int(row['doc'])} in Explore heads, layer {int(row['layer'])}, head "
                  f"{int(row['head'])}", key="corpus_found_open", icon=":material/search:", on_click=open_in_explore,
                  args=(path, int(row["doc"]), int(row["layer"]), int(row["head"]), said))
    with st.expander("The SQL (its values written in: paste it into DuckDB on the scan's file)"):
        st.code(sql, language="sql")
    st.markdown("**Heads**: where a key token takes a share of all the weight")
    with st.form("corpus_head_search"):
        columns = st.columns(2)
        key_token = columns[0].text_input("Key token", "[SEP]" if said.get("model_type") == "bert" else ".",
                                          key="corpus_h_word", max_chars=100)
        share = columns[1].number_input("More than this share of the head's weight", 0.0, 1.0, 0.3, 0.05,
                                        key="corpus_h_share")
        st.form_submit_button("Find heads", icon=":material/search:")
    heads, sql = scan_read(path, "search_heads", key_token, share)
    st.caption(f"{counted(len(heads), 'head', 'heads')}.")
    st.dataframe(heads.round(4), hide_index=True, width="stretch", height=220)
    with st.expander("The SQL (its values written in)"):
        st.code(sql, language="sql")


def compare_view(path: Path, said: dict, scans: list[Path]) -> None:
    other = choose_scan(scans, "corpus_other", "Compare with", exclude=path)
    if other is None:
        st.info("Scan another model (or a fine-tuned checkpoint of this one) over the same corpus to compare them "
                "head by head.", icon=":material/compare:")
        return
    other_said = scan_read(other, "settings")
    if (other_said["n_layers"], other_said["n_heads"]) != (said["n_layers"], said["n_heads"]):
        st.warning(f"{other_said['model']} has {other_said['n_layers']} x {other_said['n_heads']} heads and "
                   f"{said['model']} {said['n_layers']} x {said['n_heads']}: head by head, they do not line up.",
                   icon=":material/warning:")
        return
    theirs_apply = set(scan_read(other, "statistics_that_apply"))
    both = [name for name in scan_read(path, "statistics_that_apply") if name in theirs_apply]
    statistic = st.selectbox("Statistic", both, index=both.index("previous") if "previous" in both else 0,
                             format_func=STATISTIC_NAMES.get, key="corpus_compare_statistic",
                             help="What some head of each scan has.")
    mine, _ = scan_read(path, "statistic_map", statistic, "queries")
    theirs, _ = scan_read(other, "statistic_map", statistic, "queries")
    difference = mine - theirs
    names = (said["model"], other_said["model"])
    if names[0] == names[1]:  # one model twice: the scans are told apart by their limits
        names = tuple(f"{s['model']} ({s['documents_scanned']:,} documents, ≤ {s['max_tokens']} tokens)"
                      for s in (said, other_said))
    figure = figures.difference_map(difference, statistic=statistic,
                                    title=f"{STATISTIC_NAMES[statistic]}:\n{names[0]}\nminus {names[1]}")
    if np.isfinite(difference).any():
        layer, head = np.unravel_index(np.nanargmax(np.abs(difference)), difference.shape)
        note = f"Largest change: layer {layer}, head {head} ({difference[layer, head]:+.3g})."
    else:
        note = "No head has this statistic in both scans."
    differences = [what for what, differs in (
        ("different corpora", other_said.get("corpus_fingerprint") != said.get("corpus_fingerprint")),
        (f"{said['documents_scanned']:,} and {other_said['documents_scanned']:,} documents",
         said["documents_scanned"] != other_said["documents_scanned"]),
        (f"at most {said.get('max_tokens')} and {other_said.get('max_tokens')} tokens a document",
         said.get("max_tokens") != other_said.get("max_tokens"))) if differs]
    if differences:
        st.warning(f"The two scans read {', '.join(differences)}: part of each difference may come from that, not "
                   "from the models.", icon=":material/warning:")
    show_figure(figure, note, key="corpus_compare_map")


def export_view(path: Path) -> None:
    table = st.selectbox("Table", store.EXPORTABLE, key="corpus_export_table")
    if st.button("Prepare the Parquet file", key="corpus_export"):
        try:
            with st.spinner(f"Writing {table} as Parquet…"):
                link, size = prepare_export(path, table)
            st.session_state["corpus_export_ready"] = (str(path), table, link, size)
        except (CheckpointRefused, database.DatabaseBusy, OSError) as problem:
            st.error(f"The export cannot be prepared: {problem_text(problem)}.", icon=":material/block:")
    ready = st.session_state.get("corpus_export_ready")
    if ready and ready[:2] == (str(path), table):
        st.link_button(f"Download {table}.parquet ({ready[3] / 1024:,.0f} KB)", ready[2], icon=":material/download:")
        st.caption("The file is streamed from the server's disk (never held in its memory) and offered for 30 "
                   "minutes.")
    st.caption(f"The whole scan is one DuckDB file: `{path.name}`. Its tables are described in the docs "
               "(docs/scans.md).")


def results() -> None:
    scans = readable_scans()
    if not scans:
        if folder.job() is None:
            st.info("No scan yet: choose a corpus and press Scan. The bundled corpus and 200 documents take about a "
                    "minute with the bundled BERT on two CPU cores.", icon=":material/dataset:")
        return
    path = choose_scan(scans, "corpus_scan_choice", "Scan")
    try:
        said = scan_read(path, "settings")
    except (database.DatabaseBusy, MemoryError) as problem:
        st.warning(f"{path.name} is busy ({problem_text(problem)}): try again in a moment.",
                   icon=":material/hourglass_top:")
        return
    except Exception as problem:  # noqa: BLE001 - a broken or foreign file in the scans folder
        st.error(f"{path.name} cannot be read as a scan: {database.without_paths(problem_text(problem))}.",
                 icon=":material/error:")
        return
    if said.get("status") != store.STATUS_FINISHED:
        st.caption(f":material/pause: This scan {said.get('status')} after {said['documents_scanned']:,} of "
                   f"{said.get('planned', 0):,} documents: what it scanned is shown; Scan with the same settings "
                   "resumes it.")
    for line in said.get("corpus_report") or []:
        st.caption(f":material/info: {line}")
    if not said["documents_scanned"]:
        st.info("This scan holds no document yet: it stopped before its first chunk was written. Scan with the same "
                "settings resumes it.", icon=":material/hourglass_empty:")
        return
    view = st.segmented_control("Show", VIEWS, default="Map", key="corpus_view", label_visibility="collapsed") or "Map"
    {"Map": lambda: map_view(path, said), "Head": lambda: head_view(path, said),
     "Search": lambda: search_view(path, said), "Compare": lambda: compare_view(path, said, scans),
     "Export": lambda: export_view(path)}[view]()


try:
    bundle = current_bundle()
    scan_controls(bundle)
except Exception as problem:  # noqa: BLE001 - the page stays usable for the scans already made
    st.error(f"Cannot start a scan: {problem_text(problem)}.", icon=":material/error:")
if folder.job() is not None:
    running_scan()
failed_scan_note()
results()
