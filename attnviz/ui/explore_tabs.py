"""Explore heads' tabs beyond View, drawn with Streamlit: Head statistics (with its pattern detectors), Q·K,
Compare two sentences, What-if, bertviz and Export, and a vision model's Image tab. Each reads its widgets, calls
:mod:`attnviz.pagelogic.explore_heads` and shows the figures it returns."""

import dataclasses
import functools

import streamlit as st

from attnviz.core import mask_patterns, vision
from attnviz.models.record import TooLongForDense, dense_token_limit
from attnviz.pagelogic.clicks import clicked_layer_head, selected_points
from attnviz.pagelogic.explore_heads.bertviz_view import bertviz_html
from attnviz.pagelogic.explore_heads.compare import compare_figures
from attnviz.pagelogic.explore_heads.detectors import MATRIX_TOKEN_LIMIT, PATTERN_KINDS, PatternProblem, detector_figure
from attnviz.pagelogic.explore_heads.export import capture_npz, figure_html, matrix_csv, matrix_json, shown_matrix
from attnviz.pagelogic.explore_heads.images import every_head_view, overlay_view
from attnviz.pagelogic.explore_heads.matrices import head_heatmap
from attnviz.pagelogic.explore_heads.options import ViewOptions
from attnviz.pagelogic.explore_heads.qk import query_key, query_key_figures
from attnviz.pagelogic.explore_heads.statistics import (
    label_rules_text,
    statistic_figure,
    statistics_column_config,
    statistics_that_apply,
)
from attnviz.pagelogic.explore_heads.views import view_figure
from attnviz.pagelogic.explore_heads.whatif import (
    MODEL_OWN_MASK,
    what_if,
    what_if_caption,
    what_if_effect,
    what_if_mask,
    what_if_mask_label,
    what_if_masks,
)
from attnviz.ui.caches.explore_heads import cached_detector, cached_statistics
from attnviz.ui.captures import capture_current
from attnviz.ui.explore_controls import VIEW_CONTROL_KEYS, keep_hidden_choices, open_head
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, transient_status
from attnviz.ui.messages import queries_unavailable
from attnviz.ui.pattern_widgets import pattern_widgets
from attnviz.viz import style
from attnviz.viz.heads import head_grid
from attnviz.viz.matrix import HALF_WIDTH


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
    show_figure(*overlay_view(capture, layer, mode, head, query, chosen["opacity"]), key="explore_image_overlay",
                on_select=lambda: on_patch_click(layout))
    if mode != "rollout":
        show_figure(*every_head_view(capture, layer, query, chosen["opacity"]), key="explore_image_heads")
    st.caption(vision.UPLOAD_HINT)


def current_head_options() -> ViewOptions:
    """The page's Layer and Head as the tabs that only read them (head statistics' outline) see them."""
    return ViewOptions(layer=int(st.session_state.get("layer", 0)), head=int(st.session_state.get("head", 0)))
