"""Ring attention and PagedAttention, simulated: exact against PyTorch's own attention and a contiguous cache."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnviz.core.paged_kv import PagedKVCache
from attnviz.flash.ring import ring_attention, ring_memory, split_sizes
from attnviz.flash.tiled import COMPUTED, SKIPPED


def reference(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("devices", [2, 3, 5, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_equals_full_attention(devices, causal):
    generator = torch.Generator().manual_seed(devices)
    q = torch.randn(2, 4, 37, 16, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 2, 37, 16, generator=generator, dtype=torch.float64)  # GQA: 4 query heads, 2 K/V heads
    v = torch.randn(2, 2, 37, 16, generator=generator, dtype=torch.float64)
    output, trace = ring_attention(q, k, v, devices, causal=causal)
    assert (output - reference(q, k, v, causal)).abs().max() <= 1e-12
    output32, _ = ring_attention(q.float(), k.float(), v.float(), devices, causal=causal)
    assert (output32.double() - reference(q, k, v, causal)).abs().max() <= 1e-6
    assert len(trace.held) == devices and sorted(trace.held[0]) == list(range(devices))
    for device in range(devices):  # every device sees every block exactly once
        assert sorted(step[device] for step in trace.held) == list(range(devices))


def test_ring_passes_each_block_to_the_next_device_and_skips_masked_blocks():
    q = k = v = torch.randn(1, 1, 16, 8)
    _, trace = ring_attention(q, k, v, 4, causal=True)
    assert trace.held == [[0, 1, 2, 3], [3, 0, 1, 2], [2, 3, 0, 1], [1, 2, 3, 0]]
    # Causal: device p needs blocks 0..p only: 1 + 2 + 3 + 4 = 10 of 16 computed.
    assert sum(row.count(COMPUTED) for row in trace.status) == 10
    assert trace.status[1][0] == SKIPPED  # device 0 holding block 3: all in its future
    one_block = 4 * 2 * 8 * 4  # 4 tokens x (K and V) x d 8 x 4 bytes
    assert trace.bytes_sent == [4 * one_block] * 3 + [0]


def test_ring_memory_per_device_shrinks_with_more_devices():
    one = ring_memory(32_768, 1, heads=32, kv_heads=8, head_dim=128)
    eight = ring_memory(32_768, 8, heads=32, kv_heads=8, head_dim=128)
    assert eight["block_tokens"] == 4096 and eight["per_device"] < one["per_device"] / 7
    assert eight["sent_per_step"] == 2 * 8 * 4096 * 128 * 2
    assert split_sizes(10, 3) == [4, 3, 3]
    with pytest.raises(ValueError, match="cannot split"):
        split_sizes(3, 4)


def filled_cache(block_size=4):
    """A prompt of 10 tokens, sampled three times: the samples share the prompt's blocks, then diverge."""
    generator = torch.Generator().manual_seed(0)
    cache = PagedKVCache(kv_heads=2, head_dim=8, block_size=block_size)
    contiguous = {}
    cache.add_sequence("prompt")
    prompt = [(torch.randn(2, 8, generator=generator), torch.randn(2, 8, generator=generator)) for _ in range(10)]
    for key, value in prompt:
        cache.append("prompt", key, value)
    for sample in ("a", "b", "c"):
        cache.fork("prompt", sample)
        contiguous[sample] = list(prompt)
    for _ in range(5):
        for sample in ("a", "b", "c"):
            key, value = torch.randn(2, 8, generator=generator), torch.randn(2, 8, generator=generator)
            cache.append(sample, key, value)
            contiguous[sample].append((key, value))
    return cache, contiguous


@pytest.mark.parametrize("block_size", [4, 16])  # 16: vLLM's and the page's; the 15 tokens share one block
def test_paged_cache_gathers_exactly_what_a_contiguous_cache_holds_and_attention_is_identical(block_size):
    cache, contiguous = filled_cache(block_size)
    generator = torch.Generator().manual_seed(1)
    for sample, tokens in contiguous.items():
        keys = torch.stack([k for k, _ in tokens], dim=1)  # [kv_heads, 15, d]
        values = torch.stack([v for _, v in tokens], dim=1)
        gathered_keys, gathered_values = cache.gather(sample)
        assert torch.equal(gathered_keys, keys) and torch.equal(gathered_values, values)
        queries = torch.randn(2, 3, 8, generator=generator)
        from attnviz.core import masks
        from attnviz.core.attention import scaled_dot_product_attention

        expected, _ = scaled_dot_product_attention(queries[None], keys[None], values[None],
                                                   mask=masks.causal(3, keys.shape[1]))
        assert torch.equal(cache.attention(sample, queries), expected[0])  # identical arithmetic: bit for bit
        causal = F.scaled_dot_product_attention(queries[None], keys[None], values[None],
                                                attn_mask=masks.causal(3, keys.shape[1]))
        assert (cache.attention(sample, queries) - causal[0]).abs().max() < 1e-6


def test_shared_prefix_blocks_are_copied_on_write_only():
    cache, _ = filled_cache(block_size=4)
    # The prompt's 10 tokens fill blocks 0, 1 and half of 2; three samples share them. Each sample's first write
    # lands in the half-full block 2, still held by the prompt: 3 copies; the full blocks 0 and 1 stay shared.
    kinds = [event.kind for event in cache.events if event.sequence != "prompt"]
    assert kinds.count("copy-on-write") == 3 and kinds[:3] == ["copy-on-write"] * 3
    assert cache.tables["a"][:2] == cache.tables["b"][:2] == cache.tables["c"][:2] == cache.tables["prompt"][:2]
    assert len({cache.tables[s][2] for s in ("prompt", "a", "b", "c")}) == 4
    assert [cache.references[b] for b in cache.tables["prompt"]] == [4, 4, 1]
    report = cache.memory(max_length=64)
    token_bytes = 2 * 2 * 8 * 4
    assert report["paged_bytes"] == report["blocks_in_use"] * 4 * token_bytes
    assert report["contiguous_bytes"] == 4 * 64 * token_bytes
    # Stored once each: the prompt, and per sample its copied block (prompt tokens 8 and 9) and its 5 new tokens.
    assert report["tokens_stored"] == 10 + 3 * (2 + 5) and report["paged_bytes"] < report["contiguous_bytes"] / 4
    assert 0 <= report["fragmentation"] < 1
    assert report["wasted_slots"] == report["blocks_in_use"] * 4 - report["tokens_stored"]


def test_a_finished_sequence_frees_its_own_blocks_and_they_are_reused():
    cache, _ = filled_cache()
    before = len(cache.key_blocks)
    own = [b for b in cache.tables["a"] if cache.references[b] == 1]
    cache.remove("a")
    assert sorted(cache.free) == sorted(own)
    cache.add_sequence("d")
    event = cache.append("d", torch.zeros(2, 8), torch.zeros(2, 8))
    assert event.kind == "allocate" and event.block in own and len(cache.key_blocks) == before
    assert math.isclose(cache.memory(16)["sequences"], 4)


def test_the_cache_counts_distinct_tokens_apart_from_the_slots_that_hold_them():
    """The prompt's 10 tokens and 5 new ones per sample are 25 different tokens; its half-full third block (tokens
    8 and 9) is held by the prompt and copied once per sample, so those two tokens fill 4 slots each."""
    cache, contiguous = filled_cache(block_size=4)
    distinct = {id(key) for sample in contiguous.values() for key, _ in sample}  # each appended token once
    report = cache.memory(max_length=64)
    assert report["distinct_tokens"] == len(distinct) == 10 + 3 * 5
    assert report["tokens_stored"] == 10 + 3 * (2 + 5)
    assert report["most_copies"] == 1 + 3  # the prompt's block and the three copies
