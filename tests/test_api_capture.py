"""attnviz.api.capture: a model built in the notebook itself (never saved), a checkpoint folder or a bundled model's
name, captured and compared with transformers' own eager attention weights; the bundle other code builds on; and
what it refuses, in words."""

import pytest
import torch
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    GPTBigCodeConfig,
    GPTBigCodeModel,
    GPTNeoConfig,
    GPTNeoForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    ViTConfig,
    ViTModel,
)

from attnviz.api.capture import IN_MEMORY_FOLDER, Captured, bundle_of, capture
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.models.capture import capture as capture_bundle
from attnviz.models.loading import ModelBundle
from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME, DEFAULT_MODEL_NAME, default_model_dir

TEXT = "The cat sat on the mat. The cat sat on the mat again."


@pytest.fixture(scope="module")
def gpt_tokenizer():
    """The bundled tiny GPT's byte-level BPE (4,096 tokens), read by transformers alone."""
    return AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def bert_tokenizer():
    return AutoTokenizer.from_pretrained(default_model_dir(), local_files_only=True)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    """A random GPT-2 made here, in memory, in training mode with dropout (as a notebook's fresh model is)."""
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=4096, n_positions=64,
                                      bos_token_id=0, eos_token_id=0, attn_pdrop=0.1))


def eager_attentions(model, **inputs) -> torch.Tensor:
    """transformers' own eager weights of ``model`` on ``inputs``: ``[layers, heads, n, n]`` (batch item 0)."""
    model.set_attn_implementation("eager")
    model.eval()
    with torch.no_grad():
        attentions = model(**inputs, output_attentions=True).attentions
    assert len(attentions) == model.config.num_hidden_layers
    return torch.stack(attentions)[:, 0]


def test_an_in_memory_gpt2_gives_transformers_eager_weights(gpt_tokenizer):
    model = tiny_gpt2()
    assert model.training and model.config._attn_implementation == "sdpa"
    captured = capture(model, gpt_tokenizer, TEXT)
    # The model is as the notebook left it: its attention implementation and training mode set back.
    assert model.training and model.config._attn_implementation == "sdpa"
    ids = gpt_tokenizer(TEXT, return_tensors="pt")["input_ids"]
    assert captured.n_tokens == ids.shape[1] == len(captured.tokens)
    assert captured.token_ids == ids[0].tolist()
    assert captured.raw_tokens == gpt_tokenizer.convert_ids_to_tokens(ids[0].tolist())
    assert captured.tokens == readable_tokens(captured.raw_tokens, tokenizer_style(gpt_tokenizer))
    assert captured.tokens[1] == "␣cat"
    assert (captured.n_layers, captured.n_heads) == (2, 4)
    weights = captured.weights()  # [layers, heads, n, n]
    expected = eager_attentions(model, input_ids=ids)
    assert weights.shape == expected.shape == (2, 4, ids.shape[1], ids.shape[1])
    torch.testing.assert_close(weights, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(captured.weights(1), expected[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, ids.shape[1]), atol=1e-5, rtol=0)
    assert not weights.triu(1).any()  # causal
    assert captured.replay.checked and captured.replay.passed and captured.replay.max_difference < 1e-5
    said = repr(captured)
    assert "\n" not in said and "GPT2LMHeadModel (in memory)" in said and f"{ids.shape[1]} tokens" in said
    assert "2 layers x 4 heads" in said and "replay passed" in said


def test_a_base_gpt2_and_a_bert_pair_in_memory(gpt_tokenizer, bert_tokenizer):
    torch.manual_seed(1)
    base = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=4096, n_positions=64))
    captured = capture(base, gpt_tokenizer, TEXT)
    ids = gpt_tokenizer(TEXT, return_tensors="pt")["input_ids"]
    torch.testing.assert_close(captured.weights(), eager_attentions(base, input_ids=ids), atol=1e-5, rtol=0)

    torch.manual_seed(2)
    bert = BertModel(BertConfig(vocab_size=bert_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=64))
    captured = capture(bert, bert_tokenizer, "The cat sat on the mat.", text_pair="It was tired.")
    encoded = bert_tokenizer("The cat sat on the mat.", "It was tired.", return_tensors="pt")
    assert captured.tokens == bert_tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    assert captured.tokens[0] == "[CLS]" and captured.tokens.count("[SEP]") == 2
    expected = eager_attentions(bert, **encoded)  # with its token types: sentence B embedded as B
    torch.testing.assert_close(captured.weights(), expected, atol=1e-5, rtol=0)
    assert captured.weights().triu(1).any()  # an encoder: every token sees every token
    assert captured.replay.passed


def test_models_observed_by_hooks_and_encoder_decoders(gpt_tokenizer, bert_tokenizer):
    """GPT-Neo computes attention in its own code (attnviz reads it by hooks, on eager attention); T5 has three
    attentions, each compared with transformers' own."""
    torch.manual_seed(3)
    neo = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=4096, hidden_size=32, num_layers=2, num_heads=4, window_size=4,
                                         attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
                                         bos_token_id=0, eos_token_id=0))
    captured = capture(neo, gpt_tokenizer, TEXT)
    assert captured.bundle.capture_path == "hooks" and captured.replay.passed
    ids = gpt_tokenizer(TEXT, return_tensors="pt")["input_ids"]
    torch.testing.assert_close(captured.weights(), eager_attentions(neo, input_ids=ids), atol=1e-5, rtol=0)

    torch.manual_seed(4)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=bert_tokenizer.vocab_size, d_model=32, d_kv=8, num_heads=4,
                                             num_layers=2, d_ff=64, decoder_start_token_id=0))
    captured = capture(t5, bert_tokenizer, "The cat sat on the mat.")
    assert captured.kinds == ["encoder", "decoder", "cross"] and captured.kind == "encoder"
    encoded = bert_tokenizer("The cat sat on the mat.", return_tensors="pt")
    t5.set_attn_implementation("eager")
    t5.eval()
    with torch.no_grad():
        outputs = t5(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                     decoder_input_ids=encoded["input_ids"], output_attentions=True)  # the text is its own target
    for kind, expected in (("encoder", outputs.encoder_attentions), ("decoder", outputs.decoder_attentions),
                           ("cross", outputs.cross_attentions)):
        torch.testing.assert_close(captured.weights(kind=kind), torch.stack(expected)[:, 0], atol=1e-5, rtol=0)
    assert captured.replay.passed


def test_a_bundled_model_by_its_name_or_a_start_of_it_and_a_folder():
    captured = capture("tiny GPT", TEXT)  # the second argument is the text: the checkpoint has its tokenizer
    assert captured.model_name == BUNDLED_GPT_NAME
    model = AutoModel.from_pretrained(BUNDLED_GPT_DIR, attn_implementation="eager", local_files_only=True,
                                      use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    torch.testing.assert_close(captured.weights(), eager_attentions(model, input_ids=ids), atol=1e-5, rtol=0)
    again = capture("TINY gpt", text=TEXT)  # any case; loaded once per process
    assert again.bundle is captured.bundle
    assert capture("all-minilm", text="A cat.").model_name == DEFAULT_MODEL_NAME
    from_folder = capture(str(BUNDLED_GPT_DIR), text=TEXT, name="my GPT")
    assert from_folder.model_name == "my GPT"
    torch.testing.assert_close(from_folder.weights(), captured.weights(), atol=1e-6, rtol=0)
    assert capture(BUNDLED_GPT_DIR, text=TEXT).n_tokens == captured.n_tokens


def test_bundle_of_an_in_memory_model_is_never_saved(gpt_tokenizer):
    model = tiny_gpt2(seed=5)
    bundle = bundle_of(model, gpt_tokenizer)
    assert isinstance(bundle, ModelBundle) and bundle.model is model and bundle.tokenizer is gpt_tokenizer
    assert bundle.folder.parent == IN_MEMORY_FOLDER and not bundle.folder.exists()
    assert (bundle.model_type, bundle.architecture, bundle.n_layers, bundle.n_heads) == ("gpt2", "decoder", 2, 4)
    assert bundle.capture_path == "interface" and bundle.max_positions == 64
    # switched for good, so that attnviz's own functions can capture it from the bundle
    assert model.config._attn_implementation == "attnviz" and not model.training
    result = capture_bundle(bundle, TEXT)
    ids = gpt_tokenizer(TEXT, return_tensors="pt")["input_ids"]
    expected = eager_attentions(model, input_ids=ids)
    torch.testing.assert_close(result.records["self"].every_layer_weights(), expected, atol=1e-5, rtol=0)
    assert bundle_of(bundle) is bundle
    assert isinstance(capture(bundle, text=TEXT), Captured)


def test_the_replay_check_can_wait(gpt_tokenizer):
    captured = capture(tiny_gpt2(seed=6), gpt_tokenizer, TEXT, check_replay=False)
    assert "replay not run yet" in repr(captured)
    assert captured.replay.passed and "replay passed" in repr(captured)


class NotFromTransformers(GPT2Model):
    """A class written around a checkpoint, as trust_remote_code would run one."""


@pytest.mark.parametrize("build, expected", [
    (lambda: NotFromTransformers(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=4096)),
     "not in transformers"),
    (lambda: GPTBigCodeModel(GPTBigCodeConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=4096)),
     "no record of model type 'gpt_bigcode'"),
    (lambda: ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                image_size=32, patch_size=16)), "reads images"),
], ids=["remote-code class", "unknown type", "vision"])
def test_models_it_cannot_read_are_refused_with_the_reason(gpt_tokenizer, build, expected):
    model = build()
    with pytest.raises(ValueError, match=expected):
        capture(model, gpt_tokenizer, TEXT)
    with pytest.raises(ValueError, match=expected):
        bundle_of(model, gpt_tokenizer)


def test_missing_or_wrong_arguments_are_named(gpt_tokenizer):
    model = tiny_gpt2(seed=7)
    with pytest.raises(TypeError, match="needs its tokenizer"):
        capture(model, text=TEXT)
    with pytest.raises(TypeError, match="needs its tokenizer"):
        bundle_of(model)
    with pytest.raises(TypeError, match="needs text"):
        capture(model, gpt_tokenizer)
    for empty in ("", "   \n"):
        with pytest.raises(ValueError, match="text is empty"):
            capture(model, gpt_tokenizer, empty)
    with pytest.raises(TypeError, match="text must be a string"):
        capture(model, gpt_tokenizer, ["a", "list"])
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer"):
        capture(model, "not a tokenizer", TEXT)
    with pytest.raises(TypeError, match="text_pair="):
        capture("tiny GPT", "A first sentence.", "A second one.")
    with pytest.raises(TypeError, match="a transformers model"):
        capture(torch.nn.Linear(2, 2), gpt_tokenizer, TEXT)
    with pytest.raises(ValueError, match="neither a folder nor a bundled model's name.*tiny GPT"):
        capture("no such model", text=TEXT)
    with pytest.raises(ValueError, match="is not a folder"):
        from pathlib import Path

        capture(Path("/no/such/folder"), text=TEXT)
    captured = capture(model, gpt_tokenizer, TEXT)
    with pytest.raises(ValueError, match="layers 0 to 1"):
        captured.weights(2)
    with pytest.raises(ValueError, match="heads 0 to 3"):
        captured.check_head(4)
    with pytest.raises(ValueError, match="no 'cross' attention"):
        captured.weights(0, kind="cross")
