"""attnviz.core.masks: patterns against brute-force definitions and PyTorch's own causal variants, and the converters
against the attention functions that use each convention."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from attnviz.core import masks


def brute_force_window(n_q, n_k, left, right):
    offset = n_k - n_q
    allowed = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        for j in range(n_k):
            position = i + offset
            allowed[i, j] = (left is None or j >= position - left) and (right is None or j <= position + right)
    return allowed


def test_full():
    assert masks.full(3, 5).all() and masks.full(3, 5).shape == (3, 5)


@pytest.mark.parametrize("n_q,n_k", [(5, 5), (3, 8), (1, 6)])
def test_causal_is_bottom_right_aligned_like_pytorch(n_q, n_k):
    expected = causal_lower_right(n_q, n_k)._materialize()
    assert torch.equal(masks.causal(n_q, n_k), expected)


def test_causal_square_is_lower_triangle_and_density():
    n = 6
    assert torch.equal(masks.causal(n), torch.ones(n, n, dtype=torch.bool).tril())
    assert masks.density(masks.causal(n)) == pytest.approx((n + 1) / (2 * n))


def test_kv_cache_query_sees_everything_before_it():
    mask = masks.causal(2, 5)  # two new tokens after three cached ones
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("left,right", [(2, 0), (0, 0), (1, 2), (None, 0), (3, None), (None, None)])
@pytest.mark.parametrize("n_q,n_k", [(7, 7), (4, 9)])
def test_sliding_window_matches_definition(left, right, n_q, n_k):
    assert torch.equal(masks.sliding_window(n_q, left, right, n_k=n_k), brute_force_window(n_q, n_k, left, right))


def test_sliding_window_special_cases_and_counts():
    assert torch.equal(masks.sliding_window(6, None, 0), masks.causal(6))
    assert masks.sliding_window(6, None, None).all()
    counts = masks.keys_per_query(masks.sliding_window(8, 2, 0))
    assert counts.tolist() == [1, 2, 3, 3, 3, 3, 3, 3]  # W = left + 1 keys once the window is full
    with pytest.raises(ValueError, match="left"):
        masks.sliding_window(4, -1)


def test_bigbird_structure():
    block, n = 4, 32
    result = masks.bigbird(n, block, num_global_blocks=1, num_window_blocks=3, num_random_blocks=2, seed=7)
    n_blocks = n // block
    layout, kind = result.layout, result.kind
    assert layout.shape == (n_blocks, n_blocks) and result.mask.shape == (n, n)
    assert layout[0].all() and layout[:, 0].all(), "global block attends to all and is attended by all"
    for i in range(n_blocks):
        for j in (i - 1, i, i + 1):
            if 0 <= j < n_blocks:
                assert layout[i, j], "window blocks around the diagonal"
    for row in range(1, n_blocks):
        assert (kind[row] == masks.BLOCK_RANDOM).sum() == 2, "r random blocks per non-global row"
    assert torch.equal(result.mask, masks.expand_block_layout(layout, block))


def test_bigbird_is_seeded_and_handles_ragged_lengths():
    a = masks.bigbird(64, 4, 1, 3, 1, seed=1)
    b = masks.bigbird(64, 4, 1, 3, 1, seed=1)
    c = masks.bigbird(64, 4, 1, 3, 1, seed=2)
    assert torch.equal(a.mask, b.mask)
    assert not torch.equal(a.mask, c.mask)
    ragged = masks.bigbird(30, 4, 1, 3, 1, seed=0)
    assert ragged.mask.shape == (30, 30) and ragged.layout.shape == (8, 8)
    with pytest.raises(ValueError, match="global blocks"):
        masks.bigbird(8, 4, num_global_blocks=3)


def test_bigbird_density_without_random_blocks():
    # 1 global block + 3-block window over 8 blocks: count the blocks by hand.
    result = masks.bigbird(32, 4, 1, 3, 0)
    on = 8 + 7  # global row and column
    on += sum(1 for i in range(1, 8) for j in (i - 1, i, i + 1) if 1 <= j < 8)
    assert masks.density(result.mask) == pytest.approx(on / 64)


def test_additive_converter_agrees_with_boolean_in_torch_sdpa():
    q, k, v = (torch.randn(2, 5, 4, dtype=torch.float64) for _ in range(3))
    allowed = masks.sliding_window(5, 1, 1)
    additive = masks.to_additive(allowed, torch.float64)
    assert additive[0, 4] == float("-inf") and additive[0, 0] == 0
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=additive),
        F.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
    )
    assert torch.equal(masks.from_additive(additive), allowed)
    assert torch.equal(masks.from_additive(torch.tensor([0.0, -1e9])), torch.tensor([True, False]))


def test_inverted_and_keep_float_converters():
    allowed = masks.causal(4)
    assert torch.equal(masks.from_masked_bool(masks.to_masked_bool(allowed)), allowed)
    # nn.MultiheadAttention reads True = masked: the converted mask must reproduce the causal result.
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 4, 8)
    _, weights = attention(x, x, x, attn_mask=masks.to_masked_bool(allowed))
    assert torch.all(weights[0].triu(diagonal=1) == 0)
    hf_attention_mask = torch.tensor([[1, 1, 1, 0]])  # HF: 1 = real token, 0 = padding
    assert masks.from_keep_float(hf_attention_mask).tolist() == [[True, True, True, False]]
    with pytest.raises(TypeError):
        masks.to_additive(torch.ones(2, 2))
    with pytest.raises(TypeError):
        masks.from_keep_float(torch.ones(2, 2, dtype=torch.bool))


def test_input_validation():
    with pytest.raises(ValueError):
        masks.causal(0)
    with pytest.raises(ValueError):
        masks.full(3, -1)
    with pytest.raises(ValueError):
        masks.bigbird(16, 0)
