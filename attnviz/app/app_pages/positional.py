"""Positional encodings: how attention learns where tokens are."""

import math

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from attnviz.core import positional, stepwise
from attnviz.interventions.word_order import word_order_experiment
from attnviz.models import position_tables
from attnviz.pagelogic.positional import (
    alibi_on_real_head,
    alibi_slopes_caption,
    extrapolation_caption,
    learned_table_facts,
    model_alibi,
    model_table_series_name,
    no_table_text,
    repeated_words,
    table_band_caption,
    table_caption,
    table_distance_caption,
    table_heatmap_caption,
)
from attnviz.ui.captures import MECHANISM_TOKENS, capture_current
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import page_intro, start_page
from attnviz.ui.messages import queries_unavailable
from attnviz.ui.session_models import current_bundle
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import style
from attnviz.viz.charts import bar_chart, line_chart
from attnviz.viz.matrix import HALF_WIDTH, SIGNED, SignedScale, heatmap_row, matrix_heatmap


def sinusoidal_tab() -> None:
    """The sinusoidal table, its curves, distance similarity and the shift property, computed."""
    columns = st.columns(3)
    d_model = columns[0].select_slider("d_model", [16, 32, 64, 128, 256, 512], 128, key="pos_sin_d")
    n_positions = columns[1].slider("Positions", 16, 512, 100, key="pos_sin_n")
    shift = columns[2].slider("Shift k", 1, min(50, n_positions - 1), min(5, n_positions - 1), key="pos_sin_k")
    table = positional.sinusoidal(n_positions, d_model)
    show_figure(
        matrix_heatmap(
            table, [f"pos {p}" for p in range(n_positions)], [f"dim {i}" for i in range(d_model)],
            title=f"Sinusoidal table: {n_positions} positions x {d_model} dimensions", scale=SIGNED,
            x_title="dimension", y_title="position", show_values=False, height=520, max_x_ticks=24,
        ),
        "Low dimensions oscillate fast, high ones slowly: together they write each position as a unique pattern.",
        key="pos_sin_table",
    )
    dims = st.multiselect(
        "Dimensions to plot", list(range(d_model)), default=[0, 1, 10, 11, min(40, d_model - 1)], key="pos_sin_dims"
    )
    left, right = st.columns(2)
    with left:
        show_figure(
            line_chart(
                range(n_positions), {f"dim {d}": table[:, d].tolist() for d in dims},
                title="Chosen dimensions along the positions", x_title="position", y_title="PE value",
            ),
            "Each pair (2i, 2i+1) is a sine and a cosine of the same frequency.",
            key="pos_sin_curves",
        )
    with right:
        length = n_positions - n_positions // 2
        series = {f"from position {origin}": positional.cosine_by_distance(table, origin)[:length].tolist()
                  for origin in (0, n_positions // 2)}
        first, second = series.values()
        gap = max(abs(a - b) for a, b in zip(first, second, strict=True))
        show_figure(
            line_chart(range(length), series, title="Similarity of PE(p) and PE(p + k)", x_title="distance k",
                       y_title="cosine similarity"),
            f"The two curves coincide (largest gap {gap:.1e}): the similarity depends on the distance only, not on "
            "where you start.",
            key="pos_sin_distance",
        )
    matrix = positional.sinusoidal_shift_matrix(shift, d_model)
    error = positional.shift_error(table, shift, matrix)
    st.markdown(
        f"**Shift property.** PE(pos + {shift}) = M_{shift} · PE(pos) for every position, where M is a block of 2x2 "
        f"rotations: max error over all {n_positions - shift} positions = **{error:.1e}**. A fixed linear map "
        "moves attention by k positions, which a head can learn."
    )
    block = min(8, d_model)
    show_figure(
        matrix_heatmap(
            matrix[:block, :block], [f"dim {i}" for i in range(block)], [f"dim {i}" for i in range(block)],
            title=f"M_{shift}: the first {block} x {block} block", scale=SIGNED, x_title="input", y_title="output",
        ),
        "Only 2x2 blocks on the diagonal are non-zero: each (sin, cos) pair rotates by k times its frequency.",
        key="pos_sin_shift",
    )


def learned_tab() -> None:
    """The current checkpoint's absolute position table (trained or fixed), if it has one: its rows labelled by the
    positions (an image's tokens) they serve."""
    bundle = current_bundle()
    found = position_tables.position_table(bundle.model)
    if found is None:
        st.info(no_table_text(bundle.name, bundle.model))
        return
    table = found.rows
    n_table = table.shape[0]
    what = "Rows" if found.is_image else "Positions"
    shown = (st.slider(f"{what} to show", 16, n_table, min(128, n_table), key="pos_learned_n") if n_table > 16
             else n_table)
    part = table[:shown]
    facts = learned_table_facts(table, shown)
    st.caption(table_caption(found, bundle.name))
    labels = found.labels()
    position_labels = labels[:shown]
    unit = "row (token of the image)" if found.is_image else "position"
    left, right = st.columns(2)
    with left:
        show_figure(
            matrix_heatmap(
                part, position_labels, [f"dim {i}" for i in range(part.shape[1])],
                title="Learned position embeddings" if found.trained else "Fixed sinusoidal position table",
                scale=SignedScale(robust=True), x_title="dimension", y_title=unit, show_values=False, height=480,
                max_x_ticks=12,
            ),
            table_heatmap_caption(found),
            key="pos_learned_table",
        )
    with right:
        show_figure(
            matrix_heatmap(
                positional.cosine_similarity_matrix(part), position_labels, position_labels,
                title="Cosine similarity between positions", scale=SIGNED, x_title=unit,
                y_title=unit, show_values=False, height=480, max_x_ticks=12,
            ),
            table_band_caption(found, facts),
            key="pos_learned_similarity",
        )
    table_curves(found, table, shown, unit, facts)


def table_curves(found, table, shown: int, unit: str, facts) -> None:
    """The position table's chosen dimensions along the positions, and its similarity by distance."""
    part, labels = table[:shown], found.labels()
    dims = st.multiselect("Dimensions to plot", list(range(table.shape[1])), default=[0, 1, 2, 3],
                          key="pos_learned_dims")
    left, right = st.columns(2)
    with left:
        show_figure(
            line_chart(range(shown), {f"dim {d}": part[:, d].tolist() for d in dims},
                       title="Chosen dimensions along the positions", x_title=unit, y_title="value"),
            "Compare with the sine and cosine curves of the Sinusoidal tab.",
            key="pos_learned_curves",
        )
    with right:
        series = {(f"from {labels[origin]}" if found.is_image else f"from position {origin}"):
                  positional.cosine_by_distance(table, origin)[: shown // 2].tolist() for origin in (0, shown // 2)}
        show_figure(
            line_chart(range(shown // 2), series, title="Similarity by distance",
                       x_title="distance k (rows, in reading order)" if found.is_image else "distance k",
                       y_title="cosine"),
            table_distance_caption(found, facts),
            key="pos_learned_distance",
        )


def rope_pair_figure(position: int, frequencies) -> go.Figure:
    angle = position * frequencies[0].item()
    vector = (1.0, 0.3)
    rotated = positional.rotate_pair(vector, angle)
    figure = go.Figure()
    for (x, y), name, colour in ((vector, "q at position 0", "#1f77b4"),
                                 (rotated, f"q at position {position}", "#d62728")):
        figure.add_trace(go.Scatter(x=[0, x], y=[0, y], mode="lines+markers", name=name,
                                    line=dict(color=colour, width=4)))
    figure.update_layout(
        title=dict(text=f"The first pair rotated by m·θ₀ = {angle:.2f} rad", x=0),
        xaxis=dict(range=[-1.2, 1.2], zeroline=True), yaxis=dict(range=[-1.2, 1.2], scaleanchor="x"),
        height=380, margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
    )
    return figure


def rope_tab() -> None:
    """RoPE: the rotation of one pair, the frequencies, the relative property and a toy head."""
    columns = st.columns(4)
    head_dim = columns[0].select_slider("Head dimension", [2, 4, 8, 16, 32, 64, 128], 64, key="pos_rope_d")
    base = columns[1].select_slider("Base θ", [100, 1000, 10000, 500000], 10000, key="pos_rope_base")
    position = columns[2].slider("Position m (for the 2-D pair)", 0, 64, 3, key="pos_rope_m")
    seed = int(columns[3].number_input("Seed", 0, 10_000, 0, key="pos_rope_seed"))
    frequencies = positional.rope_frequencies(head_dim, base)
    left, right = st.columns(2)
    q, k = positional.random_pair(head_dim, seed)
    with left:
        show_figure(rope_pair_figure(position, frequencies),
                    "RoPE turns each pair of q's and k's dimensions by an angle proportional to the position. The "
                    "paper pairs dims (2i, 2i + 1), as GPT-J's code does; Llama's and GPT-NeoX's code in Hugging "
                    "Face transformers, and this page, pair (i, i + d/2): the same rotations of reordered "
                    f"dimensions (their scores differ by {positional.rope_layouts_gap(q, k, 24, base):.0e}).",
                    key="pos_rope_pair")
    with right:
        show_figure(
            line_chart(
                range(len(frequencies)),
                {"frequency θᵢ": frequencies.tolist(), "wavelength 2π/θᵢ": (2 * math.pi / frequencies).tolist()},
                title="Frequencies of the pairs", x_title="pair i", y_title="radians per position / positions",
                log_y=True,
            ),
            "Early pairs turn fast (fine position), late pairs slowly (long range); a larger base stretches them.",
            key="pos_rope_freq",
        )
    scores = positional.rope_relative_scores(q, k, 24, base)
    deviation = max((scores.diagonal(o) - scores.diagonal(o)[0]).abs().max().item() for o in range(-23, 24))
    show_figure(
        matrix_heatmap(
            scores, [f"m={m}" for m in range(24)], [f"n={n}" for n in range(24)],
            title="RoPE(q, m) · RoPE(k, n) for one fixed q and k", scale=SIGNED, x_title="key position n",
            y_title="query position m", show_values=False,
        ),
        f"Constant along every diagonal: the score depends on m − n only (largest deviation {deviation:.1e}).",
        key="pos_rope_relative",
    )
    tokens = stepwise.tokens_of(current_sentence())[0] or ["attention"]
    toy = stepwise.prefill_qkv(tokens, max(2, min(8, head_dim)), seed)
    plain, rotated = positional.toy_attention_with_and_without_rope(toy["Q"], toy["K"], base)
    labels = style.token_labels(tokens)
    repeated = repeated_words(tokens)
    caption = (f"Without positions, the repeated {', '.join(repeated)} get identical rows; RoPE separates them by "
               "where they stand." if repeated else
               "No word repeats in these words: type one twice in the sidebar to see RoPE tell the copies apart.")
    show_figure(
        heatmap_row([plain, rotated], ["Without RoPE", "With RoPE"], labels, labels,
                    title="A toy head on your first words (repeated words share Q and K)",
                    show_values=len(labels) <= 8),
        caption,
        key="pos_rope_toy",
    )


def extrapolation_figure(bundle, found: position_tables.PositionTable | None):
    training = bundle.max_positions
    distances = np.arange(0, 2 * training)
    sinus = positional.cosine_by_distance(positional.sinusoidal(2 * training, 64)).numpy()
    series = {
        "ALiBi bias −m·k (any m: scaled to [−1, 0])": (-distances / distances.max()).tolist(),
        "sinusoidal: cos(PE(0), PE(k))": sinus.tolist(),
    }
    if found is not None:
        own = positional.cosine_by_distance(found.rows).tolist()[: len(distances)]
        series[model_table_series_name(found, bundle.name)] = own + [None] * (len(distances) - len(own))
    return line_chart(distances, series, title="Position signals beyond the training length", x_title="distance k",
                      y_title="signal", vlines={f"training length {training}": training})


def model_alibi_section(bundle, record, own: dict, layer: int, head: int, labels: list[str]) -> None:
    """The current model's own ALiBi (BLOOM), as it recorded it: its slopes, and one head with and without it."""
    slopes, standard, matches = own["slopes"], own["standard"], own["matches_paper"]
    st.markdown(
        f"**{bundle.name} uses ALiBi itself.** Its slopes, read from the bias it added in layer {layer}: "
        + ", ".join(f"{s:.4g}" for s in slopes.tolist()[:8]) + (" …" if len(slopes) > 8 else "")
        + (f" — the paper's slopes for {record.n_heads} heads." if matches else
           f" (the paper's for {record.n_heads} heads would be "
           + ", ".join(f"{s:.4g}" for s in standard.tolist()[:8]) + ").")
    )
    left, right = st.columns(2)
    with left:
        show_figure(
            matrix_heatmap(own["bias"], labels, labels, title=f"Its bias, head {head} (m = {slopes[head]:.3g})",
                           scale=SIGNED, show_values=False, width=HALF_WIDTH),
            "The model adds m·key position; a softmax ignores a constant per row, so this is −m·distance (shown "
            "relative to the query's own position).",
            key="pos_alibi_model_bias",
        )
    with right:
        show_figure(
            heatmap_row([own["with"], own["without"]], ["As the model computes it", "The same Q and K, no ALiBi"],
                        labels, labels, title=f"Layer {layer}, head {head}", width=HALF_WIDTH),
            f"Replayed from the model's own Q and K: removing its ALiBi moves the weights by up to "
            f"{own['change']:.2f}.",
            key="pos_alibi_model",
        )


def alibi_tab() -> None:
    """ALiBi: the slopes, the bias, the bias on a real head's scores, and behaviour past the training length."""
    bundle, capture, _ = capture_current(current_sentence(), max_tokens=MECHANISM_TOKENS)
    record = capture.records[capture.kinds[0]]
    columns = st.columns(4)
    n_heads = columns[0].slider("Heads", 1, 32, 8, key="pos_alibi_heads")
    alibi_head = int(columns[1].number_input("ALiBi head (slope)", 0, n_heads - 1, 0, key="pos_alibi_head"))
    layer = int(columns[2].number_input("Real layer", 0, record.n_layers - 1, 0, key="pos_alibi_layer"))
    head = int(columns[3].number_input("Real head", 0, record.n_heads - 1, 0, key="pos_alibi_real_head"))
    slopes = positional.alibi_slopes(n_heads)
    left, right = st.columns(2)
    with left:
        show_figure(
            bar_chart([f"h{h}" for h in range(n_heads)], slopes.tolist(), title=f"Slopes for {n_heads} heads",
                      y_title="slope m", text=[f"1/{1 / s:.3g}" for s in slopes.tolist()], log_y=True),
            alibi_slopes_caption(n_heads),
            key="pos_alibi_slopes",
        )
    causal = record.is_causal(layer)  # the attention shown: a decoder's causal, an encoder's both ways
    bias = positional.alibi_bias(n_heads, record.weights.shape[-1], causal=causal)
    labels = style.token_labels(record.key_display)
    with right:
        shown_heads = sorted({0, n_heads // 2, n_heads - 1})
        show_figure(
            heatmap_row([bias[h] for h in shown_heads], [f"head {h}: m = {slopes[h]:.3g}" for h in shown_heads],
                        labels, labels, title="Bias −m·distance added to the scores", scale=SIGNED,
                        width=HALF_WIDTH),
            "No embeddings at all: a penalty that grows linearly with distance"
            + (" (|i − j|, bidirectional)." if not causal else "."),
            key="pos_alibi_bias",
        )
    own = model_alibi(record, layer, head) if record.replayable else None
    if own is not None:
        model_alibi_section(bundle, record, own, layer, head, labels)
    elif not queries_unavailable(bundle, record, "Adding ALiBi to a real head"):
        before, after = alibi_on_real_head(record, layer, head, bias[alibi_head])
        show_figure(
            heatmap_row([before, after], ["The model's head", f"+ ALiBi bias of head {alibi_head}"], labels, labels,
                        title=f"ALiBi added to the real scores of layer {layer}, head {head}"),
            "The bias pulls attention toward nearby tokens; the steeper the slope, the more local the head becomes.",
            key="pos_alibi_real",
        )
    found = position_tables.position_table(bundle.model)
    show_figure(
        extrapolation_figure(bundle, found),
        extrapolation_caption(found, bundle.name),
        key="pos_alibi_extrapolation",
    )


def order_tab() -> None:
    """Without position embeddings, a shuffled sentence gives exactly shuffled attention."""
    bundle = current_bundle()
    columns = st.columns(3)
    seed = int(columns[0].number_input("Shuffle seed", 0, 10_000, 1, key="pos_order_seed"))
    remove = columns[1].toggle("Remove position embeddings", value=True, key="pos_order_remove")
    head = int(columns[2].number_input("Head (layer 0)", 0, bundle.n_heads - 1, 0, key="pos_order_head"))
    try:
        result = word_order_experiment(bundle, current_sentence(), seed, remove_positions=remove)
    except ValueError as problem:
        st.info(str(problem))
        return
    tokens, order = result["display_tokens"], result["order"]  # as every page shows them ("␣the")
    labels = style.token_labels(tokens)
    shuffled = style.token_labels([tokens[j] for j in order])
    st.markdown("**Shuffled:** " + " ".join(tokens[j] for j in order))
    left, right = st.columns(2)
    with left:
        show_figure(matrix_heatmap(result["original"][head], labels, labels, title="Original order",
                                   show_values=False),
                    "Layer 0 of the real model.", key="pos_order_original")
    with right:
        show_figure(matrix_heatmap(result["permuted"][head], shuffled, shuffled, title="Shuffled order",
                                   show_values=False),
                    "The same words in another order.", key="pos_order_permuted")
    difference = result["max_difference"]
    if remove:
        st.success(
            f"With `{result['parameter']}` zeroed, un-shuffling the rows and columns of the shuffled run gives "
            f"the original weights back: max difference **{difference:.1e}**. Without positions, attention is "
            "a function of the set of words, not their order."
        )
    else:
        st.warning(
            f"With position embeddings kept, the un-shuffled weights differ by up to **{difference:.3g}**: "
            "the model knows where each word stands."
        )


def main() -> None:
    start_page("Positional encodings")
    page_intro(
        "Attention itself has no idea of order: without a mask, permute the tokens and the weights permute with "
        "them. A causal mask (decoders) is the exception: each token sees only those before it, so order leaks in "
        "even without positions. Position enters through added vectors (sinusoidal, learned), rotations of Q and K "
        "(RoPE) or a bias on the scores (ALiBi)."
    )
    tabs = st.tabs(
        ["Sinusoidal", "Learned", "RoPE", "ALiBi", "Word order"], key="pos_tab", on_change="rerun",
        default="Sinusoidal", bind="query-params",
    )
    for tab, body in zip(tabs, (sinusoidal_tab, learned_tab, rope_tab, alibi_tab, order_tab), strict=True):
        if tab.open:  # only the open tab computes
            with tab:
                body()


main()
