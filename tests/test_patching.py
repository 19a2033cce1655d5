"""The patching experiment's prompts and presets: the induction preset does what the page says it does at every
period (the per-site maps against hand hooks and brute force: tests/test_activation_patching.py); every head of a
layer at once; the warnings come whenever the shares mean little (the typed IOI example on the tiny GPT: the model
does not prefer the answer even clean: a negative logit difference, -2.46 on the model shipped on 2026-12-06)."""

import pytest
import torch

from attnviz.core import circuits
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import edits as iv
from attnviz.interventions import induction_circuit as ind
from attnviz.interventions import patching as patch
from attnviz.models.shipped import BUNDLED_GPT_DIR
from tests.tiny_models import TINY_GPT_HEADS, TINY_GPT_LAYERS


@pytest.fixture(scope="module")
def tiny_gpt():
    return iv.editable_lm(BUNDLED_GPT_DIR)


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
    """What docs/importance.md and docs/patching.md say of the preset, at every period the page offers the ends of,
    on eight seeds: the clean prompt prefers the answer (so no warning), patching every head of the layer of the
    strongest induction heads (by attention, measured on the page's circuit sequences) restores more than 2/3 of the
    answer and more than any other layer, and the single head restoring most is an induction head of that layer."""
    model, tokenizer = tiny_gpt
    pool = circuits.ordinary_token_ids(tokenizer)
    scores = ind.circuit_scores(model, pool, period=50, seed=11, bos=tokenizer.bos_token_id)["induction"]
    layer = int(scores.max(-1).values.argmax())
    assert layer == TINY_GPT_LAYERS - 1
    examples = [patch.induction_prompts(pool, period, seed=seed, bos=tokenizer.bos_token_id) for seed in range(8)]
    heads = ap.patch_map(model, examples, "head")
    layers = ap.whole_layers(model, examples, "head")  # [examples, layers]
    for seed in range(8):
        clean, corrupted = float(heads.clean[seed]), float(heads.corrupted[seed])
        assert patch.problems(clean, corrupted, "answer", "foil") == [], (period, seed)
        assert clean > patch.PREFERS and corrupted < 0  # the corrupted run prefers the foil
        assert layers[seed, layer] > 2 / 3 and int(layers[seed].argmax()) == layer, (period, seed)
        best = int(heads.shares[seed].nan_to_num(-9).argmax())
        assert best // TINY_GPT_HEADS == layer and scores.flatten()[best] > 0.5, (period, seed)


def test_every_head_at_once_equals_the_attention_output_and_the_sum_of_nothing_else(tiny_gpt):
    """whole_layers: every head of a layer patched at every position equals its attention output patched there (the
    output projection's bias is the same in both runs), and the residual stream entering layer 0 at every position
    is the whole clean run (share 1)."""
    model, tokenizer = tiny_gpt
    examples = [patch.induction_prompts(circuits.ordinary_token_ids(tokenizer), 16, seed=s, bos=0) for s in (1, 2)]
    heads = ap.whole_layers(model, examples, "head")
    attention = ap.whole_layers(model, examples, "attn")
    assert torch.allclose(heads, attention, atol=1e-5)
    assert torch.allclose(ap.whole_layers(model, examples, "resid")[:, 0], torch.ones(2, dtype=torch.float64),
                          atol=1e-5)
    noising = ap.whole_layers(model, examples, "resid", direction="noising")
    assert torch.allclose(noising[:, 0], torch.ones(2, dtype=torch.float64), atol=1e-5)


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
