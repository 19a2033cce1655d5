"""Scaling and softmax: why scores are divided by sqrt(d_k), measured."""

import math

import pandas as pd
import streamlit as st
import torch

from attnviz import scaling
from attnviz.ui import capture_current, current_sentence, show_figure
from attnviz.viz import style
from attnviz.viz.charts import bar_chart, histogram, line_chart
from attnviz.viz.matrix import heatmap_row

st.title("Scaling and softmax")
st.latex(r"q \cdot k = \sum_{i=1}^{d_k} q_i k_i,\qquad \mathrm{Var}(q\cdot k) = d_k \;\Rightarrow\; \mathrm{Var}\!\left(\tfrac{q\cdot k}{\sqrt{d_k}}\right) = 1")

st.subheader("1 · Dot products grow with d_k")
columns = st.columns(3)
seed = columns[0].number_input("Seed", 0, 10_000, 0, key="scale_seed")
samples = columns[1].select_slider("Samples", [500, 1000, 4000, 16000], 4000, key="scale_samples")
d_hist = columns[2].select_slider("d_k for the histogram", scaling.D_K_VALUES, 64, key="scale_d_hist")
variance = scaling.dot_product_variance(scaling.D_K_VALUES, samples, int(seed))
left, right = st.columns(2)
with left:
    show_figure(
        line_chart(
            [r["d_k"] for r in variance],
            {
                "measured Var(q·k)": [r["measured"] for r in variance],
                "theory: d_k": [r["theory"] for r in variance],
                "measured Var(q·k / √d_k)": [r["measured_scaled"] for r in variance],
            },
            title="Variance of q·k for random unit-variance vectors", x_title="d_k", y_title="variance",
            log_x=True, log_y=True, markers=True, dashed={"theory: d_k"},
        ),
        "The measured variance follows d_k exactly; dividing by √d_k brings it back to 1 at every size.",
        key="scale_variance",
    )
with right:
    dots = scaling.dot_samples(d_hist, samples, int(seed))
    show_figure(
        histogram({"q·k": dots.tolist(), "q·k / √d_k": (dots / math.sqrt(d_hist)).tolist()},
                  title=f"Distribution of scores at d_k = {d_hist}", x_title="score"),
        f"Unscaled scores spread over ±{2 * math.sqrt(d_hist):.3g} (2σ); scaled ones stay within about ±2.",
        key="scale_histogram",
    )

st.subheader("2 · Softmax saturates without scaling, and its gradient vanishes")
columns = st.columns(2)
d_k = columns[0].select_slider("d_k", scaling.D_K_VALUES, 256, key="scale_d", bind="query-params")
n_keys = columns[1].select_slider("Keys per query", [8, 16, 32, 64, 128], 32, key="scale_keys")
statistics = scaling.softmax_statistics(scaling.D_K_VALUES, n_keys=n_keys, seed=int(seed))
xs = [r["d_k"] for r in statistics]
columns = st.columns(3)
for column, (stat, label, caption) in zip(
    columns,
    (
        ("entropy", "entropy (nats)", f"Scaled stays near its maximum log {n_keys} = {math.log(n_keys):.2f}; unscaled collapses to 0."),
        ("max_weight", "largest weight", "Without scaling one key takes almost all the weight: a one-hot softmax."),
        ("jacobian", "‖∂softmax/∂scores‖", "The softmax Jacobian goes to 0 as it saturates: no gradient reaches Q and K."),
    ),
):
    with column:
        show_figure(
            line_chart(
                xs, {"÷ √d_k": [r[f"{stat}_scaled"] for r in statistics], "unscaled": [r[f"{stat}_unscaled"] for r in statistics]},
                title=label, x_title="d_k", y_title=label, log_x=True, markers=True,
                vlines={f"d_k = {d_k}": d_k}, height=320,
            ),
            caption,
            key=f"scale_stat_{stat}",
        )
rows = {name: scaling.softmax_rows(d_k, n_keys, 1, int(seed), scaled)[0] for name, scaled in (("÷ √d_k", True), ("unscaled", False))}
left, right = st.columns(2)
for column, (name, weights) in zip((left, right), rows.items()):
    ordered = weights.sort(descending=True).values
    with column:
        show_figure(
            bar_chart([str(i) for i in range(n_keys)], ordered.tolist(), title=f"One query's weights, sorted: {name}",
                      y_title="weight", height=300),
            f"Entropy {scaling.entropy(weights).item():.3g} nats, largest weight {ordered[0].item():.3g}, "
            f"Jacobian norm {scaling.jacobian_norm(weights).item():.3g}.",
            key=f"scale_row_{name}",
        )

st.subheader("3 · The same on a real head")
bundle, capture = capture_current(current_sentence())
record = capture.records[capture.kinds[0]]
columns = st.columns(3)
layer = columns[0].number_input("Layer", 0, record.n_layers - 1, 0, key="scale_layer")
head = columns[1].number_input("Head", 0, record.n_heads - 1, 0, key="scale_head")
temperature = columns[2].slider("Temperature T", 0.1, 5.0, 2.0, 0.1, key="scale_temperature")
versions = scaling.real_head_scalings(record, int(layer), int(head), temperature)
labels = style.token_labels(record.key_tokens)
entropies = {name: scaling.entropy(w).mean().item() for name, w in versions.items()}
show_figure(
    heatmap_row(list(versions.values()), [f"{name}<br>entropy {entropies[name]:.2f}" for name in versions], labels, labels,
                title=f"{bundle.name}, layer {layer}, head {head}: its real Q and K with three scalings"),
    f"d_k = {record.queries.shape[-1]}: without the 1/√d_k the real head turns nearly one-hot; T > 1 flattens it, T < 1 sharpens it.",
    key="scale_real",
)

st.subheader("4 · Numerical stability: subtract the max")
st.markdown(
    "softmax(x) = softmax(x − max x) exactly, but only the second form keeps every exponent ≤ 0. Written naively, "
    "e^x overflows: fp16 at x > 11.1, fp32 at x > 88.7."
)
scales = st.multiselect("Largest logit", [5, 10, 50, 100, 1000, 10000], default=[10, 50, 100, 1000], key="scale_logits")
table = pd.DataFrame(scaling.stability_table(sorted(scales), {"fp16": torch.float16, "fp32": torch.float32}, int(seed)))
if not table.empty:
    st.dataframe(
        table.style.format({"max |error| vs fp64": "{:.2e}"}).map(
            lambda finite: "color: #b00020; font-weight: bold" if finite is False else "", subset=["finite"]
        ),
        hide_index=True,
    )
    failures = table[(table["method"] == "naive") & (~table["finite"])]
    st.caption(
        f"The naive form fails in {len(failures)} of {len(table) // 2} cases; the max-subtracted form never does. "
        "Every attention kernel, flash attention included, keeps a running max for this reason."
    )
