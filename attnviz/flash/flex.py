"""PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) as a contender, with our masks.

FlexAttention compiles one fused attention kernel from a ``mask_mod`` (may query q attend key k?) and skips
whole blocks that its :class:`BlockMask` marks empty, like our tiled path and Triton kernel. Our
:class:`~attnviz.core.masks.MaskSpec` becomes a ``mask_mod``: causal and sliding windows as arithmetic on the
positions (no N x N tensor), a block layout (BigBird) as a lookup in its ``[query blocks, key blocks]`` table.

Compiling takes seconds the first time for each shape and mask (reported apart from run time by
:func:`compile_seconds`); the compiled function is kept per process.
"""

from __future__ import annotations

import functools
import time

import torch

from attnviz.core.masks import MaskSpec


def mask_mod_of(spec: MaskSpec, device):
    """A FlexAttention ``mask_mod(batch, head, q_index, k_index) -> bool`` equal to ``spec.dense()``."""
    if spec.block_layout is not None:
        layout, size = spec.block_layout.to(device), int(spec.block_size)

        def block_sparse(b, h, q_index, k_index):
            return layout[q_index // size, k_index // size]

        return block_sparse
    offset, left, right = spec.offset, spec.left, spec.right

    def rule(b, h, q_index, k_index):
        position = q_index + offset  # queries aligned to the end of the keys, as everywhere in attnviz
        allowed = k_index >= 0
        if right is not None:
            allowed = allowed & (k_index <= position + right)
        if left is not None:
            allowed = allowed & (k_index >= position - left)
        return allowed

    return rule


def block_mask_of(spec: MaskSpec, device, block_size: int = 128):
    """The :class:`BlockMask` of ``spec``: which blocks FlexAttention computes, and the mask inside them."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod_of(spec, device), None, None, spec.n_q, spec.n_k, device=device,
                             BLOCK_SIZE=block_size)


@functools.lru_cache(maxsize=1)
def compiled_flex_attention():
    """``torch.compile(flex_attention)``: without compiling, FlexAttention materialises the full score matrix."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, scale: float,
                   block_mask=None) -> torch.Tensor:
    """Attention by compiled FlexAttention: ``q [b, h, n_q, d]``, ``k, v [b, h_kv, n_k, d]`` (GQA allowed)."""
    if block_mask is None and not spec.is_full:
        block_mask = block_mask_of(spec, q.device)
    return compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=scale,
                                     enable_gqa=q.shape[1] != k.shape[1])


def compile_seconds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, scale: float) -> float:
    """Seconds of the first call for this shape and mask: compiling (and one run), apart from run time."""
    started = time.perf_counter()
    flex_attention(q, k, v, spec, scale)
    return time.perf_counter() - started
