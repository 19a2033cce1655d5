"""Heads across a corpus: scan a model over many documents and see what each head does in general."""

import functools
from pathlib import Path

import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.core.units import counted
from attnviz.corpus import background, database
from attnviz.corpus.scan import store
from attnviz.corpus.scan.heads import CRITERIA, HISTOGRAM_BINS, LABELS
from attnviz.corpus.scan.runner import text_as_read
from attnviz.pagelogic import corpus as corpus_page
from attnviz.pagelogic.clicks import clicked_layer_head
from attnviz.ui import scans
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, page_intro, start_page
from attnviz.ui.messages import problem_text
from attnviz.ui.open_in_explore import ask_to_open, switch_if_asked
from attnviz.ui.scan_start import failed_scan_note, running_scan, scan_controls
from attnviz.ui.session_models import current_bundle
from attnviz.viz import corpus as figures

CUSTOM_OFFSETS = "custom offsets"
STATISTIC_NAMES = {
    **corpus_page.STATISTIC_NAMES,
    **{label: f"documents labelled '{label}'" for label in LABELS},
    CUSTOM_OFFSETS: "custom pattern: weight at chosen relative positions",
}
REPEAT_NOTE = ("Averaged over the queries whose token occurred earlier in the document (TransformerLens's "
               "detect_head divides by every query, so its scores are smaller by the share of such queries).")
VIEWS = ("Map", "Head", "Search", "Compare", "Export")
EXAMPLES_SHOWN = 6


# ---------------------------------------------------------------------------------------------------------------
# Reading a scan (starting one: attnviz.ui.scan_start)


def scan_label(path: Path) -> str:
    """A scan in the page's list: model, corpus, documents and the token limit (two scans of one model differ there)."""
    return scans.scan_named(path, corpus_page.scan_label)


def choose_scan(listed: list[Path], key: str, label: str, exclude: Path | None = None) -> Path | None:
    """A scan to show. The main choice follows a scan just opened, started or finished (``corpus_chosen``) once
    it can be read, and otherwise keeps what the reader chose."""
    choices = [path for path in listed if path != exclude]
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
    applying = [*scans.statistics_that_apply(path), CUSTOM_OFFSETS]
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
        mean, spread = scans.offsets_map(path, offsets), None
        what = f"weight at key − query = {', '.join(f'{o:+d}' for o in offsets)}"
        note = (" Averaged over the queries that have a key at one of these offsets (exact, from the offset "
                "profile); a later key gets weight 0 under a causal mask.")
    else:
        mean, spread = scans.statistic_map(path, statistic, over)
        what = STATISTIC_NAMES[statistic]
        note = f" {REPEAT_NOTE}" if statistic in ("duplicate", "induction") else ""
    title = f"{what}, every head, over {said['documents_scanned']:,} documents"
    figure = figures.statistic_map(mean, spread, statistic=statistic, title=title,
                                   highlight=(st.session_state.get("corpus_layer", 0),
                                              st.session_state.get("corpus_head", 0)))
    said_best = corpus_page.highest_note(mean)
    show_figure(figure, f"{said_best}{note} The hover gives each head's spread; click a head to open it.",
                key="corpus_map", on_select=functools.partial(open_clicked_head, said["n_layers"], said["n_heads"]))


def custom_offsets() -> list[int]:
    """The relative positions a custom detector looks at, typed as "-2" or "-3, -2" (±32 at most); [] with a
    message when the text says none."""
    typed = st.text_input("Offsets (key − query)", "-2", key="corpus_offsets_typed", max_chars=200,
                          help="Comma-separated, from −32 to 32: −1 is the previous token, 0 the query itself, −2 two "
                               "tokens back. A head's score is its weight on those keys.")
    offsets, wrong = corpus_page.typed_offsets(typed)
    if wrong:
        st.warning(wrong, icon=":material/edit:")
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
    labels = scans.label_shares(path, layer, head)
    top = labels.iloc[0]
    columns[2].metric(f"Its label on {top['share']:.0%} of the documents", top["label"],
                      help="each document's label, by Explore heads' rules on that document's means")
    left, right = figure_columns(2, key="corpus_head", min_width=400)
    with left:
        profile = scans.offset_profile(path, layer, head)
        show_figure(figures.offset_profile(profile["offset"].tolist(), profile["weight"].tolist(),
                                           title=f"Layer {layer}, head {head}: mean weight by relative position"),
                    "Where its weight goes, counted from the query (0 is the query itself): a previous-token head "
                    "is one bar at −1. Keys further than ±32 away are not drawn.", key="corpus_offsets")
    with right:
        histogram = scans.histogram(path, layer, head)
        show_figure(figures.largest_weight_histogram(HISTOGRAM_BINS, histogram["queries"].tolist(),
                                                     title=f"Layer {layer}, head {head}: how sharp its queries are"),
                    "Each query's largest weight: a sharp head piles up at the right, a broad one at the left.",
                    key="corpus_histogram")
    summary = scans.head_summary(path, layer, head)
    summary["statistic"] = summary["statistic"].map(STATISTIC_NAMES)
    left, right = st.columns([3, 2])
    rows_high = max(len(summary), len(labels)) * 35 + 38  # every row shown, no scrollbar
    left.dataframe(summary.round(4), hide_index=True, width="stretch", height=rows_high)
    right.dataframe(labels.round(3), hide_index=True, width="stretch", height=rows_high)
    left, right = st.columns(2)
    left.markdown("**Token pairs it links most** (the weight each query gives its 3 strongest keys)")
    left.dataframe(scans.token_pairs(path, layer, head, 15).round(4), hide_index=True, width="stretch")
    by = right.radio("**Key tokens that attract most**", ("weight", "per occurrence"), horizontal=True,
                     key="corpus_keys_by", help="per occurrence: among tokens seen 5 times or more")
    right.dataframe(scans.key_tokens(path, layer, head, 15, by=by).round(4), hide_index=True, width="stretch")
    examples_section(path, said, layer, head)


def examples_section(path: Path, said: dict, layer: int, head: int) -> None:
    criteria = scans.criteria_with_examples(path, layer, head)
    if not criteria:
        st.info("No document gives this head a positive score by any criterion.", icon=":material/info:")
        return
    if st.session_state.get("corpus_criterion") not in criteria:
        st.session_state.pop("corpus_criterion", None)
    criterion = st.selectbox("Top examples by", criteria, format_func=CRITERIA.get, key="corpus_criterion",
                             help="The criteria by which this head has an example in this scan.")
    examples = scans.examples(path, layer, head, criterion)
    pointed = ("the key the criterion points at" if criterion not in ("focused", "far")
               else "the query's strongest key")
    st.caption(f"Each token shaded by the weight the query (boxed) gives it; {pointed} is underlined. Hover a token "
               "for its weight; a far key is shown apart, after a gap. One example per document, and never a query "
               "with a single allowed key (it has no choice). Open in Explore heads reads the document as the scan "
               f"did (its first {said.get('max_tokens')} tokens at most).")
    for rank, example in enumerate(examples[:EXAMPLES_SHOWN]):
        text_column, button_column = st.columns([6, 1])
        text_column.markdown(corpus_page.example_line(rank, example))
        text_column.html(figures.example_html(list(example["window_tokens"]), list(example["window_weights"]),
                                              corpus_page.example_positions(example), example["query"],
                                              example["key"]))
        button_column.button("Open in Explore heads", key=f"corpus_open_{rank}", on_click=open_in_explore,
                             args=(path, int(example["doc"]), layer, head, said), icon=":material/search:")


def open_in_explore(path: Path, doc: int, layer: int, head: int, said: dict) -> None:
    """Callback: the document as the scan read it (its first ``max_tokens`` tokens, cut by the scan's model's
    tokenizer when the sidebar holds that model) opens in Explore heads on the head, with the scan's model when
    this session has it."""
    document = scans.document(path, doc)
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
    found, sql = scans.search_queries(path, query_word=query_word or None, key_word=key_word or None,
                                      layer=None if layer == "any" else layer, head=None if head == "any" else head,
                                      min_weight=min_weight)
    found.insert(0, "context", scans.query_contexts(path, list(zip(found["doc"], found["query"], found["key"],
                                                                    strict=True))))
    causal = (" The first query of a decoder (which sees only itself) is left out."
              if scans.is_causal(path) else "")
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
    heads, sql = scans.search_heads(path, key_token, share)
    st.caption(f"{counted(len(heads), 'head', 'heads')}.")
    st.dataframe(heads.round(4), hide_index=True, width="stretch", height=220)
    with st.expander("The SQL (its values written in)"):
        st.code(sql, language="sql")


def compare_view(path: Path, said: dict, listed: list[Path]) -> None:
    other = choose_scan(listed, "corpus_other", "Compare with", exclude=path)
    if other is None:
        st.info("Scan another model (or a fine-tuned checkpoint of this one) over the same corpus to compare them "
                "head by head.", icon=":material/compare:")
        return
    other_said = scans.scan_settings(other)
    if (other_said["n_layers"], other_said["n_heads"]) != (said["n_layers"], said["n_heads"]):
        st.warning(f"{other_said['model']} has {other_said['n_layers']} x {other_said['n_heads']} heads and "
                   f"{said['model']} {said['n_layers']} x {said['n_heads']}: head by head, they do not line up.",
                   icon=":material/warning:")
        return
    theirs_apply = set(scans.statistics_that_apply(other))
    both = [name for name in scans.statistics_that_apply(path) if name in theirs_apply]
    statistic = st.selectbox("Statistic", both, index=both.index("previous") if "previous" in both else 0,
                             format_func=STATISTIC_NAMES.get, key="corpus_compare_statistic",
                             help="What some head of each scan has.")
    mine, _ = scans.statistic_map(path, statistic, "queries")
    theirs, _ = scans.statistic_map(other, statistic, "queries")
    difference = mine - theirs
    names = corpus_page.compared_names(said, other_said)
    figure = figures.difference_map(difference, statistic=statistic,
                                    title=f"{STATISTIC_NAMES[statistic]}:\n{names[0]}\nminus {names[1]}")
    note = corpus_page.largest_change(difference)
    differences = corpus_page.read_differently(said, other_said)
    if differences:
        st.warning(f"The two scans read {', '.join(differences)}: part of each difference may come from that, not "
                   "from the models.", icon=":material/warning:")
    show_figure(figure, note, key="corpus_compare_map")


def export_view(path: Path) -> None:
    table = st.selectbox("Table", store.EXPORTABLE, key="corpus_export_table")
    if st.button("Prepare the Parquet file", key="corpus_export"):
        try:
            with st.spinner(f"Writing {table} as Parquet…"):
                link, size = scans.prepare_export(path, table)
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


def results(folder: background.ScanFolder) -> None:
    listed = scans.readable_scans(folder)
    if not listed:
        if folder.job() is None:
            st.info("No scan yet: choose a corpus and press Scan. The bundled corpus and 200 documents take about a "
                    "minute with the bundled BERT on two CPU cores.", icon=":material/dataset:")
        return
    path = choose_scan(listed, "corpus_scan_choice", "Scan")
    try:
        said = scans.scan_settings(path)
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
     "Search": lambda: search_view(path, said), "Compare": lambda: compare_view(path, said, listed),
     "Export": lambda: export_view(path)}[view]()



def main() -> None:
    start_page("Heads across a corpus")
    switch_if_asked()
    page_intro(
        "What does a head do in general? Scan the sidebar's model over many documents: every head's statistics with "
        "their spread, how often each label holds, where its weight goes by relative position, the token pairs it "
        "links and the examples where it does its thing most strongly. Results are kept in a DuckDB file per scan "
        "(searchable, exportable to Parquet); the same scan runs from the command line and on Ray "
        "(`python -m attnviz.corpus.scan`)."
    )
    folder = scans.scan_folder()
    try:
        bundle = current_bundle()
        scan_controls(folder, bundle)
    except Exception as problem:  # noqa: BLE001 - the page stays usable for the scans already made
        st.error(f"Cannot start a scan: {problem_text(problem)}.", icon=":material/error:")
    if folder.job() is not None:
        running_scan(folder)
    failed_scan_note(folder)
    results(folder)


main()
