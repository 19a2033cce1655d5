"""The frame of every page: its start, presentation mode for a projector, the story's Previous/Next links,
progress boxes, and the run log."""

from __future__ import annotations

import contextlib
import time

import streamlit as st

from attnviz.system.run_log import append_run_log
from attnviz.viz.matrix import HALF_WIDTH


def start_page(title: str) -> None:
    """The first call of every page: its title."""
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
h1 { font-size: 2.1rem !important; padding: 0.25rem 0 0.25rem 0 !important; }
[data-testid="stHeader"] { background: transparent; }  /* the title just under it stays whole */
[data-testid="stMain"] [data-testid="stVerticalBlock"] { gap: 0.6rem; }
/* The whole width of a 1280-px projector for the content: the sidebar starts collapsed, the margins shrink, and
   the first screen goes to the page's point (the header's strip is only the sidebar's button). */
[data-testid="stMainBlockContainer"] { max-width: 100%; padding: 2.25rem 1.5rem 2rem 1.5rem; }
</style>
"""


FIGURE_ROW = "figrow"  # the key prefix of figure_columns' rows, which LAYOUT_CSS gives their minimum width
FIGURE_COLUMN_WIDTHS = (230, 260, 300, 400, HALF_WIDTH)  # px: the widths a figure column may ask for (a CSS rule each)


# Every page, every width: a row of controls too narrow for its labels wraps onto the next line instead of cutting
# them ("Hid…", "Ca", "fp" at 900 px); a column never gets narrower than its labels need.
LAYOUT_CSS = """
<style>
/* The story's links above the title sit in the header's band, at the right, on every screen of the page: no line
   of their own, and Next is one click away wherever the page is scrolled to.
   They sit on a card of their own, so a page scrolled under them does not show through their text. */
.st-key-story_top {
  position: fixed; top: 0.7rem; right: 4.5rem; left: auto; width: max-content !important; z-index: 999991;
  background: #ffffff; border-radius: 0.5rem; padding: 0.1rem 0.75rem; box-shadow: 0 1px 6px rgba(27, 31, 36, 0.15); }
@media (max-width: 1000px) { .st-key-story_top { position: static; box-shadow: none; padding: 0; } }
[data-testid="stMain"] [data-testid="stHorizontalBlock"] { flex-wrap: wrap; }
/* Labels, buttons, metric values and a multiselect's chips wrap onto a second line in a narrow column instead of
   ending in "…" or scrolling out of sight. */
[data-testid="stMain"] [data-testid="stCheckbox"] [data-testid="stMarkdownContainer"],
[data-testid="stMain"] [data-testid="stCheckbox"] [data-testid="stMarkdownContainer"] p,
[data-testid="stMain"] [data-testid="stButton"] button [data-testid="stMarkdownContainer"],
[data-testid="stMain"] [data-testid="stButton"] button [data-testid="stMarkdownContainer"] p,
[data-testid="stMain"] [data-testid="stMetricValue"] > div,
[data-testid="stMain"] [data-testid="stMetricValue"] p {
  white-space: normal; overflow: visible; text-overflow: clip; }
[data-testid="stMain"] [data-testid="stButton"] button { height: auto; }
[data-testid="stMain"] [data-testid="stRadio"] [role="radiogroup"] { flex-wrap: wrap; }
[data-testid="stMain"] [data-testid="stButtonGroup"] > div { flex-wrap: wrap; overflow: visible; row-gap: 0.25rem; }
[data-testid="stMain"] [data-testid="stMultiSelectTagsContainer"] { flex-wrap: wrap; overflow: visible; height: auto; }
[data-testid="stMain"] [data-testid="stMultiSelect"] div:has(> [data-testid="stMultiSelectTagsContainer"]) {
  max-height: none; height: auto; }
[data-testid="stMain"] [data-testid="stMultiSelect"] .react-aria-ComboBox { height: auto; }
[data-testid="stMain"] [data-testid="stHorizontalBlock"] > [data-testid="stColumn"] {
  min-width: min(120px, 100%); flex-grow: 0; }
""" + "".join(
    f'[class*="st-key-{FIGURE_ROW}{width}_"] > [data-testid="stLayoutWrapper"] > [data-testid="stHorizontalBlock"] '
    f'> [data-testid="stColumn"] {{ min-width: min({width}px, 100%); flex-grow: 1; }}\n'
    for width in FIGURE_COLUMN_WIDTHS) + """</style>
"""


def figure_columns(spec, *, key: str, min_width: int = HALF_WIDTH, gap: str = "small") -> list:
    """``st.columns(spec)`` for figures: side by side while each column gets ``min_width`` px (one of
    :data:`FIGURE_COLUMN_WIDTHS`), one under the other at full width in a narrower window (a 900-px window, a
    laptop with the sidebar open). A figure drawn in one can be built for ``min_width`` px: it is never drawn
    narrower, so its ticks, titles and cell values are fitted to a width it really gets. ``gap``: as for
    ``st.columns``."""
    if min_width not in FIGURE_COLUMN_WIDTHS:
        raise ValueError(f"min_width must be one of {FIGURE_COLUMN_WIDTHS}, not {min_width}")
    with st.container(key=f"{FIGURE_ROW}{min_width}_{key}"):
        return list(st.columns(spec, gap=gap))


def apply_presentation_mode(enabled: bool) -> None:
    """Every page's layout rules; in presentation mode also larger text for a projector and the page's full width
    (figures read ``figure_scale()``)."""
    with st.sidebar:  # the rules apply to the whole page from there, without a gap in the page's own column
        st.markdown(LAYOUT_CSS + (PRESENTATION_CSS if enabled else ""), unsafe_allow_html=True)


def presenting() -> bool:
    """Whether presentation mode is on (a projector: the page's point first, the speaker says the rest)."""
    return bool(st.session_state.get("presentation_mode", False))


def page_intro(text: str) -> None:
    """The page's opening words: a caption; on a projector, behind one click (the speaker says them), so that the
    page's point comes up on the first screen."""
    if presenting():
        with st.expander("About this page", icon=":material/info:"):
            st.caption(text)
    else:
        st.caption(text)


def setup_area(label: str):
    """Where a page puts what sets up its point but is not the point (the text, the model, checks, secondary
    options): in presentation mode a closed expander, so that the page's main figure is on the projector's first
    screen; otherwise a plain container, in place."""
    if presenting():
        return st.expander(label, expanded=False, icon=":material/tune:")
    return st.container()


def presentation_requested() -> bool:
    """Whether this run's URL asks for presentation mode (read before the sidebar exists, to start it
    collapsed)."""
    return st.query_params.get("presentation_mode", "").lower() in ("true", "1", "yes")


# The order a talk follows, from the mechanism to the real model (its heads, then how they formed over its training)
# and to the systems that make it fast.
STORY = ("Attention step by step", "Scaling and softmax", "Masks", "Positional encodings", "Explore heads",
         "Over training", "Heads and KV cache", "Flash vs naive", "Generation and KV cache")


def story_neighbours(title: str) -> tuple[str | None, str | None]:
    """The pages before and after ``title`` in :data:`STORY` (None at either end, or off the story)."""
    if title not in STORY:
        return None, None
    index = STORY.index(title)
    return (STORY[index - 1] if index > 0 else None), (STORY[index + 1] if index + 1 < len(STORY) else None)


def story_links(pages_by_title: dict, title: str, *, top: bool = False) -> None:
    """Above and at the end of each page of the story: "← Previous" and "Next →", one click each (``top``: the
    row above the title, without the divider that ends a page)."""
    previous, following = story_neighbours(title)
    if previous is None and following is None:
        return
    if top:  # in the page's top margin, at the right (STORY_TOP_CSS): no line of its own above the title
        with st.container(key="story_top", horizontal=True, gap="medium", width="content"):
            if previous:
                st.page_link(pages_by_title[previous], label=f"← Previous: {previous}")
            if following:
                st.page_link(pages_by_title[following], label=f"Next: {following} →")
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
    """With ``ATTNVIZ_RUN_LOG=<file>``, append one JSON line per script run
    (:func:`attnviz.system.run_log.append_run_log`):
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
