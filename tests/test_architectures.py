"""Every model type attnviz lists as supported (attnviz.models.architectures, the one list the Checkpoints page and the
README show): a tiny random checkpoint made here, loaded like an upload, its attention compared with
transformers' own eager weights (an independent copy of the model, output_attentions=True)."""

import pytest
import torch

from attnviz.models import architectures, position_tables
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.models.record import NotReplayable
from attnviz.models.replay_check import replay_difference
from tests.test_models import eager_attentions

TEXT, PAIR = "The quick brown fox jumps over the lazy dog.", "A dog sleeps."
EXPECTED_KINDS = {"encoder": ["self"], "decoder": ["self"], "encoder-decoder": ["cross", "decoder", "encoder"]}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint


@pytest.mark.parametrize("kind", list(architectures.TESTED_MODEL_TYPES))
def test_every_listed_type_loads_and_matches_transformers_eager_weights(checkpoint, kind):
    folder = checkpoint(kind)
    bundle = load_model_dir(folder)
    assert bundle.model_type == kind
    assert bundle.capture_path == architectures.path_of(kind)
    assert bundle.architecture == architectures.TESTED_MODEL_TYPES[kind].split(",")[0]
    result = capture(bundle, TEXT, PAIR)
    assert sorted(result.kinds) == EXPECTED_KINDS[bundle.architecture]
    reference = eager_attentions(folder, bundle, TEXT, PAIR)
    for record in result.records.values():
        weights = record.weights
        torch.testing.assert_close(weights, reference[record.kind], atol=1e-5, rtol=0, msg=f"{kind} {record.kind}")
        # every layer at once (one batched softmax where it can) is each layer's own replay, stacked
        each_layer = torch.stack([record.layer_weights(layer) for layer in range(record.n_layers)])
        torch.testing.assert_close(weights, each_layer, atol=1e-6, rtol=0, msg=f"{kind} {record.kind}")
        if not any(sink is not None for sink in record.sinks):  # gpt-oss's sinks take a share of every row
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)
        if record.kind in ("decoder",) or (record.kind == "self" and bundle.architecture == "decoder"):
            assert torch.all(weights.triu(diagonal=1) == 0), f"{kind}: a decoder query saw a later key"
        if bundle.replayable:
            assert replay_difference(record) < 1e-5, f"{kind} {record.kind}"
            check_query_key_view(record, reference[record.kind], f"{kind} {record.kind}")
            check_scaling_panels(record, reference[record.kind], f"{kind} {record.kind}")
    assert (bundle.capture_note is None) == (bundle.capture_path == "interface")
    record = architectures.ARCHITECTURES[kind]
    table = position_tables.learned_position_table(bundle.model)  # where the record says the table is, or none
    assert (table is not None) == (record.position_table is not None), kind
    assert table is None or table[0].endswith(record.position_table)


def check_scaling_panels(record, eager: torch.Tensor, what: str) -> None:
    """What the Scaling page calls the model's head (its "model (× s)" panel, and temperature 1) is transformers'
    eager weights of that head, whatever the model adds to its scores (bias, soft-capping, sinks)."""
    from attnviz.pagelogic.scaling import real_head_scalings

    layer, head = record.n_layers - 1, record.n_heads - 1
    model, _, at_one = real_head_scalings(record, layer, head, 1.0).values()
    torch.testing.assert_close(model, eager[layer, head], atol=1e-5, rtol=0, msg=what)
    torch.testing.assert_close(at_one, model, atol=1e-6, rtol=0, msg=what)


def check_query_key_view(record, eager: torch.Tensor, what: str) -> None:
    """The Q·K view of the last layer's last head, for the last query and the first and last keys its mask
    allows (a sliding window may hide key 0): q·k is the dot product of the recorded vectors; without soft-capping
    or a position bias the score is q·k times the scaling; the weights are transformers' eager row; and the two
    scores differ by the log of the two eager weights' ratio (a softmax's only degree of freedom, sinks or not)."""
    from attnviz.pagelogic.explore_heads.qk import query_key, query_key_figures

    layer, head = record.n_layers - 1, record.n_heads - 1
    query = record.n_q - 1
    allowed = record.mask_rows(layer, query, query + 1)[0].nonzero().flatten().tolist()
    start, own = allowed[0], allowed[-1]
    first, mine = (query_key(record, layer, head, query, key) for key in (start, own))
    q = record.queries[layer, head, query].float()
    key = record.keys[layer, record.kv_head(head), start].float()
    assert first.dot == pytest.approx(float(q @ key), rel=1e-5, abs=1e-6)
    plain = not (record.softcaps and record.softcaps[layer]) and record.bias_rows(layer) is None
    if plain:
        assert first.score == pytest.approx(first.dot * first.scale, rel=1e-5, abs=1e-6), what
    row = eager[layer, head, query]
    torch.testing.assert_close(first.weights, row, atol=1e-5, rtol=0, msg=what)
    expected = torch.log(row[own].double() / row[start].double())
    assert mine.score - first.score == pytest.approx(float(expected), abs=1e-3), what
    _, _, caption = query_key_figures(mine, record, layer, head, query, own)
    has_sinks = bool(record.sinks and record.sinks[layer] is not None)
    assert f"{mine.dot:.4g}" in caption and ("sink" in caption) == has_sinks


def test_the_readme_and_checkpoints_page_show_the_tested_list():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert architectures.supported_markdown() in readme
    assert len(architectures.TESTED_MODEL_TYPES) >= 33
    paths = {architectures.path_of(kind) for kind in architectures.TESTED_MODEL_TYPES}
    assert paths == {"interface", "hooks", "weights"}


def test_the_records_are_the_one_list_of_what_attnviz_knows_per_type():
    from pathlib import Path

    records = architectures.RECORDS
    assert len({record.model_type for record in records}) == len(records) == len(architectures.ARCHITECTURES)
    listed = [record for record in records if record.listed]
    tested = list(architectures.TESTED_MODEL_TYPES) + list(architectures.TESTED_VISION_TYPES)
    assert tested == [r.model_type for r in listed]
    for record in records:
        positions_in_a_table = record.positions in ("learned", "sinusoidal", "learned + relative")
        assert record.position_table is None or positions_in_a_table, record.model_type
        assert (record.vision_tower is not None) <= (record.role == "vision")
    # No other module names a model type: loading, capture, eager, vision and positions ask the records (the
    # checkpoint checks sit below models and keep their own list of layer-sharing types, checked against the
    # records by test_the_checkpoint_checks_know_which_types_share_their_layers)
    package = Path(__file__).resolve().parents[1] / "attnviz"
    sources = {name: (package / name).read_text() for name in (
        "models/loading.py", "models/capture.py", "models/eager.py",
        "models/record.py", "models/scoring.py", "core/vision.py", "core/positional.py")}
    for record in records:
        for name, source in sources.items():
            assert f'"{record.model_type}"' not in source, f"{name} names {record.model_type}: use its record"


def test_a_changed_record_changes_how_a_type_is_loaded_and_captured(checkpoint, monkeypatch):
    from dataclasses import replace

    mpnet = architectures.ARCHITECTURES["mpnet"]
    assert load_model_dir(checkpoint("mpnet")).capture_path == "hooks"
    monkeypatch.setitem(architectures.ARCHITECTURES, "mpnet", replace(
        mpnet, adapter=None, weights_only_reason="a test took its adapter away", position_table=None))
    bundle = load_model_dir(checkpoint("mpnet"))
    assert bundle.capture_path == "weights" and "a test took its adapter away" in bundle.capture_note
    assert not capture(bundle, TEXT).records["self"].replayable
    assert position_tables.learned_position_table(bundle.model) is None

    bert = architectures.ARCHITECTURES["bert"]
    monkeypatch.setitem(architectures.ARCHITECTURES, "bert",
                        replace(bert, role="decoder", positions_after_padding=True))
    bundle = load_model_dir(checkpoint("bert"))
    assert bundle.architecture == "decoder" and bundle.max_positions == 64 - 1  # after the padding row (id 0)


def test_a_record_names_its_cross_attention_and_image_prefix(monkeypatch):
    from dataclasses import replace

    assert architectures.attention_kind("decoder.layers.1.encoder_attn", "bart", True) == "cross"
    assert architectures.attention_kind("decoder.block.0.layer.1.EncDecAttention", "t5", True) == "cross"
    assert architectures.attention_kind("encoder.layers.0.self_attn", "bart", True) == "encoder"
    assert architectures.attention_kind("decoder.layers.0.self_attn", "bart", False) == "self"
    monkeypatch.setitem(architectures.ARCHITECTURES, "bart", replace(architectures.ARCHITECTURES["bart"],
                                                               cross_attention=("source_attn",)))
    assert architectures.attention_kind("decoder.layers.1.encoder_attn", "bart", True) == "decoder"
    assert architectures.attention_kind("decoder.layers.1.source_attn", "bart", True) == "cross"
    assert architectures.attention_kind("decoder.layers.1.encoder_attn", "no-record", True) == "cross"  # the convention
    assert architectures.image_prefix("deit") == ("[CLS]", "[DIST]")
    assert architectures.image_prefix("no-record") == ("[CLS]",)


def test_bloom_alibi_is_recorded_as_a_score_bias_and_replay_needs_it(checkpoint):
    from dataclasses import replace

    from attnviz.core import positional
    from attnviz.pagelogic.positional import model_alibi

    record = capture(load_model_dir(checkpoint("bloom")), TEXT).records["self"]
    assert record.replayable and record.bias is not None
    # The bias is the paper's: slope m_h times the key position, the same for every query
    own = model_alibi(record, 0, 1)
    assert own is not None and own["matches_paper"]
    torch.testing.assert_close(own["slopes"], positional.alibi_slopes(4))
    n = record.n_q
    distance = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # j - i
    seen = torch.ones(n, n, dtype=torch.bool).tril()  # causal: the bias is shown where the model attends
    torch.testing.assert_close(own["bias"].double()[seen], (own["slopes"][1] * distance)[seen], atol=1e-5, rtol=0)
    assert own["bias"][~seen].isnan().all()
    without = replace(record, biases=[None] * record.n_layers, memo={}).weights
    assert (without - record.weights).abs().max() > 1e-3  # ALiBi changes the weights: replay must apply it
    # and the what-if works on it: no scaling changes the weights, like any replayable model
    assert (record.layer_weights(0, scale=1.0) - record.weights[0]).abs().max() > 1e-4


def test_a_relative_bias_is_not_taken_for_alibi(checkpoint):
    from attnviz.pagelogic.positional import model_alibi

    record = capture(load_model_dir(checkpoint("mpnet")), TEXT).records["self"]
    assert record.bias is not None  # MPNet's relative position bias, read by the hooks
    assert model_alibi(record, 0, 0) is None


def test_gpt_neo_local_layers_keep_their_window(checkpoint):
    from attnviz.core import masks

    record = capture(load_model_dir(checkpoint("gpt_neo")), TEXT).records["self"]
    n = record.n_q
    assert torch.equal(record.mask_rows(0), masks.causal(n, n))  # layer 0: global
    window = masks.MaskSpec(n, n, causal=True, window=(3, 0)).dense()  # layer 1: local, 4 keys with itself
    assert torch.equal(record.mask_rows(1), window)
    assert record.scales == [1.0, 1.0]  # GPT-Neo does not scale its scores


def test_the_weights_path_says_what_it_cannot_do(checkpoint):
    bundle = load_model_dir(checkpoint("deberta-v2"))
    assert not bundle.replayable and "DeBERTa" in bundle.capture_note and "not available" in bundle.capture_note
    record = capture(bundle, TEXT).records["self"]
    assert not record.replayable
    with pytest.raises(NotReplayable):
        record.scores(0)
    with pytest.raises(NotReplayable):
        record.layer_weights(0, scale=1.0)
    with pytest.raises(NotReplayable):
        replay_difference(record)
    # A mask that only takes keys away is exact without Q and K: the model's softmax renormalised over them
    n = record.n_q
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    restricted = record.layer_weights(0, mask=keep)
    expected = record.weights[0] * keep / (record.weights[0] * keep).sum(-1, keepdim=True)
    torch.testing.assert_close(restricted, expected)
    mpt = capture(load_model_dir(checkpoint("mpt")), TEXT).records["self"]  # a decoder on the weights path
    with pytest.raises(NotReplayable):  # a causal model's mask cannot be widened without its Q and K
        mpt.layer_weights(0, mask=torch.ones(mpt.n_q, mpt.n_k, dtype=torch.bool))


def test_eager_paths_cap_the_input_where_every_layers_weights_fit(checkpoint, monkeypatch):
    from attnviz.models import record

    assert record.dense_token_limit(24, 16) == 456  # sqrt(80M / 384)
    assert record.dense_token_limit(2, 4) == 1024
    bundle = load_model_dir(checkpoint("mpt"))
    assert bundle.capture_path == "weights"
    monkeypatch.setattr(record, "DENSE_CELLS", 2 * 4 * 10 * 10)
    result = capture(bundle, " ".join(["word"] * 40))
    assert len(result.tokens) == 10 and result.truncated


@pytest.mark.parametrize("kind,reason", [("longformer", "not \\[batch, heads, n, n\\]"),
                                         ("mamba", "no attention weights")])
def test_a_model_whose_weights_cannot_be_drawn_is_refused_when_added(tmp_path, kind, reason):
    from transformers import AutoConfig, AutoModel

    from attnviz.checkpoints.safety import CheckpointRefused

    sizes = {"longformer": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                attention_window=4, max_position_embeddings=66, vocab_size=100),
             "mamba": dict(hidden_size=32, num_hidden_layers=1, state_size=4, vocab_size=100)}[kind]
    AutoModel.from_config(AutoConfig.for_model(kind, **sizes)).save_pretrained(tmp_path / kind)
    with pytest.raises(CheckpointRefused, match=f"cannot show this model: {kind} .*{reason}"):
        load_model_dir(tmp_path / kind)


def test_xlnet_is_not_taken_for_a_decoder(tmp_path):
    from transformers import XLNetConfig, XLNetModel

    XLNetModel(XLNetConfig(vocab_size=100, d_model=32, n_layer=1, n_head=4, d_inner=64)).save_pretrained(
        tmp_path / "xlnet")
    bundle = load_model_dir(tmp_path / "xlnet")
    assert bundle.architecture == "encoder"
    record = capture(bundle, "bidirectional by default").records["self"]
    assert not record.layer_masks[0].is_causal  # read from its weights, not assumed


def test_bloom_alibi_is_found_in_bf16_too(tmp_path):
    from transformers import AutoModel

    from attnviz.bench.tiny import tiny_config
    from attnviz.pagelogic.positional import model_alibi

    torch.manual_seed(0)
    AutoModel.from_config(tiny_config("bloom")).to(torch.bfloat16).save_pretrained(tmp_path / "bloom-bf16")
    bundle = load_model_dir(tmp_path / "bloom-bf16")
    assert bundle.dtype == "bfloat16"
    record = capture(bundle, " ".join(["word"] * 40)).records["self"]
    own = model_alibi(record, 0, 0)
    assert own is not None and own["matches_paper"]  # within bf16's rounding of the stored bias


def test_sessions_capturing_one_hooked_model_at_once_never_see_each_others_calls(checkpoint):
    import threading

    bundle = load_model_dir(checkpoint("gpt_neo"))
    texts = [f"thread {i}: " + " ".join(["word"] * (3 + 4 * i)) for i in range(4)]
    results, problems = {}, []
    start = threading.Barrier(len(texts))

    def work(text):
        try:
            start.wait()
            for _ in range(3):
                record = capture(bundle, text).records["self"]
                assert record.n_layers == 2 and record.n_q == len(bundle.tokenizer(text)["input_ids"])
                assert replay_difference(record) < 1e-5
            results[text] = record
        except Exception as problem:  # noqa: BLE001 - reported below
            problems.append(repr(problem))

    threads = [threading.Thread(target=work, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not problems, problems
    assert len(results) == len(texts)


def test_the_word_order_experiment_says_why_it_cannot_run_on_a_hooked_model(checkpoint):
    from attnviz.interventions.word_order import word_order_experiment

    bundle = load_model_dir(checkpoint("mpnet"))  # an encoder with a learned position table, read by hooks
    with pytest.raises(ValueError, match="mpnet does not use"):
        word_order_experiment(bundle, "the cat sat on the mat")


def test_the_checkpoint_checks_know_which_types_share_their_layers():
    """The intake checks (below the models layer) keep their own list of layer-sharing types: the records agree."""
    from attnviz.checkpoints.config_numbers import LAYER_SHARING_TYPES

    assert {record.model_type for record in architectures.RECORDS if record.shared_layers} == LAYER_SHARING_TYPES
