"""The Generation page on decoders whose attention is not a plain softmax over every earlier token: sliding windows
shorter than the prompt (gpt-oss, Mistral, Gemma 3), learned sinks (gpt-oss), and heads that are not circuits
(an untrained model). Each statement is checked against the model's own full forward pass."""

import numpy as np
import pytest
import torch

from attnviz.core import circuits
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.pagelogic.generation import reading as reading
from attnviz.pagelogic.generation import systems as gen_systems
from tests.apptest_helpers import assert_no_failure, figure_titled, open_page, plotly_array

WINDOW = 4
PROMPT = "the cat sat on the mat and then it slept"  # 12 tokens with [CLS] and [SEP]: three windows long
NEW = 6


def _causal_lm(kind: str, folder, **changes):
    from transformers import AutoModelForCausalLM

    from attnviz.bench.tiny import copy_tokenizer
    from tests.tiny_models import tiny_config

    config = tiny_config(kind)
    for name, value in changes.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    copy_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    root = tmp_path_factory.mktemp("windows")
    return {
        "gpt_oss": _causal_lm("gpt_oss", root / "tiny-gpt-oss", sliding_window=WINDOW),  # sliding, full, sinks
        "mistral": _causal_lm("mistral", root / "tiny-mistral", sliding_window=WINDOW),  # every layer slides
        "gemma3_text": _causal_lm("gemma3_text", root / "tiny-gemma3", sliding_window=WINDOW,
                                  layer_types=["sliding_attention", "full_attention"]),
        "gpt2": _causal_lm("gpt2", root / "tiny-gpt2"),  # untrained: no circuits
    }


@pytest.mark.parametrize("kind", ["gpt_oss", "mistral", "gemma3_text"])
def test_each_step_is_placed_at_its_absolute_key_positions(windowed, kind):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed[kind])
    result = gen.generate(model, tokenizer, PROMPT, NEW, gen.Sampling("greedy"))  # used to crash on gpt-oss
    prompt = len(result.prompt_tokens)
    assert prompt > WINDOW and len(result.steps) == NEW
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"][0].tolist() + [s.token_id for s in result.steps]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions  # no cache, whole sequence
    for step in result.steps:
        expected = torch.stack([layer[0, :, step.position - 1, : step.position] for layer in full])
        torch.testing.assert_close(step.attention, expected, atol=1e-5, rtol=1e-4)
    slides = []
    for layer in range(len(full)):
        timeline = reading.timeline(result, layer, 0)  # [steps, positions]
        firsts = []
        for index, step in enumerate(result.steps):
            query = step.position - 1
            read = (full[layer][0, :, query, : step.position] != 0).any(0)  # the keys this query really read
            first = int(read.nonzero()[0])
            firsts.append(first)
            row = timeline[index]
            assert np.isnan(row[:first]).all() and np.isnan(row[step.position:]).all()
            np.testing.assert_allclose(row[first: step.position], full[layer][0, 0, query, first: step.position],
                                       atol=1e-5, rtol=1e-4)
        sink = reading.sink_mass(result)[:, layer]  # the weight on position 0 itself
        np.testing.assert_allclose(sink, torch.stack([full[layer][0, :, s.position - 1, 0] for s in result.steps]),
                                   atol=1e-5)
        leaves = reading.first_token_leaves(result, layer)
        expected_leaves = next((index + 1 for index, first in enumerate(firsts) if first > 0), None)
        assert leaves == expected_leaves
        slides.append(expected_leaves is not None)
    assert any(slides)  # the window is shorter than the prompt: some layer leaves token 0 behind


def test_the_row_sum_is_measured_and_the_sink_named(windowed):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed["gpt_oss"])
    result = gen.generate(model, tokenizer, PROMPT, 3, gen.Sampling("greedy"))
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        full = model(input_ids=ids, output_attentions=True).attentions
    for layer in range(len(full)):
        total = float(full[layer][0, 1, -1].sum())  # head 1's last row, as transformers computes it
        assert total < 0.99  # gpt-oss's sink logit takes a share of every row
        statement = reading.row_sum_statement(result, 0, layer, 1)
        assert f"{total:.2f}" in statement and f"{1 - total:.2f}" in statement and "sink" in statement


def test_the_cache_is_described_per_layer_as_its_tensors_hold_it(windowed):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed["gpt_oss"])
    last = gen.generate(model, tokenizer, PROMPT, 3, gen.Sampling("greedy")).steps[-1]
    full = model.config.layer_types.index("full_attention")
    sliding = model.config.layer_types.index("sliding_attention")
    held = [shape[2] for shape in last.cache_keys]
    assert held[full] == last.position and held[sliding] < WINDOW  # the full layer keeps all; the sliding one not
    statement = reading.cache_holds(last)
    assert "every layer" not in statement
    assert f"{held[full]} tokens in layer {full}" in statement
    assert f"{held[sliding]} tokens in layer {sliding}" in statement


def test_paged_attention_refuses_a_layer_whose_window_dropped_tokens(windowed):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed["gpt_oss"])
    samples = [gen.generate(model, tokenizer, PROMPT, 4, gen.Sampling("sample", 1.0, seed=s)) for s in range(3)]
    layer_types = model.config.layer_types
    sliding, full = layer_types.index("sliding_attention"), layer_types.index("full_attention")
    with pytest.raises(ValueError, match="sliding window"):
        gen_systems.paged_demo(samples, sliding, block_size=4, max_length=64)
    assert gen_systems.paged_demo(samples, full, block_size=4, max_length=64).identical


@pytest.mark.parametrize("block", [5, 4])  # 12 prompt tokens: a partly filled last block, then whole blocks
def test_paged_statement_counts_what_is_really_stored(windowed, block):
    """Three samples of one prompt: the distinct tokens are the prompt's and each sample's own; a partly filled last
    prompt block is held once per sample (two copy-on-write copies and the original)."""
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed["gpt2"])
    samples = [gen.generate(model, tokenizer, PROMPT, 5, gen.Sampling("sample", 1.0, seed=s)) for s in range(3)]
    demo = gen_systems.paged_demo(samples, 0, block_size=block, max_length=64)
    prompt = len(samples[0].prompt_tokens)
    partial = prompt % block
    own = [len(s.tokens) - 1 - prompt for s in samples]  # cached new tokens (the last generated one is not)
    distinct = prompt + sum(own)
    filled = (prompt - partial) + sum(partial + n for n in own)
    report = demo.cache.memory(64)
    assert report["distinct_tokens"] == distinct and report["tokens_stored"] == filled
    statement = gen_systems.paged_statement(demo, 0)
    assert f"{distinct} distinct tokens" in statement and f"{filled} filled slots" in statement
    assert "stored once each" not in statement or filled == distinct
    if partial:
        assert report["most_copies"] == len(samples) and f"{filled - distinct} slots repeat" in statement
    else:
        assert report["most_copies"] == 1 and filled == distinct


def test_an_untrained_model_has_no_circuit_named(windowed):
    from attnviz.models.with_heads import load_causal_lm

    model, tokenizer = load_causal_lm(windowed["gpt2"])
    found = {head.name: head for head in gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text())}
    pool = [i for i in range(model.config.vocab_size) if i not in set(tokenizer.all_special_ids)]
    scores = circuits.circuit_scores(model, tokenizer, gen_heads.held_out_text(), pool, max_positions=64)
    for head, key in ((found["previous-token head"], "previous_token"), (found["induction head"], "induction")):
        best = float(torch.tensor(scores[key]).max())
        assert head.score == pytest.approx(best, abs=1e-6) and best < 0.5
        assert not head.found and not head.in_words().startswith(f"**{head.name}**: layer")
    assert f"{len(pool):,}" in found["induction head"].measure  # the pool it really drew from


@pytest.fixture
def _clean(clean_streamlit_caches):
    yield


def test_the_page_generates_past_gpt_oss_window_and_states_the_row_sum(windowed, _clean):
    folder = windowed["gpt_oss"]
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-gpt-oss": str(folder)}
    at = open_page("app_pages/generation.py", timeout=300, models=models, model="tiny-gpt-oss",
                   gen_request=dict(prompt=PROMPT, new_tokens=NEW, strategy="greedy", temperature=1.0, top_k=0,
                                    top_p=1.0, seed=0))
    assert_no_failure(at)
    layer = int(at.number_input(key="gen_layer").value)
    head = int(at.number_input(key="gen_head").value)
    bars = figure_titled(at, f"Step {NEW}: attention of layer {layer}, head {head}")
    total = sum(bars["data"][0]["y"])
    caption = next(c.value for c in at.caption if c.value.startswith("The weights of the query"))
    assert f"sum to {total:.2f}" in caption and total < 0.99
    timeline = figure_titled(at, "Timeline")
    z = plotly_array(timeline["data"][0]["z"])  # [steps, positions]
    assert z.shape[0] == NEW and not np.isnan(z[-1, -2])  # the last step's query read the key before it


def test_the_page_names_no_circuit_below_the_threshold(windowed, _clean):
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-gpt2": str(windowed["gpt2"])}
    at = open_page("app_pages/generation.py", timeout=300, models=models, model="tiny-gpt2")
    assert_no_failure(at)
    found = [m.value for m in at.markdown if m.value.startswith(("**previous-token head**", "**induction head**"))]
    assert len(found) == 2 and not any(": layer" in value.split("none found")[0] for value in found)


def test_the_paged_tab_says_when_every_layer_dropped_tokens(windowed, _clean):
    """Every layer of the tiny Mistral slides a window of 4: no layer's cache holds the whole sequence, so the
    PagedAttention tab says so instead of paging tokens the cache no longer has."""
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-mistral": str(windowed["mistral"])}
    at = open_page("app_pages/generation.py", timeout=300, models=models, model="tiny-mistral",
                   gen_tab="PagedAttention",
                   gen_request=dict(prompt=PROMPT, new_tokens=NEW, strategy="greedy", temperature=1.0, top_k=0,
                                    top_p=1.0, seed=0))
    assert_no_failure(at)
    note = next(i.value for i in at.info if "layer 0's cache holds" in i.value)
    assert f"of the {len(PROMPT.split()) + 2 + NEW - 1} tokens written" in note  # [CLS], [SEP]; the last not cached
    assert not [f for f in at.get("plotly_chart")]  # no block table drawn from tokens the cache no longer has
