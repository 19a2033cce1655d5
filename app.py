"""attnviz: see how transformer attention works. Run with `streamlit run app.py`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything works offline: never reach for a model hub

import streamlit as st

from attnviz.runtime import optional_features
from attnviz.ui import DEFAULT_SENTENCE, apply_presentation_mode

st.set_page_config(page_title="attnviz · attention, explained", page_icon="🔍", layout="wide")

pages = [
    st.Page("pages/step_by_step.py", title="Attention step by step", icon="🧮", default=True),
]
navigation = st.navigation(pages)

with st.sidebar:
    st.text_input(
        "Sentence",
        value=DEFAULT_SENTENCE,
        key="sentence",
        max_chars=2000,
        help="The text every page works on. Pages that need few tokens take the first words.",
    )
    st.toggle("Presentation mode", key="presentation_mode", help="Larger text and figures for a projector.")
    with st.expander("This installation"):
        for feature in optional_features():
            if feature.available:
                st.markdown(f"✅ **{feature.package}** {feature.version or ''}: {feature.needed_for}.")
            else:
                st.markdown(f"⚠️ **{feature.package}** is not installed: {feature.needed_for} is unavailable.")

apply_presentation_mode(st.session_state.get("presentation_mode", False))
navigation.run()
