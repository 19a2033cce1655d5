"""AppTest: the Generation and KV cache page, as a user drives it, on the bundled tiny GPT."""

import pytest

from attnviz.models.shipped import BUNDLED_GPT_NAME
from tests.apptest_helpers import assert_no_failure, figure_titled, figures, open_page
from tests.tiny_models import TINY_GPT_LAYERS

PAGE = "app_pages/generation.py"


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_the_encoder_in_the_sidebar_hands_over_to_the_bundled_gpt_which_generates():
    at = open_page(PAGE, timeout=300)
    assert_no_failure(at)
    assert any("is an encoder" in i.value for i in at.info)
    assert at.selectbox(key="gen_model").value == BUNDLED_GPT_NAME
    timeline = figure_titled(at, "Timeline")
    assert len(timeline["layout"]["yaxis"]["ticktext"]) == 12  # the default: 12 new tokens, one row each
    assert figure_titled(at, "Step 12: next-token distribution")
    assert metric(at, "Same tokens uncached") == "yes"
    assert float(metric(at, "Largest logit difference")) < 1e-4
    check = next(c.value for c in at.caption if "float64 copy" in c.value)
    assert "the same tokens" in check and float(check.split("at most **")[1].split("**")[0]) <= 1e-5
    found = [m.value for m in at.markdown if "head**" in m.value]
    assert any(value.startswith("**previous-token head**") for value in found)
    assert any(value.startswith("**induction head**") for value in found)


def test_one_more_token_grows_the_timeline_and_the_step_slider_moves_the_views():
    at = open_page(PAGE, timeout=300)
    at.button(key="gen_more").click().run()
    assert_no_failure(at)
    assert len(figure_titled(at, "Timeline")["layout"]["yaxis"]["ticktext"]) == 13
    at.slider(key="gen_step").set_value(3).run()
    assert figure_titled(at, "Step 3: next-token distribution")
    attention = figure_titled(at, "Step 3: attention of layer")
    assert abs(sum(attention["data"][0]["y"]) - 1) < 1e-4  # one query's weights over the tokens before it
    assert len(figure_titled(at, "Timeline")["layout"]["yaxis"]["ticktext"]) == 3  # built up to the step
    keys = len(attention["data"][0]["y"])  # the cache after step 3 holds K and V of every key it attended to
    table = next(frame.value for frame in at.dataframe if "V shape" in frame.value.columns)
    assert len(table) == TINY_GPT_LAYERS  # a row per layer
    assert int(table["V shape"].iloc[0].strip("[]").split(",")[2]) == keys


def test_sampling_settings_apply_with_the_generate_button():
    at = open_page(PAGE, timeout=300)
    at.radio(key="gen_strategy").set_value("sample").run()  # enables the sampling controls (off under greedy)
    at.slider(key="gen_temperature").set_value(1.5)
    at.number_input(key="gen_count").set_value(5)
    submit = next(b for b in at.button if getattr(b, "label", "") == "Generate")
    submit.click().run()
    assert_no_failure(at)
    assert len(figure_titled(at, "Timeline")["layout"]["yaxis"]["ticktext"]) == 5
    assert at.session_state["gen_request"]["strategy"] == "sample"


def test_paged_and_ring_tabs():
    at = open_page(PAGE, timeout=300)
    at.session_state["gen_tab"] = "PagedAttention"
    at.run()
    assert_no_failure(at)
    assert metric(at, "Through the block table") == "identical"
    titles = [s["layout"]["title"]["text"] for s in figures(at)]
    assert "Block tables: logical block → physical block" in titles and "The pool of physical blocks" in titles
    at.session_state["gen_tab"] = "Ring attention"
    at.run()
    assert_no_failure(at)
    ring = figure_titled(at, "Who holds which K/V block")
    assert len(ring["data"][0]["y"]) == 4  # the default: 4 devices, 4 steps
    difference = next(m.value for m in at.markdown if "Largest difference from full causal attention" in m.value)
    assert float(difference.split("**")[-2]) <= 1e-5


def test_a_prompt_too_long_for_the_model_is_cut_with_a_notice():
    at = open_page(PAGE, timeout=300)
    at.text_area(key="gen_prompt").set_value("word " * 400)
    next(b for b in at.button if getattr(b, "label", "") == "Generate").click().run()
    assert_no_failure(at)
    assert any("positions" in w.value and "reads the first" in w.value for w in at.warning)
    assert figure_titled(at, "Timeline")  # it generated (tests/test_generation_teaching.py: the keep-latest offer)


def test_an_encoder_decoder_generates_on_the_page_with_its_cross_attention(tmp_path):
    from attnviz.bench.tiny import make_tiny_checkpoint

    folder = make_tiny_checkpoint("bart", tmp_path / "tiny-bart", seq2seq_lm=True)
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", "tiny-bart": str(folder)}
    at = open_page(PAGE, timeout=300, models=models, model="tiny-bart")
    assert_no_failure(at)
    assert at.selectbox(key="gen_model").value == "tiny-bart"
    rows = len(figure_titled(at, "Cross-attention timeline")["layout"]["yaxis"]["ticktext"])
    assert 1 <= rows <= 12  # up to 12 new tokens: an encoder-decoder stops after its end-of-sequence token
    assert figure_titled(at, f"Step {rows}: cross-attention of layer 0, head 0 over the source")
    assert metric(at, "Same tokens uncached") == "yes"
    assert any("cross-attention cache" in c.value for c in at.caption)
    at = open_page(PAGE, timeout=300, models=models, model="tiny-bart", gen_tab="PagedAttention")
    assert any(i.value.startswith("PagedAttention is simulated here on a decoder") for i in at.info)


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_a_mixture_of_experts_generates_end_to_end_with_its_cache_table_and_float64_check(kind, tmp_path):
    """A tiny mixture-of-experts decoder: its experts run as one grouped matrix product, which has no float64
    kernel, so the float64 re-check used to raise after the figures were drawn; the page then said it "could not
    generate" (an ``st.error``, which ``at.exception`` does not see) and left out the KV-cache table and check."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.test_generation_windows import _causal_lm

    new, prompt = 4, "the cat sat on the mat"
    folder = _causal_lm(kind, tmp_path / f"tiny-{kind}")
    models = {"all-MiniLM-L6-v2 (bundled BERT)": "unused", f"tiny-{kind}": str(folder)}
    at = open_page(PAGE, timeout=300, models=models, model=f"tiny-{kind}",
                   gen_request=dict(prompt=prompt, new_tokens=new, strategy="greedy", temperature=1.0, top_k=0,
                                    top_p=1.0, seed=0))
    assert_no_failure(at)
    assert not any("could not generate" in e.value for e in at.error)
    # The KV-cache table after the last step, against transformers' own greedy generation and cache.
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, prompt]
    with torch.no_grad():
        sequence = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)  # [1, prompt + new]
        cache = model(input_ids=sequence[:, :-1], use_cache=True).past_key_values  # what the last step read
    table = next(frame.value for frame in at.dataframe if "V shape" in frame.value.columns)
    assert len(table) == model.config.num_hidden_layers
    for layer, row in table.iterrows():
        assert row["K shape [batch, K/V heads, tokens, head dim]"] == str(list(cache.layers[layer].keys.shape))
        assert row["V shape"] == str(list(cache.layers[layer].values.shape))
    # The check: with and without the cache, then again on a float64 copy (the part that used to raise).
    assert metric(at, "Same tokens uncached") == "yes"
    assert float(metric(at, "Largest logit difference")) < 1e-4
    check = next(c.value for c in at.caption if "float64 copy" in c.value)
    assert "give the same tokens" in check and float(check.split("at most **")[1].split("**")[0]) <= 1e-10


def test_a_float64_check_that_cannot_run_leaves_the_cache_table_and_says_why(monkeypatch):
    """Any op without a float64 kernel (not only the experts' grouped product): the generation and its cache are
    shown, the float64 line says it was not checked and why, and the page does not say it could not generate."""
    from attnviz.pagelogic.generation import decode as gen

    def no_float64(*args, **kwargs):
        raise RuntimeError("no float64 kernel for this op")

    monkeypatch.setattr(gen, "float64_cache_agreement", no_float64)
    at = open_page(PAGE, timeout=300)
    assert_no_failure(at)
    assert any("V shape" in frame.value.columns for frame in at.dataframe)
    assert metric(at, "Same tokens uncached") == "yes"
    check = next(c.value for c in at.caption if "float64" in c.value and "cache holds" in c.value)
    assert "Not checked again in float64" in check and "no float64 kernel for this op" in check


def test_a_view_that_fails_after_the_figures_is_not_called_a_failed_generation(monkeypatch):
    from attnviz.pagelogic.generation import reading as reading

    def broken(*args, **kwargs):
        raise RuntimeError("the sink view broke")

    monkeypatch.setattr(reading, "sink_mass", broken)
    at = open_page(PAGE, timeout=300)
    assert not at.exception, [e.value for e in at.exception]
    assert figure_titled(at, "Timeline")  # drawn before the sink view
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "generated, but a view of its generation could not be drawn" in errors[0]
    assert "the sink view broke" in errors[0] and "could not generate" not in errors[0]
