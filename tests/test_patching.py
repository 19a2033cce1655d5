"""Activation patching on the "Does this head matter?" page: per head and per layer and position, against transformers'
eager GPT-2 with hand-written hooks and against brute force; the induction preset does what the page says it does at
every preset; the warnings come whenever the shares mean little (the typed IOI example on the tiny GPT: the model
does not prefer the answer even clean, logit difference -7.5, and its foil was "\\n")."""

import pytest
import torch

from attnviz.core import circuits
from attnviz.interventions import edits as iv
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import patching as patch
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.models.with_heads import load_causal_lm
from tests.tiny_models import TINY_GPT_HEADS, TINY_GPT_LAYERS


@pytest.fixture(scope="module")
def tiny_gpt():
    return iv.editable_lm(BUNDLED_GPT_DIR)


@pytest.fixture(scope="module")
def eager():
    model, _ = load_causal_lm(BUNDLED_GPT_DIR)
    return model


def _difference(logits: torch.Tensor, answer: int, foil: int) -> float:
    last = logits[0, -1].double()
    return float(last[answer] - last[foil])


def test_the_induction_preset_changes_only_the_token_to_copy():
    pool = list(range(10, 200))
    prompts = patch.induction_prompts(pool, 30, seed=3, bos=0)
    assert prompts.bos and prompts.clean[0] == 0 and len(prompts.clean) == 1 + 30 + 15
    assert prompts.clean[1:31][:15] == prompts.clean[31:]  # the second copy: the first half again
    assert prompts.changed == (16,) and prompts.answer == prompts.clean[16] and prompts.corrupted[16] == prompts.foil
    assert [i for i, (a, b) in enumerate(zip(prompts.clean, prompts.corrupted, strict=True)) if a != b] == [16]
    assert prompts.foil not in prompts.clean  # the foil appears nowhere in the clean prompt
    assert patch.induction_prompts(pool, 30, seed=3).clean == prompts.clean[1:]  # no BOS: none put in


@pytest.mark.parametrize("period", [8, 16, 30, 60])
def test_at_every_preset_the_induction_layer_restores_the_answer(tiny_gpt, period):
    """What docs/importance.md says of the preset, at every period the page offers the ends of, and eight seeds:
    the clean prompt prefers the answer (so no warning), patching the layer of the strongest induction heads (by
    attention, measured on the page's circuit sequences) restores more than 3/4 of the answer and more than any
    other layer, and the single head restoring most is an induction head of that layer."""
    model, tokenizer = tiny_gpt
    pool = circuits.ordinary_token_ids(tokenizer)
    scores = ind.circuit_scores(model, pool, period=50, seed=11, bos=tokenizer.bos_token_id)["induction"]
    layer = int(scores.max(-1).values.argmax())
    assert layer == TINY_GPT_LAYERS - 1
    for seed in range(8):
        prompts = patch.induction_prompts(pool, period, seed=seed, bos=tokenizer.bos_token_id)
        result = patch.patching_map(model, prompts.clean, prompts.corrupted, prompts.answer, prompts.foil)
        assert patch.problems(result.clean, result.corrupted, result.answer, result.foil) == [], (period, seed)
        assert result.clean > patch.PREFERS and result.corrupted < 0  # the corrupted run prefers the foil
        assert result.layers[layer] > 0.75 and int(result.layers.argmax()) == layer, (period, seed)
        best = int(result.heads.nan_to_num(-9).argmax())
        assert best // TINY_GPT_HEADS == layer and scores.flatten()[best] > 0.5, (period, seed)


def test_patching_a_head_equals_patching_its_projection_columns_by_hand(tiny_gpt, eager):
    """Each head's share against transformers' eager GPT-2: its columns of the output projection's input set to the
    clean run's by a pre-hook."""
    model, tokenizer = tiny_gpt
    prompts = patch.induction_prompts(circuits.ordinary_token_ids(tokenizer), 16, seed=2, bos=0)
    result = patch.patching_map(model, prompts.clean, prompts.corrupted, prompts.answer, prompts.foil)
    width = eager.config.n_embd // eager.config.n_head
    kept = {}
    with torch.no_grad():
        handles = [eager.transformer.h[layer].attn.c_proj.register_forward_pre_hook(
            lambda _, args, layer=layer: kept.__setitem__(layer, args[0].clone())) for layer in range(TINY_GPT_LAYERS)]
        clean = _difference(eager(input_ids=torch.tensor([prompts.clean])).logits, prompts.answer, prompts.foil)
        for handle in handles:
            handle.remove()
        corrupted = _difference(eager(input_ids=torch.tensor([prompts.corrupted])).logits, prompts.answer,
                                prompts.foil)
        assert result.clean == pytest.approx(clean, abs=1e-4) and result.corrupted == pytest.approx(corrupted, abs=1e-4)
        for layer in range(TINY_GPT_LAYERS):
            for head in range(TINY_GPT_HEADS):
                columns = slice(head * width, (head + 1) * width)

                def hook(_, args, layer=layer, columns=columns):
                    merged = args[0].clone()
                    merged[..., columns] = kept[layer][..., columns]
                    return (merged, *args[1:])

                handle = eager.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
                patched = _difference(eager(input_ids=torch.tensor([prompts.corrupted])).logits, prompts.answer,
                                      prompts.foil)
                handle.remove()
                assert float(result.heads[layer, head]) == pytest.approx((patched - corrupted) / (clean - corrupted),
                                                                         abs=1e-4), (layer, head)


def test_patching_the_residual_stream_by_position_against_hooks_by_hand_and_brute_force(tiny_gpt, eager):
    model, tokenizer = tiny_gpt
    prompts = patch.induction_prompts(circuits.ordinary_token_ids(tokenizer), 16, seed=4, bos=0)
    n, changed = len(prompts.clean), prompts.changed[0]
    result = patch.position_patching(model, prompts.clean, prompts.corrupted, prompts.answer, prompts.foil,
                                     tokenizer=tokenizer, rows_per_forward=5)
    assert result.shares.shape == (TINY_GPT_LAYERS + 1, n)
    assert result.rows == ["embeddings (into layer 0)", "into layer 1", "into layer 2", "out of layer 2"]
    shares = result.shares
    # brute force: the only position that differs, patched at the embeddings, is the clean run; positions before
    # it are the same in both runs; the last layer's output is read only at the last position (to float32's
    # rounding: rows of one batch may round apart by an ulp of the logits, a few 1e-8 of the gap)
    assert float(shares[0, changed]) == pytest.approx(1.0, abs=1e-5)
    assert shares[:, :changed].abs().max() < 1e-6
    assert float(shares[-1, -1]) == pytest.approx(1.0, abs=1e-5)
    assert shares[-1, :-1].abs().max() < 1e-6
    # against transformers' eager GPT-2: a pre-hook on block l (a forward hook on the last) sets one position of
    # the residual stream to the clean run's
    blocks = eager.transformer.h
    with torch.no_grad():
        clean_hidden = {}
        handles = [blocks[layer].register_forward_pre_hook(
            lambda _, args, layer=layer: clean_hidden.__setitem__(layer, args[0].clone())) for layer in range(3)]
        handles.append(blocks[2].register_forward_hook(
            lambda _, __, output: clean_hidden.__setitem__(3, (output[0] if isinstance(output, tuple) else output)
                                                           .clone())))
        clean = _difference(eager(input_ids=torch.tensor([prompts.clean])).logits, prompts.answer, prompts.foil)
        for handle in handles:
            handle.remove()
        corrupted = _difference(eager(input_ids=torch.tensor([prompts.corrupted])).logits, prompts.answer,
                                prompts.foil)
        for layer, position in [(1, changed), (2, changed), (1, changed + 1), (2, n - 1), (0, n - 1), (3, changed)]:
            def put(hidden, layer=layer, position=position):
                hidden = hidden.clone()
                hidden[:, position] = clean_hidden[layer][:, position]
                return hidden

            if layer < 3:
                handle = blocks[layer].register_forward_pre_hook(lambda _, args, put=put: (put(args[0]), *args[1:]))
            else:
                handle = blocks[2].register_forward_hook(
                    lambda _, __, output, put=put: (put(output[0]), *output[1:]) if isinstance(output, tuple)
                    else put(output))
            patched = _difference(eager(input_ids=torch.tensor([prompts.corrupted])).logits, prompts.answer,
                                  prompts.foil)
            handle.remove()
            expected = (patched - corrupted) / (clean - corrupted)
            assert float(shares[layer, position]) == pytest.approx(expected, abs=1e-4), (layer, position)
    # the path the preset is built to show: the token to copy carries the answer until the induction layer reads it,
    # and the last position carries little of it before that layer's output (0.15 into layer 2: layer 1's weaker
    # induction head moves a part) and all of it after
    assert shares[:3, changed].min() > 0.9 and shares[:2, -1].abs().max() < 0.1 and shares[2, -1] < 0.5


def test_the_residual_stream_is_edited_only_inside_the_block_and_only_on_its_model(tiny_gpt):
    model, tokenizer = tiny_gpt
    ids = torch.tensor([tokenizer("The cat sat on the mat.")["input_ids"]])
    modules = iv.attention_modules(model, {"input_ids": ids})
    blocks = iv.residual_blocks(model, modules)
    assert blocks == ["transformer.h.0", "transformer.h.1", "transformer.h.2"]
    with torch.no_grad():
        before = model(input_ids=ids).logits
        seen = []
        with iv.on_residual(model, blocks, lambda layer, hidden: seen.append(layer) or hidden):
            same = model(input_ids=ids).logits
        assert seen == [0, 1, 2, 3] and torch.equal(same, before)
        with iv.on_residual(model, blocks, lambda layer, hidden: hidden * 0 if layer == 3 else hidden):
            assert model(input_ids=ids).logits.abs().max() < before.abs().max()  # the final state zeroed
        assert torch.equal(model(input_ids=ids).logits, before)  # nothing left behind


def test_the_shares_are_warned_of_whenever_they_mean_little():
    # the typed IOI example on the tiny GPT: the model does not prefer the answer even clean
    said = patch.problems(-7.5, -9.0, " boy", " girl")
    assert [level for level, _ in said] == ["warning"] and "does not prefer the answer" in said[0][1]
    assert "-7.50" in said[0][1]
    level, words = patch.problems(5.0, 4.6, "a", "b")[0]  # about equal: the shares divide by 0.4
    assert level == "warning" and "about equal" in words
    assert patch.problems(3.0, 3.0, "a", "b")[0][0] == "error"  # nothing to recover
    assert "prefers the answer more" in patch.problems(2.0, 6.0, "a", "b")[0][1]
    assert patch.problems(8.0, -8.0, "a", "b") == []


def test_typed_prompts_take_the_foil_given_and_one_bos(tiny_gpt):
    _, tokenizer = tiny_gpt
    clean = "When the boy and the girl went to the store, the girl gave a drink to the"
    corrupted = "When the boy and the girl went to the store, the boy gave a drink to the"
    prompts = patch.own_prompts(tokenizer, clean, corrupted, " boy", " girl", bos=True)
    assert prompts.foil == tokenizer(" girl", add_special_tokens=False)["input_ids"][0]
    assert prompts.bos and prompts.clean[0] == tokenizer.bos_token_id and prompts.clean[1] != tokenizer.bos_token_id
    assert len(prompts.changed) == 1
    assert patch.own_prompts(tokenizer, clean, corrupted, " boy", "", bos=False).foil is None
    assert not patch.own_prompts(tokenizer, clean, corrupted, " boy", " girl", bos=False).bos
    assert "same number of tokens" in patch.own_prompts(tokenizer, clean, "Shorter", " boy", " girl", bos=True)
    assert "the same token" in patch.own_prompts(tokenizer, clean, corrupted, " boy", " boy", bos=True)
    lines = patch.prompt_lines(tokenizer, prompts)
    assert lines.startswith("clean") and "[" in lines and lines.splitlines()[1].rstrip().endswith("girl")
