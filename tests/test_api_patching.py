"""attnviz.patch, paths, attribute, logit_lens and composition from a notebook: the same numbers as the
interventions they call, on a bundled name and on a model in memory (switched only while they run), and
attnviz.show draws each result offline."""

import numpy as np
import pytest
import torch
import transformers

import attnviz
from attnviz.interventions import activation_patching as ap
from attnviz.interventions import composition as comp
from attnviz.interventions import logit_attribution as dla
from attnviz.interventions import path_patching as pp
from attnviz.interventions.edits import editable_lm
from attnviz.models.shipped import BUNDLED_GPT_DIR


@pytest.fixture(scope="module")
def reference():
    return editable_lm(BUNDLED_GPT_DIR)


@pytest.fixture(scope="module")
def examples():
    return attnviz.induction_examples("tiny GPT", 3, period=16, change="previous")


def test_patch_and_paths_by_name_equal_the_interventions(reference, examples):
    model, _ = reference
    found = attnviz.patch("tiny GPT", examples, "k", progress=False)
    assert torch.allclose(found.shares, ap.patch_map(model, examples, "k").shares, equal_nan=True)
    traced = attnviz.paths("tiny GPT", examples, (2, 1), "k", mlps="free", progress=False)
    assert torch.allclose(traced.shares, pp.path_patching(model, examples, (2, 1), "k", mlps="free").shares,
                          equal_nan=True)
    assert traced.share_spread.examples == 3


def test_a_model_in_memory_is_switched_only_while_it_runs(examples):
    model = transformers.AutoModelForCausalLM.from_pretrained(BUNDLED_GPT_DIR)
    before = model.config._attn_implementation
    model.train()
    found = attnviz.patch(model, examples, "head", progress=False)
    assert model.config._attn_implementation == before and model.training
    by_name = attnviz.patch("tiny GPT", examples, "head", progress=False)
    assert torch.allclose(found.shares, by_name.shares, atol=1e-6, equal_nan=True)


def test_attribute_lens_and_composition(reference, examples):
    model, tokenizer = reference
    example = examples[0]
    found = attnviz.attribute("tiny GPT", example)  # the foil: the corrupted run's top other token
    foil = ap.ends(model, example, "logit difference").foil
    expected = dla.direct_logit_attribution(model, example.clean, example.answer, foil)
    assert torch.allclose(found.values, expected.values)
    assert float(found.values[:, -1].sum()) == pytest.approx(float(found.logit_difference[-1]), abs=1e-5)
    lens = attnviz.logit_lens("tiny GPT", example.clean, example.answer, foil)
    assert torch.equal(lens.top, dla.logit_lens(model, example.clean, example.answer, foil).top)
    scores = attnviz.composition("tiny GPT", "V")
    assert torch.allclose(scores.scores, comp.composition_scores(model, "V").scores, equal_nan=True)
    with pytest.raises(ValueError, match="answer and the foil"):
        attnviz.attribute("tiny GPT", example.clean)


def test_example_from_text_and_its_refusal():
    tokenizer = transformers.AutoTokenizer.from_pretrained(BUNDLED_GPT_DIR)
    made = attnviz.example(tokenizer, "the cat sat on the", "the dog sat on the", " mat")
    assert len(made.clean) == len(made.corrupted) and made.clean[0] == tokenizer.bos_token_id and made.foil is None
    with pytest.raises(ValueError, match="same number of tokens"):
        attnviz.example(tokenizer, "the cat sat on the", "a much longer corrupted prompt than that", " mat")


def test_show_draws_every_result(examples):
    shown = [attnviz.show.patching(attnviz.patch("tiny GPT", examples, "resid", progress=False)),
             attnviz.show.paths(attnviz.paths("tiny GPT", examples, (2, 1), "k", progress=False)),
             attnviz.show.attribution(attnviz.attribute("tiny GPT", examples[0])),
             attnviz.show.lens(attnviz.logit_lens("tiny GPT", examples[0])),
             attnviz.show.composition(attnviz.composition("tiny GPT", "K"))]
    for figure in shown:
        assert figure.caption and figure.data
        bundle = figure._repr_mimebundle_()
        assert "<script src=" not in bundle["text/html"].replace(" ", "")  # plotly.js inline, never fetched
    heat = np.asarray(shown[0].data[0].z, dtype=float)
    assert heat.shape == (4, len(examples[0].clean))
