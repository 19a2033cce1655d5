"""Attention from scratch: softmax(Q K^T / sqrt(d_k) + bias) V, the multi-head layer and its variants.

Read top to bottom, as in The Annotated Transformer: the function first, then the modules built on it.
Masks are boolean, **True = may attend**, broadcastable to ``[..., n_q, n_k]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnviz.core import masks as masks_mod


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias, masked) v, returning ``(output, weights)``.

    Shapes: ``q [..., n_q, d_k]``, ``k [..., n_k, d_k]``, ``v [..., n_k, d_v]`` -> output ``[..., n_q, d_v]``,
    weights ``[..., n_q, n_k]`` (the softmax probabilities, before dropout).

    ``mask`` is boolean, True = may attend, broadcastable to the weights. ``bias`` is an additive float tensor
    (ALiBi, relative positions). ``scale`` defaults to ``1 / sqrt(d_k)``. A query row with no allowed key gets
    zero weights and a zero output, never NaN. ``dropout_p > 0`` drops weights as in training.
    """
    _check_qkv(q, k, v)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean with True = may attend, got dtype {mask.dtype}; "
            "convert float or inverted masks with attnviz.core.masks.from_keep_float / from_additive / from_masked_bool"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    d_k = q.shape[-1]
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale

    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # [..., n_q, n_k]
    if bias is not None:
        scores = scores + bias
    weights = masked_softmax(scores, mask)

    used = F.dropout(weights, p=dropout_p, training=True) if dropout_p > 0 else weights
    return torch.matmul(used, v), weights  # [..., n_q, d_v], [..., n_q, n_k]


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of ``scores`` where ``mask`` (bool, True = may attend) allows.

    Blocked entries get weight 0. A row with no allowed key (or whose scores are all -inf) gets all zeros,
    where a plain softmax would give NaN.
    """
    if mask is not None and not bool(mask.all()):  # a mask that hides nothing costs no pass over the scores
        scores = scores.masked_fill(~mask, float("-inf"))
    row_is_empty = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # [..., n_q, 1]
    if not bool(row_is_empty.any()):
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(row_is_empty, 0.0)
    return torch.softmax(scores, dim=-1).masked_fill(row_is_empty, 0.0)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() < 2 or k.dim() < 2 or v.dim() < 2:
        raise ValueError(
            f"q, k and v need at least 2 dimensions [..., seq, dim]; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_k (last dim): q {tuple(q.shape)} vs k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys: k {tuple(k.shape)} vs v {tuple(v.shape)}")


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[batch, n_kv_heads, seq, d]`` -> ``[batch, n_kv_heads * n_rep, seq, d]``: each K/V head serves n_rep
    query heads."""
    if n_rep == 1:
        return x
    return x.repeat_interleave(n_rep, dim=1)


def kv_head_of_query_head(n_heads: int, n_kv_heads: int) -> list[int]:
    """For grouped-query attention: which K/V head each query head reads (consecutive groups, as in Llama)."""
    if n_kv_heads < 1 or n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate W_Q, W_K, W_V, W_O, as in "Attention Is All You Need".

    ``n_kv_heads < n_heads`` is grouped-query attention (GQA); ``n_kv_heads == 1`` is multi-query (MQA).
    ``forward(q, k, v, mask)`` takes ``[batch, seq, d_model]`` inputs (k/v may be longer or shorter than q, as in
    cross-attention) and returns ``(output [batch, n_q, d_model], weights [batch, n_heads, n_q, n_k])``.
    """

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = False, dropout: float = 0.0
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model < 1 or n_heads < 1 or n_kv_heads < 1:
            raise ValueError(f"d_model, n_heads and n_kv_heads must be >= 1, got {d_model}, {n_heads}, {n_kv_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.w_q = nn.Linear(d_model, n_heads * self.d_head, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * self.d_head, bias=bias)
        self.w_o = nn.Linear(n_heads * self.d_head, d_model, bias=bias)

    def split_heads(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, n_heads, self.d_head).transpose(1, 2)  # [batch, heads, seq, d_head]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.dim() != 3 or x.shape[-1] != self.d_model:
                raise ValueError(f"{name} must be [batch, seq, {self.d_model}], got {tuple(x.shape)}")
        if k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0]:
            raise ValueError(f"batch/length mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # [batch, n_q, n_k] -> [batch, 1, n_q, n_k]: same mask for every head

        queries = self.split_heads(self.w_q(q), self.n_heads)  # [batch, n_heads, n_q, d_head]
        keys = self.split_heads(self.w_k(k), self.n_kv_heads)  # [batch, n_kv_heads, n_k, d_head]
        values = self.split_heads(self.w_v(v), self.n_kv_heads)  # [batch, n_kv_heads, n_k, d_head]
        n_rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(keys, n_rep), repeat_kv(values, n_rep)  # [batch, n_heads, n_k, d_head]

        dropout_p = self.dropout if self.training else 0.0
        heads, weights = scaled_dot_product_attention(queries, keys, values, mask, dropout_p=dropout_p)
        batch, _, n_q, _ = heads.shape
        concat = heads.transpose(1, 2).reshape(batch, n_q, self.n_heads * self.d_head)  # [batch, n_q, d_model]
        return self.w_o(concat), weights

    @classmethod
    def from_torch(cls, reference: nn.MultiheadAttention) -> "MultiHeadAttention":
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same d for q, k, v; no bias_k/v; bias on or off).

        The copy gives the same output, and its weights averaged over heads equal the reference's averaged weights.
        """
        if not reference._qkv_same_embed_dim or reference.bias_k is not None:
            raise ValueError("only nn.MultiheadAttention with kdim = vdim = embed_dim and no add_bias_kv is supported")
        has_bias = reference.in_proj_bias is not None
        copy = cls(reference.embed_dim, reference.num_heads, bias=has_bias, dropout=reference.dropout)
        copy = copy.to(dtype=reference.in_proj_weight.dtype, device=reference.in_proj_weight.device)
        w_q, w_k, w_v = reference.in_proj_weight.detach().chunk(3, dim=0)
        with torch.no_grad():
            copy.w_q.weight.copy_(w_q)
            copy.w_k.weight.copy_(w_k)
            copy.w_v.weight.copy_(w_v)
            copy.w_o.weight.copy_(reference.out_proj.weight)
            if has_bias:
                b_q, b_k, b_v = reference.in_proj_bias.detach().chunk(3)
                copy.w_q.bias.copy_(b_q)
                copy.w_k.bias.copy_(b_k)
                copy.w_v.bias.copy_(b_v)
                copy.w_o.bias.copy_(reference.out_proj.bias)
        return copy


def make_norm(kind: str, d_model: int) -> nn.Module:
    if kind == "layer":
        return nn.LayerNorm(d_model)
    if kind == "rms":
        return nn.RMSNorm(d_model)
    raise ValueError(f"norm must be 'layer' or 'rms', got {kind!r}")


class AttentionSublayer(nn.Module):
    """An attention sub-layer with its residual and norm: the body that self- and cross-attention share.

    Pre-norm (default, as in GPT-2 and Llama): ``x + dropout(attn(norm(x), memory))``.
    Post-norm (the 2017 paper, BERT): ``norm(x + dropout(attn(x, memory)))``.
    The norm applies to the query side ``x``; ``memory`` (the keys' and values' source) is ``x`` itself for
    self-attention, already normalised for cross-attention (as the encoder's final norm leaves it).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        norm: str = "layer",
        norm_first: bool = True,
        dropout: float = 0.0,
        bias: bool = False,
    ):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias, dropout=dropout)
        self.norm = make_norm(norm, d_model)
        self.norm_first = norm_first
        self.residual_dropout = nn.Dropout(dropout)

    def attend(
        self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attention(x, memory, memory, mask)

    def sublayer(
        self, x: torch.Tensor, memory: torch.Tensor | None, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``memory`` None means self-attention: keys and values come from ``x`` after the same norm."""
        queries_from = self.norm(x) if self.norm_first else x
        update, weights = self.attend(queries_from, queries_from if memory is None else memory, mask)
        y = x + self.residual_dropout(update)  # [batch, n_q, d_model]
        return (y if self.norm_first else self.norm(y)), weights


class SelfAttentionLayer(AttentionSublayer):
    """Self-attention sub-layer: ``forward(x [batch, seq, d_model], mask)`` returns
    ``(y [batch, seq, d_model], weights [batch, heads, seq, seq])``."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sublayer(x, None, mask)


class DecoderSelfAttention(SelfAttentionLayer):
    """Causal self-attention (GPT): each position sees itself and the past. An extra mask is combined with AND."""

    def attend(
        self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        allowed = masks_mod.causal(x.shape[1], memory.shape[1]).to(x.device)  # [seq, seq]
        if mask is not None:
            allowed = allowed & (mask.unsqueeze(1) if mask.dim() == 3 else mask)
        return self.attention(x, memory, memory, allowed)


class CrossAttention(AttentionSublayer):
    """Encoder-decoder attention: queries from the decoder, keys and values from the encoder's output.

    ``forward(x [batch, n_dec, d_model], memory [batch, n_enc, d_model], mask)`` returns
    ``(y [batch, n_dec, d_model], weights [batch, heads, n_dec, n_enc])``.
    """

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sublayer(x, memory, mask)
