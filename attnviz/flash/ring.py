"""Ring attention (Liu et al., 2023), simulated exactly on one machine.

The sequence is split into P blocks, one per device. Device p keeps its query block Q_p for the whole run and
starts with its own key/value block (K_p, V_p). At each of P steps every device attends Q_p to the K/V block it
holds, folds the result into its running state with the online-softmax rule (the same update as FlashAttention's,
:func:`attnviz.flash.tiled.online_softmax_update`), then passes that K/V block to its neighbour p + 1 and
receives one from p - 1. After P steps every device has seen every block, and its state normalises to exactly
its rows of full attention; no device ever holds more than two K/V blocks (the one it works on and the one
arriving). With a causal mask, a block from later in the sequence is skipped (every score in it is masked) and
the block on the diagonal is masked within.

Shapes: ``q [batch, heads, n, d]``, ``k, v [batch, kv_heads, n, d]`` (GQA: heads a multiple of kv_heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnviz.flash.tiled import COMPUTED, SKIPPED, RowState, online_softmax_update


@dataclass
class RingTrace:
    """Who held which K/V block at each step, and what it did with it."""

    n_devices: int
    block_sizes: list[int]  # tokens of each device's block
    held: list[list[int]] = field(default_factory=list)  # [step][device] -> the K/V block it holds
    status: list[list[str]] = field(default_factory=list)  # [step][device] -> computed or skipped
    bytes_sent: list[int] = field(default_factory=list)  # [step] over all links (0 after the last step)

    def computed_share(self) -> float:
        flat = [s for row in self.status for s in row]
        return flat.count(COMPUTED) / len(flat)


def split_sizes(n: int, parts: int) -> list[int]:
    """``n`` tokens over ``parts`` devices as evenly as possible (the first ones get one more)."""
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} tokens over {parts} devices")
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_devices: int, *, causal: bool = False,
                   scale: float | None = None) -> tuple[torch.Tensor, RingTrace]:
    """Attention of ``q`` over ``k, v`` computed as P = ``n_devices`` devices in a ring would; returns
    ``(output [b, h, n, d], trace)``. Equals full (or causal) attention up to rounding."""
    batch, heads, n, d = q.shape
    kv_heads = k.shape[1]
    if k.shape[2] != n or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"ring attention is self-attention: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} K/V heads evenly")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    sizes = split_sizes(n, n_devices)
    starts = [sum(sizes[:i]) for i in range(n_devices)]
    compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = heads // kv_heads

    def block(tensor: torch.Tensor, index: int) -> torch.Tensor:
        return tensor[:, :, starts[index] : starts[index] + sizes[index]].to(compute_dtype)

    # What each device holds: its query block for good, and the K/V block currently passing through it.
    queries = [block(q, p) for p in range(n_devices)]  # [b, h, n_p, d] each
    held = list(range(n_devices))  # device p starts with its own K/V block
    states = [RowState(running_max=torch.full((batch, heads, sizes[p]), -math.inf, dtype=compute_dtype),
                       running_sum=torch.zeros(batch, heads, sizes[p], dtype=compute_dtype),
                       accumulator=torch.zeros(batch, heads, sizes[p], d, dtype=compute_dtype))
              for p in range(n_devices)]
    trace = RingTrace(n_devices, sizes)
    bytes_per_token = 2 * kv_heads * d * k.element_size()  # one token's K and V
    for step in range(n_devices):
        trace.held.append(list(held))
        trace.status.append([])
        for device in range(n_devices):
            kv_block = held[device]
            if causal and kv_block > device:  # every key comes after every query of this device: all masked
                trace.status[-1].append(SKIPPED)
                continue
            keys, values = block(k, kv_block), block(v, kv_block)  # [b, kv_heads, n_kv, d]
            if group > 1:
                keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
            scores = torch.matmul(queries[device], keys.transpose(-2, -1)) * scale  # [b, h, n_p, n_kv]
            if causal and kv_block == device:  # the diagonal block: the causal triangle within it
                scores.masked_fill_(torch.ones(sizes[device], sizes[device], dtype=torch.bool).triu(1), -math.inf)
            online_softmax_update(states[device], scores, values)
            trace.status[-1].append(COMPUTED)
        # Every device passes the block it holds to the next one (none after the last step).
        last = step == n_devices - 1
        trace.bytes_sent.append(0 if last else sum(sizes[b] for b in held) * bytes_per_token * batch)
        held = [held[(device - 1) % n_devices] for device in range(n_devices)]
    outputs = [state.accumulator / state.running_sum.clamp_min(1e-300).unsqueeze(-1) for state in states]
    return torch.cat(outputs, dim=2).to(q.dtype), trace


def ring_memory(n: int, n_devices: int, *, heads: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2,
                batch: int = 1) -> dict[str, int]:
    """Bytes per device for N tokens over P devices: its Q block, the K/V block it works on and the one arriving,
    and its running state (output accumulator, max and sum in fp32); and bytes each device sends per step."""
    block = math.ceil(n / n_devices)
    query = batch * heads * block * head_dim * bytes_per_value
    kv_block = 2 * batch * kv_heads * block * head_dim * bytes_per_value
    state = batch * heads * block * (head_dim + 2) * 4
    return {"block_tokens": block, "query": query, "kv_blocks": 2 * kv_block, "state": state,
            "per_device": query + 2 * kv_block + state, "sent_per_step": kv_block,
            "one_device_kv": 2 * batch * kv_heads * n * head_dim * bytes_per_value}
