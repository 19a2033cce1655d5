"""Flash attention in Triton: forward with an online softmax in base 2, backward (dQ, dK, dV) as an
``autograd.Function``, with causal, sliding-window and block-sparse (BigBird) masks, GQA and any length.

Written for Triton 3.6 and 3.9 alike: plain pointer arithmetic, no block pointers, one configuration per head
size (no autotune, which the interpreter cannot run). On a machine without CUDA the kernels run in Triton's
interpreter on CPU tensors: correct, and far too slow to time (keep N <= 256 there).

Masks follow ``attnviz.core.masks.MaskSpec``: queries aligned to the end of the keys, causal = key <= position,
window ``(left, right)`` = ``position - left <= key <= position + right``.
"""

from __future__ import annotations

import math
import os

import torch

from attnviz.core.masks import MaskSpec
from attnviz.system.runtime import configure_triton

configure_triton()  # no GPU: the kernels must run in the interpreter, which Triton decides when first imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _element_mask(offs_m, offs_n, n_k, offset, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[BLOCK_M, BLOCK_N] True where query row offs_m may attend to key offs_n."""
    query_pos = offs_m[:, None] + offset
    key_pos = offs_n[None, :]
    allowed = (key_pos < n_k) & (query_pos >= offset)  # the second term is all-true; it fixes the shape
    if HAS_LEFT:
        allowed = allowed & (key_pos >= query_pos - left)
    if HAS_RIGHT:
        allowed = allowed & (key_pos <= query_pos + right)
    return allowed


@triton.jit
def _forward_tile(
    acc, running_sum, running_max, q, K, V, start_n, offs_m, offs_n, offs_d, n_k, head_dim, stride_kn, stride_kd,
    stride_vn, stride_vd, qk_scale, offset, left, right,
    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, UPCAST: tl.constexpr,
):
    cols = start_n + offs_n
    k = tl.load(K + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                mask=(cols[None, :] < n_k) & (offs_d[:, None] < head_dim), other=0.0)  # [BLOCK_D, BLOCK_N]
    v = tl.load(V + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=(cols[:, None] < n_k) & (offs_d[None, :] < head_dim), other=0.0)  # [BLOCK_N, BLOCK_D]
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, k) * qk_scale  # [BLOCK_M, BLOCK_N], base-2 units
    if MASKED:
        allowed = _element_mask(offs_m, cols, n_k, offset, left, right, HAS_LEFT, HAS_RIGHT)
        scores = tl.where(allowed, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, 1))
    # A row that has seen no allowed key yet has max -inf: subtract 0 instead, so exp2 gives 0 rather than NaN.
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    p = tl.math.exp2(scores - safe_max[:, None])
    correction = tl.math.exp2(running_max - safe_max)
    running_sum = running_sum * correction + tl.sum(p, 1)
    acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, running_sum, new_max


@triton.jit
def _forward_kernel(
    Q, K, V, Out, LSE2, BlockIndex, BlockCount,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, n_k, head_dim, qk_scale, offset, left, right, max_blocks,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, UPCAST: tl.constexpr,
):
    block_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // n_heads
    head = batch_head % n_heads
    kv_head = head // GROUP
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    K_head = K + batch * stride_kb + kv_head * stride_kh
    V_head = V + batch * stride_vb + kv_head * stride_vh

    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    if SPARSE:
        # Block-sparse: visit only the key blocks listed for this query block (masking just the ragged tail).
        count = tl.load(BlockCount + block_m)
        for index in range(0, count):
            start_n = tl.load(BlockIndex + block_m * max_blocks + index) * BLOCK_N
            acc, running_sum, running_max = _forward_tile(
                acc, running_sum, running_max, q, K_head, V_head, start_n, offs_m, offs_n, offs_d, n_k, head_dim,
                stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, offset, left, right,
                True, False, False, UPCAST)
    else:
        first = block_m * BLOCK_M + offset  # positions of this block's first and last (valid) query
        last = tl.minimum(block_m * BLOCK_M + BLOCK_M, n_q) - 1 + offset
        lo = 0
        hi = n_k
        full_lo = 0
        full_hi = n_k
        if HAS_LEFT:
            lo = tl.maximum(first - left, 0)
            full_lo = tl.maximum(last - left, 0)
        if HAS_RIGHT:
            hi = tl.minimum(last + right + 1, n_k)
            full_hi = tl.minimum(first + right + 1, n_k)
        lo = (lo // BLOCK_N) * BLOCK_N
        # Tiles wholly inside [full_lo, full_hi) need no element mask: the diagonal/edge tiles do.
        inner_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
        inner_hi = (full_hi // BLOCK_N) * BLOCK_N
        inner_lo = tl.maximum(inner_lo, lo)
        inner_hi = tl.minimum(inner_hi, hi)
        if inner_hi <= inner_lo:
            inner_lo = lo
            inner_hi = lo
        for start_n in range(lo, inner_lo, BLOCK_N):
            acc, running_sum, running_max = _forward_tile(
                acc, running_sum, running_max, q, K_head, V_head, start_n, offs_m, offs_n, offs_d, n_k, head_dim,
                stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, offset, left, right,
                True, HAS_LEFT, HAS_RIGHT, UPCAST)
        for start_n in range(inner_lo, inner_hi, BLOCK_N):
            acc, running_sum, running_max = _forward_tile(
                acc, running_sum, running_max, q, K_head, V_head, start_n, offs_m, offs_n, offs_d, n_k, head_dim,
                stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, offset, left, right,
                False, HAS_LEFT, HAS_RIGHT, UPCAST)
        for start_n in range(inner_hi, hi, BLOCK_N):
            acc, running_sum, running_max = _forward_tile(
                acc, running_sum, running_max, q, K_head, V_head, start_n, offs_m, offs_n, offs_d, n_k, head_dim,
                stride_kn, stride_kd, stride_vn, stride_vd, qk_scale, offset, left, right,
                True, HAS_LEFT, HAS_RIGHT, UPCAST)

    empty = running_sum == 0.0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, running_sum)[:, None])
    lse2 = tl.where(empty, float("-inf"), running_max + tl.math.log2(tl.where(empty, 1.0, running_sum)))
    tl.store(Out + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim))
    tl.store(LSE2 + batch_head * n_q + offs_m, lse2, mask=offs_m < n_q)


@triton.jit
def _probabilities(q, k, lse2, offs_m, offs_n, n_q, n_k, qk_scale, offset, left, right,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """The softmax tile recomputed from Q, K and the saved log-sum-exp (base 2): [BLOCK_M, BLOCK_N]."""
    scores = tl.dot(q, tl.trans(k)) * qk_scale
    allowed = _element_mask(offs_m, offs_n, n_k, offset, left, right, HAS_LEFT, HAS_RIGHT) & (offs_m[:, None] < n_q)
    safe_lse = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # an empty row has p = 0 everywhere
    return tl.where(allowed, tl.math.exp2(scores - safe_lse[:, None]), 0.0)


@triton.jit
def _backward_dkdv_kernel(
    Q, K, V, DO, LSE2, Delta, DK, DV, BlockIndex, BlockCount,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_gb, stride_gh, stride_gn, stride_gd,
    n_heads, n_q, n_k, head_dim, qk_scale, scale, offset, left, right, max_blocks,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, UPCAST: tl.constexpr,
):
    """One key block of one (expanded) head: dK and dV summed over the query blocks that see it."""
    block_n = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // n_heads
    head = batch_head % n_heads
    kv_head = head // GROUP
    offs_n = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_m_base = tl.arange(0, BLOCK_M)
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=kv_mask, other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    Q_head = Q + batch * stride_qb + head * stride_qh
    DO_head = DO + batch * stride_ob + head * stride_oh

    # Queries that can see this key block: position p with key - right <= p <= key + left.
    lo = 0
    hi = n_q
    if HAS_RIGHT:
        lo = tl.maximum(block_n * BLOCK_N - right - offset, 0)
    if HAS_LEFT:
        hi = tl.minimum(block_n * BLOCK_N + BLOCK_N - 1 + left - offset + 1, n_q)
    lo = (lo // BLOCK_M) * BLOCK_M
    count = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_M)
    if SPARSE:
        count = tl.load(BlockCount + block_n)
    for index in range(0, count):
        if SPARSE:
            start_m = tl.load(BlockIndex + block_n * max_blocks + index) * BLOCK_M
        else:
            start_m = lo + index * BLOCK_M
        offs_m = start_m + offs_m_base
        row_mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
        q = tl.load(Q_head + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_mask, other=0.0)
        do = tl.load(DO_head + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=row_mask, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse2 = tl.load(LSE2 + batch_head * n_q + offs_m, mask=offs_m < n_q, other=float("-inf"))
        delta = tl.load(Delta + batch_head * n_q + offs_m, mask=offs_m < n_q, other=0.0)
        p = _probabilities(q, k, lse2, offs_m, offs_n, n_q, n_k, qk_scale, offset, left, right, HAS_LEFT, HAS_RIGHT)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * scale
    out_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
    grad_offsets = batch * stride_gb + head * stride_gh + offs_n[:, None] * stride_gn + offs_d[None, :] * stride_gd
    tl.store(DK + grad_offsets, dk.to(DK.dtype.element_ty), mask=out_mask)
    tl.store(DV + grad_offsets, dv.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _backward_dq_kernel(
    Q, K, V, DO, LSE2, Delta, DQ, BlockIndex, BlockCount,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    n_heads, n_q, n_k, head_dim, qk_scale, scale, offset, left, right, max_blocks,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, SPARSE: tl.constexpr, UPCAST: tl.constexpr,
):
    block_m = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // n_heads
    head = batch_head % n_heads
    kv_head = head // GROUP
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n_base = tl.arange(0, BLOCK_N)
    row_mask = (offs_m[:, None] < n_q) & (offs_d[None, :] < head_dim)
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_mask, other=0.0)
    do = tl.load(DO + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
                 mask=row_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2 = tl.load(LSE2 + batch_head * n_q + offs_m, mask=offs_m < n_q, other=float("-inf"))
    delta = tl.load(Delta + batch_head * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    K_head = K + batch * stride_kb + kv_head * stride_kh
    V_head = V + batch * stride_vb + kv_head * stride_vh

    first = block_m * BLOCK_M + offset
    last = tl.minimum(block_m * BLOCK_M + BLOCK_M, n_q) - 1 + offset
    lo = 0
    hi = n_k
    if HAS_LEFT:
        lo = tl.maximum(first - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(last + right + 1, n_k)
    lo = (lo // BLOCK_N) * BLOCK_N
    count = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    if SPARSE:
        count = tl.load(BlockCount + block_m)
    for index in range(0, count):
        if SPARSE:
            start_n = tl.load(BlockIndex + block_m * max_blocks + index) * BLOCK_N
        else:
            start_n = lo + index * BLOCK_N
        offs_n = start_n + offs_n_base
        kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < head_dim)
        k = tl.load(K_head + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(V_head + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        p = _probabilities(q, k, lse2, offs_m, offs_n, n_q, n_k, qk_scale, offset, left, right, HAS_LEFT, HAS_RIGHT)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * scale
    tl.store(DQ + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
             dq.to(DQ.dtype.element_ty), mask=row_mask)


# ---------------------------------------------------------------------------------------------------------------
# Host side


class TritonUnavailable(RuntimeError):
    """The Triton kernel cannot run here (and why)."""


def _block_lists(layout: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per row of a block layout, the column indices it keeps: ``(index [rows, max], count [rows], max)``."""
    counts = layout.sum(dim=1).to(torch.int32)
    max_blocks = max(int(counts.max()) if counts.numel() else 0, 1)
    index = torch.zeros(layout.shape[0], max_blocks, dtype=torch.int32)
    for row in range(layout.shape[0]):
        columns = layout[row].nonzero().flatten()
        index[row, : len(columns)] = columns.to(torch.int32)
    return index.to(device), counts.to(device), max_blocks


def _config(head_dim: int, spec: MaskSpec) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): one configuration per case, no autotune."""
    if spec.block_layout is not None:
        return spec.block_size, spec.block_size, 4, 2
    if INTERPRETED:
        return 32, 32, 4, 1
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 64, 8, 3
    return 64, 32, 8, 2


def _interpreter_is_consistent() -> bool:
    """Triton's own library functions must have been decorated in interpreter mode too (runtime.configure_triton)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.standard.cdiv, InterpretedFunction)


def _check(q, k, v, spec: MaskSpec) -> None:
    if INTERPRETED and not _interpreter_is_consistent():
        raise TritonUnavailable(
            "triton was imported before TRITON_INTERPRET=1 was set, so its interpreter cannot run; start the process "
            "with TRITON_INTERPRET=1 (app.py and the tests do this)"
        )
    if q.device.type == "cpu" and not INTERPRETED:
        raise TritonUnavailable("the Triton kernel needs a CUDA GPU, or TRITON_INTERPRET=1 for the CPU interpreter")
    if q.device.type == "cuda" and INTERPRETED:
        raise TritonUnavailable("Triton is in interpreter mode (TRITON_INTERPRET=1) but the tensors are on the GPU")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one of fp16, bf16, fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    head_dim = q.shape[-1]
    if not 16 <= head_dim <= 256 or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        raise ValueError(
            f"head dims must be equal and between 16 and 256, got q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]}"
        )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} K/V heads evenly")
    if spec.block_layout is not None and (spec.block_size < 16 or spec.block_size & (spec.block_size - 1)):
        raise ValueError(f"block-sparse tiles must be a power of two >= 16, got {spec.block_size}")


def _mask_arguments(spec: MaskSpec) -> dict:
    return {
        "offset": spec.offset,
        "left": spec.left if spec.left is not None else 0,
        "right": spec.right if spec.right is not None else 0,
        "HAS_LEFT": spec.left is not None,
        "HAS_RIGHT": spec.right is not None,
    }


def _forward(q, k, v, spec: MaskSpec, scale: float):
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    block_m, block_n, warps, stages = _config(head_dim, spec)
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty_like(q)
    lse2 = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
    sparse = spec.block_layout is not None
    if sparse:
        index, count, max_blocks = _block_lists(spec.block_layout, q.device)
    else:
        index = count = torch.zeros(1, dtype=torch.int32, device=q.device)
        max_blocks = 1
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    _forward_kernel[grid](
        q, k, v, out, lse2, index, count,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        heads, n_q, n_k, head_dim, scale * LOG2E, max_blocks=max_blocks,
        GROUP=heads // k.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, SPARSE=sparse,
        UPCAST=INTERPRETED and q.dtype != torch.float32, num_warps=warps, num_stages=stages,
        **_mask_arguments(spec),
    )
    return out, lse2


def _backward(q, k, v, out, lse2, grad_out, spec: MaskSpec, scale: float):
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    group = heads // kv_heads
    block_m, block_n, warps, stages = _config(head_dim, spec)
    if not INTERPRETED and spec.block_layout is None:
        block_m, block_n = 64, 64  # backward tiles hold more live values: smaller tiles
    block_d = max(16, triton.next_power_of_2(head_dim))
    grad_out = grad_out.contiguous()
    delta = (out.float() * grad_out.float()).sum(-1).contiguous()  # [b, h, n_q]: rowsum(dO * O)
    dq = torch.empty_like(q)
    dk_expanded = torch.empty(batch, heads, n_k, head_dim, dtype=q.dtype, device=q.device)
    dv_expanded = torch.empty_like(dk_expanded)
    sparse = spec.block_layout is not None
    dummy = torch.zeros(1, dtype=torch.int32, device=q.device)
    common = dict(GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, SPARSE=sparse,
                  UPCAST=INTERPRETED and q.dtype != torch.float32, num_warps=warps, num_stages=1 if INTERPRETED else 2,
                  **_mask_arguments(spec))
    if sparse:
        index_t, count_t, max_t = _block_lists(spec.block_layout.T.contiguous(), q.device)
        index, count, max_blocks = _block_lists(spec.block_layout, q.device)
    else:
        index_t = count_t = index = count = dummy
        max_t = max_blocks = 1
    _backward_dkdv_kernel[(triton.cdiv(n_k, block_n), batch * heads)](
        q, k, v, grad_out, lse2, delta, dk_expanded, dv_expanded, index_t, count_t,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(), *dk_expanded.stride(),
        heads, n_q, n_k, head_dim, scale * LOG2E, scale, max_blocks=max_t, **common,
    )
    _backward_dq_kernel[(triton.cdiv(n_q, block_m), batch * heads)](
        q, k, v, grad_out, lse2, delta, dq, index, count,
        *q.stride(), *k.stride(), *v.stride(), *grad_out.stride(),
        heads, n_q, n_k, head_dim, scale * LOG2E, scale, max_blocks=max_blocks, **common,
    )
    # GQA: each K/V head served `group` query heads; its gradient is the sum over them.
    dk = dk_expanded.view(batch, kv_heads, group, n_k, head_dim).sum(2)
    dv = dv_expanded.view(batch, kv_heads, group, n_k, head_dim).sum(2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec, scale):
        out, lse2 = _forward(q, k, v, spec, scale)
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.spec, ctx.scale = spec, scale
        return out, lse2

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse2 = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse2, grad_out, ctx.spec, ctx.scale)
        return dq, dk, dv, None, None


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec | None = None,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention in Triton. ``q [b, h, n_q, d]``, ``k, v [b, h_kv, n_k, d]`` -> ``(output, lse)``.

    ``mask`` is a rule (None = full). ``lse`` is the natural log-sum-exp per row. Differentiable (dQ, dK, dV)
    with the same masks.
    """
    spec = MaskSpec(q.shape[2], k.shape[2]) if mask is None else mask
    if (spec.n_q, spec.n_k) != (q.shape[2], k.shape[2]):
        raise ValueError(f"the mask is for {spec.n_q} x {spec.n_k} but the inputs are {q.shape[2]} x {k.shape[2]}")
    _check(q, k, v, spec)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, lse2 = _TritonAttention.apply(q, k, v, spec, scale)
    return out, lse2 / LOG2E
