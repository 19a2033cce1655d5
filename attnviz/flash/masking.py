"""The masks the flash paths understand, described by rules rather than N x N tensors.

Positions follow ``attnviz.masks``: queries are aligned to the end of the keys (``offset = n_k - n_q``), causal
means key <= query position, and a window ``(left, right)`` keeps ``pos - left <= key <= pos + right``
(FlashAttention's ``window_size``; None = unbounded). A block layout is ``[n_query_blocks, n_key_blocks]`` bool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MaskSpec:
    n_q: int
    n_k: int
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    block_layout: torch.Tensor | None = None  # [n_qb, n_kb] bool, True = compute this tile
    block_size: int | None = None  # the layout's block size (query and key)

    def __post_init__(self):
        if self.block_layout is not None:
            if self.causal or self.window is not None:
                raise ValueError("a block layout is the whole mask: do not combine it with causal or window")
            if self.block_size is None or self.block_size < 1:
                raise ValueError("a block layout needs its block_size")
            n_qb, n_kb = -(-self.n_q // self.block_size), -(-self.n_k // self.block_size)
            if tuple(self.block_layout.shape) != (n_qb, n_kb):
                raise ValueError(
                    f"block layout is {tuple(self.block_layout.shape)} but {self.n_q} x {self.n_k} tokens in blocks of "
                    f"{self.block_size} need {(n_qb, n_kb)}"
                )

    @property
    def offset(self) -> int:
        return self.n_k - self.n_q

    @property
    def left(self) -> int | None:
        return None if self.window is None else self.window[0]

    @property
    def right(self) -> int | None:
        """The effective right bound: 0 when causal (combined with a window's right bound if any)."""
        right = None if self.window is None else self.window[1]
        if self.causal:
            return 0 if right is None else min(right, 0)
        return right

    @property
    def is_full(self) -> bool:
        return not self.causal and self.window is None and self.block_layout is None

    def tile(self, q_start: int, q_end: int, k_start: int, k_end: int) -> torch.Tensor:
        """The token mask of one tile, ``[q_end - q_start, k_end - k_start]`` bool, True = may attend."""
        query_pos = torch.arange(q_start, q_end).unsqueeze(1) + self.offset
        key_pos = torch.arange(k_start, k_end).unsqueeze(0)
        allowed = torch.ones(q_end - q_start, k_end - k_start, dtype=torch.bool)
        if self.left is not None:
            allowed &= key_pos >= query_pos - self.left
        if self.right is not None:
            allowed &= key_pos <= query_pos + self.right
        if self.block_layout is not None:
            qb = torch.arange(q_start, q_end) // self.block_size
            kb = torch.arange(k_start, k_end) // self.block_size
            allowed &= self.block_layout[qb][:, kb]
        return allowed

    def dense(self) -> torch.Tensor:
        """The full ``[n_q, n_k]`` mask (for the naive reference; avoid at large N)."""
        return self.tile(0, self.n_q, 0, self.n_k)

    def key_range(self, q_start: int, q_end: int) -> tuple[int, int]:
        """Keys any query in ``[q_start, q_end)`` may see: ``[lo, hi)`` (the window and causal bounds)."""
        first, last = q_start + self.offset, q_end - 1 + self.offset
        lo = 0 if self.left is None else max(0, first - self.left)
        hi = self.n_k if self.right is None else min(self.n_k, last + self.right + 1)
        return lo, max(lo, hi)

    def fully_allowed_range(self, q_start: int, q_end: int) -> tuple[int, int]:
        """Keys every query in the block may see: tiles inside ``[lo, hi)`` need no element mask."""
        first, last = q_start + self.offset, q_end - 1 + self.offset
        lo = 0 if self.left is None else max(0, last - self.left)
        hi = self.n_k if self.right is None else min(self.n_k, first + self.right + 1)
        return lo, max(lo, hi)


def spec_from(n_q: int, n_k: int, *, causal: bool = False, window=None, block_layout=None, block_size=None) -> MaskSpec:
    if window is not None:
        window = (window[0], window[1])
        for side in window:
            if side is not None and side < 0:
                raise ValueError(f"window sides must be >= 0 or None, got {window}")
    return MaskSpec(n_q, n_k, causal, window, block_layout, block_size)
