"""Masks: which keys each query may see, what each pattern costs, and the convention bug that leaks the future."""

import pandas as pd
import streamlit as st

from attnviz import masks, patterns
from attnviz.ui import capture_current, current_sentence, show_figure
from attnviz.viz import style
from attnviz.viz.matrix import BLOCK_COLOURS, heatmap_row, mask_heatmap

st.title("Masks")
st.caption(
    "A mask decides which keys each query may see. Sparse patterns trade reach for cost: compare them on your "
    "sentence, then apply one to a real head."
)

bundle, capture = capture_current(current_sentence())
record = capture.records[capture.kinds[0]]
tokens = record.key_tokens
labels = style.token_labels(tokens)
n = len(tokens)

controls = st.columns([3, 5])
key = controls[0].selectbox(
    "Pattern", list(patterns.PATTERNS), index=2, format_func=lambda k: patterns.PATTERNS[k][0], key="masks_pattern",
    bind="query-params",
)
params = {}
with controls[1]:
    columns = st.columns(3)
    if key in ("sliding_causal", "sliding_bidirectional", "dilated", "global_local"):
        params["window"] = columns[0].slider("Window W (keys)", 1, max(2, n), min(3, n), key="masks_window")
    if key == "dilated":
        params["dilation"] = columns[1].slider("Dilation d", 1, 8, 2, key="masks_dilation")
    if key == "global_local":
        params["global_tokens"] = columns[1].slider("Global tokens G", 0, max(1, n // 2), 1, key="masks_global")
    if key == "bigbird":
        params["block_size"] = columns[0].slider("Block size b", 1, 16, 2, key="masks_block")
        n_blocks = -(-n // params["block_size"])
        params["global_blocks"] = columns[1].slider("Global blocks g", 0, n_blocks, min(1, n_blocks), key="masks_gb")
        params["window_blocks"] = columns[2].slider("Window blocks w", 0, 9, 3, key="masks_wb")
        params["random_blocks"] = columns[0].slider("Random blocks r", 0, 8, 1, key="masks_rb")
    if key == "lsh":
        params["n_buckets"] = columns[0].select_slider("Buckets", [2, 4, 8, 16], 4, key="masks_buckets")
        params["n_rounds"] = columns[1].slider("Hash rounds", 1, 8, 2, key="masks_rounds")
    if key in ("bigbird", "lsh"):
        params["seed"] = columns[2].number_input("Seed", 0, 10_000, 0, key="masks_seed")

vectors = None
if key == "lsh":  # shared query/key vectors: the model's own layer-0 keys, head 0
    keys = record.keys[0, 0]
    vectors = keys / keys.norm(dim=-1, keepdim=True).clamp_min(1e-6)
pattern = patterns.build_pattern(key, n, vectors=vectors, **params)

seen = masks.keys_per_query(pattern.mask)
metrics = st.columns(4)
metrics[0].metric("Density", f"{pattern.density:.1%}")
metrics[1].metric("Scores computed", f"{pattern.scores_computed:,} of {n * n:,}")
metrics[2].metric("Cost", pattern.complexity)
metrics[3].metric("Keys per query", f"{int(seen.min())}–{int(seen.max())}")

left, right = st.columns(2)
with left:
    if pattern.block_kind is not None:
        kinds = pattern.block_kind.repeat_interleave(params["block_size"], 0).repeat_interleave(params["block_size"], 1)
        figure = mask_heatmap(kinds[:n, :n], labels, labels, title=f"{pattern.name} over your {n} tokens", legend=BLOCK_COLOURS)
    else:
        figure = mask_heatmap(pattern.mask.long(), labels, labels, title=f"{pattern.name} over your {n} tokens")
    show_figure(figure, pattern.description + " Rows are queries, columns keys.", key="masks_pattern_figure")
with right:
    n_layers = st.slider("Stacked layers", 1, 12, 4, key="masks_layers")
    query = st.selectbox("Follow the query at", list(range(n)), index=n - 1, format_func=lambda i: labels[i], key="masks_query")
    reach = patterns.receptive_field_summary(pattern.mask, n_layers, query)
    show_figure(
        mask_heatmap(
            reach.long(), [f"after {l + 1} layer{'s' if l else ''}" for l in range(n_layers)], labels,
            title=f"Receptive field of {labels[query]}", height=140 + 30 * n_layers,
        ),
        "Blue: tokens whose information can reach this position through the stacked layers (with residuals). "
        "Windows grow by W-1 per layer; global tokens connect everything in two.",
        key="masks_reach",
    )
    st.caption("Tokens reaching it per layer: " + ", ".join(str(c) for c in reach.sum(-1).tolist()) + f" of {n}.")

st.subheader("Apply the mask to a real head")
columns = st.columns(4)
layer = columns[0].number_input("Layer", 0, record.n_layers - 1, 0, key="masks_layer")
head = columns[1].number_input("Head", 0, record.n_heads - 1, 0, key="masks_head")
before, cut, after, lost = patterns.apply_to_head(record, int(layer), int(head), pattern.mask)
show_figure(
    heatmap_row(
        [before, cut, after],
        ["Before: the model's head", "Masked, not renormalised", "Masked and renormalised"],
        labels, labels, title=f"{bundle.name}, layer {layer}, head {head}, under the {pattern.name} mask",
    ),
    f"Without renormalising, rows sum to less than 1 (this head loses {lost:.1%} of its "
    "attention on average); a softmax over the allowed keys only makes the kept weights fill each row again.",
    key="masks_real",
)

st.subheader(":material/warning: The mask-convention bug")
st.error(
    "The same causal mask has several spellings. PyTorch's `scaled_dot_product_attention` reads a **boolean mask as "
    "True = may attend** and **adds a float mask** to the scores. `nn.MultiheadAttention` reads True = **masked**. "
    "Pass the wrong one and nothing fails: the model silently sees the future. Below, PyTorch's own SDPA runs on "
    "this head's real queries and keys with each spelling.",
    icon=":material/visibility:",
)
demo_size = min(n, 8)
demo = patterns.convention_demo_on_head(record, int(layer), int(head), demo_size)
small_labels = labels[:demo_size]
spellings = st.columns(4)
for column, (name, matrix) in zip(
    spellings,
    (("True = may attend", demo.allowed.long()), ("True = masked", demo.masked.long()),
     ("additive 0 / −∞", demo.additive), ("float 1 = keep", demo.keep_float)),
):
    column.markdown(f"**{name}**")
    column.dataframe(pd.DataFrame(matrix.numpy(), index=small_labels, columns=range(demo_size)).astype(str))
verdicts = []
for name in demo.weights:
    leak = demo.future_weight[name]
    verdict = "✔ none on the future" if leak == 0 else f"✘ {leak:.0%} on the future"
    verdicts.append(verdict + (f", {demo.nan_rows[name]} NaN rows" if demo.nan_rows[name] else ""))
show_figure(
    heatmap_row(
        list(demo.weights.values()),
        [f"{name}<br>{verdict}" for name, verdict in zip(demo.weights, verdicts)],
        small_labels, small_labels, title="What PyTorch's SDPA does with each spelling of the same causal mask",
        show_values=demo_size <= 6,
    ),
    "Only the first two are right. The 0/1 float mask is added to the scores (+1 or +0), so nothing is blocked; "
    "the inverted boolean blocks the past and the diagonal instead of the future.",
    key="masks_convention",
)

st.subheader("Memory of the score matrix")
columns = st.columns(3)
lengths = columns[0].multiselect(
    "Sequence lengths N", [1024, 4096, 8192, 32768, 131072, 1048576], default=[1024, 8192, 32768, 131072],
    key="masks_lengths",
)
dtype = columns[1].selectbox("dtype", list(patterns.DTYPE_BYTES), index=1, key="masks_dtype")
heads = columns[2].number_input("Heads x batch", 1, 4096, 1, key="masks_heads")
if lengths:
    table = patterns.score_memory_table(key, lengths, dtype, heads, **params)
    st.dataframe(table.drop(columns=["dense bytes"]), hide_index=True)
    st.caption(
        "Naive attention materialises all N² scores (and as many softmax probabilities). At N = 128K in fp16 that is "
        "32 GiB per head: why long-context models use sparse patterns or flash attention, which never stores them."
    )
