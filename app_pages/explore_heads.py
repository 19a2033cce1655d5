"""Explore heads: what every head of a real pretrained model attends to, for any sentence."""

import dataclasses
import functools
import hashlib
import math

import streamlit as st

from attnviz.core import analysis, mask_patterns, vision
from attnviz.core.units import human_bytes
from attnviz.models.record import TooLongForDense, dense_token_limit
from attnviz.pagelogic.clicks import clicked_layer_head, customdata_numbers, selected_points
from attnviz.pagelogic.explore_heads.bertviz_view import bertviz_html
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.detectors import MATRIX_TOKEN_LIMIT, PATTERN_KINDS, PatternProblem, detector_figure
from attnviz.pagelogic.explore_heads.export import capture_npz, figure_html, matrix_csv, matrix_json, shown_matrix
from attnviz.pagelogic.explore_heads.grid import filtered_thumbnails, has_thumbnails, labels_heads
from attnviz.pagelogic.explore_heads.long_texts import sample_text
from attnviz.pagelogic.explore_heads.matrices import POOL_LIMIT, ZOOM_SIZES, head_heatmap
from attnviz.pagelogic.explore_heads.options import (
    BLOCKS,
    GRID_SCALES,
    KIND_NAMES,
    LONG_TEXT,
    SCALES,
    VIEWS,
    ViewOptions,
    automatic_scale,
    automatic_scale_note,
)
from attnviz.pagelogic.explore_heads.qk import query_key, query_key_figures
from attnviz.pagelogic.explore_heads.statistics import (
    has_statistics,
    label_rules_text,
    statistic_figure,
    statistics_column_config,
    statistics_table,
    statistics_that_apply,
)
from attnviz.pagelogic.explore_heads.views import LINES_TOKEN_LIMIT, view_figure, zoom_figure
from attnviz.pagelogic.explore_heads.whatif import (
    MODEL_OWN_MASK,
    what_if,
    what_if_caption,
    what_if_effect,
    what_if_mask,
    what_if_mask_label,
    what_if_masks,
)
from attnviz.ui.caches.explore_heads import cached_detector, cached_replay_difference, cached_statistics
from attnviz.ui.captures import cached_image_capture, capture_current
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, setup_area, start_page, transient_status
from attnviz.ui.messages import problem_text, queries_unavailable, warn_if_not_finite
from attnviz.ui.pattern_widgets import pattern_widgets
from attnviz.ui.session_models import current_bundle, current_model_name, model_dtype, registered_models
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import style
from attnviz.viz.heads import head_grid, head_sharing
from attnviz.viz.matrix import HALF_WIDTH
from attnviz.viz.vision import heads_overlay_figure, overlay_figure

AUTOMATIC_REPLAY_CELLS = 64 * 2048 * 2048  # above this (heads x N x N), the replay check waits for a click
TEXT_SOURCES = ["the sidebar's sentence", "a long text", "Python's documentation"]
SAMPLE_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
MAX_LONG_TEXT_BYTES = 2_000_000
TABS = ["View", "Head statistics", "Q·K", "Compare two sentences", "What-if", "bertviz (online)", "Export"]


def run_open_tab(tabs: dict, bodies: dict) -> None:
    """Only the open tab computes: run its body inside it."""
    for title, body in bodies.items():
        if tabs[title].open:
            with tabs[title]:
                body()


def on_figure_click() -> None:
    """Callback of the grid and lines views: a click on a thumbnail opens that head; on a query token, follows it."""
    for point in selected_points(st.session_state.get("explore_main_figure")):
        numbers = customdata_numbers(point.get("customdata"))
        if numbers is not None and len(numbers) == 2:  # a grid thumbnail: (layer, head)
            open_head(*numbers)
            return
        if numbers is not None and len(numbers) == 1:  # a query token of the lines view: follow it, or stop
            position = numbers[0]
            following = st.session_state.get("explore_follow", [])
            st.session_state["explore_follow"] = [] if following == [position] else [position]
            return


def open_head(layer: int, head: int) -> None:
    """Callback (runs before the widgets exist, so their state may be set)."""
    st.session_state["layer"], st.session_state["head"] = layer, head
    st.session_state["view"] = "head"
    st.session_state["explore_tab"] = "View"


def replay_check(capture_key: tuple, kind: str, record, model) -> None:
    if not record.replayable:
        return  # the eager-weights path: nothing to replay (the page's note says so)
    cells = record.n_layers * record.n_heads * record.n_q * record.n_k
    asked = st.session_state.get("explore_replay_asked") == (capture_key, kind)
    if cells > AUTOMATIC_REPLAY_CELLS and not asked:
        st.button(
            f"Run the replay check ({record.n_layers} layers x {record.n_heads} heads x {record.n_q:,} tokens)",
            key="explore_replay_button", on_click=lambda: st.session_state.update(
                explore_replay_asked=(capture_key, kind)),
            help="Recomputes every head with attnviz's attention and compares weights @ V with the model's output.",
        )
        return
    with transient_status("Replay check: recomputing every layer with attnviz's attention…") as status:
        difference = cached_replay_difference(
            capture_key, kind, record,
            _progress=lambda layer, n: status.update(label=f"Replay check: layer {layer + 1} of {n}…"), _model=model,
        )
    if not math.isfinite(difference):
        st.markdown(
            ":material/error: **Replay check: not finite.** The model's attention output, or attnviz's, holds NaN or "
            "infinity in at least one layer, so there is nothing to compare (see the warning above).",
            help="The check compares attnviz's weights @ V with the model's own kernel, layer by layer; NaN never "
                 "counts as agreement.")
        return
    dtype = str(difference.dtype).removeprefix("torch.")
    rounding = (f"rounding in {dtype} allows each output an error of its own, from its weights, its values and the "
                f"size of its scores: the output nearest its bound differs by {difference.share:.0%} of it "
                f"({difference.allowed:.1e})")
    if not difference.passed:
        st.markdown(
            f":material/warning: **Replay check:** attnviz's own attention differs from the model's output by up to "
            f"**{difference:.1e}**, more than rounding in {dtype} explains.",
            help=f"attnviz's weights, times the model's V, should reproduce the attention output of the model's "
                 f"kernel in every layer and head; {rounding}. What is shown here may not be what this model "
                 "computes.",
        )
        return
    shown = "**exactly**" if difference == 0 else f"to within **{difference:.1e}**"
    st.markdown(
        f":material/check_circle: **Replay check:** attnviz's own attention reproduces the model's output in all "
        f"{record.n_layers} x {record.n_heads} heads {shown}.",
        help=f"The weights shown here are computed by attnviz's from-scratch attention from the model's own Q and "
             f"K; times its V, they reproduce the attention output of the model's kernel in every layer and head "
             f"(max difference {difference:.1e}; {rounding}).",
    )


def keep_hidden_choices(*keys: str) -> None:
    """Streamlit forgets a widget's value on a run that does not draw it: controls shown only for some views keep
    their value while another view is on."""
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


# The view controls' keys, kept while they are hidden (another view, or the Image tab, is on).
VIEW_CONTROL_KEYS = ("view", "explore_follow", "explore_top_k", "explore_rollout_layer", "explore_line_heads",
                     "explore_scale", "explore_grid_scale", "explore_renormalise", "explore_lines_start")


def requested_view() -> str:
    """The view asked for, read before the View control: Layer and Head, drawn left of it, depend on it."""
    view = st.session_state.get("view") or st.query_params.get("view")
    return view if view in VIEWS else "head"


def layer_control(column, record, view: str) -> int:
    """The Layer box; for rollout, the layer its product runs through (rollout has its own box)."""
    if view != "rollout":
        return int(column.number_input("Layer", 0, record.n_layers - 1, 0, key="layer", bind="query-params"))
    return int(column.number_input(
        "Rollout through layer", 0, record.n_layers - 1, record.n_layers - 1, key="explore_rollout_layer",
        bind="query-params", help="Rollout multiplies the layers' attention from layer 0 up to this one."))


def head_control(column, record, view: str) -> int:
    """The Head box, for the views of one head (average and rollout mix every head: 0 there)."""
    if view in ("average", "rollout"):
        return 0
    # Opens on head 2: in the bundled BERT's layer 0 it attends to the previous token, a pattern seen at a glance.
    return int(column.number_input("Head", 0, record.n_heads - 1, min(2, record.n_heads - 1), key="head",
                                   bind="query-params", on_change=follow_head_in_lines))


def follow_head_in_lines() -> None:
    """The Head box moves the lines view's heads too (it would change nothing there): a single head drawn becomes
    the new one; a new head joins several drawn."""
    drawn, head = st.session_state.get("explore_line_heads"), st.session_state.get("head")
    if drawn is None or head is None:
        return
    if len(drawn) <= 1:
        st.session_state["explore_line_heads"] = [head]
    elif head not in drawn:
        st.session_state["explore_line_heads"] = [*drawn, head]


def layer_fields(view: str, layer: int) -> dict:
    """The ViewOptions fields of the layer box: rollout's box is its last layer, and the layer the other views
    and tabs show stays the Layer box's (hidden while rollout is on)."""
    if view != "rollout":
        return {"layer": layer}
    return {"layer": int(st.session_state.get("layer", 0)), "rollout_layer": layer}


def filter_controls(columns, kind: str, text_pair: str, architecture: str) -> dict:
    """Hide special tokens, (for a sentence pair) the A/B block, and renormalise rows: drawn only while something
    is hidden, the one case where it changes what is shown."""
    fields = {
        "hide_special": columns[0].toggle("Hide special tokens", key="explore_hide_special", bind="query-params",
                                          help="[CLS], [SEP], <s>, padding"),
    }
    if text_pair and kind in ("self", "encoder") and architecture != "encoder-decoder":
        fields["block"] = columns[2].selectbox("Sentence block", BLOCKS, key="explore_block",
                                               help="query → key", bind="query-params")
    if fields["hide_special"] or fields.get("block", "all") != "all":
        fields["renormalise"] = columns[1].toggle(
            "Renormalise rows", value=True, key="explore_renormalise", bind="query-params",
            help="Rescale each row's kept weights to sum to 1 again (on), or keep the model's weights (off).",
        )
    return fields


def lines_controls(column, record, head: int) -> dict:
    """The lines view's tokens to follow, heads to draw, and strongest keys per query."""
    follow = column.multiselect(
        "Follow query tokens", list(range(len(record.query_tokens))),
        format_func=lambda i: style.token_label(i, record.query_display[i]),
        key="explore_follow", help="Draw only these queries' lines (or click a query token).",
    )
    columns = st.columns([6, 2])
    line_heads = columns[0].multiselect("Heads to draw", list(range(record.n_heads)), default=[head],
                                        key="explore_line_heads", help="One colour per head.")
    top_k = columns[1].number_input("Strongest keys per query (0: all)", 0, record.n_k, 0, key="explore_top_k")
    chosen = {"follow": follow, "line_heads": line_heads, "top_k": int(top_k) or None}
    if record.n_q > LINES_TOKEN_LIMIT and not follow:  # a long text: a window of queries, movable
        chosen["lines_start"] = int(st.slider(
            "Queries drawn, from position", 0, record.n_q - LINES_TOKEN_LIMIT, 0, step=16, key="explore_lines_start",
            help=f"{LINES_TOKEN_LIMIT} queries at a time stay readable; the keys shown are those they use most."))
    return chosen


def colour_control(column, view: str, record) -> dict:
    """The colour scale: the grid's own choices, the weights heatmaps' for the others (the lines view has none).
    The heatmaps open on "automatic": 0–1 for a short text, each row to its maximum for a long one."""
    if view == "grid":
        return {"grid_scale": column.selectbox(
            "Colour", list(GRID_SCALES), format_func=GRID_SCALES.get, key="explore_grid_scale",
            help="Each head to its own maximum shows faint heads; 0–1 compares heads as the head view does.",
        )}
    if view == "lines":
        return {}
    automatic = automatic_scale(record.n_q, record.n_k)
    # The scale "automatic" stands for is not listed again: choosing it would change nothing.
    chosen = column.selectbox(
        "Colour", ["auto", *(scale for scale in SCALES if scale != automatic)], key="explore_scale",
        format_func=lambda scale: f"automatic: {SCALES[automatic]}" if scale == "auto" else SCALES[scale],
        help="0–1 compares heads; this head's maximum stretches a faint head; at long lengths most weights are "
             f"tiny: scale each row to its maximum, or use a log scale, to see structure. Automatic: 0–1 up to "
             f"{LONG_TEXT} tokens, each row to its maximum above. The title says which is on.",
    )
    return {"scale": automatic if chosen == "auto" else chosen, "automatic_scale": chosen == "auto"}


def pooling_controls(record) -> dict:
    """Above POOL_LIMIT tokens a side: how cells are pooled, and the zoom window at full resolution."""
    columns = st.columns([2, 2, 2, 2])
    pooling = columns[0].radio(
        "Pool cells by", list(analysis.POOLINGS), horizontal=True, key="explore_pooling",
        help=f"More than {POOL_LIMIT} tokens a side: each cell shows the max (peaks stay visible) "
             "or the mean of a block of weights.",
    )
    zoom_size = columns[1].select_slider("Zoom window", ZOOM_SIZES, 128, key="explore_zoom_size")
    zoom_query = columns[2].number_input("Zoom: first query", 0, max(0, record.n_q - 1), 0, step=zoom_size,
                                         key="explore_zoom_query")
    zoom_key = columns[3].number_input("Zoom: first key", 0, max(0, record.n_k - 1), 0, step=zoom_size,
                                       key="explore_zoom_key")
    return {"pooling": pooling, "zoom_size": zoom_size, "zoom_query": int(zoom_query), "zoom_key": int(zoom_key)}


def view_options(capture, record, kind: str, text_pair: str, architecture: str) -> ViewOptions:
    """The controls above the tabs, as one ViewOptions: only those that act on the chosen view are drawn."""
    keep_hidden_choices("layer", "head", *VIEW_CONTROL_KEYS)
    asked = requested_view()
    controls = st.columns([2, 2, 6, 3])
    layer = layer_control(controls[0], record, asked)
    head = head_control(controls[1], record, asked)
    view = controls[2].segmented_control(
        "View", list(VIEWS), format_func=VIEWS.get, default="head", key="view", required=True,
        bind="query-params",
    )
    filters = st.columns([3, 3, 2, 4])
    fields = {**layer_fields(view, layer), **filter_controls(filters, kind, text_pair, architecture)}
    if view == "lines":
        fields.update(lines_controls(filters[3], record, head))
    fields.update(colour_control(controls[3], view, record))
    if view in ("head", "average") and max(record.n_q, record.n_k) > POOL_LIMIT:
        fields.update(pooling_controls(record))
    return ViewOptions(kind=kind, head=head, view=view, **fields)


def prepare_grid(capture, record, options: ViewOptions) -> None:
    """The grid's slow parts, each computed once per record with its progress shown: every head's thumbnails, and
    the head statistics its labels come from."""
    if not has_thumbnails(capture, record, options):
        with transient_status("Pooling every head into thumbnails…") as status:
            filtered_thumbnails(capture, record, options, progress=lambda layer, n: status.update(
                label=f"Pooling every head into thumbnails: layer {layer + 1} of {n}…"))
    if labels_heads(record) and not has_statistics(record):
        with transient_status("Labelling every head…") as status:
            statistics_table(capture, options.kind, progress=lambda layer, n: status.update(
                label=f"Labelling every head: layer {layer + 1} of {n}…"))


def view_tab(capture, record, options: ViewOptions) -> None:
    try:
        if options.view == "grid":
            prepare_grid(capture, record, options)
        figure, caption = view_figure(capture, options)
    except ValueError as problem:
        st.warning(str(problem))
    else:
        show_figure(figure, caption, key="explore_main_figure",
                    on_select=on_figure_click if options.view in ("grid", "lines") else None)
        if options.automatic_scale and options.view in ("head", "average", "rollout"):
            note = automatic_scale_note(record.n_q, record.n_k)
            if note:
                st.caption(note)
        if options.view in ("head", "average") and max(record.n_q, record.n_k) > POOL_LIMIT:
            zoom, zoom_caption = zoom_figure(capture, options)
            show_figure(zoom, zoom_caption, key="explore_zoom_figure")
    if record.n_kv_heads != record.n_heads:
        show_figure(
            head_sharing(record.n_heads, record.n_kv_heads,
                         title=f"{record.n_heads} query heads share {record.n_kv_heads} K/V heads"),
            "Grouped-query attention: heads of one colour read the same keys and values (their queries differ).",
            key="explore_sharing",
        )


def on_table_select() -> None:
    """Callback of the statistics table: the selected row's head becomes the page's Layer and Head."""
    selection = st.session_state.get("explore_stats_table")
    rows = selection["selection"]["rows"] if isinstance(selection, dict) else selection.selection.rows
    shown = st.session_state.get("explore_stats_shown", [])
    if rows and rows[0] < len(shown):
        st.session_state["layer"], st.session_state["head"] = shown[rows[0]]


def on_statistic_click(n_layers: int, n_heads: int) -> None:
    """Callback of the layers x heads heatmap: a click on a cell opens that head in the View tab."""
    head = clicked_layer_head(st.session_state.get("explore_stats_heatmap"), n_layers, n_heads)
    if head is not None:
        open_head(*head)


def statistics_tab(capture, capture_key: tuple, kind: str, options: ViewOptions) -> None:
    try:
        with transient_status("Computing head statistics…") as status:
            table = cached_statistics(capture_key, kind, capture, _progress=lambda layer, n: status.update(
                label=f"Computing head statistics: layer {layer + 1} of {n}…"))
    except ValueError as problem:
        st.info(str(problem))
        return
    columns = st.columns([2, 5])
    applying = statistics_that_apply(table, capture.records[kind].is_causal())
    if st.session_state.get("explore_stats_map") not in applying:
        st.session_state.pop("explore_stats_map", None)
    statistic = columns[0].selectbox("Statistic to map", applying, key="explore_stats_map",
                                     help="Every head of every layer, coloured by this column of the table (only "
                                          "what some head has on this text: no next token under a causal mask, no "
                                          "induction where no token repeats).")
    labels = sorted(table["label"].unique())
    chosen_labels = columns[1].multiselect("Show heads labelled", labels, default=labels, key="explore_stats_labels",
                                           help="Filters the map (others greyed) and the table.")
    figure, caption = statistic_figure(table, statistic, chosen_labels, (options.layer, options.head),
                                       n_keys=len(capture.records[kind].key_tokens))
    record = capture.records[kind]
    show_figure(figure, caption, key="explore_stats_heatmap",
                on_select=functools.partial(on_statistic_click, record.n_layers, record.n_heads))
    st.markdown("Labels: " + label_rules_text())
    detector_section(capture, capture_key, kind, options)
    shown = table[table["label"].isin(chosen_labels)].reset_index(drop=True)
    st.session_state["explore_stats_shown"] = list(zip(shown["layer"].astype(int), shown["head"].astype(int),
                                                       strict=True))
    st.dataframe(
        shown, key="explore_stats_table", on_select=on_table_select, selection_mode="single-row", hide_index=True,
        height=min(420, 40 + 35 * len(shown)), column_config=statistics_column_config(st.column_config),
    )
    st.caption(f"{len(shown)} of {len(table)} heads. Select a row to make it the page's Layer and Head (now layer "
               f"{options.layer}, head {options.head}).")
    st.button("Open this head in the View tab", key="explore_open_button", on_click=open_head,
              args=(options.layer, options.head))
    figure, caption = view_figure(capture, ViewOptions(kind=kind, layer=options.layer,
                                                                       head=options.head))
    show_figure(figure, caption, key="explore_stats_figure")


def detector_section(capture, capture_key: tuple, kind: str, options: ViewOptions) -> None:
    """A head detector on this text: induction, duplicate token, or a pattern the reader gives (offsets, key
    tokens, a typed matrix), every head scored as attnviz and as TransformerLens do."""
    with st.expander("Detect a pattern in every head (induction, duplicate token, or your own)",
                     expanded=st.session_state.get("explore_detector_open", False)):
        columns = st.columns([2, 3])
        pattern = columns[0].selectbox("Pattern", list(PATTERN_KINDS), format_func=lambda k: f"{k}: {PATTERN_KINDS[k]}",
                                       key="explore_detector")
        spec = ""
        if pattern == "offsets":
            spec = columns[1].text_input("Offsets (key − query)", "-2", key="explore_detector_offsets",
                                         max_chars=200, help="Comma-separated: −1 the previous token, −2 two back.")
        elif pattern == "key tokens":
            spec = columns[1].text_input("Key tokens", "the, [SEP]", key="explore_detector_words", max_chars=500,
                                         help="Comma-separated words; any case, with or without a space mark.")
        elif pattern == "matrix":
            n = len(capture.records[kind].key_tokens)
            spec = columns[1].text_area(f"Matrix: {n} rows of {n} numbers (0 or 1)", "\n".join(
                " ".join("1" if j == i - 1 else "0" for j in range(n)) for i in range(min(n, MATRIX_TOKEN_LIMIT))),
                key="explore_detector_matrix", height=160, help="Row i is query i; a 1 at column j asks for weight "
                "on key j. Filled with the previous-token pattern to start from.")
        try:
            scores = cached_detector(capture_key, kind, pattern, spec, capture)
        except PatternProblem as problem:
            st.warning(f"{str(problem).capitalize()}.", icon=":material/edit:")
            return
        figure, caption = detector_figure(scores, pattern, (options.layer, options.head))
        record = capture.records[kind]
        show_figure(figure, caption, key="explore_detector_map",
                    on_select=functools.partial(on_detector_click, record.n_layers, record.n_heads))


def on_detector_click(n_layers: int, n_heads: int) -> None:
    st.session_state["explore_detector_open"] = True
    head = clicked_layer_head(st.session_state.get("explore_detector_map"), n_layers, n_heads)
    if head is not None:
        open_head(*head)


def query_key_tab(bundle, capture, record, options: ViewOptions) -> None:
    if queries_unavailable(bundle, record, "The Q·K view"):
        return
    st.markdown("How one score is made, in the head chosen above: the query and key vectors as the model's attention "
                "received them (after RoPE, if any), their element-wise product, its sum, the scaling, and the "
                "softmax over every key.")
    columns = st.columns(2)
    query = columns[0].selectbox("Query token", list(range(record.n_q)), index=min(2, record.n_q - 1),
                                 format_func=lambda i: style.token_label(i, record.query_display[i]), key="qk_query")
    weights = record.head_weights(options.layer, options.head, query, query + 1)[0]
    key = columns[1].selectbox("Key token", list(range(record.n_k)), index=int(weights.argmax()),
                               format_func=lambda j: style.token_label(j, record.key_display[j]), key="qk_key",
                               help="Starts on the key this query attends to most.")
    anatomy = query_key(record, options.layer, options.head, int(query), int(key))
    vectors, row, caption = query_key_figures(anatomy, record, options.layer, options.head, int(query), int(key),
                                              capture.ids_of(record.key_tokens))
    show_figure(vectors, "Red and blue: positive and negative entries; where q and k agree in sign, q∘k is red and "
                         "adds to the score.", key="qk_vectors")
    show_figure(row, caption, key="qk_row")


def needs_every_head(record) -> bool:
    """The tabs that need every head's weights at once say so on a long input, rather than fail."""
    if record.dense_ok:
        return False
    try:
        record.check_dense()
    except TooLongForDense as problem:
        st.info(f"{problem}.", icon=":material/straighten:")
    return True


def compare_tab(capture, text: str, text_pair: str, options: ViewOptions, max_tokens: int | None) -> None:
    if needs_every_head(capture.records[options.kind]):
        return
    other_text = st.text_input(
        "Second text to compare", value=text.replace("cat", "dog", 1) if "cat" in text else text[:2000],
        key="explore_compare_text", max_chars=2000,
    )
    if not other_text.strip():
        return
    other = capture_current(other_text, text_pair, max_tokens, notice=False).capture
    try:
        figures, caption = compare_figures(capture, other, options.kind, options.layer, options.head)
    except TooLongForDense as problem:
        st.info(f"{problem}.")
        return
    for index, (column, figure) in enumerate(zip(figure_columns(2, key="explore_compare"), figures[:2], strict=True)):
        with column:
            show_figure(figure, "The same head on each text.", key=f"explore_compare_{index}")
    if len(figures) > 2:
        show_figure(figures[2], caption, key="explore_compare_difference")
    else:
        st.info(caption)


def what_if_tab(bundle, capture, record, options: ViewOptions) -> None:
    if needs_every_head(record) or queries_unavailable(bundle, record, "The what-if"):
        return
    st.markdown(
        "Re-run this layer's **real** queries and keys through attnviz's attention with another mask or scale. "
        "Before = the model; after = the same Q and K under your rule."
    )
    columns = st.columns(4)
    mask_key = columns[0].selectbox("Mask", what_if_masks(), format_func=what_if_mask_label, key="whatif_mask")
    unscaled = columns[1].toggle("Remove the 1/√d_k scaling", key="whatif_unscaled")
    temperature = columns[1].slider("Temperature", 0.1, 5.0, 1.0, 0.1, key="whatif_temperature")
    n_q, n_k = record.n_q, record.n_k
    params = {} if mask_key == MODEL_OWN_MASK else pattern_widgets(
        mask_key, mask_patterns.WHAT_IF, columns[2:], n_k, prefix="whatif")
    layer, head = options.layer, options.head
    try:
        new_mask = what_if_mask(mask_key, n_q, n_k, **params)
        before, after = what_if(record, layer, new_mask, unscaled=unscaled, temperature=temperature)
    except ValueError as problem:
        st.warning(str(problem))
        return
    effect = what_if_effect(record, layer, before, after, new_mask)
    left, right = figure_columns(2, key="explore_whatif")
    with left:
        show_figure(
            head_heatmap(capture, record, before[head], f"Before: layer {layer}, head {head} (the model)",
                         width=HALF_WIDTH),
            "The model's own weights.", key="whatif_before",
        )
    with right:
        rule = (what_if_mask_label(mask_key) + (", no √d_k scaling" if unscaled else "")
                + (f", T = {temperature:g}" if temperature != 1 else ""))
        show_figure(
            head_heatmap(capture, record, after[head], f"After: {rule}", width=HALF_WIDTH),
            what_if_caption(effect, unscaled, temperature),
            key="whatif_after",
        )
    show_figure(
        head_grid([before, after], title=f"All {record.n_heads} heads of layer {layer}, before and after",
                  row_names=["before", "after"], highlight=(0, head), clickable=False),
        f"Every head of the layer under the same rule; the largest change of any weight is "
        f"{effect.largest_change:.3g}.",
        key="whatif_all_heads",
    )


def bertviz_tab(capture, kind: str) -> None:
    st.info(
        "bertviz draws with require.js, d3 and jQuery loaded **from a CDN: this tab needs internet**. "
        "Every other view in attnviz works offline.",
        icon=":material/public:",
    )
    which = st.radio("bertviz view", ["head view", "model view"], horizontal=True, key="explore_bertviz_view")
    if len(capture.tokens) > 128:
        st.warning("bertviz becomes unusable beyond about 128 tokens; use the grid or lines view instead.")
    elif st.button("Build the bertviz view", key="explore_bertviz_build"):
        try:
            html = bertviz_html(capture, kind, which)
        except ImportError:
            st.error("bertviz is not installed here: pip install bertviz.")
        else:
            st.iframe(html, height=900 if which == "model view" else 650)


def export_tab(capture, record, options: ViewOptions) -> None:
    st.markdown("Download what you see: the figure as a self-contained HTML file, the numbers of the head view as "
                "shown (after filters, pooling and colour scale), and every captured tensor. The CSV and JSON name "
                "each token by the tokenizer's own piece (`Ġthe` where the page shows `␣the`), the JSON and .npz "
                "with its id.")
    columns = st.columns(4)
    layer, head, view = options.layer, options.head, options.view
    try:
        figure, _ = view_figure(capture, options)
        columns[0].download_button(
            "Figure (HTML)", lambda: figure_html(figure), f"attnviz_{view}_L{layer}H{head}.html", "text/html",
            key="export_html", on_click="ignore",
        )
    except ValueError:
        columns[0].caption("No figure to export with these filters.")
    columns[1].download_button(
        "All tensors (.npz)", lambda: capture_npz(capture), "attnviz_capture.npz", "application/octet-stream",
        key="export_npz", on_click="ignore", help=f"Q, K and V of every layer (and every head's weights up to "
                               f"{dense_token_limit(record.n_layers, record.n_heads):,} tokens with this model).",
    )
    table_options = options if view in ("head", "average") else dataclasses.replace(options, view="head")
    columns[2].download_button(
        "This head as shown (CSV)", lambda: matrix_csv(shown_matrix(capture, table_options), capture, options.kind),
        f"attnviz_L{layer}H{head}.csv", "text/csv", key="export_csv", on_click="ignore",
    )
    columns[3].download_button(
        "This head as shown (JSON)",
        lambda: matrix_json(capture, table_options, shown_matrix(capture, table_options)),
        f"attnviz_L{layer}H{head}.json", "application/json", key="export_json", on_click="ignore",
    )
    st.caption("Link to this view: copy the address bar; it holds the model, the sentence and sentence B, the layer, "
               "head and view, and the filters.")


def text_source(bundle) -> tuple[str, int | None]:
    """The text to explore: the sidebar's sentence, a long text pasted or uploaded, or Python's documentation
    (which ships with Python: a long text offline). Returns the text and a token limit (None: the model's)."""
    source = st.segmented_control(
        "Text", TEXT_SOURCES, default=TEXT_SOURCES[0], key="explore_source", required=True, bind="query-params",
        help="Long texts: attnviz replays attention on demand, pools large heatmaps and zooms into any window.",
    )
    if source == TEXT_SOURCES[1]:
        uploaded = st.file_uploader("A .txt file (UTF-8), or paste below", type=["txt"], key="explore_long_file",
                                    max_upload_size=max(1, -(-MAX_LONG_TEXT_BYTES // 1024**2)))
        if uploaded is not None:
            data = uploaded.getvalue()
            if len(data) > MAX_LONG_TEXT_BYTES:
                st.error(f"That file is {len(data) / 1e6:.1f} MB; paste or upload at most "
                         f"{MAX_LONG_TEXT_BYTES // 10**6} MB of text.")
                st.stop()
            return data.decode("utf-8", errors="replace"), None
        pasted = st.text_area("Long text", key="explore_long_text", height=160, max_chars=MAX_LONG_TEXT_BYTES,
                              placeholder="Paste a long text: an article, a chapter, code…")
        return pasted or current_sentence(), None
    if source == TEXT_SOURCES[2]:
        lengths = [n for n in SAMPLE_LENGTHS if n <= bundle.max_positions] or [bundle.max_positions]
        tokens = st.select_slider("Tokens", lengths, min(1024, lengths[-1]), key="explore_sample_tokens",
                                  bind="query-params", help="The first tokens of Python's own documentation.")
        return sample_text(), int(tokens)
    return current_sentence(), None


IMAGE_TABS = ["Image", "View", "Head statistics", "Export"]
IMAGE_SOURCES = ["Sample photo", "Upload an image"]


@st.cache_resource(max_entries=2, show_spinner=False)
def sample_photo(name: str):
    return vision.sample_image(name)


def image_source() -> tuple[str, object, str]:
    """The image to explore: one of scikit-learn's sample photos (offline) or an upload, validated. Returns a key
    for the cache, the RGB image and its name."""
    columns = st.columns([2, 3])
    source = columns[0].segmented_control("Image", IMAGE_SOURCES, default=IMAGE_SOURCES[0], required=True,
                                          key="explore_image_source")
    if source == IMAGE_SOURCES[1]:
        uploaded = columns[1].file_uploader("A PNG or JPEG", type=["png", "jpg", "jpeg"], key="explore_image_file",
                                            max_upload_size=vision.MAX_IMAGE_BYTES // 1024**2,
                                            help=f"Up to {human_bytes(vision.MAX_IMAGE_BYTES)} and "
                                                 f"{vision.MAX_IMAGE_PIXELS / 1e6:.0f} megapixels.")
        if uploaded is None:
            st.info("Upload a PNG or JPEG to see where this model's heads look.", icon=":material/upload:")
            st.stop()
        data = uploaded.getvalue()
        try:
            image = vision.read_image(data)
        except vision.ImageRefused as problem:
            st.error(f"This image cannot be read: {problem}.", icon=":material/broken_image:")
            st.stop()
        return "upload:" + hashlib.sha256(data).hexdigest(), image, uploaded.name
    name = columns[1].selectbox("Sample photo", list(vision.SAMPLE_IMAGES), key="explore_image_sample")
    return "sample:" + name, sample_photo(name), name


def on_patch_click(layout: vision.PatchLayout) -> None:
    """Callback of the image overlay: the clicked patch becomes the query (the point's pixel position: a click
    may land on the image's trace or the heatmap's)."""
    for point in selected_points(st.session_state.get("explore_image_overlay")):
        if point.get("x") is None or point.get("y") is None:
            continue
        token = vision.token_at_pixel(layout, float(point["x"]), float(point["y"]))
        if token is not None:
            st.session_state["explore_image_query"] = token
            return


def image_controls(record) -> dict:
    """The Image tab's own controls, one set of views: this head, the mean of the layer's heads, or rollout through
    layers 0 to the Layer box's (the same Layer and Head boxes as the View tab; the Head box only where a head is
    drawn), the query patch, and the overlay's opacity."""
    keep_hidden_choices("head", *VIEW_CONTROL_KEYS)
    columns = st.columns([4, 2, 2, 3, 3])
    mode = columns[0].segmented_control("Heads", vision.OVERLAY_MODES, format_func=vision.OVERLAY_NAMES.get,
                                        default="head", required=True, key="explore_image_mode",
                                        help="This head (Layer and Head), the mean of the layer's heads, or rollout "
                                             "through layers 0 to Layer.")
    layer = int(columns[1].number_input("Layer", 0, record.n_layers - 1, 0, key="layer", bind="query-params"))
    head = 0
    if mode == "head":
        head = int(columns[2].number_input("Head", 0, record.n_heads - 1, min(2, record.n_heads - 1), key="head",
                                           bind="query-params"))
    if st.session_state.get("explore_image_query", 0) >= record.n_q:
        st.session_state["explore_image_query"] = 0
    query = columns[3].selectbox("Query token (or click a patch)", list(range(record.n_q)),
                                 format_func=lambda i: f"{i}: {record.query_display[i]}", key="explore_image_query")
    opacity = columns[4].slider("Overlay opacity", 0.1, 1.0, 0.8, 0.05, key="explore_image_opacity",
                                help="How strongly the attention covers the photo where it is highest; where it "
                                     "is 0 the photo shows through untouched.")
    return {"mode": mode, "layer": layer, "head": head, "query": int(query), "opacity": float(opacity)}


def image_tab(capture) -> None:
    record, layout = capture.records["self"], capture.layout
    chosen = image_controls(record)
    mode, layer, head, query = chosen["mode"], chosen["layer"], chosen["head"], chosen["query"]
    if mode == "rollout" and needs_every_head(record):
        return
    shown = vision.overlay(capture, layer, mode, head, query)
    first = layout.prefix[0] if layout.prefix else "the first patch"
    show_figure(
        overlay_figure(capture.image, shown.grid, layout, query, shown.title, opacity=chosen["opacity"]),
        f"Where {capture.tokens[query]} looks, on the {layout.image_size[1]} x {layout.image_size[0]} pixels the "
        f"model saw ({layout.rows} x {layout.cols} patches of {layout.patch} px). Click a patch to make it the "
        f"query; choose {first} in the query box to go back.",
        key="explore_image_overlay", on_select=lambda: on_patch_click(layout),
    )
    if mode != "rollout":
        grids = [vision.overlay(capture, layer, "head", each, query).grid for each in range(record.n_heads)]
        show_figure(
            heads_overlay_figure(grids, f"Every head of layer {layer}: where {capture.tokens[query]} looks",
                                 image=capture.image, query_patch=layout.patch_of(query), opacity=chosen["opacity"]),
            "One colour scale for all heads, over the image with the query's patch outlined: the heads of one layer "
            "often split the work (nearby patches, the object, the background, [CLS]).",
            key="explore_image_heads",
        )
    st.caption(vision.UPLOAD_HINT)


def current_head_options() -> ViewOptions:
    """The page's Layer and Head as the tabs that only read them (head statistics' outline) see them."""
    return ViewOptions(layer=int(st.session_state.get("layer", 0)), head=int(st.session_state.get("head", 0)))


def image_main(bundle) -> None:
    """Explore heads for a vision transformer: an image picker instead of the sentence box, an overlay view."""
    if bundle.tokenizer_note:  # the image processor's stand-in
        st.warning(bundle.tokenizer_note, icon=":material/warning:")
    image_key, image, image_name = image_source()
    name = current_model_name()
    folder = registered_models()[name]
    try:
        capture = cached_image_capture(folder, name, model_dtype(name), image_key, bundle, image, image_name)
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, said in words
        st.error(f"{name} could not run on this image: {problem_text(problem)}. Try another image, or choose another "
                 "model in the sidebar.", icon=":material/error:")
        st.stop()
    warn_if_not_finite(bundle, capture)
    capture_key = (folder, name, model_dtype(name), image_key)
    st.caption(f"**{name}** · {bundle.describe()} · {len(capture.tokens)} tokens: "
               + (f"{', '.join(capture.layout.prefix)} and " if capture.layout.prefix else "")
               + f"{capture.layout.rows} x {capture.layout.cols} patches")
    record = capture.records["self"]
    replay_check(capture_key, "self", record, bundle.model)
    tabs = dict(zip(IMAGE_TABS, st.tabs(IMAGE_TABS, key="explore_image_tab", on_change="rerun"), strict=True))

    def options() -> ViewOptions:  # the views' controls, drawn in the tabs that use them
        return view_options(capture, record, "self", "", bundle.architecture)

    bodies = {
        "Image": lambda: image_tab(capture),
        "View": lambda: view_tab(capture, record, options()),
        "Head statistics": lambda: statistics_tab(capture, capture_key, "self", current_head_options()),
        "Export": lambda: export_tab(capture, record, options()),
    }
    run_open_tab(tabs, bodies)


def main() -> None:
    start_page("Explore heads")
    bundle = current_bundle()
    if bundle.modality == "image":
        image_main(bundle)
        return
    if bundle.uses_fallback_tokenizer:
        st.warning(bundle.tokenizer_note, icon=":material/warning:")
        st.radio(
            "Stand-in tokenizer (this checkpoint has none)", ["whitespace", "bytes"], horizontal=True,
            key="fallback_tokenizer", help="Whitespace: one token per word. Bytes: one token per UTF-8 byte.",
        )
    setup = setup_area("Text, model and replay check")
    with setup:
        source_column, pair_column = st.columns([6, 4])
        with source_column:
            text, max_tokens = text_source(bundle)
        if bundle.architecture == "encoder-decoder":
            pair_label = "Decoder input (empty: the sentence itself)"
            pair_help = "What the decoder reads; its queries attend to the encoder's keys."
        else:
            pair_label, pair_help = "Second sentence (B), optional", "A sentence pair (A, B), as in BERT's training."
        text_pair = pair_column.text_input(pair_label, key="explore_pair", max_chars=2000, help=pair_help,
                                           bind="query-params")
        bundle, capture, capture_key = capture_current(text, text_pair, max_tokens, notice=False)
        name = current_model_name()
        st.caption(f"**{name}** · {bundle.describe()}")
        if bundle.capture_note:
            st.info(bundle.capture_note, icon=":material/route:")
    if capture.truncated and (max_tokens is None or len(capture.tokens) < max_tokens):
        limit = (f"this model reads at most {bundle.max_positions}" if len(capture.tokens) >= bundle.max_positions
                 else "on this model's eager path attnviz keeps every layer's weights at once, which fit up to "
                      f"{len(capture.tokens)}")
        st.warning(f"The text has {capture.length_of_text} tokens; {limit}. Showing the first "
                   f"{len(capture.tokens)}.", icon=":material/content_cut:")
    kind = capture.kinds[0]
    if len(capture.kinds) > 1:
        kind = st.segmented_control("Attention", capture.kinds, default=capture.kinds[0],
                                    format_func=KIND_NAMES.get, key="explore_kind", required=True)
    record = capture.records[kind]
    with setup:
        replay_check(capture_key, kind, record, bundle.model)
    options = view_options(capture, record, kind, text_pair, bundle.architecture)

    tabs = dict(zip(TABS, st.tabs(TABS, key="explore_tab", on_change="rerun", bind="query-params"), strict=True))
    with tabs["View"]:
        view_tab(capture, record, options)
    bodies = {
        "Head statistics": lambda: statistics_tab(capture, capture_key, kind, options),
        "Q·K": lambda: query_key_tab(bundle, capture, record, options),
        "Compare two sentences": lambda: compare_tab(capture, text, text_pair, options, max_tokens),
        "What-if": lambda: what_if_tab(bundle, capture, record, options),
        "bertviz (online)": lambda: bertviz_tab(capture, kind),
        "Export": lambda: export_tab(capture, record, options),
    }
    run_open_tab(tabs, bodies)


main()
