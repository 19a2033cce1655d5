"""Where a model that computes attention in its own code keeps what replay needs: one adapter per such model.

The hooks path (:mod:`attnviz.models.eager`) reads the outputs of an attention module's projections (Q, K, V) and
the arguments it was called with. How to turn those into the replay's terms differs by model: whether Q, K and V
come from one fused projection, how the scores are scaled, and which mask and position bias apply. Each adapter
answers those three questions for one attention class; :mod:`attnviz.models.architectures` names the adapter of each
model type that takes this path.
"""

from __future__ import annotations

import math

import torch

from attnviz.models.attention_hook import batch_zero_mask


def split_heads(tensor: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``[1, n, heads * d]`` -> ``[heads, n, d]`` (batch item 0)."""
    n = tensor.shape[1]
    return tensor[0].view(n, n_heads, -1).transpose(0, 1)


class Adapter:
    """One attention class's layout. Subclasses set the three names and say how the scores are formed."""

    attention_class: str  # the module that takes hidden states and returns the attention output
    projections: tuple[str, ...]  # its child Linear(s) whose outputs hold Q, K, V
    note: str  # how the model forms its scores, for the page

    def split(self, module: torch.nn.Module, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """(query, key, value), each ``[heads, n, d]``, from three projections' ``[1, n, heads * d]`` outputs."""
        n_heads = getattr(module, "num_heads", None) or module.num_attention_heads
        return tuple(split_heads(t, n_heads) for t in outputs)

    def scaling(self, module: torch.nn.Module) -> float:
        """What q.k is multiplied by."""
        return 1.0 / math.sqrt(module.attention_head_size)

    def score_terms(self, module: torch.nn.Module, arguments: dict, n_q: int, n_k: int):
        """(mask bool ``[n_q, n_k]`` or None, causal, position bias ``[heads, n_q or 1, n_k]`` or None) of one call."""
        raise NotImplementedError


class GPTNeoAdapter(Adapter):
    attention_class = "GPTNeoSelfAttention"
    projections = ("q_proj", "k_proj", "v_proj")
    note = "GPT-Neo's scores are q.k unscaled; its local layers see a sliding window"

    def scaling(self, module: torch.nn.Module) -> float:
        return 1.0  # GPT-Neo does not scale its scores

    def score_terms(self, module: torch.nn.Module, arguments: dict, n_q: int, n_k: int):
        # The module's own causal buffer (a sliding window in its local layers), as its _attn slices it
        return module.bias[0, 0, n_k - n_q : n_k, :n_k].clone(), True, None


class MPNetAdapter(Adapter):
    attention_class = "MPNetSelfAttention"
    projections = ("q", "k", "v")
    note = "MPNet adds a relative position bias (T5's buckets) to q.k / sqrt(d)"

    def score_terms(self, module: torch.nn.Module, arguments: dict, n_q: int, n_k: int):
        bias = arguments.get("position_bias")  # [batch, heads, n_q, n_k]
        return batch_zero_mask(arguments.get("attention_mask")), False, None if bias is None else bias[0].detach()


class BloomAdapter(Adapter):
    attention_class = "BloomAttention"
    projections = ("query_key_value",)
    note = "BLOOM adds ALiBi (a per-head slope times the key position) to q.k / sqrt(d)"

    def split(self, module: torch.nn.Module, outputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        fused = outputs[0]  # [1, n, heads * 3 * d], interleaved per head as (q, k, v)
        n = fused.shape[1]
        fused = fused[0].view(n, module.num_heads, 3, module.head_dim)  # [n, heads, 3, d]
        return tuple(fused[:, :, i].transpose(0, 1) for i in range(3))

    def scaling(self, module: torch.nn.Module) -> float:
        return float(module.inv_norm_factor)

    def score_terms(self, module: torch.nn.Module, arguments: dict, n_q: int, n_k: int):
        alibi = arguments["alibi"]  # [batch * heads, 1, n_k]: slope x key position (softmax drops the offset)
        bias = alibi.view(-1, module.num_heads, *alibi.shape[-2:])[0] * module.beta  # [heads, 1, n_k]
        return batch_zero_mask(arguments.get("attention_mask")), True, bias.detach()
