"""What a capture holds: per attention kind, every layer's queries, keys and values as the model's attention
received them, its masks (as rules where they are), scaling and score terms; or, on the eager-weights path,
transformers' weights alone. Nothing holds the ``[layers, heads, N, N]`` weights: :class:`AttentionRecord` replays
them on demand, per layer, head and query range, through :mod:`attnviz.models.scoring`, so an 8,192-token text
costs the queries, keys and values it keeps, not 36 GB. Only views that need every head at once (rollout,
compare, what-if, the .npz export) materialise all of them, and only up to :func:`dense_token_limit` tokens
(DENSE_LIMIT, fewer where the model's layers x heads x N^2 would pass DENSE_CELLS).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from attnviz.core import masks
from attnviz.core.tokens_display import PLAIN
from attnviz.models import scoring

DENSE_LIMIT = 1024  # tokens: up to this (and DENSE_CELLS), all weights may be materialised at once
DENSE_CELLS = 80_000_000  # layers x heads x n_q x n_k: 320 MB of fp32 (6 x 12 heads x 1,054 tokens)


def dense_token_limit(n_layers: int, n_heads: int) -> int:
    """The longest input whose ``[layers, heads, n, n]`` weights the dense views (rollout, compare, what-if, the
    .npz export) materialise: DENSE_LIMIT tokens, and DENSE_CELLS weights in all (GPT-2 small: 745 tokens)."""
    return max(1, min(DENSE_LIMIT, math.isqrt(DENSE_CELLS // max(1, n_layers * n_heads))))
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


@dataclass
class AttentionRecord:
    """One attention kind ("self", "encoder", "decoder" or "cross") over all its layers, batch of one.

    Tensors stay in the model's dtype; weights are replayed in fp32 on demand (:meth:`head_weights`,
    :meth:`layer_weights`, by :mod:`attnviz.models.scoring`); ``weights`` materialises all of them, for inputs of
    at most :data:`DENSE_LIMIT`."""

    kind: str
    queries: LayerStack | None  # [layers, heads, n_q, d_head], as the attention saw them (after RoPE, if any)
    keys: LayerStack | None  # [layers, kv_heads, n_k, d_head]
    values: LayerStack | None  # [layers, kv_heads, n_k, d_v]
    kernels: list  # per layer: the model's own kernel call (attention_hook.KernelCall), for the replay check
    layer_masks: list[LayerMask]
    scales: list[float]  # per layer
    query_tokens: list[str]
    key_tokens: list[str]
    biases: list[torch.Tensor | None] = field(default_factory=list)  # per layer [heads, n_q, n_k]: T5, MPNet, ALiBi
    softcaps: list[float | None] = field(default_factory=list)
    sinks: list[torch.Tensor | None] = field(default_factory=list)  # per layer [heads]
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # derived views, computed once
    # The weights path (no Q/K/V): transformers' eager weights per layer, [layers, heads, n_q, n_k]
    eager: LayerStack | None = None
    # The tokens as the pages show them (attnviz.core.tokens_display: "␣the" for "Ġthe"), computed once per capture;
    # default: the raw tokens themselves. query_tokens / key_tokens stay the tokenizer's own (exports, filters).
    query_display: list[str] | None = None
    key_display: list[str] | None = None

    def __post_init__(self):
        if self.query_display is None:
            self.query_display = self.query_tokens
        if self.key_display is None:
            self.key_display = self.key_tokens

    @property
    def replayable(self) -> bool:
        """Whether attnviz holds Q and K (replay, Q.K, what-if); False on the eager-weights path."""
        return self.queries is not None

    def require_replay(self, what: str) -> None:
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

    def is_causal(self, layer: int = 0) -> bool:
        """Whether the model's own mask for this layer is causal (no query sees a later key)."""
        layer_mask = self.layer_masks[layer]
        if layer_mask.rule is not None:
            return layer_mask.is_causal
        return self.n_q > 1 and not (layer_mask.dense & ~masks.causal(self.n_q, self.n_k)).any().item()

    def bias_rows(self, layer: int, start: int = 0, end: int | None = None) -> torch.Tensor | None:
        """The model's position bias for query rows ``start:end`` (T5, MPNet, ALiBi), or None."""
        bias = self.biases[layer] if self.biases else None
        return None if bias is None else bias[:, start:end].float()  # [heads, rows, n_k]

    def _chosen(self, heads: list[int] | None) -> list[int]:
        return list(range(self.n_heads)) if heads is None else heads

    def scores(self, layer: int, start: int = 0, end: int | None = None, *, heads: list[int] | None = None,
               scale: float | None = None, temperature: float = 1.0, extra_bias: torch.Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The logits the softmax sees for query rows ``start:end``: ``[heads, rows, n_k]`` in ``dtype``, before
        masking (:func:`attnviz.models.scoring.logits`): q·k times the scaling, soft-capped, plus the model's
        position bias. ``scale`` replaces the model's scaling (1.0: unscaled), ``extra_bias`` (``[rows or n_q,
        n_k]``, e.g. an ALiBi bias) is added after the model's, and ``temperature`` divides every logit (the
        what-if)."""
        self.require_replay("The scores")
        heads = self._chosen(heads)
        q = self.queries[layer, heads, start:end].to(dtype)  # [heads, rows, d]
        k = self.keys[layer, [self.kv_head(h) for h in heads]].to(dtype)  # [heads, n_k, d]
        bias = self.bias_rows(layer, start, end)  # [all heads, rows, n_k] or None
        if extra_bias is not None and extra_bias.shape[0] == self.n_q:
            extra_bias = extra_bias[start:end]  # [rows, n_k]
        return scoring.logits(q, k, self.scales[layer] if scale is None else scale,
                              softcap=self.softcaps[layer] if self.softcaps else None,
                              biases=(None if bias is None else bias[heads].to(dtype),
                                      None if extra_bias is None else extra_bias.to(dtype)),
                              temperature=temperature)

    def layer_weights(self, layer: int, start: int = 0, end: int | None = None, *, heads: list[int] | None = None,
                      mask: torch.Tensor | None = None, scale: float | None = None, temperature: float = 1.0,
                      extra_bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Attention weights of ``heads`` (default all) for query rows ``start:end``: ``[heads, rows, n_k]`` in
        ``dtype``, as the model computes them (:meth:`scores`, then :func:`attnviz.models.scoring.weights`: the
        softmax over the allowed keys and any sink column). The what-if, the Scaling and Positional pages call it.

        ``mask`` (bool ``[rows, n_k]`` or ``[n_q, n_k]``, True = may attend) replaces the model's mask."""
        end = self.n_q if end is None else end
        allowed = self.mask_rows(layer, start, end) if mask is None else (
            mask[start:end] if mask.shape[0] == self.n_q and end - start != self.n_q else mask)
        if not self.replayable:
            if scale is not None or temperature != 1.0 or extra_bias is not None:
                self.require_replay("Another scale, temperature or bias")
            return self._eager_weights(layer, start, end, heads, None if mask is None else allowed).to(dtype)
        logits = self.scores(layer, start, end, heads=heads, scale=scale, temperature=temperature,
                             extra_bias=extra_bias, dtype=dtype)
        sinks = self.sinks[layer] if self.sinks else None
        return scoring.weights(logits, allowed, None if sinks is None else sinks[self._chosen(heads)])

    def _eager_weights(self, layer: int, start: int, end: int, heads: list[int] | None,
                       mask: torch.Tensor | None) -> torch.Tensor:
        """The weights path: transformers' eager weights ``[heads, rows, n_k]``, renormalised over ``mask``
        when it only takes keys away from the model's."""
        weights = self.eager[layer, self._chosen(heads), start:end].float()  # [heads, rows, n_k]
        if mask is None:
            return weights
        if (mask & ~self.mask_rows(layer, start, end)).any():
            self.require_replay("A mask that lets a query see keys the model's mask hides")
        return scoring.renormalised(weights, mask)

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
                f"{dense_token_limit(self.n_layers, self.n_heads):,} tokens for {self.n_layers} layers x "
                f"{self.n_heads} heads (at most {DENSE_LIMIT:,} tokens and {DENSE_CELLS / 1e6:.0f} million weights "
                "in all); use the head view (pooled, with zoom) or head statistics"
            )

    @functools.cached_property
    def weights(self) -> torch.Tensor:
        """All weights ``[layers, heads, n_q, n_k]`` fp32, replayed once and kept (inputs up to DENSE_LIMIT)."""
        self.check_dense()
        return self.every_layer_weights()

    def every_layer_weights(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Every layer's weights ``[layers, heads, n_q, n_k]`` in ``dtype``, not kept: :meth:`layer_weights` of each
        layer, stacked. Where the layers share their shapes and have no soft cap or sink (most models), the scores
        and the softmax run once over all layers: a scan reads every layer of every document, and one call per
        layer costs more than the arithmetic at a few hundred tokens. The caller bounds the size (see
        :attr:`dense_ok`)."""
        batched = (self.replayable and not any(self.softcaps or ()) and all(s is None for s in self.sinks or ())
                   and len({tuple(t.shape) for t in self.queries.tensors}) == 1
                   and len({tuple(t.shape) for t in self.keys.tensors}) == 1)
        if not batched:
            return torch.stack([self.layer_weights(layer, dtype=dtype) for layer in range(self.n_layers)])
        q = self.queries.stacked().to(dtype)  # [layers, heads, n_q, d]
        k = self.keys.stacked().to(dtype)  # [layers, kv_heads, n_k, d]
        if self.n_kv_heads != self.n_heads:
            k = k[:, [self.kv_head(head) for head in range(self.n_heads)]]  # [layers, heads, n_k, d]
        scales = torch.tensor(self.scales, dtype=dtype).view(-1, 1, 1, 1)
        scores = q @ k.transpose(-2, -1) * scales  # [layers, heads, n_q, n_k]
        for layer, bias in enumerate(self.biases or ()):
            if bias is not None:
                scores[layer] += bias.to(dtype)  # [heads, n_q, n_k]
        allowed = torch.stack([self.mask_rows(layer) for layer in range(self.n_layers)])  # [layers, n_q, n_k]
        return scoring.weights(scores, allowed.unsqueeze(1))

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
    layout: object = None  # a vision model's attnviz.core.vision.PatchLayout: which token is which patch
    image: object = None  # ... and the image as it saw it, [H, W, 3] uint8
    nonfinite: list[str] = field(default_factory=list)  # what held NaN or infinity: "the queries of layers 0-1", ...
    # The tokenizer's ids of ``tokens`` and ``decoder_tokens`` (None for a vision model's patches): for exports
    token_ids: list[int] | None = None
    decoder_token_ids: list[int] | None = None
    # How the pages show the tokens (attnviz.core.tokens_display, with the tokenizer's style, computed once at capture):
    # "␣the" for byte-level "Ġthe" or SentencePiece "▁the"; default: the tokens as they are (patch labels)
    display_tokens: list[str] | None = None
    decoder_display_tokens: list[str] | None = None
    token_style: str = PLAIN  # attnviz.core.tokens_display's name of how the tokenizer writes its pieces
    # The tokenizer's ids of the tokens that end a sentence or a text ([SEP], </s>; capture.separator_ids); None:
    # unknown (a stand-in tokenizer, a vision model): every special token but the first counts as one
    separator_ids: frozenset | None = None

    def __post_init__(self):
        if self.display_tokens is None:
            self.display_tokens = self.tokens
        if self.decoder_display_tokens is None:
            self.decoder_display_tokens = self.decoder_tokens

    def special_of(self, tokens: list[str]) -> list[bool]:
        """Which of ``tokens`` (the encoder's or the decoder's list) are special tokens."""
        if tokens is self.decoder_tokens and self.decoder_special is not None:
            return self.decoder_special
        if tokens is self.tokens:
            return self.special
        return [False] * len(tokens)

    def separators_of(self, tokens: list[str]) -> list[bool] | None:
        """Which of ``tokens`` (the encoder's or the decoder's list) are separators ([SEP], </s>, by the
        tokenizer's ids), or None where the tokenizer does not say (:func:`attnviz.core.analysis.separator_keys` then
        counts every special token but the first)."""
        ids = self.ids_of(tokens)
        if not self.separator_ids or ids is None:
            return None
        return [special and i in self.separator_ids for i, special in zip(ids, self.special_of(tokens), strict=True)]

    def display_of(self, tokens: list[str]) -> list[str]:
        """How the pages show ``tokens`` (the encoder's or the decoder's list); other lists as they are."""
        if tokens is self.decoder_tokens and self.decoder_display_tokens is not None:
            return self.decoder_display_tokens
        if tokens is self.tokens:
            return self.display_tokens
        return tokens

    def ids_of(self, tokens: list[str]) -> list[int] | None:
        """The tokenizer's ids of ``tokens`` (the encoder's or the decoder's list), or None where unknown."""
        if tokens is self.decoder_tokens and self.decoder_tokens is not None:
            return self.decoder_token_ids
        if tokens is self.tokens:
            return self.token_ids
        return None

    @property
    def kinds(self) -> list[str]:
        return list(self.records)

    @property
    def length_of_text(self) -> str:
        """How many tokens the whole text has, as the pages say it: '1,234', or 'more than 8,192'."""
        total = self.n_tokens_before_truncation
        return f"{total:,}" if total >= 0 else f"more than {-total:,}"
