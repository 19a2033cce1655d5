"""attnviz.api.detect: every head scored on a pattern, against independent computations on transformers' own eager
weights: the bundled tiny GPT's induction, previous-token and duplicate-token heads on random tokens repeated twice,
TransformerLens's "mul" score of the same weights, custom patterns, and a result that detects for itself."""

import random

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from attnviz.api.capture import capture
from attnviz.api.detect import detect
from attnviz.models.shipped import BUNDLED_GPT_DIR

PERIOD = 40


@pytest.fixture(scope="module")
def repeated():
    """Random tokens of the tiny GPT's vocabulary, ``PERIOD`` of them, written twice, captured; with their ids and
    transformers' own eager weights ``[layers, heads, n, n]``. The tokens are whole words with their leading space
    (``"Ġ" + letters``, 2,388 of the 4,096), drawn without repeats, so that the text tokenizes back to exactly them and
    each second-copy token has one earlier occurrence; the tokenizer adds no BOS."""
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True)
    vocabulary = tokenizer.get_vocab()
    words = sorted(token for token in vocabulary if token.startswith("Ġ") and token[1:].isalpha() and len(token) > 3)
    drawn = random.Random(0).sample(words, PERIOD)
    half = tokenizer.convert_tokens_to_string(drawn)
    ids = tokenizer(half + half)["input_ids"]
    assert ids == [vocabulary[word] for word in drawn] * 2
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager", local_files_only=True,
                                                 use_safetensors=True)
    with torch.no_grad():
        attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    return capture("tiny GPT", half + half), ids, torch.stack(attentions)[:, 0].double()


def score_of(frame: pd.DataFrame, layer: int, head: int, column: str = "score") -> float:
    return float(frame[(frame["layer"] == layer) & (frame["head"] == head)][column].iloc[0])


def test_induction_heads_of_the_tiny_gpt(repeated):
    captured, ids, weights = repeated
    frame = detect(captured, "induction")
    assert list(frame.columns) == ["layer", "head", "score", "transformerlens_mul"]
    assert len(frame) == 3 * 4 and frame.score.is_monotonic_decreasing
    # the heads its training report names (layer 2, heads 1 and 2) come first, and copy most of the time
    assert set(zip(frame["layer"][:2], frame["head"][:2], strict=True)) == {(2, 1), (2, 2)}  # ("head" is a method)
    assert frame.score.iloc[1] > 0.6
    # independently: the mean weight from each second-copy token to the token after its first occurrence
    queries = torch.arange(PERIOD, 2 * PERIOD)
    expected = weights[:, :, queries, queries - PERIOD + 1].mean(-1)  # [layers, heads]
    for layer in range(3):
        for head in range(4):
            assert score_of(frame, layer, head) == pytest.approx(float(expected[layer, head]), abs=1e-5)
    assert frame.attrs["queries_with_target"] == PERIOD and frame.attrs["queries"] == 2 * PERIOD


def transformerlens_patterns(ids: list[int]) -> dict[str, torch.Tensor]:
    """TransformerLens's detection patterns (transformer_lens/head_detector.py), written again here: the previous
    token's diagonal; earlier equal tokens (its lower triangle, the diagonal zeroed); and that shifted right by one,
    its first column zeroed."""
    tokens = torch.tensor(ids)
    n = len(ids)
    previous = torch.zeros(n, n)
    previous[1:, :-1] = torch.eye(n - 1)
    duplicate = (tokens[None, :] == tokens[:, None]).float()
    duplicate.fill_diagonal_(0)
    duplicate = duplicate.tril()
    induction = torch.roll(duplicate, shifts=1, dims=1)
    induction[:, 0] = 0
    return {"previous_token_head": previous.tril(), "duplicate_token_head": duplicate, "induction_head":
            induction.tril()}


@pytest.mark.parametrize("name", ["induction_head", "previous_token_head", "duplicate_token_head"])
def test_the_transformerlens_column_is_its_mul_score_on_the_same_tokens(repeated, name):
    """TransformerLens's default "mul": sum(pattern * weights) / sum(weights) over every query row."""
    captured, ids, weights = repeated
    frame = detect(captured, name)  # TransformerLens's names are read too
    pattern = transformerlens_patterns(ids)[name].double()
    for layer in range(3):
        for head in range(4):
            head_weights = weights[layer, head]
            mul = float((head_weights * pattern).sum() / head_weights.sum())
            assert score_of(frame, layer, head, "transformerlens_mul") == pytest.approx(mul, abs=1e-5)
    # attnviz's score averages over the queries that have a target: TransformerLens's times that share
    share = frame.attrs["queries_with_target"] / frame.attrs["queries"]
    assert (frame.transformerlens_mul - frame.score * share).abs().max() < 1e-9


def test_previous_and_duplicate_token_heads(repeated):
    captured, ids, weights = repeated
    previous = detect(captured, "previous-token")
    assert (int(previous["layer"][0]), int(previous["head"][0])) == (0, 1) and previous.score.iloc[0] > 0.5
    n = len(ids)
    rows = torch.arange(1, n)
    expected = weights[:, :, rows, rows - 1].mean(-1)  # every query but the first has a previous token
    duplicate = detect(captured, "Duplicate token")
    queries = torch.arange(PERIOD, 2 * PERIOD)
    expected_duplicate = weights[:, :, queries, queries - PERIOD].mean(-1)  # the one earlier copy
    for layer in range(3):
        for head in range(4):
            assert score_of(previous, layer, head) == pytest.approx(float(expected[layer, head]), abs=1e-5)
            assert score_of(duplicate, layer, head) == pytest.approx(float(expected_duplicate[layer, head]),
                                                                     abs=1e-5)
    assert previous.attrs["queries_with_target"] == n - 1
    offsets = detect(captured, "offsets", "-1")  # the page's own pattern kinds, with their spec
    pd.testing.assert_frame_equal(offsets, previous, check_like=False)


def test_custom_patterns(repeated):
    captured, ids, weights = repeated
    n = len(ids)
    previous = torch.zeros(n, n, dtype=torch.bool)
    previous[torch.arange(1, n), torch.arange(n - 1)] = True
    as_tensor = detect(captured, previous)
    named = detect(captured, "previous-token")
    pd.testing.assert_series_equal(as_tensor.score, named.score)
    assert as_tensor.attrs["kind"] == "custom"
    # a callable of the capture; a float pattern weights its cells: half the weight on the previous token
    halved = detect(captured, lambda c: torch.diag(torch.full((c.n_tokens - 1,), 0.5), -1))
    assert (halved.score - named.score / 2).abs().max() < 1e-9
    # the first two tokens: a pattern that gives every query the same two keys
    first_two = detect(captured, lambda c: torch.zeros(c.n_tokens, c.n_tokens).index_fill_(1, torch.arange(2), 1))
    expected = weights[:, :, :, :2].sum(-1).mean(-1)
    for layer in range(3):
        for head in range(4):
            assert score_of(first_two, layer, head) == pytest.approx(float(expected[layer, head]), abs=1e-5)
    with pytest.raises(ValueError, match=rf"must be \[{n}, {n}\]"):
        detect(captured, torch.ones(3, 3))
    with pytest.raises(ValueError, match="finite"):
        detect(captured, torch.full((n, n), float("nan")))
    with pytest.raises(ValueError, match="no detector 'successor'.*'induction'"):
        detect(captured, "successor")


def test_an_encoder_and_a_result_that_detects_for_itself(bert):
    captured = capture(bert, text="The cat sat on the mat. The cat sat on the mat.")
    frame = detect(captured, "previous-token")
    assert len(frame) == 6 * 12 and frame.score.between(0, 1).all()
    weights = captured.weights().double()  # [layers, heads, n, n]
    n = captured.n_tokens
    rows = torch.arange(1, n)
    layer, head, score = frame["layer"][0], frame["head"][0], frame["score"][0]
    assert score == pytest.approx(float(weights[layer, head, rows, rows - 1].mean()), abs=1e-6)
    # repeats skip the special tokens: [CLS] and [SEP] are neither queries nor occurrences
    ids = captured.token_ids
    assert captured.tokens[0] == "[CLS]" and captured.tokens[-1] == "[SEP]"
    repeats = [i for i in range(1, n - 1) if ids[i] in ids[1:i]]  # "the" again in the first half, all the second
    assert len(repeats) == 8
    duplicate = detect(captured, "duplicate-token")
    assert duplicate.attrs["queries_with_target"] == len(repeats)
    layer, head, score = duplicate["layer"][0], duplicate["head"][0], duplicate["score"][0]
    on_copies = [float(weights[layer, head, i, [j for j in range(1, i) if ids[j] == ids[i]]].sum()) for i in repeats]
    assert score == pytest.approx(sum(on_copies) / len(on_copies), abs=1e-6)

    class ScanResult:
        def detect(self, kind):
            return pd.DataFrame({"layer": [0], "head": [0], "score": [1.0], "kind": [kind]})

    assert detect(ScanResult(), "induction").kind.iloc[0] == "induction"
    with pytest.raises(TypeError, match="Captured"):
        detect("not a capture", "induction")
