"""The Generation page's inference systems on real generations: PagedAttention's shared blocks of several
sampled continuations, and Ring attention over simulated devices on a recorded layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.core.paged_kv import PagedKVCache
from attnviz.flash.ring import ring_attention
from attnviz.pagelogic.generation.decode import Generation


@dataclass
class PagedDemo:
    cache: PagedKVCache
    names: list[str]
    identical: bool  # attention through the block tables equals attention on contiguous tensors, bit for bit
    max_length: int  # what a contiguous cache reserves per sequence
    prompt_length: int = 0  # the prompt's tokens, shared by every sample


def paged_demo(samples: list[Generation], layer: int, *, block_size: int = 16, max_length: int,
               seed: int = 0) -> PagedDemo:
    """The real K/V of ``samples`` (one prompt sampled several times) at ``layer``, stored in a paged cache: the
    prompt once, forked into each sample, whose own tokens are then appended step by step (copy-on-write where a
    shared block is written: the prompt's last, partly filled block). Checks that attention of a seeded query
    over each sample's K/V gives the same bits through the block table as on the contiguous tensors."""
    from attnviz.core import masks
    from attnviz.core.attention import scaled_dot_product_attention

    prompt_length = len(samples[0].prompt_tokens)
    keys, values = samples[0].kv[layer]
    for sample in samples:
        held, written = sample.kv[layer][0].shape[1], len(sample.tokens) - 1  # every token but the last generated
        if held != written:
            raise ValueError(f"layer {layer}'s cache holds {held} of the {written} tokens written (a sliding "
                             "window drops the older ones): PagedAttention is shown on a layer that keeps every "
                             "token")
    cache = PagedKVCache(kv_heads=keys.shape[0], head_dim=keys.shape[-1], block_size=block_size, dtype=keys.dtype)
    cache.add_sequence("prompt")
    for position in range(prompt_length):
        cache.append("prompt", keys[:, position], values[:, position])
    names = [f"sample {index + 1}" for index in range(len(samples))]
    for name in names:
        cache.fork("prompt", name)
    cache.remove("prompt")  # the samples hold the prompt's blocks now (each block shared by all of them)
    for step in range(max(len(sample.steps) for sample in samples)):  # the samples advance together
        for name, sample in zip(names, samples, strict=True):
            sample_keys, sample_values = sample.kv[layer]
            position = prompt_length + step
            if position < sample_keys.shape[1]:
                cache.append(name, sample_keys[:, position], sample_values[:, position])
    identical = True
    generator = torch.Generator().manual_seed(seed)
    for name, sample in zip(names, samples, strict=True):
        sample_keys, sample_values = sample.kv[layer]
        heads = sample_keys.shape[0]
        query = torch.randn(heads, 1, sample_keys.shape[-1], generator=generator, dtype=sample_keys.dtype)
        contiguous, _ = scaled_dot_product_attention(query[None], sample_keys[None], sample_values[None],
                                                     mask=masks.causal(1, sample_keys.shape[1]))
        identical &= torch.equal(cache.attention(name, query), contiguous[0])
    return PagedDemo(cache, names, identical, max_length, prompt_length)


def paged_statement(demo: PagedDemo, layer: int) -> str:
    """What the paged cache stores, counted from its own blocks: tokens in the tables, distinct tokens, filled
    slots, and the copies copy-on-write made."""
    report = demo.cache.memory(demo.max_length)
    copies = sum(event.kind == "copy-on-write" for event in demo.cache.events)
    distinct, stored = report["distinct_tokens"], report["tokens_stored"]
    text = (f"Layer {layer}: {report['sequences']} sequences, {report['logical_tokens']} tokens in their block "
            f"tables, {distinct} distinct tokens (the prompt's {demo.prompt_length} and each sample's own) in "
            f"{stored} filled slots")
    if stored > distinct:
        partial = demo.prompt_length % demo.cache.block_size
        text += (f": the prompt's last, partly filled block ({partial} of its tokens) is held {report['most_copies']} "
                 f"times ({copies} copy-on-write cop{'y' if copies == 1 else 'ies'} and the original), so "
                 f"{stored - distinct} slots repeat a token.")
    else:
        text += ": each stored once (the prompt fills whole blocks, so no sample writes into a shared one)."
    return text


def ring_demo(record, layer: int, devices: int, *, causal: bool):
    """Ring attention over ``devices`` simulated devices on one captured layer's real Q, K, V (the model's own
    scaling); returns ``(largest difference from full attention, trace)``."""
    import torch.nn.functional as F

    q = record.queries[layer][None].float()  # [1, heads, n, d]
    k, v = record.keys[layer][None].float(), record.values[layer][None].float()
    output, trace = ring_attention(q, k, v, devices, causal=causal, scale=record.scales[layer])
    group = q.shape[1] // k.shape[1]
    full = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                          is_causal=causal, scale=record.scales[layer])
    return float((output - full).abs().max()), trace
