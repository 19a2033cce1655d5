"""Head detectors on one text (Explore heads, Head statistics): induction, duplicate token and the reader's own
patterns (offsets, key tokens, a typed matrix) score every head as a brute force over transformers' eager weights
does, relate to TransformerLens's detect_head as the page says, and refuse a pattern they cannot read in words."""

import numpy as np
import pytest
import torch

from attnviz.models.capture import capture
from attnviz.pagelogic.explore_heads.detectors import PatternProblem, detector_scores, pattern_targets
from tests.apptest_helpers import figures, open_page, plotly_array

EXPLORE = "app_pages/explore_heads.py"
REPEATED = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog."


@pytest.fixture(autouse=True)
def _clean(clean_streamlit_caches):
    yield


def eager(bundle, text):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(bundle.folder, attn_implementation="eager", local_files_only=True,
                                      use_safetensors=True).eval()
    encoded = bundle.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**encoded, output_attentions=True).attentions
    return encoded["input_ids"][0].tolist(), torch.stack([a[0] for a in attentions]).double().numpy()


def test_induction_duplicate_and_offsets_equal_a_brute_force_over_eager_weights(bert):
    result = capture(bert, REPEATED)
    tokens = result.records["self"].key_tokens
    ids, weights = eager(bert, REPEATED)
    assert ids == result.token_ids
    special = result.special
    n = len(ids)
    for kind in ("induction", "duplicate token", "offsets"):
        targets = pattern_targets(kind, "-2, -1", result, tokens)
        scores = detector_scores(result, "self", targets)
        on, rows = np.zeros(weights.shape[:2]), 0
        for i in range(n):
            earlier = [j for j in range(i) if ids[j] == ids[i] and not special[i] and not special[j]]
            keys = {"induction": sorted({j + 1 for j in earlier}), "duplicate token": earlier,
                    "offsets": [j for j in (i - 2, i - 1) if j >= 0]}[kind]
            if keys:
                on += weights[:, :, i, keys].sum(-1)
                rows += 1
        assert scores.queries_with_target == rows > 0
        np.testing.assert_allclose(scores.mean, on / rows, atol=2e-6, err_msg=kind)
        np.testing.assert_allclose(scores.transformerlens, on / n, atol=2e-6, err_msg=kind)  # detect_head's "mul"


def test_key_tokens_and_a_typed_matrix(bert):
    result = capture(bert, "the cat and the dog")
    tokens = result.records["self"].key_tokens  # [CLS] the cat and the dog [SEP]
    by_words = pattern_targets("key tokens", "The, [SEP]", result, tokens)
    assert by_words[0].tolist() == [t in ("the", "[SEP]") for t in tokens]
    n = len(tokens)
    typed = "\n".join(" ".join("1" if j == 0 else "0" for j in range(n)) for _ in range(n))
    first = detector_scores(result, "self", pattern_targets("matrix", typed, result, tokens))
    weights = result.records["self"].every_layer_weights().double()
    np.testing.assert_allclose(first.mean, weights[..., 0].mean(-1).numpy(), atol=1e-6)
    with pytest.raises(PatternProblem, match=f"needs {n} rows of {n} numbers"):
        pattern_targets("matrix", "1 0\n0 1", result, tokens)
    with pytest.raises(PatternProblem, match="0 and 1 only"):
        pattern_targets("matrix", typed.replace("1", "2", 1), result, tokens)
    with pytest.raises(PatternProblem, match="whole numbers"):
        pattern_targets("offsets", "-1, two", result, tokens)


def test_the_page_maps_a_detector_and_says_how_transformerlens_scores_it(bert):
    at = open_page(EXPLORE)
    at.session_state["sentence"] = REPEATED
    at.session_state["explore_tab"] = "Head statistics"
    at.run()
    assert not at.exception
    assert "induction" in at.selectbox(key="explore_stats_map").options  # the text repeats tokens
    at.selectbox(key="explore_detector").set_value("induction").run()
    title = "induction: weight on the pattern, every head"
    spec = next(s for s in figures(at) if s["layout"]["title"]["text"] == title)
    result = capture(bert, REPEATED)
    expected = detector_scores(result, "self", pattern_targets("induction", "", result, result.tokens))
    np.testing.assert_allclose(plotly_array(spec["data"][0]["z"]).reshape(6, 12), expected.mean, atol=1e-6)
    caption = next(c.value for c in at.caption if "TransformerLens's detect_head" in c.value)
    best = np.unravel_index(np.nanargmax(expected.mean), expected.mean.shape)
    assert f"layer {best[0]}, head {best[1]} ({expected.mean[best]:.3f})" in caption
    assert f"gives it {expected.transformerlens[best]:.3f}" in caption
    assert "The tokenizer starts the text with [CLS]" in caption  # whether a BOS stands first, said
    at.selectbox(key="explore_detector").set_value("offsets").run()
    at.text_input(key="explore_detector_offsets").set_value("minus one").run()
    assert any("whole numbers" in w.value for w in at.warning) and not at.exception


def test_a_decoder_is_not_offered_the_next_token_map(tiny_checkpoint):
    from attnviz.models.loading import load_model_dir
    from attnviz.pagelogic.explore_heads.statistics import statistics_table, statistics_that_apply

    bundle = load_model_dir(tiny_checkpoint("gpt2"))
    result = capture(bundle, "one two three one two three")
    table = statistics_table(result, "self")
    applying = statistics_that_apply(table, result.records["self"].is_causal())

    assert "next token" not in applying and "induction" in applying and "previous token" in applying


def test_the_bundled_tiny_gpt_has_no_bos_and_the_note_says_so():
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import BUNDLED_GPT_DIR
    from attnviz.pagelogic.explore_heads.detectors import bos_note

    result = capture(load_model_dir(BUNDLED_GPT_DIR), "red green blue red green blue")
    scores = detector_scores(result, "self", pattern_targets("induction", "", result, result.tokens))
    assert not result.special[0] and bos_note(scores).startswith("No BOS token is prepended")
    # "red" starts the text without a space: its second " red" is another token, so green and blue repeat
    assert scores.queries_with_target == 2 and np.nanmax(scores.mean) > 0.5
