"""The step-by-step computation against PyTorch's attention and closed forms; input parsing."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from attnviz.core import masks, stepwise
from attnviz.core.attention import scaled_dot_product_attention


@pytest.fixture
def qkv():
    tokens, _ = stepwise.tokens_of("the quick brown fox jumps over the dog")
    m = stepwise.prefill_qkv(tokens, 4, seed=3)
    return m["Q"], m["K"], m["V"]


def test_scaled_dot_steps_match_torch_sdpa(qkv):
    q, k, v = qkv
    mask = masks.sliding_window(8, 2, 1)
    steps = stepwise.attention_steps(q, k, v, score_function="scaled_dot", mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(steps.output, expected, atol=1e-12, rtol=0)
    assert steps.scale == pytest.approx(0.5)
    torch.testing.assert_close(steps.scaled_scores, q @ k.T / 2)
    assert torch.all(torch.isneginf(steps.masked_scores[~mask]))
    assert torch.all(steps.weights[~mask] == 0)
    torch.testing.assert_close(steps.weights.sum(-1), torch.ones(8, dtype=torch.float64))


def test_dot_and_general_scores_are_unscaled(qkv):
    q, k, v = qkv
    dot = stepwise.attention_steps(q, k, v, score_function="dot")
    torch.testing.assert_close(dot.output, F.scaled_dot_product_attention(q, k, v, scale=1.0))
    general = stepwise.attention_steps(q, k, v, score_function="general", seed=9)
    w = stepwise.score_parameters(4, 9).w_general
    torch.testing.assert_close(general.output, F.scaled_dot_product_attention(q @ w, k, v, scale=1.0))
    assert general.scale == 1.0


def test_additive_score_matches_its_formula_entry_by_entry(qkv):
    q, k, v = qkv
    steps = stepwise.attention_steps(q, k, v, score_function="additive", seed=2)
    p = stepwise.score_parameters(4, 2)
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            expected = float(p.v_additive @ torch.tanh(p.w_query @ q[i] + p.w_key @ k[j]))
            assert steps.scores[i, j].item() == pytest.approx(expected, abs=1e-12)
    _, expected_weights = scaled_dot_product_attention(
        torch.zeros(8, 1, dtype=torch.float64), torch.zeros(8, 1, dtype=torch.float64), v, bias=steps.scores
    )
    torch.testing.assert_close(steps.weights, expected_weights)


def test_additive_score_spread_follows_its_hidden_size_not_d_k():
    """Vaswani et al.: additive attention needs no 1/sqrt(d_k). With unit-variance q and k and the usual
    1/sqrt(d_k) initialisation of W, the score's spread is set by the hidden size d_a, not by d_k."""
    generator = torch.Generator().manual_seed(0)

    def score_std(d_k: int, d_a: int) -> float:
        q = torch.randn(64, d_k, generator=generator, dtype=torch.float64)
        k = torch.randn(64, d_k, generator=generator, dtype=torch.float64)
        params = stepwise.score_parameters(d_k, seed=1, d_a=d_a)
        scores = stepwise.raw_scores(q, k, "additive", params)
        assert float(scores.abs().max()) <= float(params.v_additive.abs().sum())  # tanh bounds every term
        return float(scores.std())

    fixed = [score_std(d_k, 8) for d_k in (1, 8, 64, 512)]
    assert max(fixed) / min(fixed) < 1.6  # about 2 whatever d_k (a dot product's grows 22x from 1 to 512)
    tied = [score_std(d_k, d_k) for d_k in (8, 512)]
    assert tied[1] / tied[0] > 4  # tying d_a to d_k is what grows it (sqrt(64) = 8 in expectation)


def test_causal_with_more_keys_than_queries():
    q = torch.randn(2, 3, dtype=torch.float64)
    k = torch.randn(4, 3, dtype=torch.float64)
    v = torch.randn(4, 2, dtype=torch.float64)
    steps = stepwise.attention_steps(q, k, v, mask=masks.causal(2, 4))
    assert steps.weights[0, 3] == 0 and steps.weights[1].gt(0).all()


def test_prefill_is_seeded_and_repeated_words_share_rows():
    tokens = ["the", "cat", "the"]
    a = stepwise.prefill_qkv(tokens, 3, seed=1)
    b = stepwise.prefill_qkv(tokens, 3, seed=1)
    c = stepwise.prefill_qkv(tokens, 3, seed=2)
    assert torch.equal(a["Q"], b["Q"]) and not torch.equal(a["Q"], c["Q"])
    assert torch.equal(a["Q"][0], a["Q"][2])
    assert a["Q"].shape == (3, 3)
    with pytest.raises(stepwise.InputError):
        stepwise.prefill_qkv([], 3, 0)


def test_tokens_are_capped():
    tokens, cut = stepwise.tokens_of(" ".join(str(i) for i in range(12)))
    assert len(tokens) == 8 and cut
    assert stepwise.tokens_of("  \n\t ") == ([], False)
    assert stepwise.tokens_of("naïve 🤖 日本語") == (["naïve", "🤖", "日本語"], False)


def test_parse_matrix_accepts_tables_and_text():
    frame = pd.DataFrame([[1.0, 2.0], [3.0, 4.5]])
    assert stepwise.parse_matrix(frame, "Q").tolist() == [[1.0, 2.0], [3.0, 4.5]]
    assert stepwise.parse_matrix_text("1, 2\n 3 4.5 \n\n", "Q").tolist() == [[1.0, 2.0], [3.0, 4.5]]


@pytest.mark.parametrize(
    "rows,message",
    [
        ([[1.0, None]], "row 1, column 2 is empty"),
        ([[1.0, np.nan]], "row 1, column 2 is empty"),
        ([["1", "abc"]], "'abc' is not a number"),
        ([["1", "inf"]], "not a finite number"),
        ([[1, 2], [3]], "same number of values"),
        ([], "is empty"),
        ([[0.0] * 9], "at most 8"),
        ([[0.0]] * 9, "at most 8"),
    ],
)
def test_parse_matrix_rejects_bad_input_with_a_message(rows, message):
    with pytest.raises(stepwise.InputError, match=message):
        stepwise.parse_matrix(rows, "Q")


def test_size_mismatches_are_explained():
    with pytest.raises(stepwise.InputError, match="same d_k"):
        stepwise.check_qkv(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(stepwise.InputError, match="every key needs exactly one value"):
        stepwise.check_qkv(torch.zeros(2, 3), torch.zeros(3, 3), torch.zeros(2, 3))


def test_scaling_keeps_score_spread_near_one():
    # Closed form: for q, k with unit-variance entries, Var(q.k) = d_k and Var(q.k / sqrt(d_k)) = 1.
    generator = torch.Generator().manual_seed(0)
    d_k = 64
    q = torch.randn(4000, d_k, generator=generator, dtype=torch.float64)
    k = torch.randn(4000, d_k, generator=generator, dtype=torch.float64)
    dots = (q * k).sum(-1)
    assert dots.var().item() == pytest.approx(d_k, rel=0.1)
    assert (dots / math.sqrt(d_k)).var().item() == pytest.approx(1.0, rel=0.1)
