"""The "Heads and KV cache" page: MHA / GQA / MQA variants of a configuration and their caches, and a small
encoder-decoder example (queries from one text, keys and values from another of a different length)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pandas as pd
import torch

from attnviz.core import kvcache
from attnviz.core.attention import CrossAttention
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.core.units import DTYPE_BYTES, human_bytes
from attnviz.models import layer_facts
from attnviz.models.loading import FallbackTokenizer


def token_embeddings(bundle, text: str, limit: int = 32) -> tuple[list[str], torch.Tensor]:
    """The model's own input embeddings of ``text``'s tokens (no special tokens), ``[n, d_model]``."""
    if isinstance(bundle.tokenizer, FallbackTokenizer):
        tokens = bundle.tokenizer.tokenize(text)[:limit]
        ids = bundle.tokenizer.ids(tokens, text)[:limit]
    else:
        ids = bundle.tokenizer(text, add_special_tokens=False)["input_ids"][:limit]
        tokens = bundle.tokenizer.convert_ids_to_tokens(ids)
    if not ids:
        raise ValueError("type at least one word in each text")
    with torch.no_grad():
        embeddings = bundle.model.get_input_embeddings()(torch.tensor(ids)).float()
    return tokens, embeddings


def cross_attention_example(bundle, source: str, target: str, n_heads: int = 1, projections: str = "identity",
                            seed: int = 0) -> dict:
    """Run :class:`attnviz.core.attention.CrossAttention` with the target text's embeddings as queries and the
    source text's as keys and values.

    ``projections="identity"``: W_Q = W_K = W_V = W_O = I, so a head attends by embedding similarity on its slice
    of dimensions (words with related meanings align). ``"random"``: seeded random projections, as an untrained
    layer has. Returns tokens (raw, and as shown: ``source_display``, ``target_display``), weights
    ``[heads, n_target, n_source]`` and whether they are all finite.
    """
    source_tokens, memory = token_embeddings(bundle, source)
    target_tokens, queries = token_embeddings(bundle, target)
    d_model = memory.shape[-1]
    if d_model % n_heads:
        raise ValueError(f"{n_heads} heads do not divide d_model = {d_model}")
    torch.manual_seed(int(seed))
    layer = CrossAttention(d_model, n_heads, norm_first=False).eval()
    if projections == "identity":
        with torch.no_grad():
            for linear in (layer.attention.w_q, layer.attention.w_k, layer.attention.w_v, layer.attention.w_o):
                linear.weight.copy_(torch.eye(d_model))
    elif projections != "random":
        raise ValueError("projections must be 'identity' or 'random'")
    normalise = lambda x: x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6) * d_model**0.5  # noqa: E731
    with torch.no_grad():
        _, weights = layer(normalise(queries).unsqueeze(0), normalise(memory).unsqueeze(0))
    style = tokenizer_style(bundle.tokenizer)
    return {"source_tokens": source_tokens, "target_tokens": target_tokens, "weights": weights[0],
            "source_display": readable_tokens(source_tokens, style),  # as the page shows them ("␣the")
            "target_display": readable_tokens(target_tokens, style),
            "finite": bool(torch.isfinite(weights).all())}


def _plain(token: str) -> str:
    """A token as Markdown shows it literally."""
    return "".join("\\" + c if c in "\\`*_[]<>#|~$" else c for c in token) or "·"


def strongest_keys(example: dict, head: int = 0) -> list[tuple[str, str, float]]:
    """For each decoder token, the encoder token its query weighs most in ``head``: (decoder token, encoder
    token, weight), the tokens as the page shows them (``"␣cat"`` for byte-level ``"Ġcat"``)."""
    weights = example["weights"][head]  # [n_target, n_source]
    best = weights.argmax(-1)
    source = example.get("source_display", example["source_tokens"])
    target = example.get("target_display", example["target_tokens"])
    return [(query, source[int(key)], float(weights[row, key]))
            for row, (query, key) in enumerate(zip(target, best, strict=True))]


def cross_attention_caption(example: dict, projections: str, n_heads: int, limit: int = 8) -> str:
    """What the cross-attention figure shows, in words: how the scores are made and, measured on these texts,
    each decoder token's strongest encoder key (never a pairing the weights do not show)."""
    how = ("With identity projections a head scores each key by how alike the model's own embeddings of the two "
           "tokens are" + (" (on its slice of the dimensions)" if n_heads > 1 else "")
           if projections == "identity" else "With seeded random projections (as an untrained layer has)")
    pairs = strongest_keys(example)
    listed = ", ".join(f"{_plain(target)} → {_plain(source)} ({weight:.2f})"
                       for target, source, weight in pairs[:limit])
    more = f", ... ({len(pairs) - limit} more)" if len(pairs) > limit else ""
    return ("The weights need not be square: one row per decoder token, one column per encoder token. "
            f"{how}. Measured here, {'head 0' if n_heads > 1 else 'the head'}'s strongest key for each decoder "
            f"token: {listed}{more}.")


# ---------------------------------------------------------------------------------------------------------------
# MHA, GQA and MQA variants of one configuration


def variants_of(config: kvcache.AttentionConfig) -> dict[str, int]:
    """MHA, this model's GQA (or a middle one) and MQA: name -> number of K/V heads."""
    if config.n_kv_heads not in (1, config.n_heads):
        return {"MHA": config.n_heads, f"GQA ({config.n_kv_heads} K/V)": config.n_kv_heads, "MQA": 1}
    middle = [d for d in range(2, config.n_heads) if config.n_heads % d == 0]
    if middle:
        chosen = middle[len(middle) // 2]
        return {"MHA": config.n_heads, f"GQA ({chosen} K/V)": chosen, "MQA": 1}
    return {"MHA": config.n_heads, "MQA": 1} if config.n_heads > 1 else {"MHA": 1}


def checkpoint_config(bundle) -> kvcache.AttentionConfig:
    """The loaded checkpoint's cache-relevant shape, with each layer's window as its own config says
    (:mod:`attnviz.models.layer_facts`: sliding and full layers, GPT-Neo's local ones, a Mistral-style window)."""
    shape = kvcache.config_of_bundle(bundle)
    config = getattr(bundle.model, "config", None)
    if config is None:
        return shape
    windows = layer_facts.cache_windows(config, n_layers=shape.n_layers)
    if not any(w is not None for w in windows):
        return shape
    keeps_all = getattr(config, "model_type", "") in CACHES_EVERY_TOKEN
    return dataclasses.replace(shape, layer_windows=windows, cache_keeps_every_token=keeps_all)


# Model types whose cache in transformers keeps every token although some layers read only a window: GPT-Neo
# masks its local layers' old keys instead of dropping them (tests/test_kv_cache_measured.py weighs it).
CACHES_EVERY_TOKEN = frozenset({"gpt_neo"})


def _implementation_note(config: kvcache.AttentionConfig, seq_len: int) -> str:
    """What transformers' own cache holds beside what the windows need (measured in the tests)."""
    if config.cache_keeps_every_token:
        return (f" That is what the layers read. transformers' cache for {config.name} keeps every token: its "
                f"sliding layers mask the old keys instead of dropping them, so each layer holds all {seq_len:,}.")
    windows = sorted({w for w in config.windows if w is not None and w < seq_len})
    kept = " and ".join(f"{w - 1:,}" for w in windows)
    return (f" Between two steps transformers keeps the last {kept} there (W - 1: the next token's own key makes "
            "W); the table counts the full window.")


def _layer_groups(config: kvcache.AttentionConfig, seq_len: int) -> list[tuple[int, int | None, int]]:
    """(layers, window or None, tokens each holds) for each distinct window, full layers first."""
    counts = Counter(config.windows)
    order = sorted(counts, key=lambda w: (w is not None, w or 0))
    return [(counts[w], w, seq_len if w is None else min(seq_len, w)) for w in order]


def window_statement(config: kvcache.AttentionConfig, seq_len: int) -> str | None:
    """What the sliding windows do to the cache at ``seq_len`` tokens, per kind of layer; None when every layer
    caches every token."""
    tokens = kvcache.layer_tokens(config, seq_len)
    if min(tokens, default=seq_len) >= seq_len:
        return None
    groups = _layer_groups(config, seq_len)
    if len(groups) == 1:
        _, window, held = groups[0]
        return (f"{config.name} attends over a sliding window of {window:,} tokens in every layer, so each layer's "
                f"rolling-buffer cache holds only the last {held:,} of the {seq_len:,} tokens."
                + _implementation_note(config, seq_len))
    parts = []
    for count, window, held in groups:
        layers = f"{count} layer{'s' if count > 1 else ''}"
        if window is None:
            parts.append(f"{layers} attend{'s' if count == 1 else ''} to every token and cache all {seq_len:,}")
        else:
            parts.append(f"{layers} slide{'s' if count == 1 else ''} a window of {window:,} tokens, so "
                         f"{'its' if count == 1 else 'their'} rolling-buffer cache{'' if count == 1 else 's'} "
                         f"hold{'s' if count == 1 else ''} only the last {held:,}")
    return (f"{config.name} mixes sliding-window and full-attention layers, as its config says: "
            + "; ".join(parts) + "." + _implementation_note(config, seq_len))


def formula_caption(config: kvcache.AttentionConfig, seq_len: int, batch: int, dtype: str) -> str:
    """The cache formula with this model's numbers, summed per kind of layer where they differ."""
    size = DTYPE_BYTES[dtype]
    groups = _layer_groups(config, seq_len)
    if len(groups) == 1:
        held = groups[0][2]
        text = (f"Formula: 2 (K and V) × layers × K/V heads × head dim × cached tokens × batch × bytes = 2 × "
                f"{config.n_layers} × {config.n_kv_heads} × {config.head_dim} × {held:,} × {batch} × {size:g} for "
                "this model.")
    else:
        terms = " + ".join(f"{count} × {held:,}" for count, _, held in groups)
        text = (f"Formula: 2 (K and V) × K/V heads × head dim × batch × bytes × the tokens each layer caches, summed "
                f"over the layers = 2 × {config.n_kv_heads} × {config.head_dim} × {batch} × {size:g} × ({terms}) "
                "for this model.")
    rolling = [held for _, window, held in groups if window is not None and held < seq_len]
    if not rolling:
        return text + " 'Per cached token' is what each token held costs one sequence."
    if len(groups) == 1:
        return text + (" 'Per cached token' is what each token held costs one sequence (once the rolling buffer "
                       "is full, a new token overwrites the oldest and costs nothing more).")
    full_layers = sum(count for count, window, _ in groups if window is None or window >= seq_len)
    full_cost = 2 * full_layers * config.n_kv_heads * config.head_dim * size
    return text + (" 'Per cached token' is what a token held in every layer costs one sequence; once the sliding "
                   f"layers' buffers are full, a new token costs only the {full_layers} layers that keep every "
                   f"token: {human_bytes(full_cost)}.")


def _per_layer_text(cache: dict, seq_len: int) -> str:
    """One layer's cache, or each kind of layer's where sliding and full layers differ."""
    sizes = sorted(set(zip(cache["layers"], cache["layer_tokens"], strict=True)), reverse=True)
    if len(sizes) == 1:
        return human_bytes(sizes[0][0])
    return " / ".join(f"{human_bytes(size)} ({'full' if held >= seq_len else f'{held:,} tokens'})"
                      for size, held in sizes)


def cache_table(config: kvcache.AttentionConfig, seq_len: int, batch: int, dtype: str) -> pd.DataFrame:
    """One row per variant: K/V heads, cache per layer and in all, per token of one sequence, parameters."""
    rows = []
    for name, kv_heads in variants_of(config).items():
        variant = kvcache.with_kv_heads(config, kv_heads)
        cache = kvcache.kv_cache_bytes(variant, seq_len, batch, dtype)
        parameters = kvcache.attention_parameters(variant)
        rows.append(
            {
                "variant": name + (" ← this model" if kv_heads == config.n_kv_heads else ""),
                "K/V heads": kv_heads,
                "KV cache per layer": _per_layer_text(cache, seq_len),
                "KV cache, all layers": human_bytes(cache["total"]),
                "per cached token": human_bytes(cache["per_token"]),
                "attention parameters per layer": f"{parameters['per layer'] / 1e6:.3g}M",
                "total bytes": cache["total"],
            }
        )
    return pd.DataFrame(rows)
