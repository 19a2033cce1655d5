"""A mask pattern is one registry entry: a pattern registered here, in the test, appears on the Masks page, in
Explore heads' What-if tab and on the Flash page, with its widgets, and its rule is its dense mask through the flash
dispatch."""

import numpy as np
import pytest
import torch

from attnviz.core import mask_patterns, masks
from attnviz.core.attention import scaled_dot_product_attention
from attnviz.core.mask_patterns import FLASH, GALLERY, STEP, WHAT_IF, MaskPattern, PatternMask, Widget
from attnviz.flash.cases import AttentionCase
from attnviz.flash.dispatch import run_contender
from attnviz.pagelogic import flash as flash_page
from attnviz.pagelogic import masks as masks_page
from attnviz.pagelogic.explore_heads import whatif
from tests.apptest_helpers import figure_titled, open_page, plotly_array

CHUNKS = "test_chunks"
LABEL = "Chunks (a test's own)"


def chunk_mask(n: int, chunk: int) -> torch.Tensor:
    """``[n, n]`` bool: each query sees the keys of its own chunk of ``chunk`` tokens (chunked local attention)."""
    chunks = torch.arange(n) // chunk
    return chunks.unsqueeze(1) == chunks.unsqueeze(0)


def chunk_rule(n_q: int, n_k: int, p: dict) -> masks.MaskSpec:
    """The same pattern as the flash kernels follow it: a block-sparse layout, one diagonal block per chunk."""
    blocks = -(-n_q // p["chunk"])
    return masks.MaskSpec(n_q, n_k, block_layout=torch.eye(blocks, dtype=torch.bool), block_size=p["chunk"])


@pytest.fixture
def chunks_pattern(clean_streamlit_caches):
    pattern = mask_patterns.register(MaskPattern(
        key=CHUNKS, label=LABEL, parameters={"chunk": 4},
        cost=lambda p: "O(N·c)",
        describe=lambda p: f"Each query sees the {p['chunk']} keys of its own chunk.",
        build=lambda n_q, n_k, p: PatternMask(chunk_mask(n_q, p["chunk"])),
        allowed_pairs=lambda n, p: float(n) * p["chunk"],
        rule=chunk_rule,
        square_only=True,
        places={
            GALLERY: (Widget("chunk", "Chunk c (tokens)", 1, lambda n, p: max(2, n)),),
            WHAT_IF: (Widget("chunk", "Chunk (tokens)", 1, lambda n, p: n, box=True),),
            FLASH: (Widget("chunk", "Chunk", choices=(16, 32, 64), default=32),),
            STEP: (Widget("chunk", "Chunk (tokens)", 1, lambda n, p: n),),
        },
    ))
    yield pattern
    mask_patterns.PATTERNS.pop(CHUNKS)


def test_a_registered_pattern_is_listed_in_each_of_its_places(chunks_pattern):
    assert CHUNKS in masks_page.gallery_patterns()
    assert CHUNKS in whatif.what_if_masks()
    assert CHUNKS in flash_page.flash_masks()
    assert CHUNKS in mask_patterns.shown_in(STEP)
    assert torch.equal(whatif.what_if_mask(CHUNKS, 6, 6, chunk=2), chunk_mask(6, 2))


def test_a_registered_pattern_is_on_the_masks_page(chunks_pattern):
    at = open_page("app_pages/masks.py")
    assert LABEL in at.selectbox(key="masks_pattern").options
    at.selectbox(key="masks_pattern").set_value(CHUNKS).run()
    at.slider(key="masks_chunk").set_value(3).run()  # its widget, from the registry
    assert not at.exception, [e.value for e in at.exception]
    n = 13  # the default sentence's tokens with [CLS] and [SEP]
    z = plotly_array(figure_titled(at, f"{LABEL} over your {n} tokens")["data"][0]["z"])
    assert np.array_equal(z, chunk_mask(n, 3).numpy())
    assert at.metric[2].value == "O(N·c)"
    assert any("Each query sees the 3 keys of its own chunk." in c.value for c in at.caption)


def test_a_registered_pattern_is_in_the_what_if_tab(chunks_pattern):
    at = open_page("app_pages/explore_heads.py", explore_tab="What-if")
    at.selectbox(key="whatif_mask").set_value(CHUNKS).run()
    at.number_input(key="whatif_chunk").set_value(4).run()
    assert not at.exception, [e.value for e in at.exception]
    after = plotly_array(figure_titled(at, f"After: {LABEL}")["data"][0]["z"])
    outside = ~chunk_mask(after.shape[0], 4).numpy()
    assert np.all(np.nan_to_num(after)[outside] == 0)
    np.testing.assert_allclose(np.nansum(after, axis=1), 1.0, atol=1e-5)  # renormalised within each chunk


def test_a_registered_pattern_is_on_the_step_by_step_page(chunks_pattern):
    at = open_page("app_pages/step_by_step.py")
    at.selectbox(key="sbs_mask").set_value(CHUNKS).run()
    at.slider(key="sbs_chunk").set_value(2).run()  # its widget, from the registry
    assert not at.exception, [e.value for e in at.exception]
    weights = np.nan_to_num(plotly_array(figure_titled(at, "Step 4 · Weights")["data"][0]["z"]))
    outside = ~chunk_mask(weights.shape[0], 2).numpy()
    assert np.all(weights[outside] == 0) and not np.all(weights[~outside] == 0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-3)


@pytest.mark.parametrize("n", [17, 64])
def test_a_registered_patterns_rule_is_its_dense_mask_through_the_dispatch(chunks_pattern, n):
    case = AttentionCase(n, d=16, heads=2, mask=CHUNKS, mask_params=(("chunk", 8),))
    dense = mask_patterns.build(CHUNKS, n, chunk=8).mask
    assert torch.equal(case.mask_spec().dense(), dense)
    q, k, v = case.tensors()
    expected, _ = scaled_dot_product_attention(q, k, v, dense)
    for contender in ("naive", "tiled"):
        output = run_contender(contender, q, k, v, case.mask_spec()).output
        torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


def test_a_registered_pattern_is_on_the_flash_page(chunks_pattern):
    at = open_page("app_pages/flash.py", flash_n=128, flash_backends=["naive", "tiled"])
    at.selectbox(key="flash_mask").set_value(CHUNKS).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.select_slider(key="flash_chunk").value == 32  # the widget the registry gives the Flash page
    table = next(t.value for t in at.table if "backend" in t.value.columns)
    ran = table[table["ran as"] != "—"]
    assert set(ran["ran as"]) == {"naive", "tiled"}
    assert all(float(x) < 1e-4 for x in ran["max |out − naive fp64|"])
    figure_titled(at, "4 x 4 tiles of 32 x 32")  # the tiles are the pattern's blocks


def test_a_pattern_must_say_where_it_appears_in_known_places():
    def pattern(**changes):
        fields = dict(key="test_bad", label="Bad", parameters={"width": 1}, cost=str, describe=str,
                      build=lambda n_q, n_k, p: PatternMask(masks.full(n_q, n_k)), allowed_pairs=lambda n, p: 0.0)
        return MaskPattern(**{**fields, **changes})

    with pytest.raises(ValueError, match="unknown places"):
        mask_patterns.register(pattern(places={"sidebar": ()}))
    with pytest.raises(ValueError, match="has none"):
        mask_patterns.register(pattern(places={FLASH: ()}))  # the Flash page needs a rule
    with pytest.raises(ValueError, match="unknown parameters"):
        mask_patterns.register(pattern(places={GALLERY: (Widget("height", "Height"),)}))
    assert "test_bad" not in mask_patterns.PATTERNS
