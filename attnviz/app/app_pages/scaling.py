"""Scaling and softmax: why scores are divided by sqrt(d_k), measured."""

import math

import pandas as pd
import streamlit as st

from attnviz.core import scaling
from attnviz.pagelogic.scaling import mean_largest_weight, real_head_scalings, saturation_captions
from attnviz.ui.caches.scaling import (
    SCALING_DEFAULTS,
    STABILITY_DTYPES,
    scaling_dot_samples,
    scaling_saturation_rows,
    scaling_stability_rows,
    scaling_variance_rows,
)
from attnviz.ui.captures import MECHANISM_TOKENS, capture_current
from attnviz.ui.figures import figure_once, show_figure
from attnviz.ui.frame import figure_columns, setup_area, start_page
from attnviz.ui.messages import queries_unavailable
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import style
from attnviz.viz.charts import bar_chart, histogram, line_chart
from attnviz.viz.matrix import heatmap_row


def variance_section() -> int:
    st.subheader("1 · Dot products grow with d_k")
    columns = st.columns([2, 3])
    d_hist = columns[0].select_slider("d_k for the histogram", scaling.D_K_VALUES, SCALING_DEFAULTS["d_hist"],
                                      key="scale_d_hist")
    with columns[1], setup_area("Seed and samples"):  # on a projector, the two figures come first
        inner = st.columns(2)
        seed = int(inner[0].number_input("Seed", 0, 10_000, SCALING_DEFAULTS["seed"], key="scale_seed"))
        samples = inner[1].select_slider("Samples", [500, 1000, 4000, 16000], SCALING_DEFAULTS["samples"],
                                         key="scale_samples")
    variance = scaling_variance_rows(samples, seed)
    worst = max(abs(r["measured"] / r["theory"] - 1) for r in variance)
    left, right = figure_columns(2, key="scaling_variance", min_width=400)
    with left:
        show_figure(
            figure_once(("scaling variance", samples, seed), lambda: line_chart(
                [r["d_k"] for r in variance],
                {
                    "measured Var(q·k)": [r["measured"] for r in variance],
                    "theory: d_k": [r["theory"] for r in variance],
                    "measured Var(q·k / √d_k)": [r["measured_scaled"] for r in variance],
                },
                title="Variance of q·k for random unit-variance vectors", x_title="d_k", y_title="variance",
                log_x=True, log_y=True, markers=True, dashed={"theory: d_k"},
            )),
            f"The measured variance follows d_k within {worst:.1%} at every size ({samples:,} samples each); dividing "
            "by √d_k brings it back to about 1.",
            key="scale_variance",
        )
    with right:
        dots = scaling_dot_samples(d_hist, samples, seed)
        scaled = dots / math.sqrt(d_hist)
        show_figure(
            figure_once(("scaling histogram", d_hist, samples, seed), lambda: histogram(
                {"q·k": dots.numpy(), "q·k / √d_k": scaled.numpy()},
                title=f"Distribution of scores at d_k = {d_hist}", x_title="score")),
            f"Unscaled scores have standard deviation {dots.std().item():.3g} (theory √{d_hist} = "
            f"{math.sqrt(d_hist):.3g}); scaled ones {scaled.std().item():.3g}.",
            key="scale_histogram",
        )
    return seed


def saturation_section(seed: int) -> None:
    st.subheader("2 · Softmax saturates without scaling, and its gradient vanishes")
    columns = st.columns(2)
    d_k = columns[0].select_slider("d_k", scaling.D_K_VALUES, 512, key="scale_d", bind="query-params")
    n_keys = columns[1].select_slider("Keys per query", [8, 16, 32, 64, 128], SCALING_DEFAULTS["n_keys"],
                                      key="scale_keys")
    statistics = scaling_saturation_rows(n_keys, seed)
    captions = saturation_captions(statistics, d_k, n_keys)
    xs = [r["d_k"] for r in statistics]
    statistic_names = (("entropy", "entropy (nats)"), ("max_weight", "largest weight"),
                       ("jacobian", "‖∂softmax/∂scores‖"))
    for column, (stat, label) in zip(figure_columns(3, key="scaling_statistics", min_width=260), statistic_names,
                                     strict=True):
        with column:
            show_figure(
                figure_once(("scaling statistic", stat, n_keys, seed, d_k), lambda stat=stat, label=label: line_chart(
                    xs, {"÷ √d_k": [r[f"{stat}_scaled"] for r in statistics],
                         "unscaled": [r[f"{stat}_unscaled"] for r in statistics]},
                    title=f"{label}<br>mean of {scaling.QUERIES_PER_POINT} queries", x_title="d_k",
                    y_title=label, log_x=True, markers=True, vlines={f"d_k = {d_k}": d_k}, height=320)),
                captions[stat],
                key=f"scale_stat_{stat}",
            )
    rows = {name: scaling.softmax_rows(d_k, n_keys, 1, seed, scaled)[0]
            for name, scaled in (("÷ √d_k", True), ("unscaled", False))}
    top = max(float(w.max()) for w in rows.values())
    for column, (name, weights) in zip(figure_columns(2, key="scaling_rows", min_width=400), rows.items(), strict=True):
        ordered = weights.sort(descending=True).values
        def build(name=name, ordered=ordered):
            figure = bar_chart([str(i) for i in range(n_keys)], ordered.tolist(),
                               title=f"One query's weights, sorted: {name}", y_title="weight", height=300)
            return figure.update_yaxes(range=[0, top * 1.1])  # both charts on one scale, so they can be compared

        with column:
            show_figure(
                figure_once(("scaling row", name, d_k, n_keys, seed), build),
                f"This query: entropy {scaling.entropy(weights).item():.3g} nats, largest weight "
                f"{ordered[0].item():.3g}, Jacobian norm {scaling.jacobian_norm(weights).item():.3g}.",
                key=f"scale_row_{name}",
            )


def real_head_section() -> None:
    st.subheader("3 · The same on a real head")
    bundle, capture, capture_key = capture_current(current_sentence(), max_tokens=MECHANISM_TOKENS)
    record = capture.records[capture.kinds[0]]
    if queries_unavailable(bundle, record, "Rescaling a real head"):
        return
    columns = st.columns(3)
    layer = int(columns[0].number_input("Layer", 0, record.n_layers - 1, 0, key="scale_layer"))
    head = int(columns[1].number_input("Head", 0, record.n_heads - 1, 0, key="scale_head"))
    temperature = columns[2].slider("Temperature T", 0.1, 5.0, 2.0, 0.1, key="scale_temperature")
    versions = real_head_scalings(record, layer, head, temperature)
    labels = style.token_labels(record.key_display)
    entropies = {name: scaling.entropy(w).mean().item() for name, w in versions.items()}
    allowed = record.allowed[layer]
    largest = {name: mean_largest_weight(w, allowed) for name, w in versions.items()}
    model_name, unscaled_name = list(versions)[:2]
    if abs(record.scales[layer] - 1.0) < 1e-12:
        verdict = ("this model applies no 1/√d_k (T5 folds it into its weights), so the first two panels are the "
                   "same")
    else:
        sharpness = "turns nearly one-hot" if largest[unscaled_name] >= 0.9 else "sharpens"
        verdict = (f"without the 1/√d_k this head {sharpness} (its largest weight averages "
                   f"{largest[unscaled_name]:.2f} over rows that see two keys or more, against "
                   f"{largest[model_name]:.2f} with the model's scaling)")
    show_figure(
        figure_once(("scaling real head", capture_key, layer, head, temperature), lambda: heatmap_row(
            list(versions.values()), [f"{name}<br>entropy {entropies[name]:.2f}" for name in versions], labels,
            labels, title=f"{bundle.name}, layer {layer}, head {head}: its real Q and K with three scalings")),
        f"d_k = {record.queries.shape[-1]}: {verdict}; T > 1 flattens it, T < 1 sharpens it.",
        key="scale_real",
    )


def stability_section(seed: int) -> None:
    st.subheader("4 · Numerical stability: subtract the max")
    fp16, fp32 = (scaling.exp_overflow_threshold(d) for d in STABILITY_DTYPES.values())
    st.markdown(
        "softmax(x) = softmax(x − max x) exactly, but only the second form keeps every exponent ≤ 0. Written "
        f"naively, e^x overflows: fp16 at x > {fp16:.2f}, fp32 at x > {fp32:.2f}."
    )
    scales = st.multiselect("Largest logit", [5, 10, 11, 12, 50, 88, 89, 100, 1000, 10000],
                            default=list(SCALING_DEFAULTS["logits"]), key="scale_logits")
    table = pd.DataFrame(scaling_stability_rows(tuple(sorted(scales)), seed))
    if table.empty:
        return
    # A result that is not finite has no error to show: say so in words (a NaN cell would read "None").
    errors = zip(table["max |error| vs fp64"], table["finite"], strict=True)
    table["max |error| vs fp64"] = [f"{error:.2e}" if finite else "— (not finite)" for error, finite in errors]
    st.dataframe(
        table.style.format({"max logit": "{:g}"}).map(
            lambda ok: "color: #b00020; font-weight: bold" if ok is False else "", subset=["finite", "right"]
        ),
        hide_index=True,
    )
    naive = table[table["method"] == "naive"]
    stable = table[table["method"] == "max-subtracted"]
    st.caption(
        f"The naive form is wrong (not finite, or off by more than {scaling.WRONG_BY:g}) in "
        f"{int((~naive['right']).sum())} of {len(naive)} cases; the max-subtracted form in "
        f"{int((~stable['right']).sum())} of {len(stable)}. Every attention kernel subtracts the row's max for this "
        "reason; flash attention, which sees a row one block at a time, keeps a running max."
    )


def main() -> None:
    start_page("Scaling and softmax")
    st.latex(r"q \cdot k = \sum_{i=1}^{d_k} q_i k_i,\qquad \mathrm{Var}(q\cdot k) = d_k \;\Rightarrow\; "
             r"\mathrm{Var}\!\left(\tfrac{q\cdot k}{\sqrt{d_k}}\right) = 1")
    seed = variance_section()
    saturation_section(seed)
    real_head_section()
    stability_section(seed)


main()
