""""Open in Explore heads" from any page: the text, model, layer and head a button names become Explore heads'
(in the button's callback, before the sidebar's widgets exist), and the page switches at the start of its next run
(``st.switch_page`` cannot run in a callback). Pages call :func:`switch_if_asked` first thing."""

from __future__ import annotations

import streamlit as st

from attnviz.ui.session_models import registered_models
from attnviz.ui.sidebar import MAX_SENTENCE_CHARS, note_sidebar_edit

EXPLORE_PAGE = "app_pages/explore_heads.py"
# Explore heads' text sources (its segmented control "explore_source"): the sidebar's sentence, or a long text
EXPLORE_SENTENCE, EXPLORE_LONG_TEXT = "the sidebar's sentence", "a long text"
_ASKED = "open_explore_asked"


def ask_to_open(text: str, model: str | None, layer: int, head: int) -> None:
    """Callback: Explore heads with ``text`` (the sidebar's sentence, or its long text when longer than the sentence
    box holds), ``model`` (when this session has it) and the head view of ``layer`` and ``head``."""
    state = st.session_state
    if len(text) <= MAX_SENTENCE_CHARS:
        state["sentence"], state["explore_source"] = text, EXPLORE_SENTENCE
    else:
        state["explore_long_text"], state["explore_source"] = text, EXPLORE_LONG_TEXT
    note_sidebar_edit("sentence")
    if model is not None and model in registered_models():
        state["model"] = model
        note_sidebar_edit("model")
    state["layer"], state["head"], state["view"], state["explore_tab"] = layer, head, "head", "View"
    state[_ASKED] = {"layer": str(layer), "head": str(head), "view": "head"}


def switch_if_asked() -> None:
    """After an "Open in Explore heads" click: go there. Only Explore's own parameters go in the URL: the
    sidebar's are bound to its widgets, which write them."""
    wanted = st.session_state.pop(_ASKED, None)
    if wanted:
        st.switch_page(EXPLORE_PAGE, query_params=wanted)
