"""Small helpers shared by the Streamlit pages. Only this module and the pages import streamlit."""

from __future__ import annotations

import streamlit as st

DEFAULT_SENTENCE = "The cat sat on the mat because it was tired."

PRESENTATION_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 1.25rem; }
[data-testid="stMarkdownContainer"] p, [data-testid="stCaptionContainer"] { font-size: 1.2rem; }
h1 { font-size: 3rem !important; }
</style>
"""


def apply_presentation_mode(enabled: bool) -> None:
    """Larger text for a projector (figures read ``figure_scale()``)."""
    if enabled:
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)


def figure_scale() -> float:
    return 1.35 if st.session_state.get("presentation_mode") else 1.0


def current_sentence() -> str:
    return st.session_state.get("sentence", DEFAULT_SENTENCE)


def show_figure(figure, caption: str, key: str | None = None) -> None:
    """A figure with its one-line caption saying what to notice; scaled up in presentation mode."""
    scale = figure_scale()
    if scale != 1.0:
        figure.update_layout(font=dict(size=int(12 * scale)), height=int((figure.layout.height or 400) * scale))
    st.plotly_chart(figure, key=key, config={"displaylogo": False})
    st.caption(caption)
