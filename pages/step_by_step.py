"""Attention step by step: the five steps of softmax(QK^T/sqrt(d_k))V on a small example you can edit."""

import math
import zlib

import pandas as pd
import streamlit as st

from attnviz import masks, stepwise
from attnviz.ui import current_sentence, show_figure
from attnviz.viz.matrix import matrix_heatmap
from attnviz.viz.style import format_number, token_labels

st.title("Attention step by step")
st.latex(r"\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + \mathrm{mask}\right) V")
st.caption(
    "Every number below is computed live from the Q, K and V tables. Edit a cell, change the mask or the score "
    "function, and watch each step change."
)

controls = st.columns([3, 2, 2, 2, 1])
score_function = controls[0].selectbox(
    "Score function",
    list(stepwise.SCORE_FUNCTIONS),
    format_func=stepwise.SCORE_FUNCTIONS.get,
    key="sbs_score_function",
    bind="query-params",
    help="Where scaled dot product came from: additive and general scores need learned weights (seeded here).",
)
d_k = controls[1].slider("d_k (columns of Q and K)", 1, stepwise.MAX_DIM, 4, key="sbs_d_k", bind="query-params")
mask_kind = controls[2].selectbox("Mask", ["none", "causal", "sliding window"], key="sbs_mask", bind="query-params")
window_left = window_right = 0
if mask_kind == "sliding window":
    window_left = controls[3].slider("Keys to the left", 0, stepwise.MAX_TOKENS - 1, 2, key="sbs_left")
    window_right = controls[3].slider("Keys to the right", 0, stepwise.MAX_TOKENS - 1, 0, key="sbs_right")
seed = controls[4].number_input("Seed", 0, 2**31 - 1, 0, key="sbs_seed", help="Seeds the random projections.")

source = st.radio(
    "Q, K and V",
    ["From the sentence", "Type numbers by hand"],
    horizontal=True,
    key="sbs_source",
    help="From the sentence: each word gets a seeded random embedding x, and Q = xW_Q, K = xW_K, V = xW_V.",
)


def matrix_to_text(matrix) -> str:
    return "\n".join(" ".join(f"{value:g}" for value in row) for row in matrix.tolist())


try:
    if source == "From the sentence":
        tokens, was_cut = stepwise.tokens_of(current_sentence())
        if not tokens:
            st.warning("The sentence in the sidebar is empty. Type a few words there to build Q, K and V.")
            st.stop()
        if was_cut:
            st.info(f"This page takes the first {stepwise.MAX_TOKENS} words of the sentence.")
        prefill = stepwise.prefill_qkv(tokens, d_k, int(seed))
        labels = token_labels(tokens)
        query_labels = key_labels = labels
        columns = [f"d{j + 1}" for j in range(d_k)]
        # A new key whenever the prefill changes, so stale cell edits never land on other rows.
        version = zlib.crc32(f"{tokens}|{d_k}|{seed}".encode())
        editors = st.columns(3)
        tables = {}
        for column, name in zip(editors, ("Q", "K", "V")):
            frame = pd.DataFrame(prefill[name].numpy(), index=labels, columns=columns)
            column.markdown(f"**{name}** = X·W_{name} &nbsp; `[{len(tokens)} × {d_k}]`")
            tables[name] = column.data_editor(
                frame,
                key=f"sbs_edit_{name}_{version}",
                column_config={c: st.column_config.NumberColumn(c, format="%.3g") for c in columns},
            )
        q, k, v = (stepwise.parse_matrix(tables[name], name) for name in ("Q", "K", "V"))
    else:
        default_tokens, _ = stepwise.tokens_of(current_sentence())
        default = stepwise.prefill_qkv(default_tokens or ["attention"], d_k, int(seed))
        st.caption("One row per line, numbers separated by spaces or commas. Q and K need the same number of columns.")
        areas = st.columns(3)
        texts = {
            name: area.text_area(f"{name}", matrix_to_text(default[name]), height=200, key=f"sbs_text_{name}")
            for area, name in zip(areas, ("Q", "K", "V"))
        }
        q, k, v = (stepwise.parse_matrix_text(texts[name], name) for name in ("Q", "K", "V"))
        query_labels = [f"q{i}" for i in range(q.shape[0])]
        key_labels = [f"k{j}" for j in range(k.shape[0])]
    stepwise.check_qkv(q, k, v)
except stepwise.InputError as problem:
    st.error(f"{problem}")
    st.stop()

n_q, n_k = q.shape[0], k.shape[0]
if mask_kind == "causal":
    mask = masks.causal(n_q, n_k)
elif mask_kind == "sliding window":
    mask = masks.sliding_window(n_q, window_left, window_right, n_k=n_k)
else:
    mask = None
steps = stepwise.attention_steps(q, k, v, score_function=score_function, mask=mask, seed=int(seed))

if mask is not None:
    seen = masks.keys_per_query(mask).tolist()
    st.markdown(
        f"**Mask:** {mask_kind}. Each query sees between {min(seen)} and {max(seen)} of the {n_k} keys "
        f"(density {masks.density(mask):.0%})."
    )

left, right = st.columns(2)
with left:
    show_figure(
        matrix_heatmap(steps.scores, query_labels, key_labels, title="Step 1 · Scores", kind="signed"),
        {
            "scaled_dot": "Q·Kᵀ: how well each query matches each key. Red = strong match, blue = mismatch.",
            "dot": "Q·Kᵀ: how well each query matches each key. Red = strong match, blue = mismatch.",
            "general": "Q·W·Kᵀ with a seeded W: a learned bilinear match between queries and keys.",
            "additive": "vᵀ·tanh(W_q·q + W_k·k): a small network scores each pair; tanh keeps scores bounded.",
        }[score_function],
        key="sbs_fig_scores",
    )
with right:
    if score_function == "scaled_dot":
        title = f"Step 2 · Scaled scores (÷ √{d_k} = ÷ {math.sqrt(d_k):.3g})"
        caption = "Dividing by √d_k keeps the scores' spread near 1 whatever d_k is, so the softmax does not saturate."
    else:
        title = "Step 2 · Scaled scores (no scaling for this score function)"
        caption = "This score function has no √d_k: with large d_k its softmax saturates (see Scaling and softmax)."
    show_figure(
        matrix_heatmap(steps.scaled_scores, query_labels, key_labels, title=title, kind="signed"),
        caption,
        key="sbs_fig_scaled",
    )

left, right = st.columns(2)
with left:
    show_figure(
        matrix_heatmap(steps.masked_scores, query_labels, key_labels, title="Step 3 · Masked scores", kind="signed"),
        "Grey cells are set to −∞: e^−∞ = 0, so those keys get no weight."
        if mask is not None
        else "No mask: every query may look at every key.",
        key="sbs_fig_masked",
    )
with right:
    row_sums = steps.weights.sum(dim=-1).tolist()
    show_figure(
        matrix_heatmap(steps.weights, query_labels, key_labels, title="Step 4 · Weights = softmax of each row"),
        "Each row is a probability distribution over keys; row sums: "
        + ", ".join(format_number(s) for s in row_sums)
        + ".",
        key="sbs_fig_weights",
    )

value_labels = [f"d{j + 1}" for j in range(v.shape[1])]
show_figure(
    matrix_heatmap(
        steps.output, query_labels, value_labels, title="Step 5 · Output = weights · V", kind="signed", x_title="dimension"
    ),
    "Each output row is a weighted average of V's rows, mixed by that query's weights.",
    key="sbs_fig_output",
)

with st.expander("Exact weights (copy or download)"):
    weights_frame = pd.DataFrame(steps.weights.numpy(), index=query_labels, columns=key_labels)
    st.dataframe(weights_frame)
    st.download_button("Download weights as CSV", weights_frame.to_csv(), "attention_weights.csv", "text/csv")
