"""Heads and KV cache: MHA, GQA and MQA compared, KV-cache memory for real configurations, and cross-attention."""

import pandas as pd
import streamlit as st

from attnviz import kvcache
from attnviz.cross import cross_attention_example
from attnviz.patterns import human_bytes
from attnviz.ui import current_bundle, current_sentence, show_figure
from attnviz.viz.charts import bar_chart
from attnviz.viz.heads import head_sharing
from attnviz.viz.matrix import heatmap_row

st.title("Heads and KV cache")
st.caption(
    "Every generated token must read the keys and values of all earlier tokens, so decoders cache them. Sharing "
    "K/V heads between query heads (GQA, MQA) shrinks that cache, the main cost of long contexts."
)

bundle = current_bundle()
presets = dict(kvcache.PRESETS)
current = kvcache.config_of_bundle(bundle)
presets[f"Current checkpoint: {bundle.name}"] = current

columns = st.columns([3, 2, 2, 2])
choice = columns[0].selectbox("Model configuration", list(presets), key="kv_preset", bind="query-params")
config = presets[choice]
seq_len = columns[1].select_slider(
    "Sequence length", [512, 1024, 2048, 4096, 8192, 16384, 32768, 131072], 4096, key="kv_seq"
)
batch = columns[2].number_input("Batch", 1, 1024, 1, key="kv_batch")
dtype = columns[3].selectbox("dtype", list(kvcache.DTYPE_BYTES), index=1, key="kv_dtype")
st.caption(
    f"**{config.name}**: {config.n_layers} layers, d_model {config.d_model}, {config.n_heads} query heads, "
    f"{config.n_kv_heads} K/V heads, head dim {config.head_dim} → {config.kind}. Source: {config.source}."
)

divisors = [d for d in range(1, config.n_heads + 1) if config.n_heads % d == 0]
variants = {"MHA": config.n_heads, "MQA": 1}
if config.n_kv_heads not in (1, config.n_heads):
    variants = {"MHA": config.n_heads, f"GQA ({config.n_kv_heads} K/V)": config.n_kv_heads, "MQA": 1}
else:
    middle = [d for d in divisors if 1 < d < config.n_heads]
    if middle:
        variants = {"MHA": config.n_heads, f"GQA ({middle[len(middle) // 2]} K/V)": middle[len(middle) // 2], "MQA": 1}

rows = []
for name, kv_heads in variants.items():
    variant = kvcache.with_kv_heads(config, kv_heads)
    cache = kvcache.kv_cache_bytes(variant, seq_len, batch, dtype)
    parameters = kvcache.attention_parameters(variant)
    rows.append(
        {
            "variant": name + (" ← this model" if kv_heads == config.n_kv_heads else ""),
            "K/V heads": kv_heads,
            "KV cache per layer": human_bytes(cache["per_layer"]),
            "KV cache, all layers": human_bytes(cache["total"]),
            "per token": human_bytes(cache["per_token"] * batch),
            "attention parameters per layer": f"{parameters['per layer'] / 1e6:.3g}M",
            "total bytes": cache["total"],
        }
    )
frame = pd.DataFrame(rows)
left, right = st.columns([3, 2])
with left:
    st.dataframe(frame.drop(columns=["total bytes"]), hide_index=True)
    ratio = frame["total bytes"].iloc[0] / frame["total bytes"].iloc[-1]
    st.caption(
        f"MQA caches {ratio:.0f}x less than MHA. Formula: 2 (K and V) × layers × K/V heads × head dim × tokens × "
        f"batch × bytes = 2 × {config.n_layers} × {config.n_kv_heads} × {config.head_dim} × {seq_len:,} × {batch} × "
        f"{kvcache.DTYPE_BYTES[dtype]} for this model."
    )
with right:
    show_figure(
        bar_chart(frame["variant"].str.replace(" ← this model", "").tolist(), (frame["total bytes"] / 2**30).tolist(),
                  title=f"KV cache at {seq_len:,} tokens, batch {batch}, {dtype}", y_title="GiB",
                  text=frame["KV cache, all layers"].tolist()),
        "The cache grows linearly with tokens and batch; K/V heads set the slope.",
        key="kv_bars",
    )

st.subheader("Who shares keys and values")
columns = st.columns(3)
drawn_heads = min(config.n_heads, 8)
for column, (name, kv_heads) in zip(columns, variants.items()):
    shown_kv = max(1, kv_heads * drawn_heads // config.n_heads)
    with column:
        show_figure(
            head_sharing(drawn_heads, shown_kv, title=name),
            f"{config.n_heads} query heads, {kv_heads} K/V head{'s' if kv_heads > 1 else ''}"
            + (f" (first {drawn_heads} drawn)" if drawn_heads < config.n_heads else "") + ".",
            key=f"kv_sharing_{name}",
        )

st.subheader("Cross-attention: queries from one text, keys and values from another")
columns = st.columns([3, 3, 1, 2])
source = columns[0].text_input("Encoder text (keys, values)", value=current_sentence(), key="kv_source", max_chars=500)
target = columns[1].text_input("Decoder text (queries)", value="A kitten rested on the rug.", key="kv_target", max_chars=500)
heads = columns[2].selectbox("Heads", [h for h in (1, 2, 4, 6, 8, 12) if bundle.d_model % h == 0], key="kv_cross_heads")
projections = columns[3].radio("Projections", ["identity", "random"], horizontal=True, key="kv_cross_proj",
                               help="Identity: attend by embedding similarity. Random: an untrained layer.")
try:
    example = cross_attention_example(bundle, source, target, n_heads=heads, projections=projections)
except ValueError as problem:
    st.warning(str(problem))
else:
    weights = example["weights"]
    source_labels = [f"{i} · {t}" for i, t in enumerate(example["source_tokens"])]
    target_labels = [f"{i} · {t}" for i, t in enumerate(example["target_tokens"])]
    shown = list(range(min(heads, 4)))
    show_figure(
        heatmap_row([weights[h] for h in shown], [f"head {h}" for h in shown], target_labels, source_labels,
                    title=f"{len(target_labels)} decoder queries attend over {len(source_labels)} encoder keys",
                    show_values=len(source_labels) * len(target_labels) <= 120),
        "The weights are not square: one row per decoder token, one column per encoder token. With identity "
        "projections and the model's own embeddings, related words find each other (kitten → cat).",
        key="kv_cross",
    )
