"""Capture through transformers' attention interface: every score modifier and mask kind recorded, replayed
weights equal to transformers' own eager weights (output_attentions=True), and sessions that never see each
other's calls."""

import threading

import pytest
import torch

from attnviz.models.attention_hook import ATTENTION_NAME, recording
from attnviz.models.capture import _to_cpu, capture, record_from_calls
from attnviz.models.loading import load_model_dir
from attnviz.models.replay_check import replay_difference
from tests.test_models import eager_attentions
from tests.tiny_models import VOCAB, make_tiny_checkpoint

TEXT = "the quick brown fox jumps over the lazy dog again"


def _config(kind: str):
    from transformers import Gemma2Config, GptOssConfig, MistralConfig

    if kind == "mistral":  # a sliding window of 4 keys, shorter than the text
        return MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                             max_position_embeddings=64)
    if kind == "gemma2":  # logit soft-capping, and sliding and full layers alternating
        return Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                            attn_logit_softcapping=5.0, max_position_embeddings=64)
    if kind == "gpt_oss":  # attention sinks
        return GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                            num_experts_per_tok=1, sliding_window=4, max_position_embeddings=64)
    raise ValueError(kind)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return lambda kind: tiny_checkpoint(kind, config=_config(kind), label=f"{kind}-modifiers")


@pytest.mark.parametrize("kind", ["mistral", "gemma2", "gpt_oss"])
def test_windows_softcaps_and_sinks_replay_to_transformers_eager_weights(checkpoint, kind):
    folder = checkpoint(kind)
    bundle = load_model_dir(folder)
    record = capture(bundle, TEXT).records["self"]
    assert record.n_q > 4  # longer than the window, so the window matters
    reference = eager_attentions(folder, bundle, TEXT)["self"]
    torch.testing.assert_close(record.weights, reference, atol=1e-5, rtol=0)
    assert replay_difference(record) < 1e-5
    if kind in ("mistral", "gemma2"):
        assert record.layer_masks[0].rule.window == (3, 0)  # the window is recorded as a rule, not N x N
    if kind == "gemma2":
        assert record.softcaps == [5.0, 5.0] and record.layer_masks[1].rule.window is None  # a full layer
    if kind == "gpt_oss":
        assert record.sinks[0].shape == (4,)
        assert float(record.weights.sum(-1).max()) < 1.0  # the sink takes a share of every row


def test_padding_is_recorded_from_the_models_own_mask(tmp_path):
    """A left-padded batch through the recorder: the padded columns are masked exactly as transformers masks them."""
    from transformers import AutoModel

    folder = make_tiny_checkpoint("llama", tmp_path / "llama")
    bundle = load_model_dir(folder)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    with torch.no_grad(), recording(bundle.model) as recorder:
        bundle.model(input_ids=ids, attention_mask=attention_mask)
    tokens = [str(i) for i in ids[0].tolist()]
    record = record_from_calls("self", [_to_cpu(c) for c in recorder.calls], tokens, tokens)
    assert record.layer_masks[0].rule is None and not record.mask_rows(0)[:, :2].any()  # pads never attended
    reference = AutoModel.from_pretrained(folder, attn_implementation="eager", local_files_only=True).eval()
    with torch.no_grad():
        eager = reference(input_ids=ids, attention_mask=attention_mask, output_attentions=True).attentions
    for layer in range(record.n_layers):
        torch.testing.assert_close(record.layer_weights(layer)[:, 2:], eager[layer][0, :, 2:], atol=1e-5, rtol=0)


def test_sessions_capture_at_once_and_never_see_each_others_calls():
    from tests.tiny_models import bundled_bert

    bundle = bundled_bert()
    assert bundle.model.config._attn_implementation == ATTENTION_NAME
    texts = {0: "one two three", 1: " ".join(["word"] * 40)}
    results, errors = {}, []
    start = threading.Barrier(2)

    def run(index):
        try:
            start.wait()
            for _ in range(5):
                result = capture(bundle, texts[index])
                results.setdefault(index, []).append(len(result.tokens))
                assert result.records["self"].n_layers == 6  # exactly its own calls: 6 layers, no more
        except Exception as problem:  # noqa: BLE001 - reported below
            errors.append(problem)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert set(results[0]) == {5} and set(results[1]) == {42}  # [CLS] + words + [SEP], each its own


def test_capture_changes_nothing_global():
    import transformers.models.bert.modeling_bert as modeling_bert

    from tests.tiny_models import bundled_bert

    before = modeling_bert.eager_attention_forward
    capture(bundled_bert(), "nothing is patched")
    assert modeling_bert.eager_attention_forward is before


def test_word_order_experiment_leaves_the_shared_model_untouched():
    from attnviz.interventions.word_order import word_order_experiment
    from tests.tiny_models import bundled_bert

    bundle = bundled_bert()
    table = bundle.model.embeddings.position_embeddings.weight.detach().clone()
    result = word_order_experiment(bundle, "the cat sat on the mat", seed=3)
    assert result["max_difference"] < 1e-5
    assert torch.equal(bundle.model.embeddings.position_embeddings.weight, table)  # silenced, never zeroed
    again = capture(bundle, "the cat sat on the mat").records["self"]
    assert replay_difference(again) < 1e-5  # positions are back for everyone else
