"""Presentation mode from a link, and the story order of the pages (AppTest; the 1280 x 720 check and each page's
Next / Previous links are checked in Chromium, tests/e2e/test_presentation_in_browser.py)."""

from streamlit.testing.v1 import AppTest

from attnviz.app import SCRIPT
from attnviz.ui import frame

SCRIPTS = {"Attention step by step": "app_pages/step_by_step.py", "Scaling and softmax": "app_pages/scaling.py",
           "Masks": "app_pages/masks.py", "Positional encodings": "app_pages/positional.py",
           "Explore heads": "app_pages/explore_heads.py", "Over training": "app_pages/over_training.py",
           "Heads and KV cache": "app_pages/heads_kv_cache.py",
           "Flash vs naive": "app_pages/flash.py", "Generation and KV cache": "app_pages/generation.py"}


def test_the_story_runs_from_the_mechanism_to_the_systems():
    assert frame.STORY[0] == "Attention step by step" and frame.STORY[-1] == "Generation and KV cache"
    assert frame.story_neighbours("Attention step by step") == (None, "Scaling and softmax")
    assert frame.story_neighbours("Explore heads") == ("Positional encodings", "Over training")
    assert frame.story_neighbours("Over training") == ("Explore heads", "Heads and KV cache")
    assert frame.story_neighbours("Flash vs naive") == ("Heads and KV cache", "Generation and KV cache")
    assert frame.story_neighbours("Generation and KV cache") == ("Flash vs naive", None)
    assert frame.story_neighbours("Checkpoints") == (None, None)
    assert set(frame.STORY) == set(SCRIPTS)


def test_presentation_mode_comes_from_the_link():
    at = AppTest.from_file(str(SCRIPT), default_timeout=120)
    at.query_params["presentation_mode"] = "true"
    at.run()
    assert at.session_state["presentation_mode"] is True
    assert any("stMainBlockContainer" in m.value for m in at.markdown)  # the full-width style is on
    plain = AppTest.from_file(str(SCRIPT), default_timeout=120).run()
    assert plain.session_state["presentation_mode"] is False
    assert not any("stMainBlockContainer" in m.value for m in plain.markdown)


def test_progress_boxes_are_cleared_when_the_work_is_refused():
    """A refusal raised inside a progress box (the page then says why) leaves no box claiming work goes on."""
    from streamlit.testing.v1 import AppTest

    def script():
        import streamlit as st

        from attnviz.ui.frame import transient_note, transient_status

        for box in (transient_note, transient_status):
            try:
                with box("Generating…"):
                    raise ValueError("the prompt is longer than the model reads")
            except ValueError as refusal:
                st.error(str(refusal))

    app = AppTest.from_function(script).run()
    assert not app.exception and len(app.error) == 2
    assert not [box for box in app.info if "Generating" in box.value]
    assert not app.get("status") and not app.get("expandable")


def test_figure_columns_carry_the_width_their_figures_are_built_for():
    """figure_columns: a keyed row whose CSS rule (in every page's layout rules) gives each column its minimum
    width; a width without a rule is refused. Whether the columns stack at 900 px and sit side by side at 1440 px is
    checked in Chromium (tests/e2e/test_presentation_in_browser.py)."""
    import pytest

    def script():
        import streamlit as st

        from attnviz.ui.frame import figure_columns

        left, right = figure_columns(2, key="demo", min_width=400)
        left.write("left")
        right.write("right")
        try:
            figure_columns(2, key="odd", min_width=333)
        except ValueError as refusal:
            st.error(str(refusal))

    app = AppTest.from_function(script).run()
    assert not app.exception
    row = next(iter(app._tree[0].children.values()))  # the first block of the page's main area
    assert row.proto.id.endswith(f"-{frame.FIGURE_ROW}400_demo")  # the key the CSS rule matches
    assert [column.proto.weight for column in app.columns] == [0.5, 0.5]
    assert [column.markdown[0].value for column in app.columns] == ["left", "right"]
    assert "min_width must be one of" in app.error[0].value
    for width in frame.FIGURE_COLUMN_WIDTHS:
        assert f'st-key-{frame.FIGURE_ROW}{width}_"]' in frame.LAYOUT_CSS and f"min-width: min({width}px" in \
            frame.LAYOUT_CSS
    with pytest.raises(ValueError):
        frame.figure_columns(2, key="x", min_width=333)
