"""attnviz.core.attention against PyTorch's own attention (F.scaled_dot_product_attention, nn.MultiheadAttention,
nn.TransformerEncoderLayer)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnviz.core import masks
from attnviz.core.attention import (
    CrossAttention,
    DecoderSelfAttention,
    MultiHeadAttention,
    SelfAttentionLayer,
    kv_head_of_query_head,
    masked_softmax,
    scaled_dot_product_attention,
)

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}


def random_qkv(*shape_prefix, n_q=5, n_k=7, d_k=8, d_v=6, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_prefix, n_q, d_k, generator=generator, dtype=dtype)
    k = torch.randn(*shape_prefix, n_k, d_k, generator=generator, dtype=dtype)
    v = torch.randn(*shape_prefix, n_k, d_v, generator=generator, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("prefix", [(), (3,), (2, 4)])
def test_matches_torch_sdpa_without_mask(dtype, prefix):
    q, k, v = random_qkv(*prefix, dtype=dtype)
    output, weights = scaled_dot_product_attention(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(output, expected, atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_torch_sdpa_with_broadcast_boolean_mask(dtype):
    q, k, v = random_qkv(2, 3, dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    mask = torch.rand(1, 3, 5, 7, generator=generator) > 0.4  # broadcasts over batch
    mask[..., 0] = True  # every row keeps a key, so PyTorch's reference has no NaN to compare with
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(output, expected, atol=TOLERANCE[dtype], rtol=0)
    assert torch.all(weights[~mask.expand_as(weights)] == 0), "a masked key received weight"


def test_bias_and_scale_match_torch():
    q, k, v = random_qkv(2, dtype=torch.float64)
    bias = torch.randn(5, 7, dtype=torch.float64)
    output, _ = scaled_dot_product_attention(q, k, v, bias=bias, scale=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)


def test_causal_matches_torch_is_causal():
    q, k, v = random_qkv(2, 2, n_q=6, n_k=6, dtype=torch.float32)
    output, weights = scaled_dot_product_attention(q, k, v, masks.causal(6))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=0)
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_row_with_no_allowed_key_gives_zeros_not_nan():
    q, k, v = random_qkv(n_q=3, n_k=4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(output).any() and not torch.isnan(weights).any()
    assert torch.all(output[1] == 0) and torch.all(weights[1] == 0)
    torch.testing.assert_close(weights[[0, 2]].sum(-1), torch.ones(2, dtype=torch.float64))
    # The other rows are untouched by the empty one.
    expected = F.scaled_dot_product_attention(q[[0, 2]], k, v)
    torch.testing.assert_close(output[[0, 2]], expected, atol=1e-6, rtol=0)


def test_all_minus_inf_scores_give_zeros():
    scores = torch.full((2, 3), float("-inf"))
    scores[0, 1] = 0.5
    weights = masked_softmax(scores)
    assert torch.equal(weights[1], torch.zeros(3))
    assert torch.equal(weights[0], torch.tensor([0.0, 1.0, 0.0]))


def test_dropout_drops_the_weights_it_returns():
    q, k, v = random_qkv(2, dtype=torch.float64)
    torch.manual_seed(5)
    output, weights = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    expected = F.dropout(weights, p=0.5, training=True) @ v
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5, dtype=torch.float64))


def test_clear_errors():
    q, k, v = random_qkv()
    with pytest.raises(ValueError, match="d_k"):
        scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same number of keys"):
        scaled_dot_product_attention(q, k, v[:-1])
    with pytest.raises(TypeError, match="True = may attend"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 7))
    with pytest.raises(ValueError, match="divisible by n_heads"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="divisible by n_kv_heads"):
        MultiHeadAttention(12, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"\[batch, seq, 16\]"):
        MultiHeadAttention(16, 4)(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), torch.zeros(1, 3, 8))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n_k", [4, 9])
def test_multihead_reproduces_torch_multihead_attention(bias, n_k):
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True).double().eval()
    ours = MultiHeadAttention.from_torch(reference).eval()
    q = torch.randn(2, 6, 16, dtype=torch.float64)
    kv = torch.randn(2, n_k, 16, dtype=torch.float64)
    allowed = masks.sliding_window(6, 3, 2, n_k=n_k)  # bottom-right aligned; every row keeps a key
    assert masks.keys_per_query(allowed).min() > 0
    output, weights = ours(q, kv, kv, allowed)
    expected_output, expected_weights = reference(
        q, kv, kv, attn_mask=masks.to_masked_bool(allowed), need_weights=True, average_attn_weights=True
    )
    torch.testing.assert_close(output, expected_output, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights.mean(dim=1), expected_weights, atol=1e-6, rtol=0)
    _, per_head = reference(q, kv, kv, attn_mask=masks.to_masked_bool(allowed), average_attn_weights=False)
    torch.testing.assert_close(weights, per_head, atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_matches_torch_enable_gqa(n_kv_heads):
    torch.manual_seed(1)
    layer = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).double()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    output, weights = layer(x, x, x, masks.causal(5))
    assert weights.shape == (2, 4, 5, 5)
    q = layer.w_q(x).view(2, 5, 4, 8).transpose(1, 2)
    k = layer.w_k(x).view(2, 5, n_kv_heads, 8).transpose(1, 2)
    v = layer.w_v(x).view(2, 5, n_kv_heads, 8).transpose(1, 2)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = layer.w_o(heads.transpose(1, 2).reshape(2, 5, 32))
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)
    assert layer.w_k.weight.shape == (n_kv_heads * 8, 32)


def test_kv_head_mapping():
    assert kv_head_of_query_head(8, 2) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert kv_head_of_query_head(4, 1) == [0, 0, 0, 0]
    assert kv_head_of_query_head(4, 4) == [0, 1, 2, 3]


def _encoder_layer_with_zero_feedforward(d_model, n_heads, norm_first):
    reference = nn.TransformerEncoderLayer(
        d_model, n_heads, dim_feedforward=8, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double().eval()
    with torch.no_grad():
        reference.linear2.weight.zero_()  # the FFN adds exactly 0: only the attention sub-layer is compared
        reference.linear2.bias.zero_()
    return reference


def test_pre_norm_layer_matches_torch_encoder_layer():
    torch.manual_seed(2)
    reference = _encoder_layer_with_zero_feedforward(16, 2, norm_first=True)
    ours = SelfAttentionLayer(16, 2, norm_first=True, bias=True).double().eval()
    ours.attention = MultiHeadAttention.from_torch(reference.self_attn)
    ours.norm.load_state_dict(reference.norm1.state_dict())
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    output, _ = ours(x)
    torch.testing.assert_close(output, reference(x), atol=1e-6, rtol=0)


def test_post_norm_layer_matches_layernorm_of_residual():
    torch.manual_seed(3)
    reference_attention = nn.MultiheadAttention(16, 2, batch_first=True, bias=False).double().eval()
    reference_norm = nn.LayerNorm(16).double()
    ours = SelfAttentionLayer(16, 2, norm_first=False).double().eval()
    ours.attention = MultiHeadAttention.from_torch(reference_attention)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    output, _ = ours(x)
    expected = reference_norm(x + reference_attention(x, x, x, need_weights=False)[0])
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)


def test_rms_norm_layer():
    torch.manual_seed(4)
    layer = SelfAttentionLayer(16, 4, norm="rms").double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    normed = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
    expected = x + layer.attention(normed, normed, normed)[0]
    torch.testing.assert_close(layer(x)[0], expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="norm"):
        SelfAttentionLayer(16, 4, norm="batch")


def test_decoder_self_attention_is_causal():
    torch.manual_seed(5)
    decoder = DecoderSelfAttention(16, 4).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    output, weights = decoder(x)
    assert torch.all(weights.triu(diagonal=1) == 0)
    changed = x.clone()
    changed[:, 4:] += 10.0  # changing the future must not change the past
    output_changed, _ = decoder(changed)
    torch.testing.assert_close(output[:, :4], output_changed[:, :4])
    assert not torch.allclose(output[:, 4:], output_changed[:, 4:])
    reference = nn.MultiheadAttention(16, 4, batch_first=True, bias=False).double()
    decoder.attention = MultiHeadAttention.from_torch(reference)
    normed = decoder.norm(x)
    future = nn.Transformer.generate_square_subsequent_mask(6).double()
    expected = x + reference(normed, normed, normed, attn_mask=future)[0]
    torch.testing.assert_close(decoder(x)[0], expected, atol=1e-6, rtol=0)


def test_cross_attention_with_different_lengths():
    torch.manual_seed(6)
    reference = nn.MultiheadAttention(16, 4, batch_first=True, bias=True).double()
    cross = CrossAttention(16, 4, bias=True).double().eval()
    cross.attention = MultiHeadAttention.from_torch(reference)
    decoder_states = torch.randn(2, 3, 16, dtype=torch.float64)
    memory = torch.randn(2, 9, 16, dtype=torch.float64)
    output, weights = cross(decoder_states, memory)
    assert weights.shape == (2, 4, 3, 9)
    normed = cross.norm(decoder_states)
    expected = decoder_states + reference(normed, memory, memory)[0]
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=0)
