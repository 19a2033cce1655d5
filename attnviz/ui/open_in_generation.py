""""Open in Generation" from any page, as :mod:`attnviz.ui.open_in_explore` does for Explore heads: the prompt and
the model a button names become Generation's (in the button's callback, before the sidebar's widgets exist), and the
page switches at the start of the next run (``st.switch_page`` cannot run in a callback). Pages with such a button
call :func:`switch_if_asked` first thing."""

from __future__ import annotations

import streamlit as st

from attnviz.ui.caches.generation import REQUEST_DEFAULTS
from attnviz.ui.session_models import registered_models
from attnviz.ui.sidebar import note_sidebar_edit

GENERATION_PAGE = "app_pages/generation.py"
_ASKED = "open_generation_asked"


def ask_to_generate(prompt: str, model: str | None) -> None:
    """Callback: Generation with ``prompt`` (the request in use and its box) and ``model`` (the sidebar's, which
    the page runs when it generates; when this session has it)."""
    state = st.session_state
    request = state.setdefault("gen_request", dict(REQUEST_DEFAULTS))
    request["prompt"] = prompt
    state.pop("gen_prompt", None)  # the box starts from the request in use
    if model is not None and model in registered_models():
        state["model"] = model
        note_sidebar_edit("model")
        state.pop("gen_model", None)  # the page's model box starts from the sidebar's
    state[_ASKED] = True


def switch_if_asked() -> None:
    """After an "Open in Generation" click: go there. With no query parameters of its own (the sidebar's are bound to
    its widgets, which write them): ``query_params=None`` would clear this page's, and Streamlit refuses to clear
    those bound to a widget."""
    if st.session_state.pop(_ASKED, None):
        st.switch_page(GENERATION_PAGE, query_params={})
