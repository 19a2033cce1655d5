"""The Generation page teaches (issue #25): the chosen head over the whole sequence (every query, prompt and
generated) against a cache-free forward pass, the "Repeat my prompt" preset, a next-token chart with one bar per
token id, a long prompt cut with a notice and the offer to keep its latest tokens, sampling controls that are off
under greedy decoding, no progress box left above a refusal, and the link that opens a head in Explore heads.

The bundled tiny GPT is being retrained: nothing here depends on its numbers, its tokens or its circuits, only on
what the page computes from whatever it holds (checked against the model's own forward pass)."""

import html
import json
import re

import numpy as np
import pytest
import torch

from attnviz.core.tokens_display import NEWLINE_MARK, SPACE_MARK, markdown_literal
from attnviz.models.shipped import BUNDLED_GPT_DIR, BUNDLED_GPT_NAME
from attnviz.models.with_heads import load_causal_lm
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import sequence as gen_sequence
from tests.apptest_helpers import assert_no_failure, figure_titled, open_page, plotly_array

PAGE = "app_pages/generation.py"
FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tiny():
    return load_causal_lm(BUNDLED_GPT_DIR)


@pytest.fixture
def _clean(clean_streamlit_caches):
    yield


def generate_button(at, label: str = "Generate"):
    return next(b for b in at.button if getattr(b, "label", "") == label)


def request(prompt: str, new_tokens: int = 12, **changes) -> dict:
    return dict(prompt=prompt, new_tokens=new_tokens, strategy="greedy", temperature=1.0, top_k=0, top_p=1.0,
                seed=0, **changes)


def page_generation(tiny, settings: dict) -> gen.Generation:
    """What the page generated for ``settings`` (greedy: deterministic), recomputed outside Streamlit."""
    model, tokenizer = tiny
    return gen.generate(model, tokenizer, settings["prompt"], settings["new_tokens"], gen.Sampling(),
                        keep=settings.get("keep", "first"))


# ---------------------------------------------------------------------------------------------------------------
# Computations


def test_repeat_pairs_point_each_repeated_stretch_at_the_token_after_its_earlier_occurrence():
    ids = [5, 6, 7, 5, 6, 9, 6]
    assert gen_sequence.repeat_pairs(ids) == [(4, 2)]  # "5 6" again: next came 7; a lone 5 or 6 does not count
    assert gen_sequence.repeat_pairs(ids, min_match=1) == [(3, 1), (4, 2), (6, 5)]  # then the latest occurrence
    assert gen_sequence.repeat_pairs([1, 2, 3]) == []
    # The longest matching run wins over the latest occurrence: "1 2 3" is repeated, "9 3" only shares a 3.
    ids = [1, 2, 3, 4, 9, 3, 1, 2, 3]
    assert gen_sequence.repeat_pairs(ids)[-1] == (8, 3)


def test_the_statement_measures_the_diagonal_and_the_stripe_on_the_weights():
    period = 6
    ids = list(range(10, 10 + period)) * 2
    n = len(ids)
    weights = torch.zeros(n, n)
    weights[0, 0] = 1
    for query in range(1, n):  # a perfect induction head: the token after the earlier occurrence, else i - 1
        weights[query, query - period + 1 if query >= period else query - 1] = 1
    view = gen_sequence.sequence_view(weights, ids, [str(i) for i in ids], prompt_length=8)
    assert view.induction == pytest.approx(1.0) and view.repeats == period - 1  # the second copy after its first
    assert view.previous_token == pytest.approx((period - 1) / (n - 1))  # only the first copy's rows
    assert view.segments == [0] * 8 + [1] * 4
    assert np.isnan(view.values[0, 1]) and view.values[1, 0] == 1  # above the diagonal: never read
    statement = gen_sequence.sequence_statement(view)
    assert f"**{view.induction:.3g}**" in statement and f"the {period - 1} queries" in statement
    assert "occurs twice" in gen_sequence.sequence_statement(
        gen_sequence.sequence_view(torch.eye(3), [1, 2, 3], ["a", "b", "c"], 3))


def test_a_long_sequence_is_max_pooled_and_its_stripe_survives():
    period, n = 300, 600
    ids = list(range(period)) * 2
    weights = torch.zeros(n, n)
    weights[torch.arange(n), torch.arange(n)] = 0.5
    rows = torch.arange(period, n)
    weights[rows, rows - period + 1] = 0.5  # the induction stripe
    view = gen_sequence.sequence_view(weights, ids, [f"t{i}" for i in ids], prompt_length=n - 10)
    assert view.pooled and view.values.shape == (gen_sequence.POOL_LIMIT,) * 2
    assert len(view.labels) == gen_sequence.POOL_LIMIT and view.labels[0].startswith("0–")
    cells = (np.arange(n) * gen_sequence.POOL_LIMIT // n)
    for query in (period, period + 137, n - 1):  # the stripe's cells hold its weight
        assert view.values[cells[query], cells[query - period + 1]] == pytest.approx(0.5)
    assert view.induction == pytest.approx(0.5)  # measured on the exact weights, not the pooled cells
    assert (view.values[np.triu_indices(gen_sequence.POOL_LIMIT, 1)] != view.values[
        np.triu_indices(gen_sequence.POOL_LIMIT, 1)]).all()  # NaN: no key of those cells is ever read


def test_labels_show_marks_and_tell_apart_tokens_that_read_alike(tiny):
    _, tokenizer = tiny
    newline, space = tokenizer.convert_tokens_to_ids("Ċ"), tokenizer.convert_tokens_to_ids("Ġ")  # byte-level BPE
    byte = tokenizer.convert_tokens_to_ids("â")  # the byte 0xE2 alone: the start of "—", "’", ...
    assert gen_sequence.readable_labels(tokenizer, [newline, space, byte]) == [NEWLINE_MARK, SPACE_MARK, "<0xE2>"]
    assert gen_sequence.distinct_labels(["a", "b", "a", "a"], [1, 2, 3, 1]) == ["a #1", "b", "a #3", "a #1"]
    labels, probabilities, ids = gen_sequence.top_token_bars(tokenizer, [(newline, 0.5), (space, 0.25)])
    assert labels == [NEWLINE_MARK, SPACE_MARK] and probabilities == [0.5, 0.25] and ids == [newline, space]


def test_a_prompt_too_long_is_cut_to_the_first_or_the_latest_tokens(tiny):
    model, tokenizer = tiny
    text = " ".join(f"{FOX} {n}" for n in range(40))
    ids = tokenizer(text)["input_ids"]
    positions = gen.context_length(model.config)
    assert len(ids) > positions
    first = gen.fit_prompt(model, tokenizer, text, 12)
    latest = gen.fit_prompt(model, tokenizer, text, 12, "latest")
    assert first.ids == ids[: positions - 12] and latest.ids == ids[-(positions - 12):]
    assert first.truncated and first.dropped == len(ids) - positions + 12 == latest.dropped
    fits = gen.fit_prompt(model, tokenizer, FOX, 12)
    assert fits.ids == tokenizer(FOX)["input_ids"] and not fits.truncated
    result = gen.generate(model, tokenizer, text, 3, gen.Sampling(), keep="latest")
    assert result.prompt_ids == ids[-(positions - 3):] and len(result.ids) == positions
    with pytest.raises(ValueError, match="positions"):  # without keep: refused, as before
        gen.generate(model, tokenizer, text, 3, gen.Sampling())
    with pytest.raises(ValueError, match="no position"):
        gen.fit_prompt(model, tokenizer, FOX, positions)


def test_the_special_tokens_a_tokenizer_adds_are_kept_when_a_prompt_is_cut(tiny):
    model, _ = tiny

    class WithEnds:  # a tokenizer that puts [CLS] ... [SEP] around every text, as BERT's does
        all_special_ids = [101, 102]

        def __call__(self, text):
            return {"input_ids": [101, *range(1000, 1000 + len(text.split())), 102]}

    fit = gen.fit_prompt(model, WithEnds(), "w " * 300, 16, "latest")
    room = gen.context_length(model.config) - 16
    assert len(fit.ids) == room and fit.ids[0] == 101 and fit.ids[-1] == 102 and fit.ids[-2] == 1299
    fit = gen.fit_prompt(model, WithEnds(), "w " * 300, 16, "first")
    assert fit.ids[:2] == [101, 1000] and fit.ids[-1] == 102


# ---------------------------------------------------------------------------------------------------------------
# The page


def test_the_whole_sequence_figure_is_a_cache_free_forward_pass_of_the_chosen_head(tiny, _clean):
    settings = request(FOX, 6)
    at = open_page(PAGE, timeout=300, gen_request=dict(settings))
    at.number_input(key="gen_layer").set_value(0).run()
    at.number_input(key="gen_head").set_value(1).run()
    assert_no_failure(at)
    generation = page_generation(tiny, settings)
    model, _ = tiny
    with torch.no_grad():  # independent of the page: transformers' own eager weights, no cache
        expected = model(input_ids=torch.tensor([generation.ids]), output_attentions=True).attentions[0][0, 1]
    spec = figure_titled(at, "Layer 0, head 1")
    assert "over the whole sequence" in spec["layout"]["title"]["text"]
    z = plotly_array(spec["data"][0]["z"])
    n = len(generation.ids)
    assert z.shape == (n, n)
    lower = np.tril(np.ones((n, n), dtype=bool))
    np.testing.assert_allclose(z[lower], expected.numpy()[lower], atol=1e-6)
    assert np.isnan(z[~lower]).all()
    # The generated tokens are marked: their labels in orange, a dashed line where they start.
    ticks = spec["layout"]["yaxis"]["ticktext"]
    prompt = len(generation.prompt_ids)
    positions = [int(re.search(r">(\d+) · ", tick).group(1)) for tick in ticks]  # (thinned when many)
    assert len(ticks) >= min(n, 20) and [("#c2410c" in tick) for tick in ticks] == [i >= prompt for i in positions]
    assert prompt - 0.5 in {shape["x0"] for shape in spec["layout"]["shapes"]}
    assert len(json.dumps(spec)) < 2e6
    # Changing the head redraws from the same forward pass (cached per layer): head 0 of layer 0.
    at.number_input(key="gen_head").set_value(0).run()
    with torch.no_grad():
        head0 = model(input_ids=torch.tensor([generation.ids]), output_attentions=True).attentions[0][0, 0]
    z0 = plotly_array(figure_titled(at, "Layer 0, head 0")["data"][0]["z"])
    np.testing.assert_allclose(z0[lower], head0.numpy()[lower], atol=1e-6)


def test_repeat_my_prompt_doubles_the_prompt_and_outlines_the_induction_cells(tiny, _clean):
    at = open_page(PAGE, timeout=300)
    at.text_area(key="gen_prompt").set_value(FOX)
    generate_button(at, "Repeat my prompt").click().run()
    assert_no_failure(at)
    doubled = f"{FOX} {FOX}"
    assert at.session_state["gen_request"]["prompt"] == doubled
    assert at.text_area(key="gen_prompt").value == doubled
    generation = page_generation(tiny, request(doubled))
    _, tokenizer = tiny
    assert generation.prompt_ids == tokenizer(doubled)["input_ids"]
    layer, head = int(at.number_input(key="gen_layer").value), int(at.number_input(key="gen_head").value)
    spec = figure_titled(at, f"Layer {layer}, head {head}")
    assert plotly_array(spec["data"][0]["z"]).shape == (len(generation.ids),) * 2
    outlined = spec["data"][1]  # the cells an induction head fills: the second copy's tokens, at least
    pairs = gen_sequence.repeat_pairs(generation.ids)
    assert len(outlined["x"]) == len(pairs) >= len(generation.prompt_ids) // 2 - 2
    caption = next(c.value for c in at.caption if c.value.startswith("Every query of the"))
    assert f"the {len(pairs)} queries that continue a stretch seen before" in caption
    # A second press doubles again (the preset reads the box as it is).
    generate_button(at, "Repeat my prompt").click().run()
    assert at.session_state["gen_request"]["prompt"] == f"{doubled} {doubled}"


def test_the_next_token_chart_has_one_bar_per_token_id_and_three_significant_digits(tiny, _clean):
    settings = request(FOX, 4)
    at = open_page(PAGE, timeout=300, gen_request=dict(settings))
    at.slider(key="gen_step").set_value(2).run()
    spec = figure_titled(at, "Step 2: next-token distribution")
    bars = spec["data"][0]
    ids = [int(row[1]) for row in bars["customdata"]]
    k = gen.TOP_SHOWN
    assert len(bars["y"]) == k and len(set(ids)) == k and list(bars["x"]) == list(range(k))
    assert spec["layout"]["title"]["text"].endswith(f"the {k} most likely")
    labels = spec["layout"]["xaxis"]["ticktext"]
    assert len(set(labels)) == k and all(label.strip() for label in labels)  # none blank, none alike
    assert bars["text"] == [f"{p:#.3g}" for p in bars["y"]]  # 0.250, not 0.25: always 3 significant digits
    assert all(len(text.replace(".", "").lstrip("0").split("e")[0]) == 3 for text in bars["text"])
    generation = page_generation(tiny, settings)
    model, tokenizer = tiny
    with torch.no_grad():  # the model's own distribution after step 1's token
        logits = model(input_ids=torch.tensor([generation.ids[: generation.steps[1].position]])).logits[0, -1]
    top = torch.softmax(logits.double(), -1).topk(k)
    assert ids == top.indices.tolist()
    np.testing.assert_allclose(bars["y"], top.values.numpy(), rtol=1e-5)
    assert labels == gen_sequence.distinct_labels(gen_sequence.readable_labels(tokenizer, ids), ids)
    pieces = tokenizer.convert_ids_to_tokens(ids)  # the hover keeps the raw piece beside the id
    assert [row[2] for row in bars["customdata"]] == [f"<br>piece {piece!r}" for piece in pieces]
    attention = figure_titled(at, "Step 2: attention of layer")["data"][0]
    position = generation.steps[1].position
    assert attention["customdata"] == [f"<br>piece {p!r}, id {i}" for p, i in zip(
        tokenizer.convert_ids_to_tokens(generation.ids[:position]), generation.ids[:position], strict=True)]


def test_an_indented_prompt_reads_its_spaces_and_its_bars_apart(tiny, _clean):
    """Python typed in: tokens that hold a newline and a line's indentation show every space, so the next-token
    chart's bars read apart, and the caption's bold label survives Markdown."""
    prompt = "def f(x):\n    if x:\n        return 1\n"
    at = open_page(PAGE, timeout=300, gen_request=dict(request(prompt, 1)))
    spec = figure_titled(at, "Step 1: next-token distribution")
    labels = spec["layout"]["xaxis"]["ticktext"]
    assert all(label == label.strip(" ") and " ↵" not in label and "↵ " not in label for label in labels), labels
    assert len({label.replace("␣", "") for label in labels}) < len(labels)  # some differ only by their marks...
    assert len(set(labels)) == len(labels)  # ...and still read apart
    caption = next(c.value for c in at.caption if "most likely next tokens" in c.value)
    taken = caption.split("**")[1]
    assert taken and not taken.endswith(" ")


def test_a_cut_prompt_notice_quotes_whole_characters_literally(tiny):
    _, tokenizer = tiny
    text = "".join(f"é{n}日*" for n in range(40))
    ids = tokenizer(text)["input_ids"]
    for window in (ids[:24], ids[-24:], ids[5:29]):
        shown = gen_sequence.whole_characters(tokenizer, window)
        assert "\ufffd" not in shown and shown and shown in text
    assert markdown_literal("**a_b** `c` [d](e) $x$") == r"\*\*a\_b\*\* \`c\` \[d\]\(e\) \$x\$"


def test_generated_tokens_are_shown_with_visible_marks(tiny, _clean):
    settings = request(FOX + "\n", 6)
    at = open_page(PAGE, timeout=300, gen_request=dict(settings))
    body = next(h.proto.body for h in at.get("html") if "token id" in h.proto.body)
    _, tokenizer = tiny
    generation = page_generation(tiny, settings)
    for step, token_id in enumerate(s.token_id for s in generation.steps):
        label = gen_sequence.readable_labels(tokenizer, [token_id])[0]
        marker = f'title="step {step + 1}, token id {token_id}"'
        assert label.strip() and marker in body  # a newline or a space reads as a mark, never as nothing
        chip = body.split(marker, 1)[1].split(">", 1)[1].split("</b>", 1)[0]
        assert chip == html.escape(label)


def test_a_long_prompt_is_cut_with_a_notice_and_the_latest_tokens_can_be_kept(tiny, _clean):
    model, tokenizer = tiny
    text = "\n".join(f"{FOX} Line {n}." for n in range(90))  # 2,600 characters, line breaks kept
    assert len(text) > 2000
    at = open_page(PAGE, timeout=300)
    at.text_area(key="gen_prompt").set_value(text)
    generate_button(at).click().run()
    assert_no_failure(at)
    assert at.session_state["gen_request"]["prompt"] == text  # nothing lost in the box, newlines included
    total, positions = len(tokenizer(text)["input_ids"]), gen.context_length(model.config)
    room = positions - 12
    notice = next(w.value for w in at.warning if "The prompt has" in w.value)
    assert f"{total:,} tokens" in notice and f"reads the first {room:,}" in notice
    spec = figure_titled(at, "Layer")
    assert plotly_array(spec["data"][0]["z"]).shape == (positions, positions)  # every position used
    offer = at.button(key="gen_keep")
    assert offer.label == f"Keep only the latest {room:,} tokens"
    offer.click().run()
    assert_no_failure(at)
    assert at.session_state["gen_request"]["keep"] == "latest"
    note = next(i.value for i in at.info if "The prompt has" in i.value)
    assert f"reads the latest {room:,}" in note and f"the first {total - room:,} are left out" in note
    kept = tokenizer(text)["input_ids"][-room:]
    body = next(h.proto.body for h in at.get("html") if "token id" in h.proto.body)
    assert tokenizer.decode(kept[-8:]).split()[-1] in body  # the end of the text is what the model continues
    assert at.button(key="gen_keep").label == f"Keep the first {room:,} tokens instead"


def test_sampling_controls_are_enabled_only_when_sampling(_clean):
    at = open_page(PAGE, timeout=300)
    controls = [at.slider(key="gen_temperature"), at.number_input(key="gen_top_k"), at.slider(key="gen_top_p"),
                at.number_input(key="gen_seed")]
    assert at.radio(key="gen_strategy").value == "greedy" and all(c.disabled for c in controls)
    at.radio(key="gen_strategy").set_value("sample").run()
    controls = [at.slider(key="gen_temperature"), at.number_input(key="gen_top_k"), at.slider(key="gen_top_p"),
                at.number_input(key="gen_seed")]
    assert not any(c.disabled for c in controls)
    assert at.session_state["gen_request"]["strategy"] == "greedy"  # applied with the Generate button only
    assert any("Press **Generate**" in c.value for c in at.caption)


def test_top_k_one_greys_out_what_it_makes_irrelevant(tiny, _clean):
    """Top-k 1 keeps only the most likely token: the draw is greedy (checked on the model), so temperature, top-p
    and the seed change nothing and are greyed out, saying why; top-k itself stays live."""
    model, tokenizer = tiny
    greedy = [step.token_id for step in gen.generate(model, tokenizer, FOX, 8, gen.Sampling()).steps]
    for seed, temperature in ((0, 1.0), (1, 1.7)):
        drawn = gen.generate(model, tokenizer, FOX, 8, gen.Sampling("sample", temperature, 1, 0.9, seed))
        assert [step.token_id for step in drawn.steps] == greedy
    at = open_page(PAGE, timeout=300)
    at.radio(key="gen_strategy").set_value("sample").run()
    at.number_input(key="gen_top_k").set_value(1)
    generate_button(at).click().run()
    assert_no_failure(at)
    assert at.session_state["gen_request"]["top_k"] == 1
    idle = [at.slider(key="gen_temperature"), at.slider(key="gen_top_p"), at.number_input(key="gen_seed")]
    assert all(c.disabled for c in idle) and all("Top-k 1 keeps only the most likely token" in c.help for c in idle)
    assert not at.number_input(key="gen_top_k").disabled
    at.number_input(key="gen_top_k").set_value(2).run()  # at once, before Generate
    assert not any(c.disabled for c in [at.slider(key="gen_temperature"), at.slider(key="gen_top_p"),
                                        at.number_input(key="gen_seed")])
    assert at.session_state["gen_request"]["top_k"] == 1  # applied with Generate
    at.number_input(key="gen_top_k").set_value(1).run()
    assert all(c.disabled for c in [at.slider(key="gen_temperature"), at.slider(key="gen_top_p")])
    at.number_input(key="gen_top_k").set_value(2).run()
    generate_button(at).click().run()
    assert at.session_state["gen_request"]["top_k"] == 2


def test_a_refused_run_leaves_no_progress_box(monkeypatch, _clean):
    def refuse(*args, **kwargs):
        raise ValueError("Not finite: refused for the test")

    monkeypatch.setattr(gen, "generate", refuse)
    at = open_page(PAGE, timeout=300)
    assert_no_failure(at)
    assert any("refused for the test" in w.value for w in at.warning)
    assert not [i.value for i in at.info if "Generating" in i.value or "Checking" in i.value]
    monkeypatch.undo()
    at = open_page(PAGE, timeout=300, gen_request=request(""))
    assert any("The prompt has no tokens" in w.value for w in at.warning)
    assert not [i.value for i in at.info if "Generating" in i.value]


def test_open_in_explore_heads_carries_the_text_the_model_the_layer_and_the_head(tiny, _clean):
    settings = request(FOX, 5)
    at = open_page(PAGE, timeout=300, gen_request=dict(settings))
    at.number_input(key="gen_layer").set_value(0).run()
    at.number_input(key="gen_head").set_value(1).run()
    button = at.button(key="gen_explore")
    assert button.label == "Open layer 0, head 1 in Explore heads"
    button.click().run()
    assert_no_failure(at)
    assert [t.value for t in at.title] == ["Explore heads"]
    _, tokenizer = tiny
    text = tokenizer.decode(page_generation(tiny, settings).ids, skip_special_tokens=True)
    assert at.session_state["sentence"] == text and text.startswith(FOX)
    assert at.session_state["model"] == BUNDLED_GPT_NAME
    assert at.number_input(key="layer").value == 0 and at.number_input(key="head").value == 1
    assert at.query_params["head"] in ("1", ["1"])  # Explore's URL reopens the head (layer 0 is its default)


def test_the_named_heads_can_be_shown_here_and_opened_in_explore(_clean):
    at = open_page(PAGE, timeout=300)
    found = [m.value for m in at.markdown if m.value.startswith(("**previous-token head**", "**induction head**"))]
    assert len(found) == 2
    named = [tuple(int(x) for x in re.search(r"layer (\d+), head (\d+)", words).groups()) for words in found]
    other = next((layer, head) for layer in range(4) for head in range(2) if (layer, head) != named[0])
    at.session_state["gen_layer"], at.session_state["gen_head"] = other  # away from the first named head
    at.run()
    assert (at.number_input(key="gen_layer").value, at.number_input(key="gen_head").value) == other
    at.button(key="gen_show_head_0").click().run()
    assert (at.number_input(key="gen_layer").value, at.number_input(key="gen_head").value) == named[0]
    at.button(key="gen_explore_head_1").click().run()
    assert [t.value for t in at.title] == ["Explore heads"]
    assert (at.number_input(key="layer").value, at.number_input(key="head").value) == named[1]


def test_a_sequence_longer_than_the_pool_limit_is_pooled_on_the_page_and_stays_small(tmp_path, _clean):
    """An untrained GPT-2 with 600 positions: 400 prompt tokens and 12 new ones are drawn max-pooled to 256 cells a
    side (the title says so), under 2 MB, and the whole-sequence statement measures the exact weights."""
    from transformers import AutoModelForCausalLM

    from attnviz.bench.tiny import copy_tokenizer
    from tests.tiny_models import tiny_config

    config = tiny_config("gpt2")
    config.n_positions = 600
    torch.manual_seed(0)
    folder = tmp_path / "tiny-gpt2-600"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    copy_tokenizer(folder)
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-gpt2-600": str(folder)}
    prompt = " ".join(["the cat sat on the mat"] * 66)  # 396 words, [CLS] and [SEP]: 398 tokens
    at = open_page(PAGE, timeout=300, models=models, model="tiny-gpt2-600", gen_request=request(prompt))
    assert_no_failure(at)
    spec = figure_titled(at, "Layer")
    n = 398 + 12
    assert f"{n:,} x {n:,} max-pooled to 256 x 256" in spec["layout"]["title"]["text"]
    assert plotly_array(spec["data"][0]["z"]).shape == (256, 256)
    assert len(json.dumps(spec)) < 2e6
    caption = next(c.value for c in at.caption if c.value.startswith("Every query of the"))
    assert f"of the {n} tokens" in caption and "max-pooled" in caption


def test_cached_figures_are_not_scaled_twice_in_presentation_mode(_clean):
    """The page caches its figures by their inputs; presentation mode scales a copy, never the cached one."""
    at = open_page(PAGE, timeout=300, presentation_mode=True)
    heights = []
    for step in (3, 4, 3, 4):
        at.slider(key="gen_step").set_value(step).run()
        heights.append({title: figure_titled(at, title)["layout"]["height"]
                        for title in ("Layer", "Attention-sink mass", f"Step {step}: next-token")})
    assert heights[0] == heights[2] and heights[1] == heights[3]
    assert heights[0]["Layer"] == heights[1]["Layer"] and heights[0]["Attention-sink mass"] == int(380 * 1.35)
