"""What the Positional page states about a model's positions, checked for every tested type against the checkpoint
itself, never against attnviz's records: which parameter the model looks its positions up in when it runs and which
rows it reads (observed on ``F.embedding``), whether the table holds sinusoids (computed here from the formula), how
many tokens a vision model makes of an image, and which modules a table-less model has (rotary, ALiBi, relative)."""

import re
import sys

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from attnviz.bench.tiny import VISION_KINDS
from attnviz.core import positional
from attnviz.interventions.word_order import word_order_experiment
from attnviz.models import architectures, position_tables
from attnviz.models.capture import capture
from attnviz.models.loading import load_model_dir
from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array

TEXT = "the cat sat on the mat because the cat was tired"
TEXT_KINDS = list(architectures.TESTED_MODEL_TYPES)
ALL_KINDS = TEXT_KINDS + list(VISION_KINDS)


class EmbeddingLookups(TorchFunctionMode):
    """Every ``F.embedding`` call while active: (indices, weight)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.embedding:
            indices = args[0] if args else kwargs["input"]
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            self.calls.append((indices.detach().clone(), weight))
        return func(*args, **kwargs)


def consecutive(indices: torch.Tensor) -> bool:
    """One sequence of ids going up by one: a lookup of positions (words, token types, relative buckets are not)."""
    if indices.dim() == 2 and indices.shape[0] == 1:
        indices = indices[0]
    return indices.dim() == 1 and indices.numel() >= 3 and bool((indices.diff() == 1).all())


def sinusoids(n: int, d: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Positions first .. first + n - 1 as sinusoids, interleaved (Vaswani et al.) and split (sin half, cos half)."""
    angles = np.arange(first, first + n)[:, None] / np.power(10000.0, np.arange(0, d, 2) / d)[None, :]
    interleaved = np.empty((n, d))
    interleaved[:, 0::2], interleaved[:, 1::2] = np.sin(angles), np.cos(angles)
    return interleaved, np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def is_sinusoidal(rows: torch.Tensor) -> bool:
    return any(np.allclose(rows.double().numpy(), reference, atol=1e-4)
               for reference in sinusoids(*rows.shape))


def text_facts(bundle) -> dict:
    """What the checkpoint itself shows when it runs on TEXT: the parameter its first position lookup reads, the
    row that served the first token, and whether the rows from there are sinusoids."""
    with EmbeddingLookups() as lookups:
        capture(bundle, TEXT)
    found = [(indices, weight) for indices, weight in lookups.calls if consecutive(indices)]
    if not found:
        return {"table": None}
    parameters = {id(p): name for name, p in bundle.model.named_parameters()}
    by_name = {}
    for indices, weight in found:  # an encoder-decoder reads two tables: the encoder's is the one read first
        by_name.setdefault(parameters[id(weight)], int(indices.min()))
    name, first_row = next(iter(by_name.items()))
    weight = bundle.model.get_parameter(name).detach().float()
    return {"table": name, "first_row": first_row, "rows": weight.shape[0], "d": weight.shape[1],
            "first_position": weight[first_row], "fixed": is_sinusoidal(weight[first_row:]),
            "all_tables": by_name}


def scheme_facts(model) -> str:
    """How a model without a position table encodes positions, from its own modules, code and config."""
    config = model.config
    classes = {type(module).__name__.lower() for module in model.modules()}
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    if getattr(config, "alibi", False) is True:  # Falcon's switch
        return "ALiBi"
    if any("rotary" in c for c in classes) or getattr(config, "rotary_dim", None):
        return "RoPE"
    if any("alibi" in name.lower() for name in vars(sys.modules[type(model).__module__])):
        return "ALiBi"
    if "relative_attention_bias" in names or getattr(config, "relative_attention", False):
        return "relative"
    return "unknown"


@pytest.fixture(scope="module")
def folders(tiny_checkpoint):
    return {kind: str(tiny_checkpoint(kind, vision=kind in VISION_KINDS)) for kind in ALL_KINDS}


@pytest.fixture(scope="module")
def learned_tab(folders):
    """One session of the app on the Learned tab, every tested type registered; a test picks its model in the
    sidebar as a user does."""
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    at = open_page("app_pages/positional.py", timeout=240, models={"bundled BERT": "unused", **folders},
                   model="bert", pos_tab="Learned")
    yield at
    st.cache_resource.clear()
    st.cache_data.clear()


def choose(at, kind: str):
    at.session_state["model"] = kind  # as the sidebar's model box sets it
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.mark.parametrize("kind", TEXT_KINDS)
def test_the_learned_tab_states_each_text_models_table_as_the_checkpoint_uses_it(learned_tab, folders, kind):
    bundle = load_model_dir(folders[kind])
    facts = text_facts(bundle)
    at = choose(learned_tab, kind)
    text = " ".join(c.value for c in at.caption) + " ".join(i.value for i in at.info)
    assert "has no learned absolute position table" not in text
    if facts["table"] is None:  # the model looks no position up: it has no absolute table
        assert not figures(at)
        said = " ".join(i.value for i in at.info)
        assert "has no absolute position table" in said
        expected = scheme_facts(bundle.model)
        assert expected in ("RoPE", "ALiBi", "relative"), kind
        assert expected in said, (kind, said)
        with pytest.raises(ValueError, match=f"has no absolute position table to remove: .*{expected}"):
            word_order_experiment(bundle, TEXT)
        return
    n_positions = facts["rows"] - facts["first_row"]  # rows before the first token's row never serve a position
    # attnviz's reading of the table (its records) is the model's, and so is the token limit loading sets
    found = position_tables.position_table(bundle.model)
    assert (found.name, found.first_row, found.n_positions) == (facts["table"], facts["first_row"], n_positions)
    assert found.trained == (not facts["fixed"]) and bundle.max_positions == n_positions
    padding = getattr(bundle.model.get_submodule(found.name.rsplit(".", 1)[0]), "padding_idx", None)
    if padding is not None:  # RoBERTa-likes, MPNet: the rows up to the padding row are never positions
        assert facts["first_row"] == padding + 1, kind
    assert facts["fixed"] == (kind in ("marian", "pegasus")), kind  # their code makes sinusoids; nothing else's
    if facts["fixed"]:  # Marian and Pegasus: sines in the first half, from position 0 (no BART-style offset)
        assert facts["first_row"] == 0 and positional.sinusoidal_layout(found.rows) == "split"
    caption = next(c.value for c in at.caption if facts["table"] in c.value)
    assert f"{n_positions} positions x {facts['d']} dimensions" in caption, caption
    assert ("fixed sinusoidal, not trained" in caption) == facts["fixed"], caption
    assert ("learned in training" in caption) == (not facts["fixed"]), caption
    if facts["first_row"]:
        assert f"the row labelled pos 0 is row {facts['first_row']}" in caption, caption
    else:
        assert "never a position" not in caption
    if bundle.architecture != "encoder":  # GPT-2, OPT, BART, Marian: the experiment says why it needs an encoder
        with pytest.raises(ValueError, match="under a causal mask each token sees only the tokens before it"):
            word_order_experiment(bundle, TEXT)
    heatmap = figure_titled(at, "Fixed sinusoidal" if facts["fixed"] else "Learned position embeddings")
    assert heatmap["data"][0]["y"][0] == "pos 0"
    np.testing.assert_allclose(plotly_array(heatmap["data"][0]["z"])[0], facts["first_position"].numpy(),
                               atol=1e-5)


@pytest.mark.parametrize("kind", VISION_KINDS)
def test_the_learned_tab_shows_a_vision_models_table_with_its_rows_named(learned_tab, folders, kind):
    bundle = load_model_dir(folders[kind])
    config = bundle.model.config
    with torch.no_grad():
        pixels = torch.zeros(1, config.num_channels, config.image_size, config.image_size)
        tokens = bundle.model(pixel_values=pixels).last_hidden_state.shape[1]  # what the model makes of an image
    patches = (config.image_size // config.patch_size) ** 2
    at = choose(learned_tab, kind)
    caption = " ".join(c.value for c in at.caption)
    assert not any(said in caption + " ".join(i.value for i in at.info)
                   for said in ("no learned absolute position table", "no absolute position table"))
    assert "learned in training" in caption
    assert f"{tokens} rows x {config.hidden_size} dimensions" in caption, caption
    side = config.image_size // config.patch_size
    assert f"the {side} x {side} patches in reading order" in caption, caption
    labels = figure_titled(at, "Learned position embeddings")["data"][0]["y"]
    assert len(labels) == tokens
    prefix = [label for label in labels if not re.fullmatch(r"\(\d+,\d+\)", label)]
    assert len(prefix) == tokens - patches and labels[len(prefix)] == "(0,0)"
    assert labels[-1] == f"({side - 1},{side - 1})"
    assert prefix == labels[:len(prefix)]
    # the word-order experiment says it needs text, and where the table is
    with pytest.raises(ValueError) as refused:
        word_order_experiment(bundle, TEXT)
    message = str(refused.value)
    assert "vision transformer" in message and "no words to shuffle" in message and "Learned tab" in message
    assert "no absolute position table" not in message and "no learned" not in message


def test_a_distilbert_asked_for_sinusoids_is_said_to_be_fixed(tiny_checkpoint):
    from attnviz.bench.tiny import tiny_config

    config = tiny_config("distilbert")
    config.sinusoidal_pos_embds = True
    bundle = load_model_dir(tiny_checkpoint("distilbert", label="distilbert-sinusoidal", config=config))
    facts = text_facts(bundle)
    assert facts["fixed"] and facts["first_row"] == 0
    found = position_tables.position_table(bundle.model)
    assert not found.trained and positional.sinusoidal_layout(found.rows) == "interleaved"
    from attnviz.pagelogic.positional import table_caption, table_heatmap_caption

    assert "fixed sinusoidal, not trained" in table_caption(found, "d")
    assert "even dimensions" in table_heatmap_caption(found)


def test_the_extrapolation_chart_names_a_fixed_table_as_fixed(folders):
    at = open_page("app_pages/positional.py", timeout=240, models={"marian": folders["marian"]}, model="marian",
                   pos_tab="ALiBi")
    assert not at.exception, [e.value for e in at.exception]
    names = [trace["name"] for trace in figure_titled(at, "Position signals beyond")["data"] if "name" in trace]
    own = [name for name in names if "marian" in name]
    assert own and "fixed sinusoidal" in own[0] and not any("learned" in name for name in names), names
    caption = next(c.value for c in at.caption if "Past the training length" in c.value)
    assert "marian's table is fixed sinusoidal" in caption and "learned table" not in caption


def test_the_word_order_tab_on_a_vision_model_says_it_needs_text(folders):
    at = open_page("app_pages/positional.py", timeout=240, models={"vit": folders["vit"]}, model="vit",
                   pos_tab="Word order")
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(i.value for i in at.info)
    assert "vision transformer" in said and "embeddings.position_embeddings" in said and "row 0 is [CLS]" in said


# --- RoPE: both layouts; permutation and the causal mask -------------------------------------------------------


def test_the_papers_rope_layout_is_the_half_split_one_with_dimensions_reordered():
    x = torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6)
    # The paper: each pair (2i, 2i+1) as a complex number, times e^(i m theta_i)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    pairs = torch.view_as_complex(x.reshape(6, 4, 2).contiguous())
    reference = torch.view_as_real(pairs * torch.polar(torch.ones(6, 4, dtype=torch.float64),
                                                       positions[:, None] * theta)).reshape(6, 8)
    torch.testing.assert_close(positional.apply_rope_interleaved(x, positions), reference)
    order = positional.half_split_order(8)
    torch.testing.assert_close(positional.apply_rope(x[:, order], positions), reference[:, order])
    q, k = positional.random_pair(64, 3)
    assert positional.rope_layouts_gap(q, k, 24) < 1e-10


def test_permuting_tokens_permutes_weights_only_without_a_causal_mask():
    q, k = torch.randn(2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    order = torch.tensor([3, 0, 5, 1, 4, 2])

    def weights(q, k, causal):
        scores = q @ k.T
        if causal:
            scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1)

    for causal, permutes in ((False, True), (True, False)):
        shuffled = weights(q[order], k[order], causal)
        assert torch.allclose(shuffled, weights(q, k, causal)[order][:, order]) == permutes
    at = open_page("app_pages/positional.py", pos_tab="RoPE")
    intro = next(c.value for c in at.caption if c.value.startswith("Attention itself has no idea of order"))
    assert "without a mask, permute the tokens and the weights permute" in intro and "causal mask" in intro
    said = " ".join(c.value for c in at.caption)
    assert "(2i, 2i + 1)" in said and "(i, i + d/2)" in said
