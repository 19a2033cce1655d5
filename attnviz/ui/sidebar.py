"""The global sidebar's memory: the sentence every page reads, and the choices kept across page changes."""

from __future__ import annotations

import streamlit as st

from attnviz.models.shipped import DEFAULT_MODEL_NAME
from attnviz.tiny_gpt.text import DEFAULT_SENTENCE

MAX_SENTENCE_CHARS = 5000


def current_sentence() -> str:
    return st.session_state.get("sentence", DEFAULT_SENTENCE)


def restore_sidebar_choices(valid_models, model_just_set: bool = False) -> None:
    """Give the sidebar's sentence and model the values this session last showed, unless the user changed them.

    Streamlit keeps a widget's value across a page change only if the browser sends it with the rerun, and the
    browser sends a value that came from the URL only once it has committed it: click to another page soon after
    opening a link (seen at once under load: eight sessions on two cores) and the sentence falls back to the
    default. So the values are saved at the end of every run (:func:`keep_sidebar_choices`) and set again here,
    before the widgets, unless their ``on_change`` (:func:`note_sidebar_edit`) says the user changed them."""
    kept = st.session_state.get("kept_sidebar", {})
    edited = st.session_state.pop("sidebar_edited", set())
    # Set again when the value is the kept one (so that it wins over the widget's default) or has fallen back to
    # the default; a value set some other way (a test's session state) is left alone.
    defaults = {"sentence": DEFAULT_SENTENCE, "model": DEFAULT_MODEL_NAME}
    for key, default in defaults.items():
        if key not in kept or key in edited or (key == "model" and (model_just_set or kept[key] not in valid_models)):
            continue
        if st.session_state.get(key, default) in (kept[key], default):
            st.session_state[key] = kept[key]


def note_sidebar_edit(key: str) -> None:
    st.session_state.setdefault("sidebar_edited", set()).add(key)


def keep_sidebar_choices() -> None:
    st.session_state["kept_sidebar"] = {key: st.session_state[key] for key in ("sentence", "model")
                                        if key in st.session_state}
