"""Attention step by step: the five steps of softmax(QK^T/sqrt(d_k))V on a small example you can edit."""

import zlib

import pandas as pd
import streamlit as st

from attnviz.core import mask_patterns, masks, stepwise
from attnviz.pagelogic.step_by_step import scaled_scores_words
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, presenting, setup_area, start_page
from attnviz.ui.pattern_widgets import pattern_widgets
from attnviz.ui.sidebar import current_sentence
from attnviz.viz.matrix import FULL_WIDTH, HALF_WIDTH, SIGNED, SignedScale, matrix_heatmap
from attnviz.viz.style import format_number, token_labels

INTRO = ("Every number below is computed live from the Q, K and V tables. Edit a cell, change the mask or the "
         "score function, and watch each step change.")
SIDE_BY_SIDE_KEYS = 6  # up to this many keys, two steps sit side by side with their numbers readable
STEP_1_CAPTIONS = {
    "scaled_dot": "Q·Kᵀ: how well each query matches each key. Red = strong match, blue = mismatch.",
    "dot": "Q·Kᵀ: how well each query matches each key. Red = strong match, blue = mismatch.",
    "general": "Q·W·Kᵀ with a seeded random W standing in for a learned one: a bilinear match of queries and keys.",
    "additive": "vᵀ·tanh(W_q·q + W_k·k): a small network (seeded random weights here) scores each pair; tanh keeps "
                "the scores bounded.",
}
FORMULAS = {  # the formula of the chosen score function, above the page
    "scaled_dot": r"\mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + \mathrm{mask}\right) V",
    "dot": r"\mathrm{softmax}\!\left(Q K^\top + \mathrm{mask}\right) V",
    "general": r"\mathrm{softmax}\!\left(Q W K^\top + \mathrm{mask}\right) V",
    "additive": r"\mathrm{softmax}\!\left(v^\top \tanh(W_q q_i + W_k k_j) + \mathrm{mask}\right) V",
}


def controls() -> dict:
    columns = st.columns([3, 2, 2, 2])
    chosen = {
        "score_function": columns[0].selectbox(
            "Score function", list(stepwise.SCORE_FUNCTIONS), format_func=stepwise.SCORE_FUNCTIONS.get,
            key="sbs_score_function", bind="query-params",
            help="Where scaled dot product came from: additive and general scores need learned weights (seeded here).",
        ),
        "source": st.session_state.get("sbs_source", "From the sentence"),
    }
    typed = chosen["source"] != "From the sentence"
    chosen["d_k"] = columns[1].slider(
        "Columns of the example to start from" if typed else "d_k (columns of Q and K)", 1, stepwise.MAX_DIM, 4,
        key="sbs_d_k", bind="query-params",
        help="With typed matrices, d_k is the number of columns you type; this only sets the example they start from."
        if typed else None,
    )
    chosen["mask"] = columns[2].selectbox("Mask", mask_patterns.shown_in(mask_patterns.STEP),
                                          format_func=mask_patterns.label, key="sbs_mask", bind="query-params")
    chosen["mask_params"] = pattern_widgets(chosen["mask"], mask_patterns.STEP, [columns[3]], stepwise.MAX_TOKENS,
                                            prefix="sbs")
    return chosen


def source_control() -> int:
    """Where Q, K and V come from (read by :func:`controls` from the session, drawn with the tables), and the seed
    of the random embeddings and projections they are made with; returns the seed."""
    left, right = st.columns([4, 1])
    seed = int(right.number_input("Seed", 0, 2**31 - 1, 0, key="sbs_seed", help="Seeds the random projections."))
    left.radio(
        "Q, K and V", ["From the sentence", "Type numbers by hand"], horizontal=True, key="sbs_source",
        help="From the sentence: each word gets a seeded random embedding x, and Q = xW_Q, K = xW_K, V = xW_V.",
    )
    return seed


def matrix_to_text(matrix) -> str:
    return "\n".join(" ".join(f"{value:g}" for value in row) for row in matrix.tolist())


def qkv_from_the_sentence(d_k: int, seed: int):
    tokens, was_cut = stepwise.tokens_of(current_sentence())
    if not tokens:
        st.warning("The sentence in the sidebar is empty. Type a few words there to build Q, K and V.")
        st.stop()
    if was_cut:
        st.info(f"This page takes the first {stepwise.MAX_TOKENS} words of the sentence.")
    prefill = stepwise.prefill_qkv(tokens, d_k, seed)
    labels = token_labels(tokens)
    columns = [f"d{j + 1}" for j in range(d_k)]
    # A new key whenever the prefill changes, so stale cell edits never land on other rows.
    version = zlib.crc32(f"{tokens}|{d_k}|{seed}".encode())
    tables = {}
    areas = figure_columns(3, key="sbs_qkv", min_width=300, gap="xsmall")  # three tables in a row at 1440 px
    for column, name in zip(areas, ("Q", "K", "V"), strict=True):
        frame = pd.DataFrame(prefill[name].numpy(), index=labels, columns=columns)
        column.markdown(f"**{name}** = X·W_{name} &nbsp; `[{len(tokens)} × {d_k}]`")
        tables[name] = column.data_editor(
            frame, key=f"sbs_edit_{name}_{version}",
            column_config={c: st.column_config.NumberColumn(c, format="%.3g") for c in columns},
        )
    q, k, v = (stepwise.parse_matrix(tables[name], name) for name in ("Q", "K", "V"))
    return q, k, v, labels, labels


def qkv_typed_by_hand(d_k: int, seed: int):
    default_tokens, _ = stepwise.tokens_of(current_sentence())
    default = stepwise.prefill_qkv(default_tokens or ["attention"], d_k, seed)
    st.caption("One row per line, numbers separated by spaces or commas. Q and K need the same number of columns.")
    # Keyed by the example's size and seed: moving either starts again from its new example (a box keeps what was
    # typed in it otherwise, and the two controls would change nothing).
    texts = {
        name: area.text_area(f"{name}", matrix_to_text(default[name]), height=200,
                             key=f"sbs_text_{name}_{d_k}_{seed}")
        for area, name in zip(figure_columns(3, key="sbs_typed", min_width=300), ("Q", "K", "V"), strict=True)
    }
    q, k, v = (stepwise.parse_matrix_text(texts[name], name) for name in ("Q", "K", "V"))
    return q, k, v, [f"q{i}" for i in range(q.shape[0])], [f"k{j}" for j in range(k.shape[0])]


def show_steps(steps: stepwise.AttentionSteps, v, query_labels, key_labels, mask_name: str) -> None:
    if steps.mask is not None:
        seen = masks.keys_per_query(steps.mask).tolist()
        st.markdown(
            f"**Mask:** {mask_name}. Each query sees between {min(seen)} and {max(seen)} of the {len(key_labels)} "
            f"keys (density {masks.density(steps.mask):.0%})."
        )
    bound = stepwise.score_colour_bound(steps)
    # Two figures a row while their numbers fit in half the width; one a row (numbers kept) for more keys.
    side_by_side = len(key_labels) <= SIDE_BY_SIDE_KEYS
    width = HALF_WIDTH if side_by_side else FULL_WIDTH
    left, right = st.columns(2) if side_by_side else (st.container(), st.container())
    with left:
        show_figure(matrix_heatmap(steps.scores, query_labels, key_labels, title="Step 1 · Scores",
                                   scale=SignedScale(bound=bound), width=width),
                    STEP_1_CAPTIONS[steps.score_function], key="sbs_fig_scores")
    with right:
        title, caption = scaled_scores_words(steps)
        show_figure(matrix_heatmap(steps.scaled_scores, query_labels, key_labels, title=title,
                                   scale=SignedScale(bound=bound), width=width),
                    caption, key="sbs_fig_scaled")
    st.caption(f"Steps 1 to 3 share one colour scale, −{bound:.3g} to +{bound:.3g}.")
    left, right = st.columns(2) if side_by_side else (st.container(), st.container())
    with left:
        show_figure(
            matrix_heatmap(steps.masked_scores, query_labels, key_labels, title="Step 3 · Masked scores",
                           scale=SignedScale(bound=bound), width=width),
            "Grey cells are set to −∞: e^−∞ = 0, so those keys get no weight."
            if steps.mask is not None else "No mask: every query may look at every key.",
            key="sbs_fig_masked",
        )
    with right:
        row_sums = steps.weights.sum(dim=-1).tolist()
        empty = steps.mask is not None and not bool(steps.mask.any(-1).all())
        show_figure(
            matrix_heatmap(steps.weights, query_labels, key_labels, title="Step 4 · Weights = softmax of each row",
                           width=width),
            "Each row is a probability distribution over keys; row sums: "
            + ", ".join(format_number(s) for s in row_sums) + "."
            + (" A row with no allowed key is set to 0 here (a plain softmax would give NaN)." if empty else ""),
            key="sbs_fig_weights",
        )
    value_labels = [f"d{j + 1}" for j in range(v.shape[1])]
    show_figure(
        matrix_heatmap(steps.output, query_labels, value_labels, title="Step 5 · Output = weights · V", scale=SIGNED,
                       x_title="dimension"),
        "Each output row is a weighted average of V's rows, mixed by that query's weights.",
        key="sbs_fig_output",
    )
    with st.expander("Exact weights (copy or download)"):
        weights_frame = pd.DataFrame(steps.weights.numpy(), index=query_labels, columns=key_labels)
        st.dataframe(weights_frame)
        st.download_button("Download weights as CSV", weights_frame.to_csv(), "attention_weights.csv", "text/csv",
                           on_click="ignore")


def main() -> None:
    start_page("Attention step by step")
    formula = st.empty()  # filled once the score function is chosen
    if not presenting():  # on a projector it opens the Q, K and V area below, and the steps come up sooner
        st.caption(INTRO)
    chosen = controls()
    formula.latex(r"\mathrm{Attention}(Q, K, V) = " + FORMULAS[chosen["score_function"]])
    try:
        with setup_area("Q, K and V: edit the numbers"):  # on a projector, the steps come first
            if presenting():
                st.caption(INTRO)
            chosen["seed"] = source_control()
            if chosen["source"] == "From the sentence":
                q, k, v, query_labels, key_labels = qkv_from_the_sentence(chosen["d_k"], chosen["seed"])
            else:
                q, k, v, query_labels, key_labels = qkv_typed_by_hand(chosen["d_k"], chosen["seed"])
        stepwise.check_qkv(q, k, v)
    except stepwise.InputError as problem:
        st.error(f"{problem}")
        st.stop()
    params = chosen["mask_params"]
    mask = None
    if chosen["mask"] != "full":
        mask = mask_patterns.build(chosen["mask"], q.shape[0], k.shape[0], **params).mask
    steps = stepwise.attention_steps(q, k, v, score_function=chosen["score_function"], mask=mask, seed=chosen["seed"])
    show_steps(steps, v, query_labels, key_labels, mask_patterns.label(chosen["mask"]))


main()
