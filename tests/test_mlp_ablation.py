"""MLP ablation beside head ablation: each layer's MLP zeroed (or replaced by its mean over the texts' real tokens)
against transformers' eager model with a hand-written forward hook doing the same, each text alone, on the tiny GPT
and a Llama-shaped model (next-token loss) and a BERT masked LM (its masked-LM loss)."""

import copy

import pytest
import torch
import transformers

from attnviz.interventions import importance as imp
from attnviz.interventions.edits import editable_lm
from attnviz.interventions.mlp_ablation import mlp_ablation
from attnviz.models.attention_hook import ATTENTION_NAME
from attnviz.models.shipped import BUNDLED_GPT_DIR

TEXTS = ["the cat sat on the mat and then it slept", "a small boat drifted past the harbour wall"]


def _llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=4096)
    return transformers.LlamaForCausalLM(config).eval()


def _with_attnviz(model):
    edited = copy.deepcopy(model)
    edited.set_attn_implementation(ATTENTION_NAME)
    return edited


def _reference_next_token(eager, batch, mlp_names, layer, how, mean=None):
    """Each text alone, its MLP output at ``layer`` replaced by hand, its mean next-token loss."""
    losses = []
    for row in range(len(batch.texts)):
        real = batch.real[row]
        ids = batch.inputs["input_ids"][row][real][None]
        module = eager.get_submodule(mlp_names[layer])
        def replace(_, __, output):
            return torch.zeros_like(output) if how == "zero" else mean.to(output.dtype).expand_as(output)

        handle = module.register_forward_hook(replace)
        try:
            with torch.no_grad():
                logits = eager(input_ids=ids).logits[0, :-1].double()
        finally:
            handle.remove()
        losses.append(float(torch.nn.functional.cross_entropy(logits, ids[0, 1:])))
    return losses


def _clean_next_token(eager, batch):
    losses = []
    for row in range(len(batch.texts)):
        ids = batch.inputs["input_ids"][row][batch.real[row]][None]
        with torch.no_grad():
            logits = eager(input_ids=ids).logits[0, :-1].double()
        losses.append(float(torch.nn.functional.cross_entropy(logits, ids[0, 1:])))
    return losses


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("how", ["zero", "mean"])
def test_each_mlp_ablated_equals_the_same_edit_by_hand(family, how):
    edited, tokenizer = editable_lm(BUNDLED_GPT_DIR)
    if family == "llama":
        eager = _llama()
        edited = _with_attnviz(eager)
    else:
        eager = transformers.AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager").eval()
    batch = imp.batch_of(tokenizer, TEXTS, "next-token")
    result = mlp_ablation(edited, batch, how)
    prefix = "transformer.h" if family == "gpt2" else "model.layers"
    names = [f"{prefix}.{layer}.mlp" for layer in range(3)]
    clean = _clean_next_token(eager, batch)
    for layer in range(3):
        mean = None
        if how == "mean":  # every real token of every text, by hand
            kept = []
            handle = eager.get_submodule(names[layer]).register_forward_hook(
                lambda _, __, output, kept=kept: kept.append(output.detach().double()[0]))
            for row in range(len(batch.texts)):
                with torch.no_grad():
                    eager(input_ids=batch.inputs["input_ids"][row][batch.real[row]][None])
            handle.remove()
            mean = torch.cat(kept).mean(0)
        ablated = _reference_next_token(eager, batch, names, layer, how, mean)
        expected = [a - c for a, c in zip(ablated, clean, strict=True)]
        assert result.per_text[layer].tolist() == pytest.approx(expected, abs=2e-4), (family, how, layer)
    assert result.labels == ["layer 0", "layer 1", "layer 2"]
    if family == "gpt2":  # a trained model's MLPs matter (the random Llama's barely do)
        assert float(result.values.abs().max()) > 0.05


def test_a_masked_lm_and_what_is_refused():
    """BERT's MLP output (its ``output.dense``, before the residual add and the norm) zeroed by a hand hook on the
    eager model, measured by the same masked-LM loss: the edit, not the loss, is what is checked here (the loss is
    checked against transformers' own in tests/test_importance_objectives.py)."""
    from tests.tiny_models import bundled_bert

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, vocab_size=30522)
    eager = transformers.BertForMaskedLM(config).eval()
    edited = _with_attnviz(eager)
    batch = imp.batch_of(bundled_bert().tokenizer, TEXTS, "masked")
    result = mlp_ablation(edited, batch, "zero", objective="masked")
    clean = imp.text_losses(imp.run_losses(eager, batch, "masked"), *imp.clean_run(eager, batch, "masked")[3:],
                            batch.copies)
    for layer in range(2):
        handle = eager.bert.encoder.layer[layer].output.dense.register_forward_hook(
            lambda _, __, output: torch.zeros_like(output))
        try:
            ablated = imp.text_losses(imp.run_losses(eager, batch, "masked"),
                                      imp.clean_run(eager, batch, "masked")[3], batch.copies)
        finally:
            handle.remove()
        assert result.per_text[layer].tolist() == pytest.approx((ablated - clean).tolist(), abs=1e-4)
    with pytest.raises(ValueError, match="zero or mean"):
        mlp_ablation(edited, batch, "resample", objective="masked")
