"""Head statistics, labels and rollout on hand-made attention matrices with known answers."""

import math

import pytest
import torch

from attnviz.core import analysis

TOKENS = ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
SPECIAL = [True, False, False, False, False, True]
N = len(TOKENS)


def one_head(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.reshape(1, 1, N, N)


def previous_token_matrix():
    m = torch.zeros(N, N)
    m[0, 0] = 1
    for i in range(1, N):
        m[i, i - 1] = 1
    return m


def test_previous_token_head():
    (stats,) = analysis.head_statistics(one_head(previous_token_matrix()), TOKENS, SPECIAL)
    assert stats.previous == pytest.approx(1.0)
    assert stats.self == pytest.approx(1 / N)  # only row 0 looks at itself
    assert stats.entropy == pytest.approx(0.0)
    assert stats.mean_distance == pytest.approx((N - 1) / N)
    assert stats.label == "previous-token head"


def test_uniform_head_is_broad_with_known_entropy_and_distance():
    uniform = torch.full((N, N), 1 / N)
    (stats,) = analysis.head_statistics(one_head(uniform), TOKENS, SPECIAL)
    assert stats.entropy == pytest.approx(math.log(N))
    assert stats.normalised_entropy == pytest.approx(1.0)
    expected_distance = sum(abs(i - j) for i in range(N) for j in range(N)) / N / N
    assert stats.mean_distance == pytest.approx(expected_distance)
    assert stats.first == pytest.approx(1 / N)
    assert stats.separator == pytest.approx(1 / N)  # [SEP] only: [CLS] counts as first token
    assert stats.punctuation == pytest.approx(1 / N)
    assert stats.label == "broad head"


def test_delimiter_first_and_punctuation_heads():
    to_sep = torch.zeros(N, N)
    to_sep[:, 5] = 1
    to_first = torch.zeros(N, N)
    to_first[:, 0] = 1
    to_dot = torch.zeros(N, N)
    to_dot[:, 4] = 1
    weights = torch.stack([to_sep, to_first, to_dot]).unsqueeze(0)  # [1 layer, 3 heads, N, N]
    labels = [s.label for s in analysis.head_statistics(weights, TOKENS, SPECIAL)]
    assert labels == ["delimiter head", "first-token head", "punctuation head"]


def test_self_and_next_heads_and_layer_head_indices():
    next_token = torch.diag(torch.ones(N - 1), 1) + torch.diag(torch.tensor([0.0] * (N - 1) + [1.0]))
    weights = torch.stack([torch.eye(N), next_token])
    stats = analysis.head_statistics(weights.reshape(2, 1, N, N), TOKENS, SPECIAL)
    assert [(s.layer, s.head, s.label) for s in stats] == [(0, 0, "self head"), (1, 0, "next-token head")]


def test_statistics_reject_non_square():
    with pytest.raises(ValueError, match="square"):
        analysis.head_statistics(torch.ones(1, 1, 2, 3) / 3, ["a", "b", "c"], [False] * 3)


def test_rollout_identity_and_closed_form():
    identity = torch.eye(N).expand(3, 2, N, N)
    torch.testing.assert_close(analysis.attention_rollout(identity), torch.eye(N).expand(3, N, N))
    uniform = torch.full((1, 1, N, N), 1 / N)
    expected = 0.5 * torch.eye(N) + 0.5 / N  # one layer: half residual, half uniform
    torch.testing.assert_close(analysis.attention_rollout(uniform)[0], expected)
    two = torch.full((2, 1, N, N), 1 / N)
    torch.testing.assert_close(analysis.attention_rollout(two)[1], expected @ expected)
    torch.testing.assert_close(analysis.attention_rollout(two).sum(-1), torch.ones(2, N))


def test_keep_tokens_with_and_without_renormalising():
    uniform = torch.full((N, N), 1 / N)
    kept = analysis.keep_tokens(uniform, [1, 2], [1, 2, 3], renormalise=False)
    torch.testing.assert_close(kept, torch.full((2, 3), 1 / N))
    renormalised = analysis.keep_tokens(uniform, [1, 2], [1, 2, 3], renormalise=True)
    torch.testing.assert_close(renormalised.sum(-1), torch.ones(2))


def test_punctuation_detection():
    assert analysis.is_punctuation(".") and analysis.is_punctuation("Ġ,") and analysis.is_punctuation("...")
    assert not any(analysis.is_punctuation(token) for token in ("cat", "[SEP]", ""))
