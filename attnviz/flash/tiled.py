"""FlashAttention-2's forward pass in plain PyTorch: one query block at a time against key blocks, with an
online softmax (running max and running sum), never holding the N x N matrix.

Read it next to Dao (2023), Algorithm 1. Shapes: ``q [batch, heads, n_q, d]``, ``k, v [batch, kv_heads, n_k, d]``.
The mask is a rule (:class:`attnviz.core.masks.MaskSpec`), so tiles it rules out are skipped without being looked at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnviz.core.masks import MaskSpec

COMPUTED, MASKED, SKIPPED = "computed", "masked", "skipped"


@dataclass
class OnlineSoftmaxStep:
    """The state of one query block after consuming one key block (for the page's stepper)."""

    key_block: int
    status: str
    scores: torch.Tensor | None  # [block_q, block_k] scaled scores of this tile (-inf where masked)
    running_max: torch.Tensor  # [block_q]
    running_sum: torch.Tensor  # [block_q]
    output: torch.Tensor  # [block_q, d]: the normalised output so far (acc / running_sum)


@dataclass
class TiledTrace:
    n_query_blocks: int
    n_key_blocks: int
    status: list[list[str]] = field(default_factory=list)  # [query block][key block]
    steps: list[OnlineSoftmaxStep] = field(default_factory=list)  # for trace_query_block, batch 0, head 0

    def counts(self) -> dict[str, int]:
        flat = [s for row in self.status for s in row]
        return {name: flat.count(name) for name in (COMPUTED, MASKED, SKIPPED)}


@dataclass
class RowState:
    """What one query block keeps between key blocks: O(block_q x d), whatever N is (Ring attention keeps the
    same on each device)."""

    running_max: torch.Tensor  # [b, h, bq], the largest score seen so far
    running_sum: torch.Tensor  # [b, h, bq], sum of exp(score - running_max)
    accumulator: torch.Tensor  # [b, h, bq, d], sum of exp(score - running_max) * v


def online_softmax_update(state: RowState, scores: torch.Tensor, values: torch.Tensor) -> None:
    """Fold one tile into the running state (in place). ``scores [b, h, bq, bk]`` are scaled and -inf where
    masked; ``values [b, h, bk, d]``. Overwrites ``scores`` with its exponentials: the tile is the largest
    temporary there is, so no copy is made."""
    new_max = torch.maximum(state.running_max, scores.amax(dim=-1))  # [b, h, bq]
    # Rows that have seen no allowed key yet keep max = -inf; use 0 there so exp() gives 0, not NaN.
    safe_max = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
    probabilities = scores.sub_(safe_max.unsqueeze(-1)).exp_()  # exp(s - m), [b, h, bq, bk]
    correction = torch.exp(state.running_max - safe_max)  # rescales what was accumulated under the old max
    state.running_sum = state.running_sum * correction + probabilities.sum(dim=-1)
    state.accumulator.mul_(correction.unsqueeze(-1)).add_(torch.matmul(probabilities, values))
    state.running_max = new_max


def _tile_is_skipped(mask: MaskSpec, qb: int, kb: int, key_range: tuple[int, int], k_start: int, k_end: int) -> bool:
    """Whether the rule rules out this whole tile: outside the window/causal range, or off the block layout."""
    lo, hi = key_range
    if k_end <= lo or k_start >= hi:
        return True
    return mask.block_layout is not None and not bool(mask.block_layout[qb, kb])


def _checked_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec | None) -> MaskSpec:
    """The rule to follow (None: full attention), once the shapes of ``q``, ``k``, ``v`` and the mask agree."""
    _, heads, n_q, d = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    if k.shape[-1] != d or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} K/V heads evenly")
    mask = MaskSpec(n_q, n_k) if mask is None else mask
    if (mask.n_q, mask.n_k) != (n_q, n_k):
        raise ValueError(f"the mask is for {mask.n_q} x {mask.n_k} but the inputs are {n_q} x {n_k}")
    return mask


def _blocks(n: int, block: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each block of ``block`` positions covering ``0 .. n`` (the last one may be shorter)."""
    return [(start, min(n, start + block)) for start in range(0, n, block)]


def _empty_row_state(batch: int, heads: int, rows: int, d_v: int, dtype: torch.dtype,
                     device: torch.device) -> RowState:
    """A query block's state before any key block: max -inf, sum 0, accumulator 0."""
    return RowState(
        running_max=torch.full((batch, heads, rows), float("-inf"), dtype=dtype, device=device),  # [b, h, bq]
        running_sum=torch.zeros(batch, heads, rows, dtype=dtype, device=device),  # [b, h, bq]
        accumulator=torch.zeros(batch, heads, rows, d_v, dtype=dtype, device=device),  # [b, h, bq, d]
    )


def _stepper_snapshot(key_block: int, status: str, tile_scores: torch.Tensor, state: RowState) -> OnlineSoftmaxStep:
    """The traced query block's state after ``key_block``, for batch 0 and head 0."""
    return OnlineSoftmaxStep(
        key_block=key_block, status=status, scores=tile_scores,
        running_max=state.running_max[0, 0].clone(), running_sum=state.running_sum[0, 0].clone(),
        output=(state.accumulator[0, 0] / state.running_sum[0, 0].clamp_min(1e-30).unsqueeze(-1)).clone(),
    )


def _attend_query_block(
    state: RowState,
    q_block: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec,
    query_block: int,
    query_rows: tuple[int, int],
    key_blocks: list[tuple[int, int]],
    scale: float,
    steps: list[OnlineSoftmaxStep] | None,
) -> list[str]:
    """The inner loop (Dao 2023, Algorithm 1's loop over key blocks; the tutorial's ``_attn_fwd_inner``): fold
    every key block the rule allows into ``state``. ``q_block [b, h, bq, d]`` in the compute dtype; ``k, v
    [b, h, n_k, d]`` with one K/V head per query head. Returns each key block's status; appends the state after
    each block to ``steps`` unless it is None."""
    q_start, q_end = query_rows
    key_range = mask.key_range(q_start, q_end)
    full_lo, full_hi = mask.fully_allowed_range(q_start, q_end)
    statuses = []
    for kb, (k_start, k_end) in enumerate(key_blocks):
        if _tile_is_skipped(mask, query_block, kb, key_range, k_start, k_end):
            statuses.append(SKIPPED)
            continue
        scores = torch.matmul(q_block, k[:, :, k_start:k_end].to(q_block.dtype).transpose(-2, -1))
        scores.mul_(scale)  # [b, h, bq, bk]; in place: this tile is the largest temporary
        needs_mask = mask.block_layout is None and not (k_start >= full_lo and k_end <= full_hi)
        if needs_mask:  # a diagonal or window-edge tile: mask element by element
            scores.masked_fill_(~mask.tile(q_start, q_end, k_start, k_end).to(q_block.device), float("-inf"))
        statuses.append(MASKED if needs_mask else COMPUTED)
        tile_scores = scores[0, 0].clone() if steps is not None else None  # the update overwrites scores
        online_softmax_update(state, scores, v[:, :, k_start:k_end].to(q_block.dtype))
        if steps is not None:
            steps.append(_stepper_snapshot(kb, statuses[-1], tile_scores, state))
    return statuses


def _normalised_rows(state: RowState, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The epilogue: ``(output [b, h, bq, d] in dtype, lse [b, h, bq])`` of a query block's final state. Rows with
    no allowed key get output 0 and lse -inf."""
    empty = state.running_sum == 0  # [b, h, bq]
    normaliser = state.running_sum.clamp_min(1e-30)
    output = torch.where(
        empty.unsqueeze(-1), torch.zeros_like(state.accumulator), state.accumulator / normaliser.unsqueeze(-1)
    ).to(dtype)
    lse = torch.where(
        empty, torch.full_like(state.running_max, float("-inf")), state.running_max + torch.log(normaliser)
    )
    return output, lse


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec | None = None,
    *,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 128,
    trace: bool = False,
    trace_query_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, TiledTrace | None]:
    """Returns ``(output [b, h, n_q, d], lse [b, h, n_q], trace)``.

    ``lse`` is the natural log-sum-exp of each row's scaled scores (-inf for a row with no allowed key, whose
    output is 0). ``mask`` None is full attention. With a block layout (e.g. BigBird's) the tiles are the layout's
    blocks and only its listed key blocks are visited. ``trace`` records which tiles were computed, masked or
    skipped; ``trace_query_block`` also records that block's online-softmax state after each key block.
    """
    mask = _checked_mask(q, k, v, mask)
    if mask.block_layout is not None:
        block_q = block_k = int(mask.block_size)
    batch, heads, n_q, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = heads // k.shape[1]  # query heads per K/V head
    k = k.repeat_interleave(group, dim=1) if group > 1 else k  # [b, heads, n_k, d]
    v = v.repeat_interleave(group, dim=1) if group > 1 else v

    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32  # accumulate in fp32 at least
    output = torch.empty(batch, heads, n_q, v.shape[-1], dtype=q.dtype, device=q.device)  # [b, h, n_q, d]
    lse = torch.empty(batch, heads, n_q, dtype=compute_dtype, device=q.device)  # [b, h, n_q]
    query_blocks, key_blocks = _blocks(n_q, block_q), _blocks(k.shape[2], block_k)
    record = TiledTrace(len(query_blocks), len(key_blocks)) if trace or trace_query_block is not None else None

    for qb, (q_start, q_end) in enumerate(query_blocks):
        q_block = q[:, :, q_start:q_end].to(compute_dtype)  # [b, h, bq, d]
        state = _empty_row_state(batch, heads, q_end - q_start, v.shape[-1], compute_dtype, q.device)
        steps = record.steps if record is not None and qb == trace_query_block else None
        statuses = _attend_query_block(state, q_block, k, v, mask, qb, (q_start, q_end), key_blocks, scale, steps)
        output[:, :, q_start:q_end], lse[:, :, q_start:q_end] = _normalised_rows(state, q.dtype)
        if record is not None:
            record.status.append(statuses)
    return output, lse, record
