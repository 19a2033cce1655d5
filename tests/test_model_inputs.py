"""What a model reads of its tokenizer's output: a decoder given a mismatched tokenizer that returns token types
(the bundled BERT's tokenizer beside a GPT-2, as the tiny test checkpoints have) does not get them, since GPT-2,
GPT-J and GPT-Neo look them up in their word embeddings; a model with a token-type table (BERT) still does."""

import pytest
import torch

from attnviz.models.architectures import model_inputs, reads_token_types
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir

TEXT, PAIR = "The cat sat on the mat.", "It was tired."


def eager_weights(folder, encoded: dict) -> torch.Tensor:
    """transformers' own eager weights ``[layers, heads, n, n]`` for exactly ``encoded``."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    with torch.no_grad():
        return torch.cat(model(**encoded, output_attentions=True).attentions)


@pytest.mark.parametrize("kind", ["gpt2", "gptj", "gpt_neo"])
@pytest.mark.parametrize("pair", [None, PAIR])
def test_a_decoder_with_a_bert_tokenizer_gets_no_token_types(tiny_checkpoint, kind, pair):
    folder = tiny_checkpoint(kind)
    bundle = load_model_dir(folder)
    encoded = bundle.tokenizer(TEXT, pair, return_tensors="pt")
    assert "token_type_ids" in encoded  # the mismatched tokenizer does return them
    result = capture(bundle, TEXT, pair)
    assert result.tokens == bundle.tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    without = eager_weights(folder, {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
    torch.testing.assert_close(result.records["self"].weights, without, atol=1e-6, rtol=0)
    # what it used to read: the token types embedded as words, which moves the weights
    with_types = eager_weights(folder, dict(encoded))
    assert float((with_types - without).abs().max()) > 1e-3
    if pair is not None:
        assert result.segments == encoded["token_type_ids"][0].tolist()  # the A/B filters still know the segments


def test_bert_still_reads_its_token_types(bert):
    encoded = bert.tokenizer(TEXT, PAIR, return_tensors="pt")
    assert set(encoded["token_type_ids"][0].tolist()) == {0, 1}
    result = capture(bert, TEXT, PAIR)
    with_types = eager_weights(bert.folder, dict(encoded))
    torch.testing.assert_close(result.records["self"].weights, with_types, atol=1e-5, rtol=0)
    without = eager_weights(bert.folder, {k: v for k, v in encoded.items() if k != "token_type_ids"})
    assert float((with_types - without).abs().max()) > 1e-3  # the segment B embedding counts for BERT


def test_which_models_read_token_types(tiny_checkpoint):
    """By the model: a token-type table, or an encoder that takes segments; never a decoder without a table."""
    from transformers import AutoModel

    from attnviz.bench.tiny import tiny_config

    expected = {"bert": True, "albert": True, "electra": True, "gpt2": False, "gptj": False, "gpt_neo": False,
                "llama": False, "distilbert": False, "t5": False}
    for kind, reads in expected.items():
        model = AutoModel.from_config(tiny_config(kind))
        assert reads_token_types(model) is reads, kind
        ones = torch.ones(1, 3, dtype=torch.long)
        inputs = {"input_ids": ones, "token_type_ids": 0 * ones, "attention_mask": ones, "pixel_values": ones}
        assert ("token_type_ids" in model_inputs(model, inputs)) is reads, kind
        assert "pixel_values" not in model_inputs(model, inputs)  # names the forward does not take
    from transformers import XLNetConfig, XLNetModel

    xlnet = XLNetModel(XLNetConfig(vocab_size=99, d_model=32, n_layer=1, n_head=4, d_inner=64))
    assert reads_token_types(xlnet)  # no table, but an encoder that reads segments
