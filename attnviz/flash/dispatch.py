"""``attention(q, k, v, backend=...)``: every contender behind one call, with the same masks.

Backends: ``naive`` (materialises the N x N matrix: attnviz.core.attention), ``tiled`` (the online softmax in PyTorch),
``sdpa`` (PyTorch's ``scaled_dot_product_attention`` with a named kernel: flash, efficient, cudnn or math, and
the one that ran reported), ``triton`` (our kernel; CUDA, or the CPU interpreter for small inputs), ``flex``
(PyTorch's compiled FlexAttention with a BlockMask made from the same rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.core.masks import MaskSpec

SDPA_KERNELS = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class Contender:
    """One way to compute attention, by name: the Flash page and the benchmarks run these."""

    key: str
    label: str
    options: dict  # keyword arguments of attention()


CONTENDERS = {c.key: c for c in (
    Contender("naive", "naive", {"backend": "naive"}),
    Contender("tiled", "tiled (PyTorch)", {"backend": "tiled", "block_q": 256, "block_k": 512}),
    Contender("sdpa/flash", "SDPA flash", {"backend": "sdpa", "sdpa_kernel": "flash"}),
    Contender("sdpa/math", "SDPA math", {"backend": "sdpa", "sdpa_kernel": "math"}),
    Contender("sdpa/efficient", "SDPA efficient", {"backend": "sdpa", "sdpa_kernel": "efficient"}),
    Contender("sdpa/cudnn", "SDPA cuDNN", {"backend": "sdpa", "sdpa_kernel": "cudnn"}),
    Contender("triton", "Triton", {"backend": "triton"}),
    Contender("flex", "FlexAttention", {"backend": "flex"}),
)}


class BackendUnavailable(RuntimeError):
    """This backend cannot run these inputs here; the message says why."""


@dataclass
class Result:
    output: torch.Tensor  # [b, h, n_q, d]
    backend: str  # what ran, e.g. "sdpa/flash" or "triton (interpreter)"


def _naive(q, k, v, spec: MaskSpec, scale, **options) -> Result:
    from attnviz.core.attention import repeat_kv, scaled_dot_product_attention

    group = q.shape[1] // k.shape[1]
    mask = None if spec.is_full else spec.dense().to(q.device)
    output, _ = scaled_dot_product_attention(q, repeat_kv(k, group), repeat_kv(v, group), mask, scale=scale)
    return Result(output, "naive")


def _tiled(q, k, v, spec: MaskSpec, scale, *, block_q: int = 128, block_k: int = 128, **options) -> Result:
    from attnviz.flash.tiled import tiled_attention

    output, _, _ = tiled_attention(q, k, v, spec, scale=scale, block_q=block_q, block_k=block_k)
    return Result(output, "tiled")


def _sdpa(q, k, v, spec: MaskSpec, scale, *, sdpa_kernel: str = "flash", **options) -> Result:
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel as only_kernels

    if sdpa_kernel not in SDPA_KERNELS:
        raise ValueError(f"sdpa_kernel must be one of {SDPA_KERNELS}, got {sdpa_kernel!r}")
    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[sdpa_kernel]
    kwargs = {"scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    if spec.causal and spec.window is None and spec.n_q == spec.n_k:
        kwargs["is_causal"] = True  # SDPA's is_causal is top-left aligned: the same as ours only when square
    elif not spec.is_full:
        kwargs["attn_mask"] = spec.dense().to(q.device)  # a dense boolean mask, True = may attend
    try:
        with only_kernels([backend]):
            return Result(F.scaled_dot_product_attention(q, k, v, **kwargs), f"sdpa/{sdpa_kernel}")
    except RuntimeError as problem:
        reason = str(problem).strip().splitlines()[0][:200]
        raise BackendUnavailable(f"SDPA's {sdpa_kernel} kernel cannot run these inputs here: {reason}") from None


def _triton(q, k, v, spec: MaskSpec, scale, **options) -> Result:
    try:
        from attnviz.flash import triton_kernel
    except ImportError:
        raise BackendUnavailable("Triton is not installed (pip install triton; Linux x86_64 wheels only)") from None
    try:
        output, _ = triton_kernel.triton_attention(q, k, v, spec, scale=scale)
    except triton_kernel.TritonUnavailable as problem:
        raise BackendUnavailable(str(problem)) from None
    return Result(output, "triton (interpreter)" if triton_kernel.INTERPRETED else "triton")


def _flex(q, k, v, spec: MaskSpec, scale, **options) -> Result:
    from attnviz.flash.flex import flex_attention

    try:
        return Result(flex_attention(q, k, v, spec, scale), "flex")
    except Exception as problem:  # noqa: BLE001 - torch.compile raises many types; all mean "not here"
        reason = str(problem).strip().splitlines()[0][:200] if str(problem).strip() else type(problem).__name__
        raise BackendUnavailable(f"FlexAttention could not compile here: {reason}") from None


# Every backend by name: ``function(q, k, v, spec, scale, **options) -> Result`` (options: the tiled backend's
# block_q/block_k, SDPA's sdpa_kernel). A new backend is one function and one entry here (and a Contender).
BACKEND_FUNCTIONS = {"naive": _naive, "tiled": _tiled, "sdpa": _sdpa, "triton": _triton, "flex": _flex}
BACKENDS = tuple(BACKEND_FUNCTIONS)


def run_contender(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: MaskSpec | None = None) -> Result:
    """Attention by the contender named ``key`` (a key of :data:`CONTENDERS`)."""
    return attention(q, k, v, mask, **CONTENDERS[key].options)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: MaskSpec | None = None,
    *,
    backend: str = "naive",
    scale: float | None = None,
    sdpa_kernel: str = "flash",
    block_q: int = 128,
    block_k: int = 128,
) -> Result:
    """Attention by the named backend. ``q [b, h, n_q, d]``, ``k, v [b, h_kv, n_k, d]``; ``mask`` a rule
    (:class:`attnviz.core.masks.MaskSpec`, e.g. from ``attnviz.core.mask_patterns.rule``), None for full attention.
    ``block_q``/``block_k`` are the tiled backend's tile sizes."""
    spec = MaskSpec(q.shape[2], k.shape[2]) if mask is None else mask
    if (spec.n_q, spec.n_k) != (q.shape[2], k.shape[2]):
        raise ValueError(f"the mask is for {spec.n_q} x {spec.n_k} but the inputs are {q.shape[2]} x {k.shape[2]}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if backend not in BACKEND_FUNCTIONS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return BACKEND_FUNCTIONS[backend](q, k, v, spec, scale, sdpa_kernel=sdpa_kernel, block_q=block_q,
                                      block_k=block_k)
