"""Masks: which keys each query may see, what each pattern costs, and the convention bug that leaks the future."""

import pandas as pd
import streamlit as st
import torch

from attnviz.core import mask_patterns, masks
from attnviz.core.units import DTYPE_BYTES
from attnviz.pagelogic import masks as masks_page
from attnviz.ui.captures import MECHANISM_TOKENS, capture_current
from attnviz.ui.figures import figure_once, show_figure
from attnviz.ui.frame import figure_columns, page_intro, start_page
from attnviz.ui.pattern_widgets import pattern_widgets
from attnviz.ui.sidebar import current_sentence
from attnviz.viz import style
from attnviz.viz.matrix import BLOCK_COLOURS, HALF_WIDTH, heatmap_row, mask_heatmap


def pattern_parameters(key: str, n: int, record) -> dict:
    """The widgets of the chosen pattern (from the registry); returns its parameters."""
    params = pattern_widgets(key, mask_patterns.GALLERY, st.columns(3), n, prefix="masks")
    if "vectors" in mask_patterns.parameters_of(key):  # a pattern that hashes vectors (LSH) gets the model's own
        params["vectors"] = key_vectors(record, n)
    return params


def key_vectors(record, n: int) -> torch.Tensor:
    """``[n, d]`` unit vectors for LSH: the model's own layer-0 keys of head 0 (shared query/key vectors)."""
    if record.replayable:
        keys = record.keys[0, 0]
    else:  # eager weights only: no keys to hash, so seeded random vectors stand in (the caption says so)
        keys = torch.randn(n, 16, generator=torch.Generator().manual_seed(0))
    return keys / keys.norm(dim=-1, keepdim=True).clamp_min(1e-6)



def pattern_figure(name: str, built: mask_patterns.PatternMask, labels: list[str]):
    n = len(labels)
    if built.block_kind is not None:
        kinds = masks.expand_block_layout(built.block_kind, built.block_size)[:n, :n]
        return mask_heatmap(kinds, labels, labels, title=f"{name} over your {n} tokens", legend=BLOCK_COLOURS,
                            width=HALF_WIDTH)
    return mask_heatmap(built.mask.long(), labels, labels, title=f"{name} over your {n} tokens", width=HALF_WIDTH)


def pattern_section(key: str, params: dict, built: mask_patterns.PatternMask, labels: list[str],
                    drawn: tuple) -> None:
    """``drawn``: what names the inputs (the capture's key, the pattern and its parameters), for the figures'
    cache."""
    n = len(labels)
    seen = masks.keys_per_query(built.mask)
    name = mask_patterns.label(key)
    left, right = figure_columns(2, key="masks_pattern", min_width=HALF_WIDTH)
    with left:
        show_figure(figure_once(("masks pattern", *drawn), lambda: pattern_figure(name, built, labels)),
                    mask_patterns.describe(key, **params) + " Rows are queries, columns keys.",
                    key="masks_pattern_figure")
    with right:
        n_layers = st.slider("Stacked layers", 1, 12, 4, key="masks_layers")
        query = st.selectbox("Follow the query at", list(range(n)), index=n - 1, format_func=lambda i: labels[i],
                             key="masks_query")
        reach = masks_page.receptive_field_summary(built.mask, n_layers, query)
        show_figure(
            figure_once(("masks reach", *drawn, n_layers, query), lambda: mask_heatmap(
                reach.long(), [f"after {layer + 1} layer{'s' if layer else ''}" for layer in range(n_layers)], labels,
                title=f"Receptive field of {style.plotly_text(labels[query])}", height=140 + 30 * n_layers,
                x_title="input token", width=HALF_WIDTH,
                y_title="stacked layers", legend={0: ("#ffffff", "cannot reach it"), 1: ("#2f6db5", "reaches it")},
            )),
            "Blue: tokens whose information can reach this position through the stacked layers (with residuals). "
            + masks_page.receptive_field_rule(key, **params),
            key="masks_reach",
        )
        st.caption("Tokens reaching it per layer: " + ", ".join(str(c) for c in reach.sum(-1).tolist()) + f" of {n}.")
    # The numbers under the pictures they describe: the pattern itself is the first thing on the screen.
    metrics = st.columns(4)
    metrics[0].metric("Density", f"{masks.density(built.mask):.1%}")
    metrics[1].metric("Scores computed", f"{int(built.mask.sum()):,} of {n * n:,}")
    metrics[2].metric("Cost", mask_patterns.cost(key, **params))
    metrics[3].metric("Keys per query", f"{int(seen.min())}–{int(seen.max())}")


def real_head_section(bundle, record, mask, name: str, labels: list[str], drawn: tuple) -> tuple[int, int]:
    st.subheader("Apply the mask to a real head")
    columns = st.columns(4)
    layer = int(columns[0].number_input("Layer", 0, record.n_layers - 1, 0, key="masks_layer"))
    head = int(columns[1].number_input("Head", 0, record.n_heads - 1, 0, key="masks_head"))

    def build():
        before, cut, after, lost = masks_page.apply_to_head(record, layer, head, mask)
        figure = heatmap_row(
            [before, cut, after], ["Before: the model's head", "Masked, not renormalised", "Masked and renormalised"],
            labels, labels, title=f"{bundle.name}, layer {layer}, head {head}, under the {name} mask")
        return figure, masks_page.real_head_caption(lost, masks_page.rows_without_keys(record, layer, mask),
                                                    len(labels))

    figure, caption = figure_once(("masks real head", *drawn, layer, head), build)
    show_figure(figure, caption, key="masks_real")
    return layer, head


def convention_section(record, layer: int, head: int, labels: list[str], drawn: tuple) -> None:
    """``drawn``: the capture's key, for the figure's cache."""
    st.subheader(":material/warning: The mask-convention bug")
    st.error(
        "The same causal mask has several spellings. PyTorch's `scaled_dot_product_attention` reads a **boolean mask "
        "as True = may attend** and **adds a float mask** to the scores. `nn.MultiheadAttention` reads True = "
        "**masked**. Pass the wrong one and nothing fails: the model silently sees the future. Below, PyTorch's own "
        "SDPA runs on " + ("this head's real queries and keys" if record.replayable else
                           "random queries and keys (this model's own are not exposed)") + " with each spelling.",
        icon=":material/visibility:",
    )
    size = min(len(labels), 8)
    demo = masks_page.convention_demo_on_head(record, layer, head, size)
    small_labels = labels[:size]
    spellings = (("True = may attend", demo.allowed.long()), ("True = masked", demo.masked.long()),
                 ("additive 0 / −∞", demo.additive), ("float 1 = keep", demo.keep_float))
    # Two by two where a table gets its width (eight columns and the labels), one under the other in a narrow window.
    for column, (name, matrix) in zip(figure_columns(4, key="masks_spellings"), spellings, strict=True):
        column.markdown(f"**{name}**")
        # static: eight narrow columns that wrap to any width (a data grid scrolled sideways on a projector)
        column.table(pd.DataFrame(matrix.numpy(), index=small_labels, columns=range(size)).astype(str),
                     border="horizontal")
    verdicts = []
    for name in demo.weights:
        leak = demo.future_weight[name]
        verdict = "✔ none on the future" if leak == 0 else f"✘ {leak:.0%} on the future"
        verdicts.append(verdict + (f", {demo.nan_rows[name]} NaN rows" if demo.nan_rows[name] else ""))
    show_figure(
        figure_once(("masks convention", drawn, layer, head), lambda: heatmap_row(
            list(demo.weights.values()),
            [f"{name}<br>{verdict}" for name, verdict in zip(demo.weights, verdicts, strict=True)],
            small_labels, small_labels, title="What PyTorch's SDPA does with each spelling of the same causal mask",
            show_values=size <= 6,
        )),
        "Only the first two are right. The 0/1 float mask is added to the scores (+1 or +0), so nothing is blocked; "
        "the inverted boolean blocks the past and the diagonal instead of the future.",
        key="masks_convention",
    )


def dtype_label(name: str) -> str:
    size = DTYPE_BYTES[name]
    return f"{'fp16 or bf16' if name == 'fp16' else name} ({size:g} byte{'s' if size > 1 else ''})"


def memory_section(key: str, params: dict) -> None:
    st.subheader("Memory of the score matrix")
    columns = st.columns(3)
    lengths = columns[0].multiselect(
        "Sequence lengths N", [1024, 4096, 8192, 32768, 131072, 1048576], default=[1024, 8192, 32768, 131072],
        key="masks_lengths",
    )
    # One entry per size: bf16 takes the bytes of fp16, so a separate bf16 entry would change nothing.
    sizes = [name for name in DTYPE_BYTES if name != "bf16"]
    dtype = columns[1].selectbox("dtype", sizes, index=1, key="masks_dtype", format_func=dtype_label)
    heads = int(columns[2].number_input("Heads x batch", 1, 4096, 1, key="masks_heads"))
    if lengths:
        table = masks_page.score_memory_table(key, lengths, dtype, heads, **params)
        st.dataframe(table.drop(columns=["dense bytes"]), hide_index=True)
        st.caption(
            "Naive attention materialises all N² scores (and as many softmax probabilities). At N = 128K in fp16 the "
            "scores alone are 32 GiB per head: why long-context models use sparse patterns or flash attention, which "
            "never stores them."
        )


def main() -> None:
    start_page("Masks")
    page_intro(
        "A mask decides which keys each query may see. Sparse patterns trade reach for cost: compare them on your "
        "sentence, then apply one to a real head."
    )
    bundle, capture, capture_key = capture_current(current_sentence(), max_tokens=MECHANISM_TOKENS)
    record = capture.records[capture.kinds[0]]
    labels = style.token_labels(record.key_display)
    n = len(labels)
    controls = st.columns([3, 5])
    gallery = masks_page.gallery_patterns()
    key = controls[0].selectbox("Pattern", gallery, index=gallery.index("sliding_causal"),
                                format_func=mask_patterns.label, key="masks_pattern", bind="query-params")
    with controls[1]:
        params = pattern_parameters(key, n, record)
    built = mask_patterns.build(key, n, **params)
    # what the figures are drawn from (LSH's vectors are the capture's own keys: named by the capture's key)
    drawn = (capture_key, key, repr(sorted((name, value) for name, value in params.items() if name != "vectors")))
    pattern_section(key, params, built, labels, drawn)
    layer, head = real_head_section(bundle, record, built.mask, mask_patterns.label(key), labels, drawn)
    convention_section(record, layer, head, labels, capture_key)
    memory_section(key, {name: value for name, value in params.items() if name != "vectors"})


main()
