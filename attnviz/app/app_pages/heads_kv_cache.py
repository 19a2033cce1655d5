"""Heads and KV cache: MHA, GQA and MQA compared, KV-cache memory for real configurations, and cross-attention."""

import streamlit as st

from attnviz.core import kvcache
from attnviz.core.units import DTYPE_BYTES, human_bytes
from attnviz.pagelogic.heads_kv_cache import (
    cache_table,
    checkpoint_config,
    cross_attention_caption,
    cross_attention_example,
    formula_caption,
    variants_of,
    window_statement,
)
from attnviz.tiny_gpt.text import CROSS_ATTENTION_TARGET
from attnviz.ui.figures import show_figure
from attnviz.ui.frame import figure_columns, start_page
from attnviz.ui.messages import problem_text
from attnviz.ui.session_models import current_bundle
from attnviz.ui.sidebar import current_sentence
from attnviz.viz.charts import bar_chart
from attnviz.viz.heads import drawn_query_heads, head_sharing
from attnviz.viz.matrix import heatmap_row
from attnviz.viz.style import token_labels

SHARING_DRAWN = 8  # query heads drawn at most in each sharing diagram
SEQUENCE_LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 131072]


def cache_section(bundle) -> kvcache.AttentionConfig:
    presets = dict(kvcache.PRESETS)
    presets[f"Current checkpoint: {bundle.name}"] = checkpoint_config(bundle)
    columns = st.columns([3, 2, 2, 2])
    choice = columns[0].selectbox("Model configuration", list(presets), key="kv_preset", bind="query-params")
    config = presets[choice]
    seq_len = columns[1].select_slider("Sequence length", SEQUENCE_LENGTHS, 4096, key="kv_seq")
    batch = int(columns[2].number_input("Batch", 1, 1024, 1, key="kv_batch"))
    dtype = columns[3].selectbox("dtype", list(DTYPE_BYTES), index=1, key="kv_dtype")
    st.caption(
        f"**{config.name}**: {config.n_layers} layers, d_model {config.d_model}, {config.n_heads} query heads, "
        f"{config.n_kv_heads} K/V heads, head dim {config.head_dim} → {config.kind}; reads up to "
        f"{config.max_positions:,} tokens. Source: {config.source}."
    )
    if config.architecture == "encoder":
        st.info(
            f"{config.name} is an encoder: it reads its whole input at once and generates nothing, so it keeps no KV "
            "cache. The numbers below are what a decoder of the same shape would cache.", icon=":material/info:",
        )
    if config.architecture == "encoder-decoder":
        cross = kvcache.cross_attention_cache_bytes(config, seq_len, batch, dtype)
        st.info(
            f"{config.name}'s cache is its decoder's ({config.n_layers} layers). The decoder also keeps the "
            f"cross-attention K and V of the encoder's tokens: {human_bytes(cross)} more for {seq_len:,} encoder "
            "tokens.", icon=":material/info:",
        )
    if kvcache.beyond_context(config, seq_len):
        st.warning(
            f"{config.name} reads at most {config.max_positions:,} tokens: a {seq_len:,}-token cache is what the "
            "formula gives, not something this model can use.", icon=":material/warning:",
        )
    windows = window_statement(config, seq_len)
    if windows:
        st.info(windows, icon=":material/info:")
    frame = cache_table(config, seq_len, batch, dtype)
    # The table the whole width (six columns, none cut short), the chart below it.
    table, chart = st.container(), figure_columns([3, 2], key="kv_bars", min_width=260)
    with table:
        # static: its cells wrap, so all six columns show whole in a 900-px window (a data grid scrolled there)
        st.table(frame.drop(columns=["total bytes"]), hide_index=True, border="horizontal")
        ratio = frame["total bytes"].iloc[0] / frame["total bytes"].iloc[-1]
        st.caption(f"MQA caches {ratio:.0f}x less than MHA. " + formula_caption(config, seq_len, batch, dtype))
    with chart[0]:
        show_figure(
            bar_chart(frame["variant"].str.replace(" ← this model", "").tolist(),
                      (frame["total bytes"] / 2**30).tolist(),
                      title=f"KV cache at {seq_len:,} tokens, batch {batch}, {dtype}", y_title="GiB",
                      text=frame["KV cache, all layers"].tolist()),
            "The cache grows linearly with cached tokens and batch; the number of K/V heads sets the slope.",
            key="kv_bars",
        )
    with chart[1]:
        st.markdown("**See a real cache grow** on the page *Generation and KV cache*: a decoder writes token by token, "
                    "with its KV cache, PagedAttention's blocks and Ring attention's devices on its own tensors.")
    return config


def sharing_section(config: kvcache.AttentionConfig) -> None:
    st.subheader("Who shares keys and values")
    variants = variants_of(config)
    columns = figure_columns(3, key="kv_sharing", min_width=230)
    for column, (name, kv_heads) in zip(columns, variants.items(), strict=False):
        drawn = drawn_query_heads(config.n_heads, kv_heads, SHARING_DRAWN)
        groups = len({head // (config.n_heads // kv_heads) for head in drawn})
        with column:
            show_figure(
                head_sharing(config.n_heads, kv_heads, title=name, max_heads=SHARING_DRAWN),
                f"{config.n_heads} query heads, {kv_heads} K/V head{'s' if kv_heads > 1 else ''}"
                + (f" ({len(drawn)} query heads drawn, from {groups} of the {kv_heads} K/V groups; … marks query "
                   "heads left out)" if len(drawn) < config.n_heads else "") + ".",
                key=f"kv_sharing_{name}",
            )


def cross_attention_section(bundle) -> None:
    st.subheader("Cross-attention: queries from one text, keys and values from another")
    if bundle.modality == "image":
        st.info(f"{bundle.name} is a vision transformer: this example embeds text with the current model's token "
                "embeddings. Choose a text model in the sidebar for it.", icon=":material/image:")
        return
    columns = st.columns([3, 3, 1, 2])
    source = columns[0].text_input("Encoder text (keys, values)", value=current_sentence(), key="kv_source",
                                   max_chars=500)
    target = columns[1].text_input("Decoder text (queries)", value=CROSS_ATTENTION_TARGET, key="kv_target",
                                   max_chars=500)
    heads = columns[2].selectbox("Heads", [h for h in (1, 2, 4, 6, 8, 12) if bundle.d_model % h == 0],
                                 key="kv_cross_heads")
    projections = columns[3].radio("Projections", ["identity", "random"], horizontal=True, key="kv_cross_proj",
                                   help="Identity: attend by embedding similarity. Random: an untrained layer.")
    try:
        example = cross_attention_example(bundle, source, target, n_heads=heads, projections=projections)
    except ValueError as problem:
        st.warning(str(problem))
        return
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's tokenizer or embeddings raise, in words
        st.error(f"{bundle.name}'s embeddings could not be read for these texts: {problem_text(problem)}.",
                 icon=":material/error:")
        return
    weights = example["weights"]
    if not example["finite"]:
        st.warning(f"**Not finite:** {bundle.name}'s token embeddings give NaN or infinity here, so these weights "
                   "are not numbers (its weights hold NaN or infinity, or overflow).", icon=":material/warning:")
    source_labels, target_labels = token_labels(example["source_display"]), token_labels(example["target_display"])
    shown = list(range(min(heads, 4)))
    show_figure(
        heatmap_row([weights[h] for h in shown], [f"head {h}" for h in shown], target_labels, source_labels,
                    title=f"{len(target_labels)} decoder queries attend over {len(source_labels)} encoder keys",
                    show_values=len(source_labels) * len(target_labels) <= 120),
        cross_attention_caption(example, projections, heads),
        key="kv_cross",
    )


def main() -> None:
    start_page("Heads and KV cache")
    st.caption(
        "Every generated token must read the keys and values of all earlier tokens, so decoders cache them. Sharing "
        "K/V heads between query heads (GQA, MQA) shrinks that cache, the main cost of long contexts."
    )
    bundle = current_bundle()
    config = cache_section(bundle)
    sharing_section(config)
    cross_attention_section(bundle)


main()
