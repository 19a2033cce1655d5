"""attnviz.flash: every backend against naive attention in fp64, the tiled trace, and the Triton kernel forward
and backward under TRITON_INTERPRET=1 on CPU tensors (small shapes)."""

import math

import pytest
import torch

from attnviz.core import mask_patterns, masks
from attnviz.core.attention import repeat_kv, scaled_dot_product_attention
from attnviz.core.masks import MaskSpec
from attnviz.flash.dispatch import BackendUnavailable, attention
from attnviz.flash.tiled import COMPUTED, MASKED, SKIPPED, tiled_attention


def inputs(n_q, n_k, d, heads=4, kv_heads=4, batch=1, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n_q, d, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, n_k, d, generator=generator).to(dtype)
    v = torch.randn(batch, kv_heads, n_k, d, generator=generator).to(dtype)
    return q, k, v


def reference(q, k, v, mask, scale=None):
    """Naive attention in fp64 with an explicit dense mask: the yardstick for every backend."""
    group = q.shape[1] // k.shape[1]
    return scaled_dot_product_attention(
        q.double(), repeat_kv(k.double(), group), repeat_kv(v.double(), group), mask, scale=scale
    )[0]


BIGBIRD = masks.bigbird(96, 16, num_global_blocks=1, num_window_blocks=3, num_random_blocks=1, seed=3)
MASK_CASES = {
    "full": ({}, None),
    "causal": ({"causal": True}, None),
    "sliding causal": ({"window": (20, 0)}, None),
    "sliding both ways": ({"window": (7, 9)}, None),
    "bigbird": ({"block_layout": BIGBIRD.layout, "block_size": 16}, BIGBIRD.mask),
}


def mask_spec(case, n_q, n_k):
    return MaskSpec(n_q, n_k, **MASK_CASES[case][0])


def dense_mask(case, n_q, n_k):
    explicit = MASK_CASES[case][1]
    if explicit is not None:
        return explicit
    spec = mask_spec(case, n_q, n_k)
    return None if spec.is_full else spec.dense()


@pytest.mark.parametrize("case", list(MASK_CASES))
@pytest.mark.parametrize("backend,kernel", [("tiled", None), ("sdpa", "flash"), ("sdpa", "math")])
@pytest.mark.parametrize("d", [16, 64, 80])
def test_cpu_backends_match_naive(case, backend, kernel, d):
    n = 96 if case == "bigbird" else 101  # odd N: ragged last tiles
    q, k, v = inputs(n, n, d, heads=4, kv_heads=2)  # GQA: 2 query heads per K/V head
    result = attention(q, k, v, mask_spec(case, n, n), backend=backend, sdpa_kernel=kernel or "flash", block_q=32,
                       block_k=16)
    torch.testing.assert_close(result.output.double(), reference(q, k, v, dense_mask(case, n, n)), atol=2e-5, rtol=0)
    assert result.backend.startswith(backend)


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_flex_attention_matches_naive_with_our_masks(case):
    """Compiled FlexAttention, its BlockMask built from our rule (one compile per mask: a few seconds each)."""
    n = 96 if case == "bigbird" else 101
    q, k, v = inputs(n, n, 32, heads=4, kv_heads=2)
    result = attention(q, k, v, mask_spec(case, n, n), backend="flex")
    torch.testing.assert_close(result.output.double(), reference(q, k, v, dense_mask(case, n, n)), atol=2e-5, rtol=0)
    assert result.backend == "flex"


def test_flex_mask_mod_is_the_dense_mask():
    from attnviz.flash.flex import mask_mod_of

    for case in MASK_CASES:
        spec = mask_spec(case, 96, 96) if case == "bigbird" else MaskSpec(40, 64, **MASK_CASES[case][0])
        rule = mask_mod_of(spec, "cpu")
        query, key = torch.meshgrid(torch.arange(spec.n_q), torch.arange(spec.n_k), indexing="ij")
        assert torch.equal(rule(0, 0, query, key), spec.dense()), case


def test_naive_backend_is_the_reference_in_fp64():
    q, k, v = inputs(33, 57, 32, dtype=torch.float64)
    out = attention(q, k, v, MaskSpec(33, 57, causal=True), backend="naive").output
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(33, 57))
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("block_q,block_k", [(16, 16), (32, 8), (128, 128)])
def test_tiled_log_sum_exp_and_kv_cache_shapes(block_q, block_k):
    q, k, v = inputs(37, 90, 16, dtype=torch.float64)
    out, lse, _ = tiled_attention(q, k, v, MaskSpec(37, 90, causal=True), block_q=block_q, block_k=block_k)
    mask = masks.causal(37, 90)
    torch.testing.assert_close(out, reference(q, k, v, mask), atol=1e-12, rtol=0)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(16)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-12, rtol=0)


def test_tiled_trace_skips_what_the_mask_rules_out():
    q, k, v = inputs(128, 128, 16)
    _, _, trace = tiled_attention(q, k, v, MaskSpec(128, 128, causal=True), block_q=32, block_k=32, trace=True)
    # 4 x 4 tiles: 6 strictly above the diagonal are skipped, 4 diagonal tiles masked, 6 below computed as is.
    assert trace.counts() == {COMPUTED: 6, MASKED: 4, SKIPPED: 6}
    assert trace.status[0] == [MASKED, SKIPPED, SKIPPED, SKIPPED]
    _, _, window_trace = tiled_attention(q, k, v, MaskSpec(128, 128, window=(31, 0)), block_q=32, block_k=32,
                                         trace=True)
    assert window_trace.status[3] == [SKIPPED, SKIPPED, MASKED, MASKED]
    _, _, sparse = tiled_attention(q[..., :96, :], k[..., :96, :], v[..., :96, :],
                                   MaskSpec(96, 96, block_layout=BIGBIRD.layout, block_size=16), trace=True)
    assert sparse.counts()[SKIPPED] == int((~BIGBIRD.layout).sum())


def test_tiled_online_softmax_steps_end_at_the_true_answer():
    q, k, v = inputs(64, 64, 16, heads=1, kv_heads=1, dtype=torch.float64)
    out, _, trace = tiled_attention(q, k, v, block_q=16, block_k=16, trace_query_block=1)
    assert [step.key_block for step in trace.steps] == [0, 1, 2, 3]
    maxima = torch.stack([s.running_max for s in trace.steps])
    assert torch.all(maxima[1:] >= maxima[:-1])  # the running max never decreases
    torch.testing.assert_close(trace.steps[-1].output, out[0, 0, 16:32])
    scores = q[0, 0, 16:32] @ k[0, 0].T / 4
    torch.testing.assert_close(trace.steps[-1].running_sum, torch.exp(scores - maxima[-1].unsqueeze(-1)).sum(-1))


def test_empty_rows_give_zeros_not_nan():
    q, k, v = inputs(8, 8, 16)
    layout = torch.tensor([[True, False], [False, False]])
    out, lse, _ = tiled_attention(q, k, v, MaskSpec(8, 8, block_layout=layout, block_size=4))
    assert torch.all(out[..., 4:, :] == 0) and torch.all(torch.isneginf(lse[..., 4:]))
    assert not torch.isnan(out).any()


def test_mask_spec_validation():
    with pytest.raises(ValueError, match="do not combine"):
        MaskSpec(8, 8, causal=True, block_layout=torch.ones(2, 2, dtype=torch.bool), block_size=4)
    with pytest.raises(ValueError, match="need"):
        MaskSpec(8, 8, block_layout=torch.ones(3, 3, dtype=torch.bool), block_size=4)
    with pytest.raises(ValueError, match=">= 0"):
        MaskSpec(8, 8, window=(-1, 0))
    with pytest.raises(ValueError, match="backend"):
        attention(*inputs(4, 4, 16), backend="magic")
    with pytest.raises(ValueError, match="the mask is for 8 x 8"):
        attention(*inputs(4, 4, 16), MaskSpec(8, 8))


def test_registry_rules_are_the_registry_masks():
    """Every pattern the flash kernels follow by rule is the same mask as the registry builds densely."""
    for key, pattern in mask_patterns.PATTERNS.items():
        if pattern.rule is None:
            continue
        for n in (17, 64):
            params = {"block_size": 4} if key == "bigbird" else {}
            rule = mask_patterns.rule(key, n, **params)
            assert torch.equal(rule.dense(), mask_patterns.build(key, n, **params).mask), (key, n)


def test_sdpa_reports_a_kernel_that_cannot_run():
    with pytest.raises(BackendUnavailable, match="efficient"):
        attention(*inputs(16, 16, 16), backend="sdpa", sdpa_kernel="efficient")  # CPU has no memory-efficient kernel


# --- Triton, in the interpreter ---------------------------------------------------------------------------------

triton_kernel = pytest.importorskip("attnviz.flash.triton_kernel", reason="triton is not installed")


def _grads(function, q, k, v, grad_out):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = function(q, k, v)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    "case,n_q,n_k",
    [("full", 100, 100), ("causal", 100, 100), ("causal", 37, 90), ("sliding causal", 100, 100),
     ("sliding both ways", 37, 90), ("bigbird", 96, 96)],
)
def test_triton_forward_and_backward_fp32(case, n_q, n_k):
    assert triton_kernel.INTERPRETED
    q, k, v = inputs(n_q, n_k, 32, heads=4, kv_heads=2)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))
    spec = mask_spec(case, n_q, n_k)
    mask = dense_mask(case, n_q, n_k)
    ours = _grads(lambda q, k, v: triton_kernel.triton_attention(q, k, v, spec)[0], q, k, v, grad_out)
    expected = _grads(lambda q, k, v: reference(q, k, v, mask), q.double(), k.double(), v.double(), grad_out.double())
    for name, got, want in zip(("output", "dQ", "dK", "dV"), ours, expected, strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float16, 5e-3), (torch.bfloat16, 4e-2)])
def test_triton_half_precision(dtype, tolerance):
    q, k, v = inputs(64, 64, 64, heads=2, kv_heads=2, dtype=dtype)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    causal = MaskSpec(64, 64, causal=True)
    ours = _grads(lambda q, k, v: triton_kernel.triton_attention(q, k, v, causal)[0], q, k, v, grad_out)
    expected = _grads(lambda q, k, v: reference(q, k, v, masks.causal(64)), q.double(), k.double(), v.double(),
                      grad_out.double())
    assert ours[0].dtype == dtype
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got.double(), want, atol=tolerance, rtol=0)


def test_triton_log_sum_exp_head_dims_and_errors():
    q, k, v = inputs(40, 40, 24)  # head dim 24: padded to 32 inside the kernel
    out, lse = triton_kernel.triton_attention(q, k, v)
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(24)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.double(), reference(q, k, v, None), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="between 16 and 256"):
        triton_kernel.triton_attention(*inputs(8, 8, 8))
    with pytest.raises(TypeError):
        triton_kernel.triton_attention(*inputs(8, 8, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="power of two"):
        layout = torch.ones(2, 2, dtype=torch.bool)
        triton_kernel.triton_attention(*inputs(24, 24, 16), MaskSpec(24, 24, block_layout=layout, block_size=12))


def test_dispatch_names_the_interpreter():
    q, k, v = inputs(48, 48, 16)
    result = attention(q, k, v, MaskSpec(48, 48, causal=True), backend="triton")
    assert result.backend == "triton (interpreter)"
    torch.testing.assert_close(result.output.double(), reference(q, k, v, masks.causal(48)), atol=1e-5, rtol=0)


def test_a_backend_is_one_entry_of_the_table(monkeypatch):
    """attention() looks backends up by name in BACKEND_FUNCTIONS: registering one is all it takes."""
    from attnviz.flash import dispatch

    def doubled(q, k, v, spec, scale, **options):
        return dispatch.Result(2 * dispatch._naive(q, k, v, spec, scale).output, "doubled")

    monkeypatch.setitem(dispatch.BACKEND_FUNCTIONS, "doubled", doubled)
    q = k = v = torch.randn(1, 2, 8, 4)
    result = attention(q, k, v, backend="doubled")
    assert result.backend == "doubled"
    torch.testing.assert_close(result.output, 2 * attention(q, k, v, backend="naive").output)
    with pytest.raises(ValueError, match="backend must be one of"):
        attention(q, k, v, backend="nonexistent")
