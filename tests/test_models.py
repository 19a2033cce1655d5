"""Models: the bundled BERT, tiny checkpoints of every architecture family, capture, replay parity."""

import pytest
import torch

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.models.capture import capture
from attnviz.models.loading import FallbackTokenizer, load_model_dir
from attnviz.models.replay_check import replay_difference


@pytest.fixture(scope="module")
def tiny_dir(tiny_checkpoint):
    return tiny_checkpoint


def test_bundled_model_is_the_real_six_by_twelve_bert(bert):
    assert bert.model_type == "bert" and bert.architecture == "encoder"
    assert (bert.n_layers, bert.n_heads, bert.d_model) == (6, 12, 384)
    assert not bert.uses_fallback_tokenizer
    assert bert.model.config._attn_implementation == "attnviz"  # the fast path, recorded


def test_capture_shapes_and_tokens(bert):
    result = capture(bert, "The cat sat on the mat.", "It was tired.")
    record = result.records["self"]
    n = len(result.tokens)
    assert result.tokens[0] == "[CLS]" and result.tokens[-1] == "[SEP]"
    assert record.weights.shape == (6, 12, n, n)
    assert record.queries.shape == (6, 12, n, 32) and record.keys.shape == (6, 12, n, 32)
    assert result.segments == [0] * 9 + [1] * 5
    assert result.special[0] and result.special[8] and not result.special[1]
    torch.testing.assert_close(record.weights.sum(-1), torch.ones(6, 12, n))
    assert record.scales[0] == pytest.approx(32**-0.5)


def eager_attentions(folder, bundle, text, text_pair=None):
    """transformers' own weights (eager attention, output_attentions=True) for the same inputs, by kind."""
    from transformers import AutoModel

    from attnviz.models.capture import _model_inputs

    reference = AutoModel.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    inputs, *_ = _model_inputs(bundle, text, text_pair, bundle.max_positions, None)
    with torch.no_grad():
        out = reference(**inputs, output_attentions=True)
    if bundle.architecture == "encoder-decoder":
        found = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    else:
        found = {"self": out.attentions}
    return {kind: torch.cat(weights) for kind, weights in found.items()}  # [layers, heads, n_q, n_k]


def test_capture_matches_transformers_output_attentions(bert):
    text = "Attention is all you need."
    result = capture(bert, text)
    reference = eager_attentions(bert.folder, bert, text)["self"]
    assert reference.shape[0] == 6
    torch.testing.assert_close(result.records["self"].weights, reference, atol=1e-5, rtol=0)


def test_nothing_holds_all_weights_until_asked(bert):
    record = capture(bert, "A short sentence.").records["self"]
    assert "weights" not in vars(record)  # replayed on demand, not captured
    one = record.head_weights(2, 5, 1, 4)
    assert one.shape == (3, record.n_k)
    torch.testing.assert_close(one, record.weights[2, 5, 1:4])


def test_replay_parity_on_the_bundled_model(bert):
    result = capture(bert, "Replay proves that our attention is the model's attention, head by head.")
    assert replay_difference(result.records["self"]) < 1e-5


@pytest.mark.parametrize(
    "kind,expected_kinds",
    [
        ("gpt2", ["self"]),
        ("distilbert", ["self"]),
        ("roberta", ["self"]),
        ("llama", ["self"]),
        ("bert", ["self"]),
        ("bart", ["encoder", "decoder", "cross"]),
        ("t5", ["encoder", "decoder", "cross"]),
    ],
)
def test_replay_parity_on_tiny_checkpoints(tiny_dir, kind, expected_kinds):
    bundle = load_model_dir(tiny_dir(kind))
    text, pair = "The quick brown fox jumps over the lazy dog.", "A dog sleeps."
    result = capture(bundle, text, pair)
    assert sorted(result.kinds) == sorted(expected_kinds)
    reference = eager_attentions(tiny_dir(kind), bundle, text, pair)
    for record in result.records.values():
        assert replay_difference(record) < 1e-5, record.kind  # attnviz's weights @ V = the model's SDPA output
        torch.testing.assert_close(record.weights, reference[record.kind], atol=1e-5, rtol=0, msg=record.kind)
        torch.testing.assert_close(record.weights.sum(-1), torch.ones(record.weights.shape[:-1]), atol=1e-5, rtol=0)


def test_decoder_is_causal_and_llama_uses_grouped_query_attention(tiny_dir):
    gpt2 = capture(load_model_dir(tiny_dir("gpt2")), "one two three four five")
    weights = gpt2.records["self"].weights
    assert torch.all(weights.triu(diagonal=1) == 0)
    llama = load_model_dir(tiny_dir("llama"))
    assert (llama.n_heads, llama.n_kv_heads) == (4, 2)
    record = capture(llama, "one two three four").records["self"]
    assert record.n_heads == 4 and record.n_kv_heads == 2 and record.keys.shape[1] == 2


def test_encoder_decoder_cross_attention_shapes(tiny_dir):
    bundle = load_model_dir(tiny_dir("bart"))
    assert bundle.architecture == "encoder-decoder"
    result = capture(bundle, "a much longer source sentence for the encoder", "short target")
    cross = result.records["cross"]
    assert cross.weights.shape[-2] == len(result.decoder_tokens)
    assert cross.weights.shape[-1] == len(result.tokens)
    assert torch.all(result.records["decoder"].weights.triu(diagonal=1) == 0)


def test_t5_position_bias_is_part_of_the_replay(tiny_dir):
    from dataclasses import replace

    record = capture(load_model_dir(tiny_dir("t5")), "relative position bias matters here").records["encoder"]
    assert record.bias is not None
    without_bias = replace(record, biases=[None] * record.n_layers).weights  # a new record: replayed anew
    assert (without_bias - record.weights).abs().max() > 1e-4  # the bias changes the weights: replay must use it


def test_long_input_is_truncated_with_a_notice(tiny_dir):
    from attnviz.models.capture import COUNTED_CHARS

    bundle = load_model_dir(tiny_dir("bert"))  # 64 positions
    text = " ".join(["word"] * 100)
    result = capture(bundle, text)
    assert result.truncated and len(result.tokens) == 64
    assert result.length_of_text == f"{len(bundle.tokenizer(text)['input_ids']):,}"  # counted whole: exact
    long = " ".join(["word"] * (COUNTED_CHARS // 2))  # longer than what is counted whole
    result = capture(bundle, long)
    assert result.length_of_text.startswith("more than")  # the text was read only as far as needed
    assert 64 < -result.n_tokens_before_truncation < len(bundle.tokenizer(long)["input_ids"])


def test_missing_tokenizer_falls_back_and_says_so(tiny_dir):
    bundle = load_model_dir(tiny_dir("gpt2", with_tokenizer=False))
    assert isinstance(bundle.tokenizer, FallbackTokenizer) and bundle.uses_fallback_tokenizer
    assert "no tokenizer" in bundle.tokenizer_note
    result = capture(bundle, "split on whitespace only")
    assert result.tokens == ["split", "on", "whitespace", "only"]
    assert replay_difference(result.records["self"]) < 1e-5


def test_fallback_byte_tokenizer():
    tokenizer = FallbackTokenizer("bytes", 300)
    assert tokenizer.tokenize("hé") == ["h", "<0xC3>", "<0xA9>"]
    assert tokenizer.ids(tokenizer.tokenize("hé"), "hé") == [104, 195, 169]


def test_empty_text_is_refused(bert):
    with pytest.raises(ValueError, match="empty"):
        capture(bert, "   ")


def test_odd_unicode_runs(bert):
    result = capture(bert, "naïve café — 日本語 🤖 \u200b zero-width")
    assert replay_difference(result.records["self"]) < 1e-5


def test_weights_of_another_architecture_are_refused(tiny_dir, tmp_path):
    import shutil

    folder = tmp_path / "mismatch"
    shutil.copytree(tiny_dir("gpt2"), folder)
    bert_weights = tiny_dir("bert") / "model.safetensors"
    shutil.copy(bert_weights, folder / "model.safetensors")  # config says gpt2, weights are BERT's
    with pytest.raises(CheckpointRefused, match="wrong architecture|do not fit|missing"):
        load_model_dir(folder)


def test_the_modifier_tests_cover_listed_types():
    """attnviz.models.architectures is the one list (tests/test_architectures.py loads every type in it); the
    modifier tests' own configs are of listed types."""
    from attnviz.models import architectures
    from tests.test_capture_modifiers import _config

    for kind in ("mistral", "gemma2", "gpt_oss"):
        assert _config(kind).model_type == kind and kind in architectures.TESTED_MODEL_TYPES
