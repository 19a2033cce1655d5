"""The bundled tiny GPT and the Generation page's computations: shipped weights that learned real circuits,
sampling, the KV cache against no cache, each step's attention against a full forward pass, Paged and Ring
attention on the model's own tensors."""

import json

import pytest
import torch

from attnviz.core import circuits
from attnviz.core.units import human_bytes
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME, bundled_models
from attnviz.models.with_heads import load_causal_lm
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.pagelogic.generation import reading as reading
from attnviz.pagelogic.generation import systems as gen_systems

PROMPT = "The for statement is used to iterate over the elements of a sequence"


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(BUNDLED_GPT_DIR)


def test_the_bundled_gpt_ships_as_a_checkpoint_any_user_can_load():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert bundled_models()[BUNDLED_GPT_NAME] == BUNDLED_GPT_DIR
    weights = BUNDLED_GPT_DIR / "model.safetensors"
    assert weights.stat().st_size <= 20 * 2**20
    model = AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR, local_files_only=True)
    config = model.config
    assert config.num_hidden_layers in (2, 3, 4) and config.hidden_size <= 256
    assert config.max_position_embeddings == 256
    assert tokenizer.decode(tokenizer(PROMPT)["input_ids"]) == PROMPT  # byte-level BPE: lossless
    card = (BUNDLED_GPT_DIR / "README.md").read_text()
    report = json.loads((BUNDLED_GPT_DIR / "training.json").read_text())
    for words in ("Data", "pydoc_data", "Training", "steps", "Final loss", "Licence", "PSF"):
        assert words in card
    assert f"{report['held_out_loss']:.3f}" in card and str(report["recipe"]["steps"]) in card
    # 20 minutes on the 2-core machine that trained the model shipped until 2026-12-06 (16.3); the same recipe's
    # steps take 26.6 on the slower 2-core machine that made the run shipped now (docs/benchmarks.md, 2026-12-06)
    assert report["seconds"] <= 30 * 60


def test_it_learned_a_previous_token_head_and_an_induction_head(tiny):
    model, tokenizer = tiny
    report = gen_heads.bundled_training_report()
    found = {head.name: head for head in gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text(),
                                                           pool=report["repeat_token_ids"])}
    assert found["induction head"].score >= 0.4
    previous = found["previous-token head"]
    assert previous.layer == 0 and previous.score >= 0.5
    # The page, the card and training.json give the same number.
    recorded = report["circuits"]["previous_token"][previous.layer][previous.head]
    assert previous.score == pytest.approx(recorded, abs=1e-4)
    assert f"{recorded:.3f}" in (BUNDLED_GPT_DIR / "README.md").read_text()
    # Measured again here, independently, on every window of the held-out text (the page uses four), each the
    # whole context long: the head holds in the context's second half too.
    context = model.config.n_positions
    ids = tokenizer(gen_heads.held_out_text(), return_tensors="pt")["input_ids"][0]
    with torch.no_grad():
        on_previous = torch.stack([torch.diagonal(model(input_ids=ids[s : s + context][None], output_attentions=True)
                                                  .attentions[0][0, previous.head], offset=-1)
                                   for s in range(0, len(ids) - context, context)])  # [windows, context - 1]
    assert len(on_previous) > 50 and float(on_previous.mean()) >= 0.5  # w[i, i-1] for i >= 1
    assert float(on_previous[:, context // 2:].mean()) >= 0.5
    # Measured again here, independently, with transformers' own eager weights on fresh random tokens.
    induction = found["induction head"]
    tokens = circuits.repeated_random_tokens(30, seed=7, pool=report["repeat_token_ids"],
                                             prefix=[tokenizer.bos_token_id])
    with torch.no_grad():
        attentions = model(input_ids=torch.tensor([tokens]), output_attentions=True).attentions
    weights = attentions[induction.layer][0, induction.head]
    second_half = range(31, 61)
    assert sum(float(weights[i, i - 29]) for i in second_half) / 30 >= 0.4
    # The held-out text (the card's loss, the previous-token score) is the documentation's end, not trained on.
    from attnviz.tiny_gpt.text import documentation_text

    held_out, text = gen_heads.held_out_text(), documentation_text()
    assert len(held_out) > 10_000 and text.endswith(held_out) and held_out[:300] not in text[: -len(held_out)]


def test_every_position_of_the_context_was_trained(tiny):
    """Learned positions that no training sequence reaches stay near their random start: a model trained on
    sequences shorter than its context loses its way past them. On held-out text, the second half of the context
    predicts at least as well as the first (it has more to read), and the induction head still copies there."""
    model, tokenizer = tiny
    context = model.config.n_positions
    ids = tokenizer(gen_heads.held_out_text(), return_tensors="pt")["input_ids"][0]
    windows = torch.stack([ids[s : s + context] for s in range(0, len(ids) - context, context)])  # [w, context]
    with torch.no_grad():
        logits = model(input_ids=windows).logits  # [w, context, vocab]
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), windows[:, 1:], reduction="none")
    first, second = float(losses[:, : context // 2].mean()), float(losses[:, context // 2:].mean())
    assert second <= first + 0.05, (first, second)
    report = gen_heads.bundled_training_report()
    period = (context - 1) // 2  # the second copy fills the context's end
    tokens = circuits.repeated_random_tokens(period, seed=11, pool=report["repeat_token_ids"],
                                             prefix=[tokenizer.bos_token_id])
    with torch.no_grad():
        attentions = model(input_ids=torch.tensor([tokens]), output_attentions=True).attentions
    induction = max(((layer, head) for layer in range(len(attentions)) for head in range(attentions[0].shape[1])),
                    key=lambda lh: float(circuits.induction_score(attentions[lh[0]][0, lh[1]], period, start=1)))
    assert float(circuits.induction_score(attentions[induction[0]][0, induction[1]], period, start=1)) >= 0.4


def test_sampling_distributions():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])
    greedy = gen.sampling_distribution(logits, gen.Sampling("greedy"))
    assert greedy.tolist() == [0, 0, 0, 0, 1]
    plain = gen.sampling_distribution(logits, gen.Sampling("sample", 1.0))
    torch.testing.assert_close(plain, torch.softmax(logits.double(), 0))
    hot = gen.sampling_distribution(logits, gen.Sampling("sample", 2.0))
    torch.testing.assert_close(hot, torch.softmax(logits.double() / 2, 0))
    top2 = gen.sampling_distribution(logits, gen.Sampling("sample", 1.0, top_k=2))
    assert (top2 > 0).tolist() == [True, False, False, False, True] and float(top2.sum()) == pytest.approx(1)
    tied = gen.sampling_distribution(torch.tensor([1.0, 1.0, 1.0, 0.0]), gen.Sampling("sample", 1.0, top_k=2))
    assert int((tied > 0).sum()) == 2 and tied.max() == pytest.approx(0.5)  # k tokens, even among equals
    nucleus = gen.sampling_distribution(logits, gen.Sampling("sample", 1.0, top_p=0.7))
    kept = plain[nucleus > 0]
    assert float(kept.sum()) >= 0.7 and float(kept.sum() - kept.min()) < 0.7  # the smallest set reaching p
    with pytest.raises(ValueError, match="temperature"):
        gen.sampling_distribution(logits, gen.Sampling("sample", 0.0))


def test_the_generation_config_is_followed_as_model_generate_follows_it(seq2seq):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(seq2seq["bart"])
    model.generation_config.forced_bos_token_id = 1037  # as mBART-50 forces its target language
    model.generation_config.suppress_tokens = [2, 3000]  # and Marian never writes its padding
    model.generation_config.forced_eos_token_id = None  # (a rule for beam search's last step; not shown here)
    result = gen.generate(model, tokenizer, PROMPT, 4, gen.Sampling("greedy"))
    assert result.steps[0].token_id == 1037 and len(result.steps) == 4
    assert not {2, 3000} & {s.token_id for s in result.steps}
    with torch.no_grad():
        expected = model.generate(tokenizer(PROMPT, return_tensors="pt")["input_ids"], max_new_tokens=4,
                                  do_sample=False, num_beams=1, eos_token_id=None)
    assert expected[0, 1:].tolist() == [s.token_id for s in result.steps]  # transformers' own generate
    # The forced and suppressed tokens are -inf with and without the cache: compared only where finite.
    uncached = gen.generate(model, tokenizer, PROMPT, 4, gen.Sampling("greedy"), use_cache=False)
    same, difference = gen.cache_agreement(result, uncached)
    assert same and 0 <= difference < 1e-4
    float64 = gen.float64_cache_agreement(model, tokenizer, PROMPT, 4, gen.Sampling("greedy"))
    assert float64[0] and float64[1] <= 1e-10
    assert 0 < gen.largest_logit(result) < float("inf")
    model.config.decoder_start_token_id = None
    model.generation_config.decoder_start_token_id = None
    assert gen.decoder_start_token(model) == model.generation_config.bos_token_id


def test_the_cache_changes_nothing_but_the_work(tiny):
    model, tokenizer = tiny
    sampling = gen.Sampling("sample", 0.9, top_k=50, seed=3)
    cached = gen.generate(model, tokenizer, PROMPT, 8, sampling)
    again = gen.generate(model, tokenizer, PROMPT, 8, sampling)
    uncached = gen.generate(model, tokenizer, PROMPT, 8, sampling, use_cache=False)
    assert [s.token_id for s in cached.steps] == [s.token_id for s in again.steps]  # seeded
    same, difference = gen.cache_agreement(cached, uncached)
    assert same and difference < 1e-4  # fp32 rounding of two different orders of summation
    same, difference = gen.float64_cache_agreement(model, tokenizer, PROMPT, 8, sampling)  # what the page shows
    assert same and difference <= 1e-10  # the issue asks 1e-5: in float64 nothing but rounding is left
    assert next(model.parameters()).dtype == torch.float32  # checked on a copy


def test_runs_that_stop_at_different_lengths_are_not_the_same(tiny):
    model, tokenizer = tiny
    longer = gen.generate(model, tokenizer, PROMPT, 4, gen.Sampling("greedy"))
    shorter = gen.generate(model, tokenizer, PROMPT, 3, gen.Sampling("greedy"))
    assert gen.cache_agreement(longer, longer) == (True, 0.0)
    same, difference = gen.cache_agreement(longer, shorter)  # one stopped at its end-of-sequence token first
    assert not same and difference == 0.0  # the three steps both took agree


def test_the_float64_check_is_skipped_for_big_models(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(gen, "FLOAT64_CHECK_PARAMETERS", 1000)
    assert gen.float64_cache_agreement(model, tokenizer, PROMPT, 2, gen.Sampling("greedy")) is None


def test_each_steps_attention_is_the_last_row_of_a_full_forward_pass(tiny):
    model, tokenizer = tiny
    result = gen.generate(model, tokenizer, PROMPT, 5, gen.Sampling("greedy"))
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"][0].tolist() + [s.token_id for s in result.steps]
    with torch.no_grad():
        attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    for step in result.steps:
        expected = torch.stack([layer[0, :, step.position - 1, : step.position] for layer in attentions])
        torch.testing.assert_close(step.attention, expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(step.attention.sum(-1), torch.ones(expected.shape[:2]), atol=1e-5, rtol=0)
    last = result.steps[-1]
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads  # GPT-2: one per head
    assert last.cache_keys == [(1, kv_heads, last.position, head_dim)] * config.num_hidden_layers
    assert last.cache_bytes == 2 * config.num_hidden_layers * kv_heads * last.position * head_dim * 4
    assert last.cache_values == last.cache_keys and sum(last.layer_bytes) == last.cache_bytes
    table = reading.cache_table(last)
    assert [row["V shape"] for row in table] == [str(list(shape)) for shape in last.cache_values]
    assert table[0]["bytes (K and V)"] == human_bytes(last.cache_bytes // config.num_hidden_layers)
    timeline = reading.timeline(result, 0, 0)
    assert timeline.shape == (5, len(ids)) and (timeline[:, -1] != timeline[:, -1]).all()  # NaN: not there yet
    sink = reading.sink_mass(result)
    assert sink.shape == (5, config.num_hidden_layers, config.num_attention_heads)


def test_paged_and_ring_attention_on_the_models_own_tensors(tiny):
    model, tokenizer = tiny
    samples = [gen.generate(model, tokenizer, PROMPT, 10, gen.Sampling("sample", 1.0, seed=seed)) for seed in range(3)]
    demo = gen_systems.paged_demo(samples, layer=1, block_size=4, max_length=256)
    assert demo.identical
    report = demo.cache.memory(256)
    prompt = len(samples[0].prompt_tokens)
    assert report["logical_tokens"] == 3 * (prompt + 9)  # the last token's K/V is not cached yet
    assert report["tokens_stored"] < report["logical_tokens"]  # the prompt's full blocks are stored once
    for name, sample in zip(demo.names, samples, strict=True):
        keys, values = demo.cache.gather(name)
        assert torch.equal(keys, sample.kv[1][0]) and torch.equal(values, sample.kv[1][1])
    record = capture(load_model_dir(BUNDLED_GPT_DIR), PROMPT).records["self"]
    for devices in (2, 3, 8):
        difference, trace = gen_systems.ring_demo(record, 0, devices, causal=True)
        assert difference <= 1e-6 and len(trace.held) == devices


@pytest.fixture(scope="module")
def seq2seq(tiny_checkpoint):
    """Tiny random BART and T5 LMs (with the bundled BERT's tokenizer files), saved as a user's folder would be."""
    return {kind: tiny_checkpoint(kind, seq2seq_lm=True) for kind in ("bart", "t5")}


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoder_generates_with_cross_attention_and_both_caches(seq2seq, kind):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(seq2seq[kind])
    sampling = gen.Sampling("sample", 1.0, seed=1)
    result = gen.generate(model, tokenizer, PROMPT, 6, sampling)
    source = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    assert result.encoder_decoder and len(result.source_tokens) == source.shape[1]
    assert len(result.prompt_tokens) == 1  # the decoder's start token
    n = len(result.steps)  # up to 6: it stops after its end-of-sequence token
    assert 1 <= n <= 6 and (n == 6 or result.steps[-1].token_id == model.config.eos_token_id)
    # Each step's self- and cross-attention are the last rows of one full forward pass over what was written
    written = torch.tensor([[model.config.decoder_start_token_id] + [s.token_id for s in result.steps]])
    with torch.no_grad():
        full = model(input_ids=source, decoder_input_ids=written, output_attentions=True)
    for step in result.steps:
        expected = torch.stack([layer[0, :, step.position - 1, : step.position] for layer in full.decoder_attentions])
        torch.testing.assert_close(step.attention, expected, atol=1e-5, rtol=1e-4)
        cross = torch.stack([layer[0, :, step.position - 1] for layer in full.cross_attentions])
        torch.testing.assert_close(step.cross_attention, cross, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(step.cross_attention.sum(-1), torch.ones(cross.shape[:2]), atol=1e-5, rtol=0)
    last, config = result.steps[-1], model.config
    layers = config.num_hidden_layers if kind == "t5" else config.decoder_layers
    assert len(last.cache_keys) == layers and last.cache_keys[0][2] == last.position  # self: what was written
    assert last.cross_keys[0][2] == source.shape[1]  # cross: the encoder's K, one row per source token
    assert reading.cross_timeline(result, 0, 1).shape == (n, source.shape[1])
    assert "".join(result.pieces(tokenizer)) == tokenizer.decode([s.token_id for s in result.steps])
    # The same tokens and logits without the cache (fp64: within 1e-5; the bound)
    double = model.double()
    same, difference = gen.cache_agreement(gen.generate(double, tokenizer, PROMPT, 6, sampling),
                                           gen.generate(double, tokenizer, PROMPT, 6, sampling, use_cache=False))
    assert same and difference <= 1e-5
