"""Run a model on a text and capture what every attention call received: queries, keys, values, the model's
mask, scaling and score modifiers, and the output the model's own kernel produced.

The model runs on its fast path (see :mod:`attnviz.models.attention_hook`); nothing holds the
``[layers, heads, N, N]`` weights. They are materialised on demand, per layer, head and query range, by exact
replay in fp32 (the scores as the model formed them, then :func:`attnviz.attention.masked_softmax`), so an
8,192-token text costs the queries, keys and values it keeps, not 36 GB. Only views that need every head at once
(rollout, compare, what-if, the .npz export) materialise all of them, and only up to ``DENSE_LIMIT`` tokens.

What the replay applies, as recorded from each call:

* **scaling**: the ``scaling`` the module passed (1/sqrt(d) when it passed none; 1 for T5, whose weights fold it);
* **mask**: transformers' SDPA mask for the call (padding, causal, sliding window), stored as a rule
  (:class:`~attnviz.masks.MaskSpec`: causal or full, with a window) when it is one, else as a dense boolean
  ``[n_q, n_k]`` shared by the layers that use it. A None mask (transformers' shortcut for plain causal or full) is
  rebuilt from the module's ``is_causal``;
* **position bias** (T5's relative attention bias): the ``position_bias`` tensor, added to the scaled scores
  (one tensor shared by every layer that reuses it);
* **logit soft-capping** (Gemma 2): ``softcap * tanh(scores / softcap)`` before the mask;
* **attention sinks** (gpt-oss): the sink logit joins every row's softmax and is dropped after it, so rows sum
  to less than 1;
* **ALiBi** (BLOOM, read by hooks: :mod:`attnviz.models.eager`): the per-head slope times the key position,
  added to the scaled scores like a position bias.

Models that compute attention in their own code take :mod:`attnviz.models.eager`'s paths: hooks (replayed the
same way, checked against the model's eager weights) or transformers' eager weights alone (``replayable`` False).

The replay check recomputes every layer's attention output (weights @ V, with the weights the page shows) and
compares it with the output of the model's own kernel, run again exactly as the model called it (the same
function, arguments and tensors: deterministic, so the same output the forward produced) rather than kept, so
a capture holds Q, K and V only.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
from dataclasses import dataclass, field

import torch

from attnviz import masks
from attnviz.attention import masked_softmax, repeat_kv
from attnviz.models import eager
from attnviz.models.attention_hook import AttentionCall, recording
from attnviz.models.loading import FallbackTokenizer, ModelBundle

CHARS_PER_TOKEN = 6  # characters of a long text read at first per token wanted (English: about 4; see _tokenize)
DENSE_LIMIT = 1024  # tokens: up to this (and DENSE_CELLS), all weights may be materialised at once
DENSE_CELLS = 80_000_000  # layers x heads x n_q x n_k: 320 MB of fp32 (6 x 12 heads x 1,054 tokens)
BLOCK_CELLS = 16_000_000  # a replayed block of rows: heads x rows x n_k floats (64 MB), whatever the model
REPLAY_BLOCK = 512  # at most this many query rows a block


class TooLongForDense(ValueError):
    """All of a long input's weights at once would not fit; use per-head or pooled views instead."""


class NotReplayable(ValueError):
    """The model's weights came from transformers' eager ``output_attentions`` only: attnviz has no Q and K to
    recompute them with another mask, scale or temperature (see :mod:`attnviz.models.eager`)."""


class LayerStack:
    """One tensor per layer, indexed like the stacked ``[layers, ...]`` tensor without copying them into one (a
    copy would hold every layer twice at the end of a capture). ``stack[layer, ...]`` indexes one layer's tensor."""

    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.tensors), *self.tensors[0].shape))

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0].dtype

    def __len__(self) -> int:
        return len(self.tensors)

    def __getitem__(self, index):
        layer, rest = (index[0], index[1:]) if isinstance(index, tuple) else (index, ())
        if isinstance(layer, int):
            return self.tensors[layer][rest] if rest else self.tensors[layer]
        return torch.stack([t[rest] if rest else t for t in self.tensors[layer]])

    def stacked(self) -> torch.Tensor:
        """All layers in one tensor (a copy), e.g. for an export."""
        return torch.stack(self.tensors)

    def float(self) -> torch.Tensor:
        return self.stacked().float()

    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors)

    def element_size(self) -> int:
        return self.tensors[0].element_size()


@dataclass(frozen=True)
class LayerMask:
    """The model's mask of one attention call: a rule when it is one, else a dense ``[n_q, n_k]`` bool."""

    rule: masks.MaskSpec | None
    dense: torch.Tensor | None = None

    def rows(self, start: int, end: int) -> torch.Tensor:
        """``[end - start, n_k]`` bool, True = may attend."""
        if self.dense is not None:
            return self.dense[start:end]
        return self.rule.tile(start, end, 0, self.rule.n_k)

    @property
    def is_causal(self) -> bool:
        return self.rule is not None and self.rule.causal


def _rule_of(call: AttentionCall, n_q: int, n_k: int, cache: dict) -> LayerMask:
    """The mask of ``call`` as a rule where possible, cached by the model's mask tensor (transformers passes the
    same one to every layer of a kind), so a dense mask is checked and kept once, not per layer."""
    if call.mask is None:
        return LayerMask(masks.MaskSpec(n_q, n_k, causal=call.is_causal and n_q > 1))
    key = (id(call.kernel.attention_mask), call.sliding_window)
    if key in cache:
        return cache[key]
    dense = call.mask[..., :n_k].expand(n_q, n_k)
    candidates = [masks.MaskSpec(n_q, n_k), masks.MaskSpec(n_q, n_k, causal=True)]
    if call.sliding_window:
        candidates.append(masks.MaskSpec(n_q, n_k, causal=True, window=(call.sliding_window - 1, 0)))
    found = next((LayerMask(rule) for rule in candidates if torch.equal(rule.dense(), dense)), None)
    cache[key] = found or LayerMask(None, dense.clone())
    return cache[key]


@dataclass
class AttentionRecord:
    """One attention kind ("self", "encoder", "decoder" or "cross") over all its layers, batch of one.

    Tensors stay in the model's dtype; weights are replayed in fp32 on demand (:meth:`head_weights`,
    :meth:`layer_weights`); ``weights`` materialises all of them, for inputs of at most :data:`DENSE_LIMIT`."""

    kind: str
    queries: LayerStack | None  # [layers, heads, n_q, d_head], as the attention saw them (after RoPE, if any)
    keys: LayerStack | None  # [layers, kv_heads, n_k, d_head]
    values: LayerStack | None  # [layers, kv_heads, n_k, d_v]
    kernels: list  # per layer: the model's own kernel call (attention_hook.KernelCall), for the replay check
    layer_masks: list[LayerMask]
    scales: list[float]  # per layer
    query_tokens: list[str]
    key_tokens: list[str]
    biases: list[torch.Tensor | None] = field(default_factory=list)  # per layer [heads, n_q, n_k] (T5)
    softcaps: list[float | None] = field(default_factory=list)
    sinks: list[torch.Tensor | None] = field(default_factory=list)  # per layer [heads]
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # derived views, computed once
    # The weights path (no Q/K/V): transformers' eager weights per layer, [layers, heads, n_q, n_k]
    eager: LayerStack | None = None

    @property
    def replayable(self) -> bool:
        """Whether attnviz holds Q and K (replay, Q.K, what-if); False on the eager-weights path."""
        return self.queries is not None

    def _require_replay(self, what: str) -> None:
        if not self.replayable:
            raise NotReplayable(f"{what} needs the model's queries and keys, which this model's own attention code "
                                "does not expose; attnviz shows transformers' eager weights for it")

    @property
    def _rows(self) -> LayerStack:
        """What has the ``[layers, heads, n_q, ...]`` shape: the queries, or the eager weights."""
        return self.queries if self.replayable else self.eager

    @property
    def n_layers(self) -> int:
        return self._rows.shape[0]

    @property
    def n_heads(self) -> int:
        return self._rows.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.keys.shape[1] if self.replayable else self.n_heads

    @property
    def n_q(self) -> int:
        return self._rows.shape[2]

    @property
    def n_k(self) -> int:
        return self.keys.shape[2] if self.replayable else self.eager.shape[3]

    def kv_head(self, head: int) -> int:
        """The K/V head a query head reads (grouped-query attention: consecutive groups)."""
        return head * self.n_kv_heads // self.n_heads

    def mask_rows(self, layer: int, start: int = 0, end: int | None = None) -> torch.Tensor:
        """The model's mask for query rows ``start:end`` of ``layer``: ``[rows, n_k]`` bool, True = may attend."""
        return self.layer_masks[layer].rows(start, self.n_q if end is None else end)

    def bias_rows(self, layer: int, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        bias = self.biases[layer] if self.biases else None
        return None if bias is None else bias[:, start:end].float()  # [heads, rows, n_k]

    def scores(self, layer: int, start: int = 0, end: int | None = None, *, heads: list[int] | None = None,
               scale: float | None = None, temperature: float = 1.0,
               extra_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The logits the softmax sees for query rows ``start:end``: ``[heads, rows, n_k]`` fp32, before masking:
        q·k times the scaling, soft-capped, plus the model's position bias. ``scale`` replaces the model's scaling,
        ``extra_bias`` (``[rows or n_q, n_k]``, e.g. an ALiBi bias) is added after the model's, and
        ``temperature`` divides every logit (the what-if)."""
        self._require_replay("The scores")
        heads = list(range(self.n_heads)) if heads is None else heads
        q = self.queries[layer, heads, start:end].float()  # [h, rows, d]
        k = self.keys[layer, [self.kv_head(h) for h in heads]].float()  # [h, n_k, d]
        logits = q @ k.transpose(-2, -1) * (self.scales[layer] if scale is None else scale)
        softcap = self.softcaps[layer] if self.softcaps else None
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        bias = self.bias_rows(layer, start, end)
        if bias is not None:
            logits = logits + bias[heads]
        if extra_bias is not None:
            rows = extra_bias[start:end] if extra_bias.shape[0] == self.n_q else extra_bias
            logits = logits + rows.float()
        return logits / temperature

    def layer_weights(self, layer: int, start: int = 0, end: int | None = None, *, heads: list[int] | None = None,
                      mask: torch.Tensor | None = None, scale: float | None = None,
                      temperature: float = 1.0, extra_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights of ``heads`` (default all) for query rows ``start:end``: ``[heads, rows, n_k]`` fp32,
        as the model computes them (:meth:`scores`, then the softmax over the allowed keys and any sink column).
        The one place the score formula lives: the what-if, the Scaling and Positional pages call it too.

        ``mask`` (bool ``[rows, n_k]`` or ``[n_q, n_k]``, True = may attend) replaces the model's mask."""
        end = self.n_q if end is None else end
        allowed = self.mask_rows(layer, start, end) if mask is None else (
            mask[start:end] if mask.shape[0] == self.n_q and end - start != self.n_q else mask)
        if not self.replayable:
            if scale is not None or temperature != 1.0 or extra_bias is not None:
                self._require_replay("Another scale, temperature or bias")
            chosen = list(range(self.n_heads)) if heads is None else heads
            weights = self.eager[layer, chosen, start:end].float()  # [heads, rows, n_k]
            if mask is None:
                return weights
            # A softmax over a subset of its keys is the full softmax renormalised over them: exact without Q and
            # K, as long as the new mask only takes keys away from the model's.
            if (allowed & ~self.mask_rows(layer, start, end)).any():
                self._require_replay("A mask that lets a query see keys the model's mask hides")
            kept = weights * allowed
            return kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
        logits = self.scores(layer, start, end, heads=heads, scale=scale, temperature=temperature,
                             extra_bias=extra_bias)
        sinks = self.sinks[layer] if self.sinks else None
        if sinks is None:
            return masked_softmax(logits, allowed)
        heads = list(range(self.n_heads)) if heads is None else heads
        column = sinks[heads].float().view(-1, 1, 1).expand(-1, logits.shape[1], 1)  # [h, rows, 1]
        with_sink = torch.cat([logits.masked_fill(~allowed, float("-inf")), column], dim=-1)
        return torch.softmax(with_sink, dim=-1)[..., :-1]

    def head_weights(self, layer: int, head: int, start: int = 0, end: int | None = None, **options) -> torch.Tensor:
        """One head's weights for query rows ``start:end``: ``[rows, n_k]`` fp32."""
        return self.layer_weights(layer, start, end, heads=[head], **options)[0]

    def block_rows(self) -> int:
        """Query rows per replayed block: BLOCK_CELLS floats for all heads, at most REPLAY_BLOCK rows."""
        return max(16, min(REPLAY_BLOCK, BLOCK_CELLS // max(1, self.n_heads * self.n_k)))

    @property
    def dense_ok(self) -> bool:
        """Whether every head's weights at once are small enough to materialise."""
        cells = self.n_layers * self.n_heads * self.n_q * self.n_k
        return max(self.n_q, self.n_k) <= DENSE_LIMIT and cells <= DENSE_CELLS

    def check_dense(self) -> None:
        if not self.dense_ok:
            raise TooLongForDense(
                f"{max(self.n_q, self.n_k):,} tokens x {self.n_layers} layers x {self.n_heads} heads: this view needs "
                f"every head's {self.n_q:,} x {self.n_k:,} weights at once, which attnviz computes up to "
                f"{DENSE_LIMIT:,} tokens (and 320 MB of weights); use the head view (pooled, with zoom) or head "
                "statistics"
            )

    @functools.cached_property
    def weights(self) -> torch.Tensor:
        """All weights ``[layers, heads, n_q, n_k]`` fp32, replayed once and kept (inputs up to DENSE_LIMIT)."""
        self.check_dense()
        return torch.stack([self.layer_weights(layer) for layer in range(self.n_layers)])

    @property
    def allowed(self) -> torch.Tensor:
        """The model's masks ``[layers, n_q, n_k]`` bool (short inputs)."""
        self.check_dense()
        return torch.stack([self.mask_rows(layer) for layer in range(self.n_layers)])

    @property
    def bias(self) -> torch.Tensor | None:
        """The position bias ``[layers, heads, n_q, n_k]`` (T5), or None (short inputs)."""
        if not self.biases or all(b is None for b in self.biases):
            return None
        self.check_dense()
        return torch.stack([b.float() for b in self.biases])


@dataclass
class Capture:
    model_name: str
    text: str
    text_pair: str | None
    tokens: list[str]  # the (encoder) input tokens
    segments: list[int]  # 0 = sentence A, 1 = sentence B, per token
    special: list[bool]  # [CLS], [SEP], <s>, padding, ...
    records: dict[str, AttentionRecord] = field(default_factory=dict)
    truncated: bool = False
    n_tokens_before_truncation: int = 0  # negative when only a lower bound is known (a very long text)
    decoder_tokens: list[str] | None = None
    decoder_special: list[bool] | None = None
    layout: object = None  # a vision model's attnviz.vision.PatchLayout: which token is which patch
    image: object = None  # ... and the image as it saw it, [H, W, 3] uint8
    nonfinite: list[str] = field(default_factory=list)  # what held NaN or infinity: "the queries of layers 0-1", ...

    def special_of(self, tokens: list[str]) -> list[bool]:
        """Which of ``tokens`` (the encoder's or the decoder's list) are special tokens."""
        if tokens is self.decoder_tokens and self.decoder_special is not None:
            return self.decoder_special
        if tokens is self.tokens:
            return self.special
        return [False] * len(tokens)

    @property
    def kinds(self) -> list[str]:
        return list(self.records)

    @property
    def length_of_text(self) -> str:
        """How many tokens the whole text has, as the pages say it: '1,234', or 'more than 8,192'."""
        total = self.n_tokens_before_truncation
        return f"{total:,}" if total >= 0 else f"more than {-total:,}"


def _attention_kind(module_name: str, encoder_decoder: bool) -> str:
    if not encoder_decoder:
        return "self"
    lowered = module_name.lower()
    if "encoder_attn" in lowered or "encdecattention" in lowered or "crossattention" in lowered:
        return "cross"
    return "encoder" if lowered.startswith("encoder") or ".encoder." in lowered else "decoder"


def _tokenize(bundle: ModelBundle, text: str, text_pair: str | None, max_tokens: int, fallback: str | None = None):
    tokenizer = bundle.tokenizer
    if isinstance(tokenizer, FallbackTokenizer):
        if fallback:
            tokenizer = FallbackTokenizer(fallback, tokenizer.vocab_size)
        tokens = tokenizer.tokenize(text) + (tokenizer.tokenize(text_pair) if text_pair else [])
        ids = tokenizer.ids(tokenizer.tokenize(text), text) + (
            tokenizer.ids(tokenizer.tokenize(text_pair), text_pair) if text_pair else []
        )
        segments = [0] * len(tokenizer.tokenize(text)) + [1] * (len(tokens) - len(tokenizer.tokenize(text)))
        total = len(ids)
        ids, tokens, segments = ids[:max_tokens], tokens[:max_tokens], segments[:max_tokens]
        inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        return inputs, tokens, segments, [False] * len(tokens), total
    # A long text is read as a prefix that holds more than max_tokens tokens (grown until it does), so a 400 KB
    # document is not tokenized whole to read its first 512 tokens.
    budget = max_tokens * CHARS_PER_TOKEN
    while True:
        cut = len(text) > budget or (text_pair is not None and len(text_pair) > budget)
        prefix, prefix_pair = text[:budget], None if text_pair is None else text_pair[:budget]
        full = tokenizer(prefix, prefix_pair, truncation=False, return_tensors="pt", return_token_type_ids=None)
        if not cut or full["input_ids"].shape[1] > max_tokens:
            break
        budget *= 2
    total = full["input_ids"].shape[1]
    total = -total if cut else total  # negative: at least this many
    encoded = full if abs(total) <= max_tokens else tokenizer(
        prefix, prefix_pair, truncation=True, max_length=max_tokens, return_tensors="pt", return_token_type_ids=None
    )
    ids = encoded["input_ids"][0].tolist()
    tokens = tokenizer.convert_ids_to_tokens(ids)
    special_ids = set(tokenizer.all_special_ids)
    special = [i in special_ids for i in ids]
    if "token_type_ids" in encoded and text_pair:
        segments = encoded["token_type_ids"][0].tolist()
    elif text_pair:
        sequence_ids = encoded.sequence_ids(0) if hasattr(encoded, "sequence_ids") else None
        segments = [1 if s == 1 else 0 for s in sequence_ids] if sequence_ids else [0] * len(ids)
        # A special token after the first sentence's end belongs to B for the A/B filters.
        if sequence_ids:
            seen_b = False
            for i, s in enumerate(sequence_ids):
                seen_b = seen_b or s == 1
                segments[i] = 1 if (s == 1 or (s is None and seen_b)) else 0
    else:
        segments = [0] * len(ids)
    accepted = set(inspect.signature(bundle.model.forward).parameters)
    inputs = {k: v for k, v in encoded.items() if k in accepted}
    return inputs, tokens, segments, special, total


def _model_inputs(bundle: ModelBundle, text: str, text_pair: str | None, limit: int, fallback: str | None):
    """Tokenize for the model: ``(inputs, tokens, segments, special, total, decoder_tokens, decoder_special)``.
    For an encoder-decoder model the pair is the decoder's input (default: the text itself)."""
    encoder_decoder = bundle.architecture == "encoder-decoder"
    inputs, tokens, segments, special, total = _tokenize(
        bundle, text, None if encoder_decoder else text_pair, limit, fallback
    )
    decoder_tokens = decoder_special = None
    if encoder_decoder:
        decoder_inputs, decoder_tokens, _, decoder_special, _ = _tokenize(bundle, text_pair or text, None, limit,
                                                                          fallback)
        inputs["decoder_input_ids"] = decoder_inputs["input_ids"]
        if "attention_mask" in decoder_inputs:
            inputs["decoder_attention_mask"] = decoder_inputs["attention_mask"]
    return inputs, tokens, segments, special, total, decoder_tokens, decoder_special


def _record_of(kind: str, calls: list[AttentionCall], query_tokens: list[str],
               key_tokens: list[str]) -> AttentionRecord:
    """One attention kind's calls (one per layer) stacked into a record."""
    n_q, n_k = calls[0].query.shape[-2], calls[0].key.shape[-2]
    rule_cache: dict = {}
    layer_masks = [_rule_of(c, n_q, n_k, rule_cache) for c in calls]
    for call, layer_mask in zip(calls, layer_masks, strict=True):
        if layer_mask.rule is not None and call.kernel.attention_mask is not None:
            # An N x N mask that is a rule is not kept: the replay check builds it again when it runs.
            rule = layer_mask.rule
            call.kernel.attention_mask = None
            call.kernel.rebuild_mask = lambda rule=rule: rule.dense()[None, None]
    del rule_cache
    return AttentionRecord(
        kind=kind,
        queries=LayerStack([c.query for c in calls]),  # [layers, heads, n_q, d_head]
        keys=LayerStack([c.key for c in calls]),  # [layers, kv_heads, n_k, d_head]
        values=LayerStack([c.value for c in calls]),  # [layers, kv_heads, n_k, d_v]
        kernels=[c.kernel for c in calls],
        layer_masks=layer_masks,
        scales=[c.scaling for c in calls],
        query_tokens=query_tokens,
        key_tokens=key_tokens,
        biases=[None if c.position_bias is None else c.position_bias.expand(-1, n_q, n_k) for c in calls],
        softcaps=[c.softcap for c in calls],
        sinks=[c.sinks for c in calls],
    )


def capture(
    bundle: ModelBundle,
    text: str,
    text_pair: str | None = None,
    *,
    max_tokens: int | None = None,
    fallback_tokenizer: str | None = None,
) -> Capture:
    """Run ``bundle``'s model on ``text`` (and ``text_pair`` for A/B pairs; for encoder-decoder models the pair
    is the decoder's input, defaulting to ``text``) and capture every attention call.

    ``fallback_tokenizer`` ("whitespace" or "bytes") chooses the stand-in tokenizer of a checkpoint that has none.
    """
    if not text or not text.strip():
        raise ValueError("the text is empty: type a sentence")
    limit = min(bundle.max_positions, max_tokens or bundle.max_positions)
    if bundle.capture_path != "interface":  # every layer's weights at once: see attnviz.models.eager
        limit = min(limit, eager.token_limit(bundle.n_layers, bundle.n_heads, DENSE_CELLS, DENSE_LIMIT))
    encoder_decoder = bundle.architecture == "encoder-decoder"
    inputs, tokens, segments, special, total, decoder_tokens, decoder_special = _model_inputs(
        bundle, text, text_pair, limit, fallback_tokenizer
    )
    _check_ids(bundle.model, inputs)
    device = _device_of(bundle.model)
    inputs = {name: value.to(device) if hasattr(value, "to") else value for name, value in inputs.items()}
    if bundle.capture_path == "interface":
        (calls, outputs_finite), eager_weights = _recorded_calls(bundle.model, inputs), {}
    else:
        eager_weights, calls, outputs_finite = eager.run(bundle.model, bundle.model_type, inputs, encoder_decoder)
        calls = [_to_cpu(call) for call in calls]

    result = Capture(
        model_name=bundle.name,
        text=text,
        text_pair=text_pair,
        tokens=tokens,
        segments=segments,
        special=special,
        truncated=abs(total) > len(tokens),
        n_tokens_before_truncation=total,
        decoder_tokens=decoder_tokens,
        decoder_special=decoder_special,
    )
    by_kind: dict[str, list[AttentionCall]] = {}
    for call in calls:
        by_kind.setdefault(_attention_kind(call.module_name, encoder_decoder), []).append(call)
    for kind in by_kind or eager_weights:
        query_tokens = decoder_tokens if kind in ("decoder", "cross") else tokens
        key_tokens = decoder_tokens if kind == "decoder" else tokens
        if by_kind:
            result.records[kind] = _record_of(kind, by_kind[kind], query_tokens, key_tokens)
        else:  # what the model's own weights show: causal when no query ever weights a later key
            weights = eager_weights[kind]
            causal = kind != "cross" and len(query_tokens) > 1 and all(
                not bool(w.triu(diagonal=1 + w.shape[-1] - w.shape[-2]).any()) for w in weights)
            result.records[kind] = _weights_record(kind, weights, query_tokens, key_tokens, causal)
    result.nonfinite = nonfinite_parts(result.records, outputs_finite)
    return result


def _check_ids(model: torch.nn.Module, inputs: dict) -> None:
    """Refuse, in words, token ids past the model's embedding table (a tokenizer that does not fit its model):
    looked up, they raise an IndexError on the CPU and break the whole process on a GPU."""
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return
    for name in ("input_ids", "decoder_input_ids"):
        ids = inputs.get(name)
        if ids is not None and ids.numel() and int(ids.max()) >= rows:
            raise ValueError(f"the tokenizer gave token id {int(ids.max()):,} for this text, but the model has only "
                             f"{rows:,} token embeddings: its tokenizer does not fit it")


def _layers_text(layers: list[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    return f"layers {layers[0]}–{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) else (
        "layers " + ", ".join(str(layer) for layer in layers[:6]) + (" …" if len(layers) > 6 else ""))


def nonfinite_parts(records: dict[str, AttentionRecord], outputs_finite: bool = True) -> list[str]:
    """What in a capture holds NaN or infinity, in words ("the queries of self-attention layers 0–5", "the model's
    outputs"): empty when everything is finite. Reads the recorded tensors (and the eager weights), not the N x N
    weights attnviz replays; a finite Q and K can still give infinite scores, which the replay check names."""
    parts = []
    for kind, record in records.items():
        where = "" if len(records) == 1 else f"{kind}-attention "
        stacks = ({"weights": record.eager} if not record.replayable else
                  {"queries": record.queries, "keys": record.keys, "values": record.values})
        for what, stack in stacks.items():
            layers = [layer for layer in range(len(stack)) if not bool(torch.isfinite(stack[layer]).all())]
            if layers:
                parts.append(f"the {what} of {where}{_layers_text(layers)}")
        biases = [b for b in (record.biases or []) if b is not None] if record.replayable else []
        if any(not bool(torch.isfinite(b).all()) for b in biases):
            parts.append(f"the {where}position bias")
    if not outputs_finite:
        parts.append("the model's outputs")
    return parts


def _finite_outputs(outputs) -> bool:
    values = outputs.values() if hasattr(outputs, "values") else (outputs if isinstance(outputs, tuple) else [outputs])
    return all(bool(torch.isfinite(v).all()) for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())


def capture_image(bundle: ModelBundle, image, name: str = "image") -> Capture:
    """Run a vision transformer (``bundle.modality == "image"``) on a PIL ``image`` and capture every attention
    call; tokens are labelled ``[CLS]`` (and DeiT's ``[DIST]``, registers) and ``(row, col)`` per patch."""
    from attnviz import vision

    if bundle.modality != "image":
        raise ValueError(f"{bundle.name} reads text, not images")
    pixels = vision.pixel_values(bundle.image_processor, image)  # [1, 3, H, W]
    vision.check_pixels(pixels, bundle.model.config)  # before the model runs: a bounded number of patches
    dtype = next(bundle.model.parameters()).dtype
    calls, outputs_finite = _recorded_calls(bundle.model, {"pixel_values": pixels.to(device=_device_of(bundle.model),
                                                                                      dtype=dtype)})
    n = calls[0].query.shape[-2]
    layout = vision.layout_of(bundle.model.config, n, pixels.shape[-2], pixels.shape[-1])
    labels = layout.labels()
    result = Capture(model_name=bundle.name, text=name, text_pair=None, tokens=labels, segments=[0] * n,
                     special=[i < len(layout.prefix) for i in range(n)], n_tokens_before_truncation=n,
                     layout=layout, image=vision.seen_image(pixels, bundle.image_processor))
    result.records["self"] = _record_of("self", calls, labels, labels)
    result.nonfinite = nonfinite_parts(result.records, outputs_finite)
    return result


def _recorded_calls(model: torch.nn.Module, inputs: dict) -> tuple[list[AttentionCall], bool]:
    """Run ``model`` on ``inputs`` while recording: its attention calls, in order, with their tensors on the CPU,
    and whether its outputs are finite."""
    with torch.no_grad(), recording(model) as recorder:
        outputs = model(**inputs)
    if not recorder.calls:
        raise RuntimeError(f"no attention call was observed in {type(model).__name__}")
    return [_to_cpu(call) for call in recorder.calls], _finite_outputs(outputs)


def _weights_record(kind: str, weights: list[torch.Tensor], query_tokens: list[str], key_tokens: list[str],
                    causal: bool) -> AttentionRecord:
    """A record of transformers' eager weights only (``[heads, n_q, n_k]`` fp32 on the CPU, per layer, as
    :func:`attnviz.models.eager.run` returns them): the weights path."""
    n_q, n_k = weights[0].shape[-2:]
    rule = LayerMask(masks.MaskSpec(n_q, n_k, causal=causal and n_q > 1))
    return AttentionRecord(kind=kind, queries=None, keys=None, values=None, kernels=[],
                           layer_masks=[rule] * len(weights), scales=[], query_tokens=query_tokens,
                           key_tokens=key_tokens,
                           eager=LayerStack(weights))


def _device_of(model: torch.nn.Module) -> torch.device:
    """Where the model's inputs go: its embeddings' device (the first parameter's for a model split across devices)."""
    try:
        device = model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        device = next(model.parameters()).device
    return torch.device("cpu") if device.type == "meta" else device  # offloaded: accelerate moves what it needs


def _to_cpu(call: AttentionCall) -> AttentionCall:
    """Recorded tensors live on the CPU, where replay runs (a no-op on a CPU machine); the kernel call stays
    where the model is."""
    if call.query.device.type == "cpu":
        return call
    moved = {name: getattr(call, name).cpu() if isinstance(getattr(call, name), torch.Tensor) else getattr(call, name)
             for name in AttentionCall.__dataclass_fields__}
    return AttentionCall(**moved)


def replay(record: AttentionRecord, *, mask: torch.Tensor | None = None, scale: float | None = None,
           temperature: float = 1.0) -> torch.Tensor:
    """Every head of ``record`` recomputed with ``mask`` (bool ``[n_q, n_k]``, True = may attend) in place of the
    model's, ``scale`` in place of its scaling and every logit divided by ``temperature``: the what-if. Returns
    ``[layers, heads, n_q, n_k]`` (short inputs)."""
    record.check_dense()
    record._require_replay("The what-if")
    return torch.stack([record.layer_weights(layer, mask=mask, scale=scale, temperature=temperature)
                        for layer in range(record.n_layers)])


def head_scores(record: AttentionRecord, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One head's raw q.k scores (unscaled, fp64) ``[n_q, n_k]`` and the model's mask ``[n_q, n_k]`` (True = may
    attend). With GQA the head reads its group's K/V head."""
    record._require_replay("The raw scores")
    q = record.queries[layer, head].double()  # [n_q, d_head]
    k = record.keys[layer, record.kv_head(head)].double()  # [n_k, d_head]
    return q @ k.T, record.mask_rows(layer)


def head_bias(record: AttentionRecord, layer: int, head: int) -> torch.Tensor | float:
    """The additive score bias the model applies to this head (T5's relative position bias), fp64, or 0."""
    bias = record.biases[layer] if record.biases else None
    return 0.0 if bias is None else bias[head].double()


def is_causal(record: AttentionRecord, layer: int = 0) -> bool:
    """Whether the model's own mask for this attention is causal (no query sees a later key)."""
    layer_mask = record.layer_masks[layer]
    if layer_mask.rule is not None:
        return layer_mask.is_causal
    return record.n_q > 1 and not (layer_mask.dense & ~masks.causal(record.n_q, record.n_k)).any().item()


def layer_output_difference(record: AttentionRecord, layer: int, block: int | None = None,
                            model: torch.nn.Module | None = None) -> float:
    """Max |attnviz's output - the model's| for one layer: attnviz's weights @ V, query block by query block,
    against the model's own kernel run again, exactly as the model called it, on the recorded Q, K and V."""
    kernel = record.kernels[layer].output(record.queries[layer], record.keys[layer], record.values[layer], model)
    kernel = kernel.float().transpose(0, 1)  # [heads, n_q, d_v]
    values = repeat_kv(record.values[layer].float().unsqueeze(0), record.n_heads // record.n_kv_heads)[0]
    block = block or record.block_rows()
    worst = 0.0
    for start in range(0, record.n_q, block):
        end = min(record.n_q, start + block)
        ours = record.layer_weights(layer, start, end) @ values  # [heads, rows, d_v]
        difference = (ours - kernel[:, start:end]).abs().max().item()  # NaN if either side has one
        if not math.isfinite(difference):
            return math.nan  # nothing to compare: see nonfinite_parts
        worst = max(worst, difference)
    return worst


def replay_tolerance(record: AttentionRecord) -> float:
    """What the replay check accepts: 16 units of rounding of the model's dtype, times the largest value of V.
    fp32: about 2e-6 x max|V| (a 5% error in a scale, or a wrong mask, is far above it); bf16: 0.125 x max|V|."""
    largest = max(float(record.values[layer].abs().max()) for layer in range(record.n_layers))
    return 16 * torch.finfo(record.values.dtype).eps * max(largest, 1e-6)


def replay_difference(record: AttentionRecord, progress=None, model: torch.nn.Module | None = None) -> float:
    """Max |attnviz's attention output - the model's| over every layer: the weights attnviz shows, times V, are
    what the model's own kernel computed. ``progress(layer, n_layers)`` is called before each layer; ``model``
    is the loaded model, should the copy the capture came from have been unloaded. NaN when a layer's attention
    output (attnviz's or the model's) is not finite."""
    record._require_replay("The replay check")
    worst = 0.0
    for layer in range(record.n_layers):
        if progress:
            progress(layer, record.n_layers)
        difference = layer_output_difference(record, layer, model=model)
        if not math.isfinite(difference):
            return math.nan  # NaN or infinity in this layer's attention or output: "not finite", never "exactly"
        worst = max(worst, difference)
    return worst


# ---------------------------------------------------------------------------------------------------------------
# Word order: the same model with its position embeddings silenced, for this thread only

_SILENCED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("attnviz_silenced", default=frozenset())


def _silence_hook(module, inputs, output):
    return torch.zeros_like(output) if id(module) in _SILENCED.get() else output


@contextlib.contextmanager
def _positions_silenced(module: torch.nn.Module):
    """Inside the block (this thread only), ``module`` (a position-embedding table) outputs zeros. The model's
    weights are never changed, so other sessions running the same model at the same time are unaffected."""
    if not getattr(module, "_attnviz_silence_hook", False):
        module.register_forward_hook(_silence_hook)
        module._attnviz_silence_hook = True
    token = _SILENCED.set(_SILENCED.get() | {id(module)})
    try:
        yield
    finally:
        _SILENCED.reset(token)


def word_order_experiment(bundle: ModelBundle, text: str, seed: int = 0, *, remove_positions: bool = True) -> dict:
    """Shuffle the words of ``text`` and compare first-layer self-attention before and after.

    With the model's learned position embeddings silenced (``remove_positions``: they output zeros in this
    thread, the weights untouched), self-attention is permutation equivariant: the shuffled sentence's weights
    are exactly the original's with rows and columns permuted. Returns the original and un-permuted weights
    ``[heads, n, n]``, the permutation and the max difference.
    """
    from attnviz.positional import learned_position_table, permutation_of_words

    found = learned_position_table(bundle.model)
    if found is None:
        raise ValueError(
            f"{bundle.name} has no learned position embeddings to remove (it uses RoPE, ALiBi or relative bias)"
        )
    if bundle.architecture != "encoder":
        raise ValueError("the word-order experiment runs on encoders (BERT-like), whose attention is not causal")
    if bundle.capture_path != "interface":
        raise ValueError(f"the word-order experiment records the attention calls of transformers' attention "
                         f"interface, which {bundle.model_type} does not use")
    inputs, tokens, _, special, _ = _tokenize(bundle, text, None, bundle.max_positions)
    n = len(tokens)
    keep_ends = special[0] and special[-1]
    order = permutation_of_words(n, seed, keep_ends=keep_ends)
    shuffled = {name: value[:, order] if value.dim() == 2 and value.shape[1] == n else value
                for name, value in inputs.items()}
    module_name = found[0].rsplit(".", 1)[0]  # "embeddings.position_embeddings.weight" -> its module
    table = dict(bundle.model.named_modules())[module_name]

    device = _device_of(bundle.model)

    def first_layer(model_inputs) -> torch.Tensor:
        model_inputs = {name: value.to(device) for name, value in model_inputs.items()}
        record = _record_of("self", _recorded_calls(bundle.model, model_inputs)[0][:1], tokens, tokens)
        return record.layer_weights(0)  # [heads, n, n]

    silenced = _positions_silenced(table) if remove_positions else contextlib.nullcontext()
    with silenced:
        original = first_layer(inputs)
        permuted = first_layer(shuffled)
    # Row i of the shuffled run is token order[i]: undo that on rows and columns.
    inverse = torch.argsort(torch.tensor(order))
    unpermuted = permuted[:, inverse][:, :, inverse]
    return {
        "tokens": tokens,
        "order": order,
        "original": original,
        "permuted": permuted,
        "unpermuted": unpermuted,
        "max_difference": (unpermuted - original).abs().max().item(),
        "parameter": found[0],
    }
