"""An encoder without a loss head (the "hidden" objective): a head's effect on a text is each token's distance from
its unedited final state, over the mean size of that text's own unedited states, averaged over the text. Checked
against transformers' eager BERT (the bundled MiniLM) with the head's columns of the output projection zeroed, each
text run alone: so a text's number never depends on the texts measured with it (the map's cell of one text is the
mean of its token bars, and chunking changes nothing), which it did when the map divided by the batch's mean norm
and the token view by the text's own."""

import copy

import pytest
import torch
import transformers as T

from attnviz.interventions import importance as imp
from attnviz.models.loading import load_model_dir
from attnviz.models.shipped import default_model_dir

TEXTS = ["The cat sat on the mat.",
         "Attention heads read keys and values, then mix them; a longer text has states of another size.",
         "Short!"]


@pytest.fixture(scope="module")
def encoder():
    bundle = load_model_dir(default_model_dir())
    eager = T.AutoModel.from_pretrained(default_model_dir(), attn_implementation="eager", local_files_only=True,
                                        use_safetensors=True).eval()
    return bundle.model.double(), bundle.tokenizer, eager.double()


def _reference(eager, tokenizer, text: str, layer: int | None, head: int) -> torch.Tensor:
    """Each token's final state moved by zeroing the head (its columns of the attention's output projection, in a
    copy of the eager model), over the mean norm of the text's unedited states; the text alone, no padding."""
    ids = tokenizer(text, return_tensors="pt")
    ids = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}
    with torch.no_grad():
        clean = eager(**ids).last_hidden_state[0]  # [n, d]
        if layer is None:
            return clean
        edited = copy.deepcopy(eager)
        dense = edited.encoder.layer[layer].attention.output.dense
        width = dense.weight.shape[1] // edited.config.num_attention_heads
        dense.weight[:, head * width:(head + 1) * width] = 0
        ablated = edited(**ids).last_hidden_state[0]
    return (ablated - clean).norm(dim=-1) / clean.norm(dim=-1).mean()


def test_a_texts_cell_is_its_own_tokens_distance_over_its_own_states_size(encoder):
    model, tokenizer, eager = encoder
    assert imp.objective_of(model) == "hidden"
    batch = imp.batch_of(tokenizer, TEXTS, "hidden")
    result = imp.ablation_map(model, batch, "zero")
    layers = len(result.modules)
    for row in (0, layers - 1):
        for head in (0, 11):
            for text, sentence in enumerate(TEXTS):
                expected = _reference(eager, tokenizer, sentence, row, head)
                assert float(result.per_text[row, head, text]) == pytest.approx(float(expected.mean()), rel=1e-9)
                # the per-token view: its bars are the reference's, and their mean is the text's cell
                targets, change = imp.token_effect(model, batch, result.modules[row], head, text=text)
                assert len(targets) == len(expected) == int(batch.real[text].sum())
                torch.testing.assert_close(change.double(), expected, rtol=1e-9, atol=1e-12)
                assert float(change.mean()) == pytest.approx(float(result.per_text[row, head, text]), rel=1e-9)
    # the map's cell is the mean of the texts' values
    torch.testing.assert_close(result.values, result.per_text.mean(-1))


def test_chunking_the_texts_changes_no_texts_value(encoder):
    """At the setting where it was false: two or more texts of different sizes, one batch or one at a time."""
    model, tokenizer, _ = encoder
    together = imp.ablation_map(model, imp.batch_of(tokenizer, TEXTS, "hidden"), "zero")
    first = imp.ablation_map(model, imp.batch_of(tokenizer, TEXTS[:1], "hidden"), "zero")
    rest = imp.ablation_map(model, imp.batch_of(tokenizer, TEXTS[1:], "hidden"), "zero")
    chunked = torch.cat([first.per_text, rest.per_text], dim=-1)
    torch.testing.assert_close(together.per_text, chunked, rtol=1e-9, atol=1e-12)
