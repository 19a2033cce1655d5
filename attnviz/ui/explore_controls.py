"""Explore heads' controls above its tabs, drawn with Streamlit: the Layer and Head boxes (rollout's own layer box),
the token filters, the lines view's choices, the colour scale and a long text's pooling; the callback that opens a
head in the View tab, and the values hidden controls keep. The page's ``view_options`` puts them together."""

import streamlit as st

from attnviz.core import analysis
from attnviz.pagelogic.explore_heads.matrices import POOL_LIMIT, ZOOM_SIZES
from attnviz.pagelogic.explore_heads.options import (
    BLOCKS,
    GRID_SCALES,
    LONG_TEXT,
    SCALES,
    VIEWS,
    automatic_scale,
)
from attnviz.pagelogic.explore_heads.views import LINES_TOKEN_LIMIT
from attnviz.viz import style


def open_head(layer: int, head: int) -> None:
    """Callback (runs before the widgets exist, so their state may be set)."""
    st.session_state["layer"], st.session_state["head"] = layer, head
    st.session_state["view"] = "head"
    st.session_state["explore_tab"] = "View"


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
