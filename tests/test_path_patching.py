"""Path patching (attnviz.interventions.path_patching) against the two-step algorithm of its module docstring,
written here with hand-written hooks on transformers' EAGER models (the float64 GPT-2, GQA Llama and BERT masked LM
of tests/test_activation_patching.py, a separate copy with the same weights), one sender per forward:

1. the target run with the sender's head output (its columns of the output projection's input) from the source
   run, every other head before the receiver's layer held at the target run's (the whole input of those output
   projections replaced), each held MLP's output replaced by the target run's; the receiver's query, key or value
   columns read off the projection's output (Llama: before RoPE, put back before RoPE at the same positions, which
   is the same as after it);
2. the target run again with only those columns replaced; the metric at the last position.

Then the GQA case (a key path reaches the K/V head the receiver shares), ``mlps`` as a tuple, and the bundled tiny
GPT's induction circuit as numbers: the previous-token head reaches the strongest induction head's keys through an
MLP (the path is there with the MLPs free and gone with them frozen), and its values, not its keys, carry the token
to copy."""

import contextlib
import functools

import pytest
import torch

from attnviz.interventions import activation_patching as ap
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import path_patching as pp
from attnviz.interventions.patching import induction_prompts
from tests.test_activation_patching import (
    SHIPPED,
    Expected,
    Ref,
    against_eager,
    assert_matches,
    capture,
    family,
    forward,
    metric,
    reference_ends,
    share,
)
from tests.test_activation_patching import hooked as hooked_at


def reference_paths(ref: Ref, example: ap.Example, receiver: tuple[int, int], via: str, mlps, direction: str,
                    name: str) -> Expected:
    """Every sender before the receiver's layer, by the two steps, one sender at a time."""
    clean, corrupted, foil = reference_ends(ref, example, name)
    source_ids, target_ids = ((example.clean, example.corrupted) if direction == "denoising"
                              else (example.corrupted, example.clean))
    sent = capture(ref, "head", source_ids)[0]  # layer -> the output projection's input [1, n, heads * d_head]
    held = capture(ref, "head", target_ids)[0]
    held_mlps = capture(ref, "mlp", target_ids)[0]  # layer -> [1, n, d_model]
    layer, head = receiver
    free = range(layer) if mlps == "free" else () if mlps == "frozen" else tuple(mlps)
    read_columns = ref.columns(via, layer, head if via == "q" else head // (ref.heads // ref.kv_heads))
    values, shares = {}, {}
    for sender in range(layer):
        for sender_head in range(ref.heads):
            recorded = {}

            def hold(_, at, sender=sender, sender_head=sender_head):
                merged = held[at].clone()
                if at == sender:
                    columns = ref.columns("head", at, sender_head)
                    merged[..., columns] = sent[at][..., columns]
                return merged

            def read(tensor, recorded=recorded):
                recorded["input"] = tensor[..., read_columns].clone()
                return tensor

            with contextlib.ExitStack() as stack:  # step 1
                for at in range(layer):
                    stack.enter_context(hooked_at(ref, "head", at, functools.partial(hold, at=at)))
                    if at not in free:
                        stack.enter_context(hooked_at(ref, "mlp", at, lambda _, at=at: held_mlps[at].clone()))
                stack.enter_context(hooked_at(ref, via, layer, read))
                forward(ref, target_ids, example.position)

            def put(tensor, recorded=recorded):
                tensor = tensor.clone()
                tensor[..., read_columns] = recorded["input"]
                return tensor

            with hooked_at(ref, via, layer, put):  # step 2
                logits = forward(ref, target_ids, example.position)[0]
            values[(sender, sender_head)] = metric(name, logits, example.answer, foil)
            shares[(sender, sender_head)] = share(values[(sender, sender_head)], clean, corrupted, direction)
    return Expected(clean, corrupted, foil, values, shares)


@functools.cache
def key_example() -> ap.Example:
    """The float64 GPT's example with the token before the one to copy changed (a corruption that reaches the
    induction heads through their keys, so that key paths are not all zero)."""
    prompts = induction_prompts(family("gpt2").pool, 12, seed=1, bos=0, change="previous")
    return ap.Example(list(prompts.clean), list(prompts.corrupted), prompts.answer, prompts.foil)


CASES = [
    ("gpt2", (2, 1), "k", "frozen", "denoising", "logit difference"),
    ("gpt2", (2, 1), "k", "free", "denoising", "logit difference"),
    ("gpt2", (2, 1), "k", (1,), "noising", "probability"),
    ("gpt2", (2, 2), "v", "free", "noising", "loss"),
    ("gpt2", (1, 3), "q", "frozen", "denoising", "loss"),
    ("llama", (2, 1), "k", "free", "denoising", "logit difference"),  # K/V head 0, shared with query head 0
    ("llama", (2, 3), "v", "frozen", "noising", "probability"),
    ("llama", (2, 2), "q", (0,), "denoising", "loss"),
    ("llama", (1, 0), "k", "frozen", "noising", "logit difference"),
    ("bert", (2, 1), "k", "free", "denoising", "logit difference"),  # read at the mask: a BERT-shaped model too
    ("bert", (1, 3), "v", "frozen", "noising", "probability"),
    ("bert", (2, 0), "q", (0,), "denoising", "loss"),
]


@pytest.mark.parametrize(("name", "receiver", "via", "mlps", "direction", "chosen"), CASES)
def test_path_patching_matches_the_two_steps_by_hand(name, receiver, via, mlps, direction, chosen):
    built = family(name)
    example = key_example() if name == "gpt2" else built.example
    result = pp.path_patching(built.model, [example], receiver, via, mlps=mlps, direction=direction, metric=chosen)
    layer = receiver[0]
    assert result.values.shape == result.shares.shape == (1, layer, built.ref.heads)
    assert result.receiver == receiver and result.via == via and result.direction == direction
    assert len(result.rows) == layer
    expected = reference_paths(built.ref, example, receiver, via, mlps, direction, chosen)
    assert_matches(result, expected, against_eager(name, via))
    assert max(abs(value) for value in expected.shares.values()) > 1e-4  # some path moves the metric


def test_a_key_path_under_gqa_reaches_the_shared_kv_head():
    """Llama, 4 query heads on 2 K/V heads: query heads 0 and 1 read K/V head 0, so a key or value path into either
    is the same patch (the same numbers), said in the note; a query path is each query head's own."""
    built = family("llama")
    example = built.example
    paths = {(head, via): pp.path_patching(built.model, [example], (2, head), via, mlps="free")
             for head in (0, 1, 2) for via in ("q", "k", "v")}
    for via in ("k", "v"):
        torch.testing.assert_close(paths[(0, via)].values, paths[(1, via)].values, atol=1e-12, rtol=0)
        assert "K/V head 0" in paths[(1, via)].note and "0-1" in paths[(1, via)].note
        assert "K/V head 1" in paths[(2, via)].note
        assert float((paths[(2, via)].values - paths[(0, via)].values).abs().max()) > 1e-6
    assert paths[(1, "q")].note == ""
    assert float((paths[(0, "q")].values - paths[(1, "q")].values).abs().max()) > 1e-6


def test_mlps_free_as_a_tuple():
    """Every MLP before the receiver named free is the same as "free"; the label says which are free."""
    built = family("gpt2")
    example = key_example()
    free = pp.path_patching(built.model, [example], (2, 1), "k", mlps="free")
    both = pp.path_patching(built.model, [example], (2, 1), "k", mlps=(0, 1))
    torch.testing.assert_close(both.values, free.values, atol=1e-12, rtol=0)
    assert both.mlps == "only L0 MLP, L1 MLP free" and free.mlps == "free"
    none_free = pp.path_patching(built.model, [example], (2, 1), "k", mlps="frozen")
    assert float((none_free.values - free.values).abs().max()) > 1e-3  # the MLPs matter on this path


@pytest.mark.parametrize("name", [SHIPPED, "llama"])
def test_a_path_with_nothing_to_carry(name):
    """corrupted == clean: every share NaN, every value the clean metric (the float64 GPT-2 is left out: its two
    ends round apart, which tests/test_activation_patching.py reports)."""
    built = family(name)
    example = built.example
    same = ap.Example(example.clean, list(example.clean), example.answer, example.foil, example.position)
    result = pp.path_patching(built.model, [same], (2, 1), "k", mlps="free")
    assert bool(result.shares.isnan().all())
    torch.testing.assert_close(result.values, torch.full_like(result.values, float(result.clean[0])),
                               atol=1e-4, rtol=0)
    assert bool(result.share_spread.mean.isnan().all())


def test_what_path_patching_refuses():
    built = family("llama")
    example = built.example
    with pytest.raises(ValueError, match="receiver"):
        pp.path_patching(built.model, [example], (0, 1), "k")
    with pytest.raises(ValueError, match="receiver"):
        pp.path_patching(built.model, [example], (1, 4), "k")
    with pytest.raises(ValueError, match="via"):
        pp.path_patching(built.model, [example], (1, 0), "o")
    with pytest.raises(ValueError, match="mlps"):
        pp.path_patching(built.model, [example], (1, 0), "k", mlps="thawed")


# ----------------------------------------------------------------------------------------- the induction circuit
@functools.cache
def circuit() -> tuple[int, tuple[int, int]]:
    """The shipped tiny GPT's previous-token head of layer 0 and its strongest induction head, by where they look
    (previous-token and induction scores on random tokens typed twice)."""
    built = family(SHIPPED)
    scores = ind.circuit_scores(built.model, built.pool, period=50, seed=11, bos=0)
    previous = int(scores["previous"][0].argmax())
    layer, head = divmod(int(scores["induction"].argmax()), scores["induction"].shape[1])
    assert layer >= 1 and float(scores["induction"][layer, head]) > 0.5
    assert float(scores["previous"][0, previous]) > 0.5
    return previous, (layer, head)


def _examples(change: str) -> list[ap.Example]:
    pool = family(SHIPPED).pool
    return ap.examples_of([induction_prompts(pool, 30, seed=seed, bos=0, change=change) for seed in range(8)])


def test_the_previous_token_head_feeds_the_induction_head_keys_through_an_mlp():
    """change="previous" (the token before the one to copy changed), 8 seeds: the previous-token head's path into
    the strongest induction head's keys carries a large share of the answer with the MLPs free, and almost none
    with them frozen: the path runs through an MLP. It does not reach the induction head's queries."""
    previous, receiver = circuit()
    model = family(SHIPPED).model
    examples = _examples("previous")
    free = pp.path_patching(model, examples, receiver, "k", mlps="free")
    frozen = pp.path_patching(model, examples, receiver, "k", mlps="frozen")
    free_shares, frozen_shares = free.shares[:, 0, previous], frozen.shares[:, 0, previous]
    assert float(free_shares.mean()) > 0.3 and float(free.share_spread.low[0, previous]) > 0.1
    assert float(frozen_shares.abs().max()) < 0.05
    assert bool((free_shares > frozen_shares + 0.05).all())
    assert float(free_shares.mean()) > 10 * float(frozen_shares.abs().mean())
    # of every sender, the previous-token head carries most into the keys
    assert int(free.share_spread.mean.nan_to_num(-9).flatten().argmax()) == previous
    queries = pp.path_patching(model, examples, receiver, "q", mlps="free")
    assert float(queries.shares[:, 0, previous].abs().max()) < 0.1


def test_the_induction_heads_values_carry_the_answer_and_their_keys_do_not():
    """change="copied" (the token to copy itself changed), 8 seeds: patching the strongest induction head's values
    brings back more than 0.3 of the answer on every example, its keys almost nothing."""
    _, (layer, head) = circuit()
    model = family(SHIPPED).model
    examples = _examples("copied")
    values = ap.patch_map(model, examples, "v")
    keys = ap.patch_map(model, examples, "k")
    assert bool((values.shares[:, layer, head] > 0.3).all()), values.shares[:, layer, head]
    assert bool((keys.shares[:, layer, head].abs() < 0.1).all()), keys.shares[:, layer, head]
    assert float(values.share_spread.low[layer, head]) > 0.3
