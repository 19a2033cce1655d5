"""Explore heads: what every head of a real pretrained model attends to, for any sentence."""

import streamlit as st

from attnviz import explore
from attnviz.viz import style
from attnviz.viz.heads import head_grid, head_sharing
from attnviz.viz.matrix import matrix_heatmap
from attnviz.ui import (
    cached_replay_difference,
    cached_statistics,
    capture_current,
    current_bundle,
    current_model_name,
    current_sentence,
    registered_models,
    show_figure,
)

st.title("Explore heads")
if current_bundle().uses_fallback_tokenizer:
    st.warning(current_bundle().tokenizer_note, icon=":material/warning:")
    st.radio(
        "Stand-in tokenizer (this checkpoint has none)", ["whitespace", "bytes"], horizontal=True,
        key="fallback_tokenizer", help="Whitespace: one token per word. Bytes: one token per UTF-8 byte.",
    )


def on_figure_click() -> None:
    """Callback of the grid and lines views: a click on a thumbnail opens that head; on a query token, follows it."""
    selection = st.session_state.get("explore_main_figure")
    points = (selection or {}).get("selection", {}).get("points", []) if isinstance(selection, dict) else (
        selection.selection.points if selection is not None else []
    )
    for point in points:
        data = point.get("customdata")
        if data and len(data) == 2:  # a grid thumbnail: (layer, head)
            open_head(int(data[0]), int(data[1]))
            return
        if data and len(data) == 1:  # a query token of the lines view: follow it, or stop following it
            position = int(data[0])
            following = st.session_state.get("explore_follow", [])
            st.session_state["explore_follow"] = [] if following == [position] else [position]
            return


def open_head(layer: int, head: int) -> None:
    """Callback (runs before the widgets exist, so their state may be set)."""
    st.session_state["layer"], st.session_state["head"] = layer, head
    st.session_state["view"] = "head"
    st.session_state["explore_tab"] = "View"


text = current_sentence()
if current_bundle().architecture == "encoder-decoder":
    pair_label, pair_help = "Decoder input (empty: the sentence itself)", "What the decoder reads; its queries attend to the encoder's keys."
else:
    pair_label, pair_help = "Second sentence (B), optional", "A sentence pair (A, B), as in BERT's training: filter by block below."
text_pair = st.text_input(pair_label, key="explore_pair", max_chars=2000, help=pair_help)
bundle, capture = capture_current(text, text_pair)
name = current_model_name()
folder = registered_models()[name]
st.caption(f"**{name}** · {bundle.describe()}")
if capture.truncated:
    st.warning(
        f"The text has {capture.n_tokens_before_truncation} tokens; this model reads at most {bundle.max_positions}. "
        f"Showing the first {len(capture.tokens)}.",
        icon=":material/content_cut:",
    )

kinds = capture.kinds
kind = kinds[0]
if len(kinds) > 1:
    kind = st.segmented_control(
        "Attention", kinds, default=kinds[0], format_func=explore.KIND_NAMES.get, key="explore_kind", required=True
    )
record = capture.records[kind]

difference = cached_replay_difference(folder, name, text, text_pair or None, kind, record)
n_heads_total = record.n_layers * record.n_heads
verdict = ":material/check_circle:" if difference < 1e-5 else ":material/warning:"
shown = "exactly 0" if difference == 0 else f"{difference:.2e}"
st.markdown(
    f"{verdict} **Replay check:** recomputing all {n_heads_total} heads from the model's own Q and K with attnviz's "
    f"from-scratch attention differs from the model's weights by at most **{shown}**."
)

controls = st.columns([2, 2, 5])
layer = controls[0].number_input("Layer", 0, record.n_layers - 1, 0, key="layer", bind="query-params")
head = controls[1].number_input("Head", 0, record.n_heads - 1, 0, key="head", bind="query-params")
view = controls[2].segmented_control(
    "View", list(explore.VIEWS), format_func=explore.VIEWS.get, default="head", key="view", required=True,
    bind="query-params",
)

filters = st.columns([3, 3, 2, 4])
hide_special = filters[0].toggle("Hide special tokens", key="explore_hide_special", help="[CLS], [SEP], <s>, padding")
renormalise = filters[1].toggle(
    "Renormalise rows", value=True, key="explore_renormalise",
    help="After hiding tokens, rescale each row to sum to 1 again (on), or keep the model's weights (off).",
)
block = "all"
if text_pair and kind in ("self", "encoder") and bundle.architecture != "encoder-decoder":
    block = filters[2].selectbox("Sentence block", explore.BLOCKS, key="explore_block", help="query → key")
token_options = list(range(len(record.query_tokens)))
follow = filters[3].multiselect(
    "Follow query tokens", token_options, format_func=lambda i: f"{i} · {record.query_tokens[i]}",
    key="explore_follow", help="In the lines view, draw only these queries' lines.",
)
line_heads = None
if view == "lines":
    line_heads = st.multiselect(
        "Heads to draw", list(range(record.n_heads)), default=[int(head)], key="explore_line_heads",
        help="One colour per head.",
    )

options = explore.ViewOptions(
    kind=kind, layer=int(layer), head=int(head), view=view, hide_special=hide_special, renormalise=renormalise,
    block=block, follow=follow, line_heads=line_heads,
)

tabs = st.tabs(
    ["View", "Head statistics", "Compare two sentences", "What-if", "bertviz (online)", "Export"],
    key="explore_tab", on_change="rerun", bind="query-params",
)
view_tab, stats_tab, compare_tab, what_if_tab, bertviz_tab, export_tab = tabs

with view_tab:
    try:
        figure, caption = explore.view_figure(capture, options)
    except ValueError as problem:
        st.warning(str(problem))
    else:
        show_figure(figure, caption, key="explore_main_figure",
                    on_select=on_figure_click if options.view in ("grid", "lines") else None)
    if record.n_kv_heads != record.n_heads:
        show_figure(
            head_sharing(record.n_heads, record.n_kv_heads, title=f"{record.n_heads} query heads share {record.n_kv_heads} K/V heads"),
            "Grouped-query attention: heads of one colour read the same keys and values, so their patterns are related.",
            key="explore_sharing",
        )

if stats_tab.open:
    with stats_tab:
        try:
            table = cached_statistics(folder, name, text, text_pair or None, kind, capture)
        except ValueError as problem:
            st.info(str(problem))
        else:
            st.markdown("Labels: " + explore.label_rules_text())
            selection = st.dataframe(
                table.style.format(precision=3), key="explore_stats_table", on_select="rerun",
                selection_mode="single-row", hide_index=True, height=420,
            )
            rows = selection.selection.rows if selection else []
            if rows:
                picked = table.iloc[rows[0]]
                st.session_state["explore_open_head"] = (int(picked["layer"]), int(picked["head"]))
            if st.session_state.get("explore_open_head"):
                picked_layer, picked_head = st.session_state["explore_open_head"]
                st.markdown(f"Selected: layer {picked_layer}, head {picked_head}.")
                st.button(
                    "Open this head in the View tab", key="explore_open_button", on_click=open_head,
                    args=(picked_layer, picked_head),
                )
                picked_options = explore.ViewOptions(kind=kind, layer=picked_layer, head=picked_head)
                figure, caption = explore.view_figure(capture, picked_options)
                show_figure(figure, caption, key="explore_stats_figure")

if compare_tab.open:
    with compare_tab:
        other_text = st.text_input(
            "Second text to compare", value=text.replace("cat", "dog", 1) if "cat" in text else text,
            key="explore_compare_text", max_chars=2000,
        )
        if other_text.strip():
            _, other = capture_current(other_text, text_pair)
            figures, caption = explore.compare_figures(capture, other, kind, int(layer), int(head))
            columns = st.columns(2)
            for index, (column, figure) in enumerate(zip(columns, figures[:2])):
                with column:
                    show_figure(figure, "The same head on each text.", key=f"explore_compare_{index}")
            if len(figures) > 2:
                show_figure(figures[2], caption, key="explore_compare_difference")
            else:
                st.info(caption)

if what_if_tab.open:
    with what_if_tab:
        st.markdown(
            "Re-run this layer's **real** queries and keys through attnviz's attention with another mask or scale. "
            "Before = the model; after = the same Q and K under your rule."
        )
        cols = st.columns(4)
        mask_kind = cols[0].selectbox("Mask", explore.WHAT_IF_MASKS, key="whatif_mask")
        unscaled = cols[1].toggle("Remove the 1/√d_k scaling", key="whatif_unscaled")
        temperature = cols[1].slider("Temperature", 0.1, 5.0, 1.0, 0.1, key="whatif_temperature")
        n_q, n_k = record.weights.shape[-2:]
        params = {}
        if mask_kind == "sliding window":
            params["left"] = cols[2].number_input("Keys to the left", 0, n_k, 2, key="whatif_left")
            params["right"] = cols[2].number_input("Keys to the right", 0, n_k, 0, key="whatif_right")
        if mask_kind == "BigBird":
            params["block_size"] = cols[2].number_input("Block size", 1, 64, 2, key="whatif_block")
            params["window_blocks"] = cols[2].number_input("Window blocks", 0, 15, 3, key="whatif_window")
            params["global_blocks"] = cols[3].number_input("Global blocks", 0, 8, 1, key="whatif_global")
            params["random_blocks"] = cols[3].number_input("Random blocks", 0, 8, 1, key="whatif_random")
            params["seed"] = cols[3].number_input("Seed", 0, 10_000, 0, key="whatif_seed")
        try:
            new_mask = explore.what_if_mask(mask_kind, n_q, n_k, **{k: int(v) for k, v in params.items()})
            before, after = explore.what_if(record, int(layer), new_mask, unscaled=unscaled, temperature=temperature)
        except ValueError as problem:
            st.warning(str(problem))
        else:
            labels_q, labels_k = style.token_labels(record.query_tokens), style.token_labels(record.key_tokens)
            columns = st.columns(2)
            with columns[0]:
                show_figure(
                    matrix_heatmap(before[int(head)], labels_q, labels_k, title=f"Before: layer {layer}, head {head} (the model)",
                                   show_values=len(labels_k) <= 10),
                    "The model's own weights.", key="whatif_before",
                )
            with columns[1]:
                rule = mask_kind + (", no √d_k scaling" if unscaled else "") + (f", T = {temperature:g}" if temperature != 1 else "")
                show_figure(
                    matrix_heatmap(after[int(head)], labels_q, labels_k, title=f"After: {rule}", show_values=len(labels_k) <= 10),
                    "Masked keys lose their weight and the rest is renormalised; without scaling the softmax sharpens.",
                    key="whatif_after",
                )
            change = (after - before).abs().amax().item()
            show_figure(
                head_grid([before, after], title=f"All {record.n_heads} heads of layer {layer}, before and after",
                          row_names=["before", "after"], highlight=(0, int(head)), clickable=False),
                f"Every head of the layer under the same rule; the largest change of any weight is {change:.3g}.",
                key="whatif_all_heads",
            )

if bertviz_tab.open:
    with bertviz_tab:
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
                html = explore.bertviz_html(capture, kind, which)
            except ImportError:
                st.error("bertviz is not installed here: pip install bertviz.")
            else:
                st.iframe(html, height=900 if which == "model view" else 650)

with export_tab:
    st.markdown("Download what you see: the figure as a self-contained HTML file, and the numbers with their tokens.")
    cols = st.columns(4)
    try:
        figure, _ = explore.view_figure(capture, options)
        cols[0].download_button(
            "Figure (HTML)", lambda: explore.figure_html(figure), f"attnviz_{view}_L{layer}H{head}.html", "text/html",
            key="export_html",
        )
    except ValueError:
        cols[0].caption("No figure to export with these filters.")
    cols[1].download_button(
        "All tensors (.npz)", lambda: explore.capture_npz(capture), "attnviz_capture.npz", "application/octet-stream",
        key="export_npz",
    )
    cols[2].download_button(
        "This head (CSV)", lambda: explore.head_csv(record, int(layer), int(head)), f"attnviz_L{layer}H{head}.csv",
        "text/csv", key="export_csv",
    )
    cols[3].download_button(
        "This head (JSON)", lambda: explore.capture_json(capture, kind, int(layer), int(head)),
        f"attnviz_L{layer}H{head}.json", "application/json", key="export_json",
    )
    st.caption("Link to this view: copy the address bar; it holds the model, sentence, layer, head and view.")
