"""What each attention layer of a checkpoint does, read from its own config (and modules, when loaded): the one
place the pages ask whether a layer slides a window, how wide, whether its softmax has a learned sink, and
whether its scores are soft-capped.

- **Sliding or full.** transformers' ``config.layer_types`` names each layer ("sliding_attention",
  "full_attention", ...) and ``config.sliding_window`` the window (Gemma 2 and 3, gpt-oss, Cohere 2, Qwen 2 with
  ``use_sliding_window``, which derives ``layer_types`` from ``max_window_layers``). A ``sliding_window`` with no
  ``layer_types`` applies to every layer (Mistral, Mixtral, Phi-3, Starcoder 2: a global window), as transformers'
  own cache builder reads it. GPT-Neo names its layers "global" and "local" (``attention_types`` expanded into
  ``attention_layers``) with ``window_size``.
- **The window** W counts the keys a query reads, itself included: the query at position i reads keys
  i - W + 1 .. i (transformers' sliding mask ``i - j < W``; GPT-Neo's ``local`` mask is the same).
- **Sinks** (gpt-oss): one learned logit per head joins every row's softmax as a column with no value, so the
  weights on the keys sum to less than 1. Read from the model's attention modules (a ``sinks`` parameter) when a
  model is given, else from the type's architecture record.
- **Soft-capping** (Gemma 2): ``attn_logit_softcapping`` caps the scores at ±c with c·tanh(s / c).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.models.architectures import ARCHITECTURES

SLIDING_LAYER_TYPES = ("sliding_attention", "hybrid_sliding")  # transformers' names of a sliding-window layer
NEO_LOCAL = "local"  # GPT-Neo's name of its sliding layers (its others are "global")


@dataclass(frozen=True)
class LayerFacts:
    """One attention layer: ``kind`` "sliding" or "full" (or transformers' own name of another layer type),
    ``window`` the keys a query reads at most (sliding; None: every earlier key), ``sinks`` whether its softmax has
    a learned sink logit per head (None: not known), ``softcap`` its score cap (None: no cap)."""

    layer: int
    kind: str
    window: int | None = None
    sinks: bool | None = False
    softcap: float | None = None

    @property
    def sliding(self) -> bool:
        return self.window is not None

    def first_key(self, query_position: int) -> int:
        """The oldest key the query at ``query_position`` reads (0 on a full layer, or before the window fills)."""
        return 0 if self.window is None else max(0, query_position - self.window + 1)

    def tokens_needed(self, seq_len: int) -> int:
        """How many tokens' K and V this layer must keep to continue a ``seq_len``-token sequence: all of them, or
        the last ``window`` (a rolling buffer: older keys can never be read again)."""
        return seq_len if self.window is None else min(seq_len, self.window)


def decoder_config(config):
    """The config whose layers generate: the text decoder's of a composite (image-text) config, else itself."""
    getter = getattr(config, "get_text_config", None)
    if getter is not None:
        try:
            return getter(decoder=True)
        except (TypeError, ValueError):
            return config
    return config


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _layer_count(config) -> int:
    for name in ("num_hidden_layers", "n_layer", "num_layers", "decoder_layers"):
        count = _int(getattr(config, name, None))
        if count:
            return count
    return 0


def _layer_config(config, layer: int):
    """A heterogeneous config's own settings for ``layer`` (transformers' ``per_layer_config``), else the config."""
    if getattr(config, "is_heterogeneous", False):
        try:
            return config.per_layer_config[layer]
        except (AttributeError, IndexError, KeyError, TypeError):
            return config
    return config


def _kinds_and_windows(config, n_layers: int) -> list[tuple[str, int | None]]:
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and layer_types:
        result = []
        for layer, name in enumerate(list(layer_types)[:n_layers] if n_layers else layer_types):
            window = _int(getattr(_layer_config(config, layer), "sliding_window", None))
            if name in SLIDING_LAYER_TYPES and window:
                result.append(("sliding", window))
            else:
                result.append(("full" if name in ("full_attention", "sliding_attention") else str(name), None))
        return result
    neo_layers = getattr(config, "attention_layers", None)  # GPT-Neo: "global" / "local" per layer
    if isinstance(neo_layers, (list, tuple)) and neo_layers:
        window = _int(getattr(config, "window_size", None))
        return [("sliding", window) if name == NEO_LOCAL and window else ("full", None) for name in neo_layers]
    window = _int(getattr(config, "sliding_window", None))  # Mistral-style: one window for every layer
    return [("sliding", window) if window else ("full", None) for _ in range(n_layers)]


def _sinks_per_layer(model, n_layers: int) -> list[bool | None]:
    """Whether each layer's attention holds a learned ``sinks`` parameter: the modules that hold one, in the
    model's order, one per layer; none: no layer has sinks; another count: not known per layer."""
    holders = [module for module in model.modules() if isinstance(getattr(module, "sinks", None), torch.nn.Parameter)]
    if not holders:
        return [False] * n_layers
    return [True] * n_layers if len(holders) == n_layers else [None] * n_layers


def layer_facts(config, model=None, *, n_layers: int | None = None) -> tuple[LayerFacts, ...]:
    """Every attention layer's facts (see the module docstring), from ``config`` (a decoder's, or the text
    decoder's of a composite) and, when given, the loaded ``model``'s modules. ``n_layers``: how many layers to
    describe where the config's own count is not the one wanted (an encoder-decoder's decoder)."""
    config = decoder_config(config)
    count = n_layers or _layer_count(config)
    kinds = _kinds_and_windows(config, count)
    if count and len(kinds) < count:  # a shorter list than the layers: the rest attend in full
        kinds += [("full", None)] * (count - len(kinds))
    cap = getattr(config, "attn_logit_softcapping", None)
    softcap = float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None
    if model is not None:
        sinks = _sinks_per_layer(model, len(kinds))
    else:
        record = ARCHITECTURES.get(getattr(config, "model_type", ""))
        known = None if record is None else "attention sinks" in record.traits
        sinks = [known] * len(kinds)
    return tuple(LayerFacts(layer, kind, window, sink, softcap)
                 for layer, ((kind, window), sink) in enumerate(zip(kinds, sinks, strict=True)))


def cache_windows(config, n_layers: int | None = None) -> tuple[int | None, ...]:
    """Per layer, the most tokens its KV cache must hold (its window), None for a layer that reads every key."""
    return tuple(facts.window for facts in layer_facts(config, n_layers=n_layers))
