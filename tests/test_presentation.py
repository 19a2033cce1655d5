"""Presentation mode from a link, and the story order of the pages (AppTest; the 1280 x 720 check and each page's
Next / Previous links are checked in Chromium, tests/e2e/test_presentation_in_browser.py)."""

from streamlit.testing.v1 import AppTest

from attnviz.ui import frame
from tests.apptest_helpers import ROOT

SCRIPTS = {"Attention step by step": "pages/step_by_step.py", "Scaling and softmax": "pages/scaling.py",
           "Masks": "pages/masks.py", "Positional encodings": "pages/positional.py",
           "Explore heads": "pages/explore_heads.py", "Heads and KV cache": "pages/heads_kv_cache.py",
           "Flash vs naive": "pages/flash.py", "Generation and KV cache": "pages/generation.py"}


def test_the_story_runs_from_the_mechanism_to_the_systems():
    assert frame.STORY[0] == "Attention step by step" and frame.STORY[-1] == "Generation and KV cache"
    assert frame.story_neighbours("Attention step by step") == (None, "Scaling and softmax")
    assert frame.story_neighbours("Explore heads") == ("Positional encodings", "Heads and KV cache")
    assert frame.story_neighbours("Flash vs naive") == ("Heads and KV cache", "Generation and KV cache")
    assert frame.story_neighbours("Generation and KV cache") == ("Flash vs naive", None)
    assert frame.story_neighbours("Checkpoints") == (None, None)
    assert set(frame.STORY) == set(SCRIPTS)


def test_presentation_mode_comes_from_the_link():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params["presentation_mode"] = "true"
    at.run()
    assert at.session_state["presentation_mode"] is True
    assert any("stMainBlockContainer" in m.value for m in at.markdown)  # the full-width style is on
    plain = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
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
