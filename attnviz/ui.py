"""Helpers shared by the Streamlit pages: global state (model, sentence), caching, presentation mode.
Only this module and the pages import streamlit."""

from __future__ import annotations

import shutil
from pathlib import Path

import streamlit as st

from attnviz.models.loading import DEFAULT_MODEL_NAME, ModelBundle, default_model_dir, load_model_dir
from attnviz.models.safety import CheckpointRefused

def _leave_legacy_page_discovery() -> None:
    """Make a deep link to a page work on a freshly started server.

    Streamlit starts in its legacy mode when a ``pages/`` folder sits beside the entry point, and stays there until
    some run calls ``st.navigation``. If the very first request is for ``/masks``, that page would run alone,
    without app.py's navigation and sidebar. Leaving the legacy mode and rerunning runs app.py, which then opens
    the requested page.
    """
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a future Streamlit without this internal: nothing to fix
        return
    if getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        st.rerun()


_leave_legacy_page_discovery()

DEFAULT_SENTENCE = "The cat sat on the mat because it was tired."
MAX_SENTENCE_CHARS = 5000
MAX_UPLOADED_MODELS = 4  # per session; with the bounded cache below, memory cannot grow without limit

PRESENTATION_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 1.25rem; }
[data-testid="stMarkdownContainer"] p, [data-testid="stCaptionContainer"] { font-size: 1.2rem; }
h1 { font-size: 3rem !important; }
[data-testid="stSidebar"] { min-width: 22rem; }
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


def show_figure(figure, caption: str, key: str | None = None, on_select=None) -> None:
    """A figure with its one-line caption saying what to notice; scaled up in presentation mode.

    ``on_select``: a callback run when the user clicks a point (it reads ``st.session_state[key].selection``)."""
    scale = figure_scale()
    if scale != 1.0:
        figure.update_layout(font=dict(size=int(12 * scale)), title_font_size=int(17 * scale),
                             height=int((figure.layout.height or 400) * scale))
    if on_select is None:
        st.plotly_chart(figure, key=key, config={"displaylogo": False})
    else:
        st.plotly_chart(figure, key=key, config={"displaylogo": False}, on_select=on_select, selection_mode="points")
    st.caption(caption)


# ---------------------------------------------------------------------------------------------------------------
# Models: a per-session registry of name -> folder, and a bounded process-wide cache of loaded models.


def registered_models() -> dict[str, str]:
    if "models" not in st.session_state:
        st.session_state["models"] = {DEFAULT_MODEL_NAME: str(default_model_dir())}
    return st.session_state["models"]


def register_model(name: str, folder: Path, *, owned: bool) -> str:
    """Add a loaded model folder under a unique name; ``owned`` folders (uploads) are deleted on removal."""
    models = registered_models()
    if sum(1 for n in models if n != DEFAULT_MODEL_NAME) >= MAX_UPLOADED_MODELS:
        raise CheckpointRefused(f"at most {MAX_UPLOADED_MODELS} extra models per session: remove one first")
    unique, number = name, 2
    while unique in models:
        unique, number = f"{name} ({number})", number + 1
    models[unique] = str(folder)
    st.session_state.setdefault("owned_folders", set())
    if owned:
        st.session_state["owned_folders"].add(str(folder))
    return unique


def remove_model(name: str) -> None:
    models = registered_models()
    if name == DEFAULT_MODEL_NAME or name not in models:
        return
    folder = models.pop(name)
    if folder in st.session_state.get("owned_folders", set()):
        st.session_state["owned_folders"].discard(folder)
        load_bundle.clear(folder, name)
        parent = Path(folder).parent
        shutil.rmtree(parent if parent.name.startswith("attnviz-upload-") else folder, ignore_errors=True)
    if name in (st.session_state.get("model"), st.session_state.get("pending_model")):
        # The sidebar's model widget already exists in this run: app.py applies the change at the next run.
        st.session_state["pending_model"] = DEFAULT_MODEL_NAME


@st.cache_resource(max_entries=4, show_spinner="Loading the model (first time only)…")
def load_bundle(folder: str, name: str) -> ModelBundle:
    return load_model_dir(folder, name=name)


def current_model_name() -> str:
    name = st.session_state.get("model", DEFAULT_MODEL_NAME)
    return name if name in registered_models() else DEFAULT_MODEL_NAME


def current_bundle() -> ModelBundle:
    """The sidebar's model, loaded (cached). Shows an error and stops the page if it cannot be loaded."""
    name = current_model_name()
    try:
        return load_bundle(registered_models()[name], name)
    except CheckpointRefused as problem:
        st.error(f"Could not load {name}: {problem}.")
        st.stop()


@st.cache_resource(max_entries=4, show_spinner="Running the model and capturing its attention…")
def cached_capture(folder: str, name: str, text: str, text_pair: str | None, _bundle: ModelBundle, fallback: str | None = None):
    """Captures are treated as read-only; keyed by the model's folder and name, the texts and the fallback."""
    from attnviz.models.capture import capture

    return capture(_bundle, text, text_pair, fallback_tokenizer=fallback)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_replay_difference(folder: str, name: str, text: str, text_pair: str | None, kind: str, _record) -> float:
    from attnviz.models.capture import replay_difference

    return replay_difference(_record)


@st.cache_resource(max_entries=8, show_spinner="Computing head statistics…")
def cached_statistics(folder: str, name: str, text: str, text_pair: str | None, kind: str, _capture):
    from attnviz.explore import statistics_table

    return statistics_table(_capture, kind)


def capture_current(text: str, text_pair: str | None = None):
    """Capture the sidebar model on ``text``; an error in the page (not a traceback) if that fails."""
    bundle = current_bundle()
    name = current_model_name()
    if not text.strip():
        st.warning("The text is empty. Type a sentence in the sidebar.")
        st.stop()
    fallback = st.session_state.get("fallback_tokenizer") if bundle.uses_fallback_tokenizer else None
    try:
        return bundle, cached_capture(registered_models()[name], name, text, text_pair or None, bundle, fallback)
    except (ValueError, RuntimeError) as problem:
        st.error(f"The model could not run on this text: {problem}")
        st.stop()
