"""The frame of every page: its start, presentation mode for a projector, the story's Previous/Next links,
progress boxes, and the run log."""

from __future__ import annotations

import contextlib
import time

import streamlit as st

from attnviz.run_log import append_run_log
from attnviz.streamlit_compat import leave_legacy_pages_mode


def start_page(title: str) -> None:
    """The first call of every page: its title, after making sure app.py's navigation runs around it."""
    leave_legacy_pages_mode()
    st.title(title)


@contextlib.contextmanager
def transient_status(label: str):
    """A progress box for slow work that disappears once the work is done (the result says what happened)."""
    placeholder = st.empty()
    try:
        with placeholder.status(label, expanded=False) as status:
            yield status
    finally:  # also when the work is refused or fails: the page says why, and no box claims it is still working
        placeholder.empty()


@contextlib.contextmanager
def transient_note(label: str):
    """A note that says what is being computed while it is, gone once it is done: for work with no steps to report.
    Unlike :func:`transient_status` it costs nothing on a cache hit (Streamlit's status box waits 0.05 s as it
    opens and again as it closes, to let the browser draw its updates)."""
    placeholder = st.empty()
    placeholder.info(label, icon=":material/hourglass_top:")
    try:
        yield
    finally:  # also when the work raises (a refusal the page then explains)
        placeholder.empty()


PRESENTATION_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 1.25rem; }
[data-testid="stMarkdownContainer"] p, [data-testid="stCaptionContainer"] { font-size: 1.2rem; }
h1 { font-size: 2.6rem !important; }
/* The whole width of a 1280-px projector for the content: the sidebar starts collapsed, the margins shrink. */
[data-testid="stMainBlockContainer"] { max-width: 100%; padding: 2.5rem 1.5rem 2rem 1.5rem; }
</style>
"""


def apply_presentation_mode(enabled: bool) -> None:
    """Larger text for a projector, and the page's full width (figures read ``figure_scale()``)."""
    if enabled:
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)


def presentation_requested() -> bool:
    """Whether this run's URL asks for presentation mode (read before the sidebar exists, to start it
    collapsed)."""
    return st.query_params.get("presentation_mode", "").lower() in ("true", "1", "yes")


# The order a talk follows, from the mechanism to the real model and to the systems that make it fast.
STORY = ("Attention step by step", "Scaling and softmax", "Masks", "Positional encodings", "Explore heads",
         "Heads and KV cache", "Flash vs naive", "Generation and KV cache")


def story_neighbours(title: str) -> tuple[str | None, str | None]:
    """The pages before and after ``title`` in :data:`STORY` (None at either end, or off the story)."""
    if title not in STORY:
        return None, None
    index = STORY.index(title)
    return (STORY[index - 1] if index > 0 else None), (STORY[index + 1] if index + 1 < len(STORY) else None)


def story_links(pages_by_title: dict, title: str) -> None:
    """At the end of each page of the story: "← Previous" and "Next →", one click each."""
    previous, following = story_neighbours(title)
    if previous is None and following is None:
        return
    st.divider()
    left, right = st.columns(2)
    if previous:
        left.page_link(pages_by_title[previous], label=f"← Previous: {previous}")
    if following:
        with right:
            st.page_link(pages_by_title[following], label=f"Next: {following} →")


@contextlib.contextmanager
def logged_run(page: str, started: float):
    """With ``ATTNVIZ_RUN_LOG=<file>``, append one JSON line per script run (:func:`attnviz.run_log.append_run_log`):
    the page, how long the whole run took on the server (app.py included, from ``started``, a
    ``time.perf_counter()``), and how it ended. Nothing about the user (no text, no session id) is written."""
    ending = "finished"
    try:
        yield
    except BaseException as stopped:  # st.stop() and reruns end a run by raising
        ending = type(stopped).__name__
        raise
    finally:
        append_run_log(page, time.perf_counter() - started, ending)
