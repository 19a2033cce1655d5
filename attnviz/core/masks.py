"""Attention masks.

Every mask in this package is a boolean tensor with **True = may attend**, broadcastable to ``[..., n_q, n_k]``
(the convention of ``torch.nn.functional.scaled_dot_product_attention``). The converters at the bottom of this
module translate from and to the other conventions found in the wild; call them at the edges only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _check_length(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return value


def full(n_q: int, n_k: int | None = None) -> torch.Tensor:
    """Every query may attend to every key (BERT). Returns ``[n_q, n_k]`` bool, True = may attend."""
    n_q = _check_length("n_q", n_q)
    n_k = n_q if n_k is None else _check_length("n_k", n_k)
    return torch.ones(n_q, n_k, dtype=torch.bool)


def causal(n_q: int, n_k: int | None = None) -> torch.Tensor:
    """Causal mask aligned to the bottom-right, as a decoder with a KV cache needs it.

    With ``n_k > n_q`` the queries are the last ``n_q`` positions of the sequence, so query ``i`` may attend to
    keys ``0 .. i + (n_k - n_q)``. Returns ``[n_q, n_k]`` bool, True = may attend.
    """
    n_q = _check_length("n_q", n_q)
    n_k = n_q if n_k is None else _check_length("n_k", n_k)
    offset = n_k - n_q
    query_pos = torch.arange(n_q).unsqueeze(1) + offset  # [n_q, 1]: absolute position of each query
    key_pos = torch.arange(n_k).unsqueeze(0)  # [1, n_k]
    return key_pos <= query_pos


def sliding_window(n: int, left: int | None, right: int | None = 0, n_k: int | None = None) -> torch.Tensor:
    """FlashAttention's ``window_size=(left, right)``: query ``i`` sees keys ``j`` with ``i - left <= j <= i + right``.

    ``right=0`` is the causal sliding window (Mistral); ``None`` on a side means unbounded on that side. With
    ``n_k > n`` the queries are aligned to the bottom-right, as in :func:`causal`. Returns ``[n, n_k]`` bool.
    """
    n = _check_length("n", n)
    n_k = n if n_k is None else _check_length("n_k", n_k)
    for name, side in (("left", left), ("right", right)):
        if side is not None and (not isinstance(side, int) or isinstance(side, bool) or side < 0):
            raise ValueError(f"window {name} must be a whole number >= 0 or None (unbounded), got {side!r}")
    query_pos = torch.arange(n).unsqueeze(1) + (n_k - n)  # [n, 1]
    key_pos = torch.arange(n_k).unsqueeze(0)  # [1, n_k]
    allowed = torch.ones(n, n_k, dtype=torch.bool)
    if left is not None:
        allowed &= key_pos >= query_pos - left
    if right is not None:
        allowed &= key_pos <= query_pos + right
    return allowed


@dataclass(frozen=True)
class BlockSparseMask:
    """A token-level mask together with the block layout it was built from.

    ``mask`` is ``[n, n]`` bool (True = may attend); ``layout`` is ``[n_blocks, n_blocks]`` bool where
    ``layout[i, j]`` says query block ``i`` attends to key block ``j``; ``kind`` names why each block is on
    (0 off, 1 global, 2 window, 3 random), for drawing.
    """

    mask: torch.Tensor
    layout: torch.Tensor
    kind: torch.Tensor
    block_size: int


BLOCK_OFF, BLOCK_GLOBAL, BLOCK_WINDOW, BLOCK_RANDOM = 0, 1, 2, 3


def bigbird(
    n: int,
    block_size: int,
    num_global_blocks: int = 1,
    num_window_blocks: int = 3,
    num_random_blocks: int = 1,
    seed: int = 0,
) -> BlockSparseMask:
    """BigBird's block-sparse pattern (Zaheer et al., 2020), at block granularity.

    The sequence is cut into ``ceil(n / block_size)`` blocks. The first ``num_global_blocks`` blocks are global:
    they attend to every block and every block attends to them. Each block attends to a window of
    ``num_window_blocks`` blocks centred on itself (3 = previous, self, next). Each non-global block row also
    attends to ``num_random_blocks`` further blocks drawn without replacement, from a generator seeded with
    ``seed``, among the blocks it does not already see. The token mask is the layout expanded to tokens and cut
    to ``n``.
    """
    n = _check_length("n", n)
    block_size = _check_length("block_size", block_size)
    n_blocks = -(-n // block_size)
    for name, value in (
        ("num_global_blocks", num_global_blocks),
        ("num_window_blocks", num_window_blocks),
        ("num_random_blocks", num_random_blocks),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    if num_global_blocks > n_blocks:
        raise ValueError(
            f"{num_global_blocks} global blocks asked for, but {n} tokens make only {n_blocks} blocks "
            f"of {block_size}"
        )

    kind = torch.zeros(n_blocks, n_blocks, dtype=torch.int8)
    blocks = torch.arange(n_blocks)
    if num_window_blocks > 0:
        left, right = (num_window_blocks - 1) // 2, num_window_blocks // 2
        offset = blocks.unsqueeze(0) - blocks.unsqueeze(1)  # [query block, key block]: key - query
        kind[(offset >= -left) & (offset <= right)] = BLOCK_WINDOW
    if num_random_blocks > 0:
        generator = torch.Generator().manual_seed(int(seed))
        for row in range(num_global_blocks, n_blocks):
            candidates = (kind[row] == BLOCK_OFF).nonzero().flatten()
            candidates = candidates[candidates >= num_global_blocks]
            if len(candidates) == 0:
                continue
            chosen = candidates[torch.randperm(len(candidates), generator=generator)[:num_random_blocks]]
            kind[row, chosen] = BLOCK_RANDOM
    kind[:num_global_blocks, :] = BLOCK_GLOBAL
    kind[:, :num_global_blocks] = BLOCK_GLOBAL

    layout = kind != BLOCK_OFF
    mask = expand_block_layout(layout, block_size)[:n, :n]
    return BlockSparseMask(mask=mask, layout=layout, kind=kind, block_size=block_size)


def expand_block_layout(layout: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[n_qb, n_kb]`` block layout -> ``[n_qb * block_size, n_kb * block_size]`` token mask."""
    return layout.repeat_interleave(block_size, dim=0).repeat_interleave(block_size, dim=1)


def dilated_sliding_window(n: int, window: int, dilation: int, *, causal: bool = True) -> torch.Tensor:
    """Longformer's dilated window: query ``i`` sees ``window`` keys spaced ``dilation`` apart, ``i - k * dilation``
    for ``k = 0 .. window - 1`` (and the mirror image ahead when not ``causal``). Returns ``[n, n]`` bool."""
    n = _check_length("n", n)
    window = _check_length("window", window)
    dilation = _check_length("dilation", dilation)
    offset = torch.arange(n).unsqueeze(1) - torch.arange(n).unsqueeze(0)  # [n, n]: i - j
    distance = offset if causal else offset.abs()
    return (distance >= 0) & (distance % dilation == 0) & (distance // dilation < window)


def global_local(n: int, global_positions: list[int], left: int, right: int = 0) -> torch.Tensor:
    """Longformer / ETC: a sliding window plus global tokens that attend to all and are attended by all."""
    allowed = sliding_window(n, left, right)
    positions = [p for p in global_positions if 0 <= p < n]
    if len(positions) != len(global_positions):
        raise ValueError(f"global positions must lie in 0..{n - 1}, got {global_positions}")
    allowed[positions, :] = True
    allowed[:, positions] = True
    return allowed


def lsh_buckets(vectors: torch.Tensor, n_buckets: int, n_rounds: int, seed: int = 0) -> torch.Tensor:
    """Reformer's angular LSH: ``argmax([xR, -xR])`` with a seeded random rotation ``R`` per round.

    ``vectors [n, d]`` (shared query/key vectors) -> bucket ids ``[n_rounds, n]``. ``n_buckets`` must be even.
    """
    if n_buckets < 2 or n_buckets % 2:
        raise ValueError(f"n_buckets must be an even number >= 2, got {n_buckets}")
    n_rounds = _check_length("n_rounds", n_rounds)
    generator = torch.Generator().manual_seed(int(seed))
    rotations = torch.randn(n_rounds, vectors.shape[-1], n_buckets // 2, generator=generator, dtype=vectors.dtype)
    rotated = torch.einsum("nd,rdb->rnb", vectors, rotations)  # [rounds, n, n_buckets / 2]
    return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)  # [rounds, n]


def lsh(vectors: torch.Tensor, n_buckets: int, n_rounds: int, seed: int = 0, *, causal: bool = False) -> torch.Tensor:
    """Reformer-style mask: a token attends to the tokens that share its hash bucket in any round.

    As in Reformer, a token does not attend to itself unless it has no other key (its own query and key are the
    same vector, so it would otherwise always win). Simplification: Reformer sorts the tokens by bucket and
    attends within fixed-size chunks, which bounds its cost at O(N log N); this mask keeps every same-bucket pair,
    so its density stays about ``1 - (1 - 1/n_buckets) ** n_rounds`` at every length (O(N^2) as built).
    """
    n = len(vectors)
    buckets = lsh_buckets(vectors, n_buckets, n_rounds, seed)  # [rounds, n]
    allowed = (buckets.unsqueeze(2) == buckets.unsqueeze(1)).any(dim=0)  # [n, n]
    if causal:
        allowed &= globals()["causal"](n)  # the function, not the flag of the same name
    itself = torch.eye(n, dtype=torch.bool)
    has_other = (allowed & ~itself).any(dim=-1, keepdim=True)  # [n, 1]
    return (allowed & ~itself) | (itself & ~has_other)


# ---------------------------------------------------------------------------------------------------------------
# Statistics


def density(mask: torch.Tensor) -> float:
    """Fraction of (query, key) pairs that may attend."""
    if mask.numel() == 0:
        return 0.0
    return mask.float().mean().item()


def keys_per_query(mask: torch.Tensor) -> torch.Tensor:
    """How many keys each query row may attend to, ``[..., n_q]``."""
    return mask.sum(dim=-1)


def receptive_field(mask: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Which inputs can reach which positions through ``n_layers`` stacked layers with this mask (and residuals).

    Returns ``[n_layers, n, n]`` bool: entry ``[l, i, j]`` says token ``j``'s information can reach position ``i``
    after ``l + 1`` layers (boolean matrix powers of ``mask | I``).
    """
    n_layers = _check_length("n_layers", n_layers)
    step = (mask | torch.eye(mask.shape[-1], dtype=torch.bool)).to(torch.float32)
    reach = step.clone()
    result = [reach > 0]
    for _ in range(n_layers - 1):
        reach = ((reach @ step) > 0).to(torch.float32)
        result.append(reach > 0)
    return torch.stack(result)


# ---------------------------------------------------------------------------------------------------------------
# Masks as rules: what the flash paths take instead of an N x N tensor


@dataclass(frozen=True)
class MaskSpec:
    """A mask described by its rule, so a kernel can skip whole tiles without building ``[n_q, n_k]``.

    Positions follow the functions above: queries are aligned to the end of the keys (``offset = n_k - n_q``),
    ``causal`` keeps key <= query position, ``window=(left, right)`` keeps ``pos - left <= key <= pos + right``
    (FlashAttention's ``window_size``; None on a side = unbounded), and ``block_layout`` (``[n_query_blocks,
    n_key_blocks]`` bool, True = compute this tile, with its ``block_size``) is a whole block-sparse mask such as
    BigBird's. :meth:`dense` gives the equivalent True = may attend tensor.
    """

    n_q: int
    n_k: int
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    block_layout: torch.Tensor | None = None
    block_size: int | None = None

    def __post_init__(self):
        _check_length("n_q", self.n_q)
        _check_length("n_k", self.n_k)
        if self.window is not None:
            object.__setattr__(self, "window", (self.window[0], self.window[1]))
            for side in self.window:
                if side is not None and (not isinstance(side, int) or isinstance(side, bool) or side < 0):
                    raise ValueError(f"window sides must be whole numbers >= 0 or None, got {self.window}")
        if self.block_layout is not None:
            if self.causal or self.window is not None:
                raise ValueError("a block layout is the whole mask: do not combine it with causal or window")
            if self.block_size is None or self.block_size < 1:
                raise ValueError("a block layout needs its block_size")
            n_qb, n_kb = -(-self.n_q // self.block_size), -(-self.n_k // self.block_size)
            if tuple(self.block_layout.shape) != (n_qb, n_kb):
                raise ValueError(
                    f"block layout is {tuple(self.block_layout.shape)} but {self.n_q} x {self.n_k} tokens in blocks "
                    f"of {self.block_size} need {(n_qb, n_kb)}"
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
        """The mask of one tile, ``[q_end - q_start, k_end - k_start]`` bool, True = may attend."""
        query_pos = torch.arange(q_start, q_end).unsqueeze(1) + self.offset  # [rows, 1]
        key_pos = torch.arange(k_start, k_end).unsqueeze(0)  # [1, cols]
        allowed = torch.ones(q_end - q_start, k_end - k_start, dtype=torch.bool)
        if self.left is not None:
            allowed &= key_pos >= query_pos - self.left
        if self.right is not None:
            allowed &= key_pos <= query_pos + self.right
        if self.block_layout is not None:
            query_blocks = torch.arange(q_start, q_end) // self.block_size
            key_blocks = torch.arange(k_start, k_end) // self.block_size
            allowed &= self.block_layout[query_blocks][:, key_blocks]
        return allowed

    def dense(self) -> torch.Tensor:
        """The whole ``[n_q, n_k]`` mask (for references and small drawings; avoid at large N)."""
        return self.tile(0, self.n_q, 0, self.n_k)

    def key_range(self, q_start: int, q_end: int) -> tuple[int, int]:
        """Keys that some query in ``[q_start, q_end)`` may see: ``[lo, hi)`` (the window and causal bounds)."""
        first, last = q_start + self.offset, q_end - 1 + self.offset
        lo = 0 if self.left is None else max(0, first - self.left)
        hi = self.n_k if self.right is None else min(self.n_k, last + self.right + 1)
        return lo, max(lo, hi)

    def fully_allowed_range(self, q_start: int, q_end: int) -> tuple[int, int]:
        """Keys that every query in the block may see: tiles inside ``[lo, hi)`` need no element mask."""
        first, last = q_start + self.offset, q_end - 1 + self.offset
        lo = 0 if self.left is None else max(0, last - self.left)
        hi = self.n_k if self.right is None else min(self.n_k, first + self.right + 1)
        return lo, max(lo, hi)


# ---------------------------------------------------------------------------------------------------------------
# Converters between conventions (use only at the edges)


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """True = may attend -> additive float mask: 0 where allowed, -inf where not (add it to the scores)."""
    _require_bool(mask)
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))


ADDITIVE_BLOCKED_AT = -1e4  # old BERT code adds -10000, newer HF code finfo.min, others -1e9 or -inf


def from_additive(additive: torch.Tensor) -> torch.Tensor:
    """Additive float mask (0 allowed; -inf or a large negative number, <= -1e4, blocked) -> True = may attend."""
    return additive > ADDITIVE_BLOCKED_AT


def from_keep_float(keep: torch.Tensor) -> torch.Tensor:
    """The textbooks' float mask, 1 = keep and 0 = drop (e.g. HF ``attention_mask``) -> True = may attend."""
    if keep.dtype == torch.bool:
        raise TypeError("from_keep_float takes a 0/1 numeric mask; this one is already boolean")
    return keep != 0


def from_masked_bool(masked: torch.Tensor) -> torch.Tensor:
    """Inverted boolean style, True = masked (``nn.MultiheadAttention``'s ``attn_mask``) -> True = may attend."""
    _require_bool(masked)
    return ~masked


def to_masked_bool(mask: torch.Tensor) -> torch.Tensor:
    """True = may attend -> True = masked, the convention of ``nn.MultiheadAttention``."""
    _require_bool(mask)
    return ~mask


def _require_bool(mask: torch.Tensor) -> None:
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a boolean mask (True = may attend), got dtype {mask.dtype}")
