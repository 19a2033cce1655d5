"""The replay check: every layer's attention output recomputed from the weights a page shows (weights @ V) and
compared with the output of the model's own kernel, run again exactly as the model called it (the same function,
arguments and tensors: deterministic, so the same output the forward produced), within what rounding in the
model's dtype allows each output.
"""

from __future__ import annotations

import math

import torch

from attnviz.core.attention import repeat_kv
from attnviz.models.record import AttentionRecord

HALF_PRECISION = (torch.float16, torch.bfloat16)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1 to the next number in ``dtype``: the largest relative error of one rounding."""
    return torch.finfo(dtype).eps / 2


class ReplayDifference(float):
    """The replay check's result: the largest |attnviz's attention output - the model's| over every layer, head,
    query and value dimension (the float itself), and how close any output came to what rounding allows it.

    Each output ``o[h, i, c] = sum_j w[h, i, j] v[j, c]`` gets a bound of its own (:func:`rounding_bound`), from its
    weights, values and the size of its scores, for the model's dtype. ``share`` is the largest difference / bound
    over all outputs (the check passes when it is at most 1); ``allowed`` is that output's bound, ``dtype`` the
    model's."""

    share: float
    allowed: float
    dtype: torch.dtype

    def __new__(cls, difference: float, share: float = 0.0, allowed: float = 0.0,
                dtype: torch.dtype = torch.float32) -> "ReplayDifference":
        result = super().__new__(cls, difference)
        result.share, result.allowed, result.dtype = share, allowed, dtype
        return result

    @property
    def passed(self) -> bool:
        return math.isfinite(self) and self.share <= 1.0


def rounding_bound(record: AttentionRecord, layer: int, start: int, end: int, weights: torch.Tensor,
                   output: torch.Tensor, values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """What rounding in the model's dtype can change each attention output of query rows ``start:end``: a bound
    ``[heads, rows, d_v]`` (first order in the rounding; doubled for what that leaves out).

    ``weights [heads, rows, n_k]`` and ``output [heads, rows, d_v]`` are attnviz's (fp64, its own rounding
    negligible), ``values [heads, n_k, d_v]`` and ``keys [heads, n_k, d]`` per query head. With ``u`` the unit
    roundoff of the dtype and ``a`` that of the accumulation (fp32 for half precision, as every kernel accumulates):

    * a score ``s = scale q.k (+ bias)`` is off by at most ``d_s = 4u|s| + d a m`` with ``m = |scale| sum|q||k|``:
      the product, the scaling, a soft-cap or a bias each rounded once in the dtype, and the ``d`` terms of the dot
      product accumulated (the recorded q and k are what the kernel received: a model that scales its queries
      first did so before it called the kernel; PyTorch's math kernel computes half precision in fp32);
    * through the softmax, key j's weight moves by ``w_j (e^{d_j} - 1)`` against the others, which moves the output
      by at most ``sum_j w_j (e^{d_j} - 1) (|v_j| + |o|)``; a sink logit's share moves the same way;
    * each weight is rounded (``u``), normalised (``u``) and summed with the others (``n_k a``), and the output is
      accumulated over ``n_k`` terms (``n_k a``) and rounded (``u |o|``).
    """
    dtype = record.values.dtype
    u = unit_roundoff(dtype)
    a = unit_roundoff(torch.float32) if dtype in HALF_PRECISION else u
    d, n_k = keys.shape[-1], keys.shape[-2]
    scores = record.scores(layer, start, end)  # [heads, rows, n_k] fp32: a bound needs no more
    queries = record.queries[layer][:, start:end].float()  # [heads, rows, d]
    magnitude = abs(record.scales[layer]) * (queries.abs() @ keys.abs().transpose(-2, -1))  # [heads, rows, n_k]
    shift = torch.expm1(4 * u * scores.abs() + d * a * magnitude)  # [heads, rows, n_k]
    moved = (weights.float() * shift).nan_to_num(posinf=torch.finfo(torch.float32).max)  # 0 where w is 0
    size = output.abs().float()  # [heads, rows, d_v]
    weighted_values = weights.float() @ values.abs()  # sum_j w_j |v_j|
    bound = moved @ values.abs() + moved.sum(-1, keepdim=True) * size
    sinks = record.sinks[layer] if record.sinks else None
    if sinks is not None:  # the sink's share of each row (1 - the weights' sum) moves with its logit's rounding
        sink_share = (1 - weights.float().sum(-1, keepdim=True)).clamp_min(0)
        bound = bound + sink_share * torch.expm1(4 * u * sinks.float().abs()).view(-1, 1, 1) * size
    bound = bound + (4 * u + 3 * n_k * a) * weighted_values + u * size
    return 2 * bound


def layer_output_difference(record: AttentionRecord, layer: int, block: int | None = None,
                            model: torch.nn.Module | None = None) -> ReplayDifference:
    """Max |attnviz's output - the model's| for one layer: attnviz's weights @ V (in fp64), query block by query
    block, against the model's own kernel run again, exactly as the model called it, on the recorded Q, K and V;
    with how close it came to what the model's rounding allows (:class:`ReplayDifference`)."""
    kernel = record.kernels[layer].output(record.queries[layer], record.keys[layer], record.values[layer], model)
    kernel = kernel.double().transpose(0, 1)  # [heads, n_q, d_v]
    group = record.n_heads // record.n_kv_heads
    values = repeat_kv(record.values[layer].double().unsqueeze(0), group)[0]  # [heads, n_k, d_v]
    keys = repeat_kv(record.keys[layer].float().unsqueeze(0), group)[0]  # [heads, n_k, d]
    values32 = values.float()
    block = block or max(16, record.block_rows() // 4)  # fp64, and the bound's own [heads, rows, n_k] terms
    worst, share, allowed = 0.0, 0.0, 0.0
    for start in range(0, record.n_q, block):
        end = min(record.n_q, start + block)
        weights = record.layer_weights(layer, start, end, dtype=torch.float64)  # [heads, rows, n_k]
        ours = weights @ values  # [heads, rows, d_v]
        difference = (ours - kernel[:, start:end]).abs()
        largest = difference.max().item()  # NaN if either side has one
        if not math.isfinite(largest):
            return ReplayDifference(math.nan, math.nan, math.nan, record.values.dtype)  # see nonfinite_parts
        worst = max(worst, largest)
        bound = rounding_bound(record, layer, start, end, weights, ours, values32, keys).double()
        ratio = difference / bound.clamp_min(torch.finfo(torch.float64).tiny)
        at = int(ratio.argmax())
        if ratio.flatten()[at].item() >= share:
            share, allowed = ratio.flatten()[at].item(), bound.flatten()[at].item()
    return ReplayDifference(worst, share, allowed, record.values.dtype)


def replay_difference(record: AttentionRecord, progress=None, model: torch.nn.Module | None = None
                      ) -> ReplayDifference:
    """Max |attnviz's attention output - the model's| over every layer: the weights attnviz shows, times V, are
    what the model's own kernel computed, within what rounding in the model's dtype allows each output
    (:class:`ReplayDifference`: a float, with ``share``, ``allowed`` and ``passed``). ``progress(layer,
    n_layers)`` is called before each layer; ``model`` is the loaded model, should the copy the capture came from
    have been unloaded. NaN when a layer's attention output (attnviz's or the model's) is not finite."""
    record.require_replay("The replay check")
    worst, share, allowed = 0.0, 0.0, 0.0
    for layer in range(record.n_layers):
        if progress:
            progress(layer, record.n_layers)
        difference = layer_output_difference(record, layer, model=model)
        if not math.isfinite(difference):
            return difference  # NaN or infinity in this layer's attention or output: "not finite", never "exactly"
        worst = max(worst, float(difference))
        if difference.share >= share:
            share, allowed = difference.share, difference.allowed
    return ReplayDifference(worst, share, allowed, record.values.dtype)
