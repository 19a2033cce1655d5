"""AppTest: the 'Attention step by step' page reacts to edits and never shows a traceback."""

import numpy as np
import pytest

from tests.apptest_helpers import figure_titled, figures, open_page, plotly_array

PAGE = "app_pages/step_by_step.py"


def weights_of(at):
    return plotly_array(figure_titled(at, "Step 4")["data"][0]["z"])


def test_page_renders_all_five_steps():
    at = open_page(PAGE)
    titles = [spec["layout"]["title"]["text"] for spec in figures(at)]
    assert [t.split(" ·")[0] for t in titles] == ["Step 1", "Step 2", "Step 3", "Step 4", "Step 5"]
    weights = weights_of(at)
    assert weights.shape == (8, 8)  # the default sentence has more than 8 words: the first 8 are used
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-9)
    assert any("first 8 words" in info.value for info in at.info)
    ticks = figure_titled(at, "Step 4")["layout"]["xaxis"]["ticktext"]
    assert ticks[0] == "0 · The" and ticks[4] == "4 · the"  # repeated words kept apart by position


def test_editing_a_cell_changes_the_weights():
    at = open_page(PAGE)
    before = weights_of(at)
    q_editor = next(editor for editor in at.data_editor if "_Q_" in editor.key)
    at.session_state[q_editor.key] = {"edited_rows": {0: {"d1": 25.0}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert not at.exception
    after = weights_of(at)
    assert not np.allclose(before[0], after[0]), "row 0 should change when Q[0] changes"
    np.testing.assert_allclose(after[1:], before[1:], atol=1e-12)  # other queries are untouched
    np.testing.assert_allclose(after.sum(axis=1), 1.0, atol=1e-9)


def test_causal_mask_zeroes_the_future_and_rows_still_sum_to_one():
    at = open_page(PAGE)
    assert np.triu(weights_of(at), k=1).sum() > 0
    at.selectbox(key="sbs_mask").set_value("causal").run()
    weights = weights_of(at)
    assert np.all(np.triu(weights, k=1) == 0)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-9)
    masked_text = figure_titled(at, "Step 3")["data"][0]["text"]
    assert masked_text[0][1] == "−∞"
    assert any("Each query sees between 1 and 8" in m.value for m in at.markdown)


def test_sliding_window_limits_keys():
    at = open_page(PAGE)
    at.selectbox(key="sbs_mask").set_value("sliding_window").run()
    at.slider(key="sbs_left").set_value(1).run()
    weights = weights_of(at)
    assert all(np.count_nonzero(row) <= 2 for row in weights)
    assert np.count_nonzero(weights[5]) == 2


def test_score_function_and_d_k_change_the_numbers():
    at = open_page(PAGE)
    scaled = weights_of(at)
    at.selectbox(key="sbs_score_function").set_value("dot").run()
    assert "no scaling" in figure_titled(at, "Step 2")["layout"]["title"]["text"]
    assert not np.allclose(weights_of(at), scaled)
    at.selectbox(key="sbs_score_function").set_value("additive").run()
    np.testing.assert_allclose(weights_of(at).sum(axis=1), 1.0, atol=1e-9)
    at.slider(key="sbs_d_k").set_value(2).run()
    assert plotly_array(figure_titled(at, "Step 5")["data"][0]["z"]).shape == (8, 2)


def test_additive_caption_states_its_real_bound_and_no_saturation_claim():
    from attnviz.core import stepwise

    at = open_page(PAGE)
    at.selectbox(key="sbs_score_function").set_value("additive").run()
    at.slider(key="sbs_d_k").set_value(8).run()
    caption = next(c.value for c in at.caption if "tanh" in c.value and "√d_k" in c.value)
    assert "saturates" not in caption
    scores = plotly_array(figure_titled(at, "Step 1")["data"][0]["z"])
    seed = int(at.number_input(key="sbs_seed").value)
    v = stepwise.score_parameters(8, seed).v_additive  # d_a = d_k = 8 on this page
    bound = float(v.abs().sum())
    assert f"±{bound:.3g}" in caption and f"d_a = {v.numel()}" in caption
    assert np.abs(scores).max() <= bound


@pytest.mark.parametrize(
    "q_text,message",
    [
        ("1 2\nabc 3", "'abc' is not a number"),
        ("", "Q is empty"),
        ("1 2 3\n4 5 6", "same d_k"),
    ],
)
def test_bad_hand_typed_input_gives_a_message_not_a_traceback(q_text, message):
    at = open_page(PAGE)
    at.radio(key="sbs_source").set_value("Type numbers by hand").run()
    at.slider(key="sbs_d_k").set_value(2).run()
    at.text_area(key="sbs_text_Q_2_0").input(q_text).run()
    assert not at.exception
    assert any(message in error.value for error in at.error), [e.value for e in at.error]
    assert not at.get("plotly_chart")


def test_hand_typed_matrices_of_different_lengths():
    at = open_page(PAGE)
    at.radio(key="sbs_source").set_value("Type numbers by hand").run()
    at.text_area(key="sbs_text_Q_4_0").input("1 0\n0 1").run()  # the boxes of the 4-column example, seed 0
    at.text_area(key="sbs_text_K_4_0").input("1 0\n0 1\n1 1").run()
    at.text_area(key="sbs_text_V_4_0").input("1\n2\n3").run()
    assert not at.exception and not at.error
    weights = weights_of(at)
    assert weights.shape == (2, 3)
    expected = np.exp(np.array([[1, 0, 1], [0, 1, 1]]) / np.sqrt(2))
    np.testing.assert_allclose(weights, expected / expected.sum(axis=1, keepdims=True), atol=1e-12)


def test_typed_matrices_are_scaled_by_their_own_d_k_and_the_title_says_so():
    at = open_page(PAGE)
    at.radio(key="sbs_source").set_value("Type numbers by hand").run()
    at.slider(key="sbs_d_k").set_value(8).run()  # the example starts with 8 columns...
    at.text_area(key="sbs_text_Q_8_0").input("1 0 2\n0 1 1").run()  # ...but the typed Q and K have 3
    at.text_area(key="sbs_text_K_8_0").input("1 0 0\n0 1 0\n1 1 1").run()
    at.text_area(key="sbs_text_V_8_0").input("1\n2\n3").run()
    assert not at.exception and not at.error
    scaled = figure_titled(at, "Step 2")
    assert scaled["layout"]["title"]["text"].startswith("Step 2 · Scaled scores (÷ √3 = ÷ 1.73)")
    raw = plotly_array(figure_titled(at, "Step 1")["data"][0]["z"])
    np.testing.assert_allclose(plotly_array(scaled["data"][0]["z"]), raw / np.sqrt(3), atol=1e-12)
    assert "Columns of the example" in at.slider(key="sbs_d_k").label


def test_empty_sentence_asks_for_words():
    at = open_page(PAGE, sentence="   ")
    assert not at.exception
    assert any("empty" in w.value for w in at.warning)


def test_steps_one_to_three_share_one_colour_scale():
    at = open_page(PAGE, sbs_d_k=8)  # scaling divides the scores by 2.8
    ranges = {title: (figure_titled(at, title)["data"][0]["zmin"], figure_titled(at, title)["data"][0]["zmax"])
              for title in ("Step 1", "Step 2", "Step 3")}
    assert len(set(ranges.values())) == 1, ranges
    low, high = ranges["Step 1"]
    scores = plotly_array(figure_titled(at, "Step 1")["data"][0]["z"])
    assert high == -low == pytest.approx(np.nanmax(np.abs(scores)))  # the widest of the three: the unscaled scores
    assert any("share one colour scale" in c.value for c in at.caption)
