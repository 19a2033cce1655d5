"""Helpers shared by the Streamlit pages: page start, global state (model, sentence), caching, figures with
their downloads, presentation mode. Only this module, ``streamlit_compat`` and the pages import streamlit."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import weakref
from pathlib import Path
from typing import NamedTuple

import streamlit as st
import torch

from attnviz.models import keep
from attnviz.models.loading import (
    BUNDLED_GPT_NAME,
    DEFAULT_MODEL_NAME,
    ModelBundle,
    bundled_models,
    default_model_dir,
    load_causal_lm,
    load_model_dir,
)
from attnviz.models.safety import CheckpointRefused
from attnviz.streamlit_compat import leave_legacy_pages_mode


@contextlib.contextmanager
def transient_status(label: str):
    """A progress box for slow work that disappears once the work is done (the result says what happened)."""
    placeholder = st.empty()
    with placeholder.status(label, expanded=False) as status:
        yield status
    placeholder.empty()


def start_page(title: str) -> None:
    """The first call of every page: its title, after making sure app.py's navigation runs around it."""
    leave_legacy_pages_mode()
    st.title(title)


DEFAULT_SENTENCE = "The cat sat on the mat because it was tired."
MAX_SENTENCE_CHARS = 5000
MAX_UPLOADED_MODELS = 4  # per session; with the bounded cache below, memory cannot grow without limit

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


def figure_scale() -> float:
    return 1.35 if st.session_state.get("presentation_mode") else 1.0


def current_sentence() -> str:
    return st.session_state.get("sentence", DEFAULT_SENTENCE)


def download_name(title: str, fallback: str = "attnviz-figure") -> str:
    """A file name from a figure title: markup and symbols dropped, words joined by dashes, at most 80 chars."""
    text = re.sub(r"<[^>]+>", " ", title or "")
    text = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")
    return (text[:80].rstrip("-") or fallback).lower()


def figure_config(figure) -> dict:
    """Plotly's toolbar config: no logo, PNG downloads at 2x named after the figure's title (the SVG button
    that :func:`install_svg_downloads` adds reads the same name)."""
    title = getattr(figure.layout.title, "text", None) or ""
    return {"displaylogo": False,
            "toImageButtonOptions": {"format": "png", "scale": 2, "filename": download_name(title)}}


def show_figure(figure, caption: str, key: str | None = None, on_select=None) -> None:
    """A figure with its one-line caption saying what to notice; scaled up in presentation mode.

    ``on_select``: a callback run when the user clicks a point (it reads ``st.session_state[key].selection``)."""
    scale = figure_scale()
    if scale != 1.0:
        figure.update_layout(font=dict(size=int(12 * scale)), title_font_size=int(17 * scale),
                             height=int((figure.layout.height or 400) * scale))
    config = figure_config(figure)
    if on_select is None:
        st.plotly_chart(figure, key=key, config=config)
    else:
        st.plotly_chart(figure, key=key, config=config, on_select=on_select, selection_mode="points")
    st.caption(caption)


# The page scripts live in assets/*.js (read once per process): an SVG download on every Plotly toolbar, and the
# lines view's hover highlight. The hidden element is where they are installed from (in the sidebar).
ASSETS = Path(__file__).resolve().parent.parent / "assets"
PAGE_SCRIPTS = ("svg_downloads.js", "lines_highlight.js")
_SCRIPT_HOST = """
<div id="attnviz-svg-downloads"></div>
<style>div[data-testid="stElementContainer"]:has(#attnviz-svg-downloads) { display: none; }</style>
"""


@functools.lru_cache(maxsize=1)
def page_scripts() -> str:
    """The page scripts as the HTML that installs them."""
    return _SCRIPT_HOST + "".join(f"<script>\n{(ASSETS / name).read_text()}</script>\n" for name in PAGE_SCRIPTS)


def install_page_scripts() -> None:
    """Once per run from app.py: every figure's toolbar gets an SVG download next to Plotly's PNG one, and the
    browser gets (or renews) its key cookie, so that a reload finds the models it added."""
    store = browser_store()
    with st.sidebar:
        st.html(page_scripts() + browser_cookie_script(store), unsafe_allow_javascript=True)
    if store is not None:
        store.touch()  # a visit: the browser's models are kept keep_hours() after the last one


# ---------------------------------------------------------------------------------------------------------------
# This browser: a random key in a cookie names the folder where its added models are kept (attnviz.models.keep).


def browser_store() -> keep.BrowserStore | None:
    """This browser's kept models, or None when keeping is off (``ATTNVIZ_KEEP_HOURS=0``). The key comes from
    the browser's cookie, or is made now (and given to the browser by :func:`browser_cookie_script`)."""
    if keep.keep_hours() <= 0:
        return None
    root = keep.usable_root()
    if root is None:  # not a private folder of ours: keep nothing rather than trust it
        return None
    key = st.session_state.get("browser_key")
    if not keep.valid_key(key):
        try:
            cookie = st.context.cookies.get(keep.COOKIE)
        except Exception:  # noqa: BLE001 - no browser behind this run (AppTest, bare mode)
            cookie = None
        key = cookie if keep.valid_key(cookie) else keep.new_key()
        st.session_state["browser_key"] = key
    return keep.BrowserStore(key, root)


def browser_cookie_script(store: keep.BrowserStore | None) -> str:
    """A script that sets the browser's key cookie, renewed on every visit so that it lasts as long as the kept
    models (``keep_hours`` after the last visit); ``SameSite=Strict`` (not sent with requests from other sites) and
    ``Secure`` over HTTPS. Browsers share cookies between all ports of one host name: on a host that serves other
    web apps, give attnviz a host name of its own (README, Run it for a group)."""
    if store is None:
        return ""
    max_age = int(keep.keep_hours() * 3600)
    key = st.session_state["browser_key"]  # [A-Za-z0-9_-] only (keep.valid_key): safe inside the script
    return (f"<script>document.cookie = '{keep.COOKIE}={key}; Max-Age={max_age}; Path=/; SameSite=Strict'"
            " + (location.protocol === 'https:' ? '; Secure' : '');</script>")


def _restore_kept_models(models: dict[str, str]) -> None:
    """A new session of a browser that added models before: they come back, with their names and dtypes."""
    store = browser_store()
    if store is None:
        return
    from attnviz.models.uploads import prepare_folder_path

    restored = []
    for kept, folder in store.models():
        if kept.kind == "folder":  # checked again: the server's folder rules may have changed since
            try:
                if not server_folders_allowed():
                    continue
                folder = prepare_folder_path(str(folder))[0]
            except CheckpointRefused:
                continue
        name = unique_name(kept.name, models)  # two tabs of one browser may have added models under one name
        models[name] = str(folder)
        st.session_state.setdefault("model_dtypes", {})[name] = kept.dtype
        restored.append(name)
    if restored:
        st.session_state["kept_restored"] = restored


# ---------------------------------------------------------------------------------------------------------------
# Models: a per-session registry of name -> folder, and a bounded process-wide cache of loaded models.


def unique_name(name: str, taken) -> str:
    """``name``, or ``name (2)``, ``name (3)``, ... : the first not in ``taken``."""
    unique, number = name, 2
    while unique in taken:
        unique, number = f"{name} ({number})", number + 1
    return unique


def registered_models() -> dict[str, str]:
    """This session's models, name -> folder: the bundled one, then those this browser added (kept for
    ``ATTNVIZ_KEEP_HOURS``), then those added in this session."""
    if "models" not in st.session_state:
        models = {name: str(folder) for name, folder in bundled_models().items()}
        st.session_state["models"] = models
        _restore_kept_models(models)
    return st.session_state["models"]


def upload_limit_bytes() -> int:
    """The upload limit in force: attnviz's (read from .streamlit/config.toml) or Streamlit's own, if smaller
    (Streamlit reads that file only when the server starts in the repository's folder)."""
    from attnviz.models.safety import MAX_UPLOAD_BYTES

    return min(MAX_UPLOAD_BYTES, int(st.get_option("server.maxUploadSize")) * 1024**2)


def model_dtype(name: str) -> str:
    """The dtype a registered model was loaded in: "stored" (as its weights are saved) or "fp32"."""
    return st.session_state.get("model_dtypes", {}).get(name, "stored")


def _remove_folders(folders: set[str]) -> None:
    for folder in list(folders):
        parent = Path(folder).parent
        shutil.rmtree(parent if parent.name.startswith("attnviz-upload-") else folder, ignore_errors=True)
    folders.clear()


class SessionUploads:
    """The upload folders of one browser session, kept in its session state. When Streamlit lets the session go
    (its tab closed, and ``server.disconnectedSessionTTL`` passed), this object is collected and the folders are
    deleted with it: uploads never outlive their session, and no other session ever sees their paths."""

    def __init__(self):
        self.folders: set[str] = set()
        weakref.finalize(self, _remove_folders, self.folders)  # holds the set, not the object

    def remove(self, folder: str) -> None:
        self.folders.discard(folder)
        _remove_folders({folder})


def session_uploads() -> SessionUploads:
    if "uploads" not in st.session_state:
        st.session_state["uploads"] = SessionUploads()
    return st.session_state["uploads"]


@contextlib.contextmanager
def logged_run(page: str, started: float):
    """With ``ATTNVIZ_RUN_LOG=<file>``, append one JSON line per script run (:func:`attnviz.run_log.append_run_log`):
    the page, how long the whole run took on the server (app.py included, from ``started``, a
    ``time.perf_counter()``), and how it ended. Nothing about the user (no text, no session id) is written."""
    import time

    from attnviz.run_log import append_run_log

    ending = "finished"
    try:
        yield
    except BaseException as stopped:  # st.stop() and reruns end a run by raising
        ending = type(stopped).__name__
        raise
    finally:
        append_run_log(page, time.perf_counter() - started, ending)


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


class SharedMeasurements:
    """Timings measured on this server, shared by every session, and one measurement at a time.

    Many people opening a page that times code on the same CPU would slow each other and distort every figure;
    with one lock the second waits for the first and reuses its result (for the same inputs), so a class sees the
    same honest numbers. Holds the ``limit`` most recent results."""

    def __init__(self, limit: int = 32):
        import collections
        import threading

        self.limit, self.lock = limit, threading.Lock()
        self.results: collections.OrderedDict = collections.OrderedDict()  # key -> (value, time measured)

    def get(self, key, measure, again: bool = False, waiting=None):
        """The stored ``(value, measured_at)`` for ``key``, or ``measure()``'s, timed while no other runs.
        ``waiting``: a context manager to show while another session's measurement holds the lock."""
        import contextlib
        import time

        if not self.lock.acquire(blocking=False):
            with waiting or contextlib.nullcontext():
                self.lock.acquire()
        try:
            if again or key not in self.results:
                self.results[key] = (measure(), time.time())
            self.results.move_to_end(key)
            while len(self.results) > self.limit:
                self.results.popitem(last=False)
            return self.results[key]
        finally:
            self.lock.release()


@st.cache_resource(max_entries=1)
def shared_measurements() -> SharedMeasurements:
    """The process-wide store of the Flash page's timings (32 settings)."""
    return SharedMeasurements(32)


_JANITOR = {"started": False}


def start_janitor(every: float | None = None) -> None:
    """Once per process: collect released sessions' garbage now and then, so their uploads are deleted soon
    after Streamlit drops them rather than whenever Python's collector next runs a full pass."""
    if _JANITOR["started"]:
        return
    _JANITOR["started"] = True
    import gc
    import threading
    import time

    interval = every or float(os.environ.get("ATTNVIZ_JANITOR_SECONDS", "30"))

    def sweep():
        while True:
            time.sleep(interval)
            gc.collect()
            keep.sweep_expired()  # browsers not seen for ATTNVIZ_KEEP_HOURS: their kept models are deleted

    threading.Thread(target=sweep, name="attnviz-janitor", daemon=True).start()


def register_model(name: str, folder: Path, *, owned: bool, dtype: str = "stored") -> str:
    """Add a loaded model folder under a unique name. ``owned`` folders (uploads) are deleted on removal; one
    adopted by this browser's store (:func:`adopt_upload`) is kept for its next visits, and so is a server folder
    (by path: it is never deleted). Anything else goes when the session ends."""
    models = registered_models()
    store = browser_store()
    unique = unique_name(name, set(models) | (store.names() if store is not None else set()))  # other tabs' too
    models[unique] = str(folder)
    st.session_state.setdefault("model_dtypes", {})[unique] = dtype
    kept = False
    if owned and store is not None and store.holds(folder):
        kept = store.record(unique, "upload", Path(folder), dtype)
    elif not owned and store is not None:
        kept = store.record(unique, "folder", Path(folder), dtype)
    if kept:
        st.session_state.setdefault("kept_folders", set()).add(str(folder))
    if owned and not kept:
        session_uploads().folders.add(str(folder))  # deleted with the session (wherever the files are)
    return unique


def adopt_upload(folder: Path) -> Path:
    """Before an upload is loaded: move it into this browser's store, so that a reload brings it back. Returns
    the folder to load: where it was when keeping is off or this browser's or the server's bound for kept models
    is reached (the upload then belongs to this session only)."""
    store = browser_store()
    moved = store.adopt_upload(folder) if store is not None else None
    return folder if moved is None else moved


def add_checkpoint(prepare, *args, dtype: str = "stored", name: str | None = None, progress=None):
    """Prepare a folder (``prepare``: one of attnviz.models.uploads' ``prepare_*``), keep it for this browser if it
    is an upload, load it (which validates it) and register it. Returns ``(registered name, bundle, notes)``;
    raises with the reason, leaving nothing on disk. ``progress(text)`` hears each step."""
    # Before anything is extracted or loaded:
    if len(registered_models()) - len(bundled_models()) >= MAX_UPLOADED_MODELS:
        raise CheckpointRefused(f"this session already holds {MAX_UPLOADED_MODELS} added models, the most one "
                                "session may keep on the server. Remove one below first")
    folder, owned, notes = None, False, []
    try:
        if progress:
            progress("Reading the upload…")
        folder, owned, notes = prepare(*args)
        name = name or folder.name or "uploaded model"
        if str(folder) in registered_models().values():
            raise CheckpointRefused("this folder is already loaded")
        if owned:
            folder = adopt_upload(folder)
        bundle = load_bundle(str(folder), name, dtype, progress)
        registered = register_model(name, folder, owned=owned, dtype=dtype)
        if registered != name:  # the cache key must match the registered name
            forget_loaded(str(folder), name, dtype)
        notes = [*notes, *bundle.notes]
        kept = str(folder) in st.session_state.get("kept_folders", set())
        if owned and not kept and browser_store() is not None:
            notes = [*notes, "This upload stays with this session only: this browser (or the server) already keeps "
                             "as many models as it may, so a reload will not bring it back."]
        return registered, bundle, notes
    except BaseException:
        if folder is not None and owned:
            shutil.rmtree(folder.parent, ignore_errors=True)  # the upload's workspace, wherever it now is
        raise


def remove_model(name: str) -> None:
    models = registered_models()
    if name in bundled_models() or name not in models:
        return
    folder = models.pop(name)
    forget_loaded(folder, name, model_dtype(name))
    store = browser_store()
    if store is not None:
        store.forget(folder)  # by where it is: an upload's files go; a server folder stays where it is
    uploads = session_uploads()
    if folder in uploads.folders:
        uploads.remove(folder)
    if name in (st.session_state.get("model"), st.session_state.get("pending_model")):
        # The sidebar's model widget already exists in this run: app.py applies the change at the next run.
        st.session_state["pending_model"] = DEFAULT_MODEL_NAME


MAX_LOADED_UPLOADS = 4  # uploaded or server-folder models held in memory, process-wide (least recently used go)


@st.cache_resource(max_entries=1, show_spinner="Loading the model (first time only)…")
def _bundled_model() -> ModelBundle:
    return load_model_dir(default_model_dir(), name=DEFAULT_MODEL_NAME)


@st.cache_resource(max_entries=MAX_LOADED_UPLOADS, show_spinner="Loading the model (first time only)…")
def _added_model(folder: str, name: str, dtype: str = "stored", _progress=None) -> ModelBundle:
    return load_model_dir(folder, name=name, dtype=dtype, progress=_progress)


@st.cache_resource(max_entries=1, show_spinner="Loading the tiny GPT (first time only)…")
def _bundled_gpt(folder: str) -> ModelBundle:
    return load_model_dir(folder, name=BUNDLED_GPT_NAME)


def load_bundle(folder: str, name: str, dtype: str = "stored", progress=None) -> ModelBundle:
    """A model, loaded once per process. The bundled models have their own slots, so that many sessions' uploads
    never push them out; the others share :data:`MAX_LOADED_UPLOADS` slots. ``progress(text)`` hears each step
    of a load (and a wait for another one)."""
    if name == DEFAULT_MODEL_NAME and Path(folder) == default_model_dir():
        return _bundled_model()
    if name == BUNDLED_GPT_NAME and Path(folder) == bundled_models().get(BUNDLED_GPT_NAME):
        return _bundled_gpt(folder)
    return _added_model(folder, name, dtype, _progress=progress)


@st.cache_resource(max_entries=2, show_spinner="Loading the model with its language-model head…")
def generation_model(folder: str, name: str):
    """A decoder or an encoder-decoder with its LM head and eager attention, for the Generation page
    (``(model, tokenizer)``)."""
    return load_causal_lm(folder)


def forget_loaded(folder: str, name: str, dtype: str) -> None:
    """Drop a removed model from the process-wide cache (its memory goes with the last session using it)."""
    _added_model.clear(folder, name, dtype)


def server_folders_allowed() -> bool:
    """Whether models may be read from folders on the server's disk (``ATTNVIZ_SERVER_FOLDERS=0`` says no)."""

    return os.environ.get("ATTNVIZ_SERVER_FOLDERS", "1") != "0"


def open_linked_model() -> None:
    """On a session's first run, before the sidebar: a link's ``model=`` that this session does not have. A
    folder on the server (where folders are allowed; inside ``ATTNVIZ_MODEL_ROOT`` when that is set) opens for
    anyone with the link; anything else falls back to the bundled model with a notice (:func:`show_notices`)."""
    if st.session_state.get("link_checked"):
        return
    st.session_state["link_checked"] = True
    wanted = st.query_params.get("model")
    if not wanted or wanted in registered_models():
        return
    if server_folders_allowed():
        from attnviz.models.uploads import prepare_folder_path

        try:
            add_checkpoint(prepare_folder_path, wanted, name=wanted)
            return
        except Exception:  # noqa: BLE001 - not a folder that may be opened: the notice below says so
            pass
    hours = keep.keep_hours()
    kept = f"after {hours:g} h without a visit" if hours else "when its session ended"
    shown = re.sub(r"[^\w./ ()-]", "?", wanted)[:80]  # a link's text, shown as text (no markdown, no links)
    st.session_state["link_notice"] = (
        f"This link asks for the model “{shown}”, which is not available here: a model someone uploaded "
        f"opens only in the browser that added it, and goes {kept}. Showing the bundled model instead.")


def show_notices() -> None:
    """What app.py did for this session before the page: models brought back, a link's model not found."""
    restored = st.session_state.pop("kept_restored", None)
    if restored:
        st.toast(f"Back from this browser's last visit: {', '.join(restored)}.", icon=":material/history:")
    notice = st.session_state.pop("link_notice", None)
    if notice:
        st.warning(notice, icon=":material/link_off:")


def current_model_name() -> str:
    name = st.session_state.get("model", DEFAULT_MODEL_NAME)
    return name if name in registered_models() else DEFAULT_MODEL_NAME


def current_bundle() -> ModelBundle:
    """The sidebar's model, loaded (cached). Shows an error and stops the page if it cannot be loaded."""
    name = current_model_name()
    try:
        return load_bundle(registered_models()[name], name, model_dtype(name))
    except Exception as problem:  # noqa: BLE001 - load_model_dir refuses with a reason; anything else, in words too
        st.error(f"Could not load {name}: {problem_text(problem)}. Choose another model in the sidebar, or remove "
                 "this one on the Checkpoints page.", icon=":material/error:")
        st.stop()


@st.cache_resource(max_entries=4, show_spinner="Running the model and capturing its attention…")
def cached_capture(
    folder: str, name: str, text: str, text_pair: str | None, _bundle: ModelBundle, fallback: str | None = None,
    max_tokens: int | None = None, dtype: str = "stored",
):
    """Captures are treated as read-only; keyed by the model (folder, name, dtype), the texts, the fallback
    tokenizer and the token limit."""
    from attnviz.models.capture import capture

    return capture(_bundle, text, text_pair, fallback_tokenizer=fallback, max_tokens=max_tokens)


@st.cache_resource(max_entries=4, show_spinner="Running the model on the image and capturing its attention…")
def cached_image_capture(folder: str, name: str, dtype: str, image_key: str, _bundle: ModelBundle, _image,
                         label: str):
    """A vision model's capture of one image, keyed by the model and the image (its bytes' digest, or the
    sample's name)."""
    from attnviz.models.capture import capture_image

    return capture_image(_bundle, _image, label)


def text_capture_key(folder: str, name: str, dtype: str, text: str, text_pair: str | None,
                     max_tokens: int | None, fallback: str | None) -> tuple:
    """What names one capture (as :func:`cached_capture` is keyed): the key of its replay check and statistics."""
    return (folder, name, dtype, text, text_pair or None, max_tokens, fallback)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_replay_difference(capture_key: tuple, kind: str, _record, _progress=None, _model=None) -> float:
    """Keyed by the capture's key (model, texts, token limit) and the attention kind."""
    from attnviz.models.capture import replay_difference

    return replay_difference(_record, progress=_progress, model=_model)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_statistics(capture_key: tuple, kind: str, _capture, _progress=None):
    from attnviz.pagelogic.explore_heads import statistics_table

    return statistics_table(_capture, kind, progress=_progress)


# The Scaling page's experiments depend only on their widgets: cached by them, process-wide, so that a rerun costs
# nothing (each is bounded); the page's defaults are sampled at server start (warm_up).
SCALING_DEFAULTS = {"seed": 0, "samples": 4000, "d_hist": 64, "n_keys": 32, "logits": (10, 12, 50, 100)}
STABILITY_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


@st.cache_data(max_entries=32, show_spinner="Sampling dot products…")
def scaling_variance_rows(samples: int, seed: int) -> list[dict]:
    from attnviz import scaling

    return scaling.dot_product_variance(scaling.D_K_VALUES, samples, seed)


@st.cache_data(max_entries=32, show_spinner=False)
def scaling_dot_samples(d_k: int, samples: int, seed: int):
    from attnviz import scaling

    return scaling.dot_samples(d_k, samples, seed)


@st.cache_data(max_entries=32, show_spinner="Measuring softmax saturation…")
def scaling_saturation_rows(n_keys: int, seed: int) -> list[dict]:
    from attnviz import scaling

    return scaling.softmax_statistics(scaling.D_K_VALUES, n_keys=n_keys, seed=seed)


@st.cache_data(max_entries=32, show_spinner=False)
def scaling_stability_rows(scales: tuple[float, ...], seed: int) -> list[dict]:
    from attnviz import scaling

    return scaling.stability_table(list(scales), STABILITY_DTYPES, seed)


def warm_up() -> None:
    """Everything the first visit to Explore heads computes, done once per process before a browser asks: the
    imports, the bundled model, its capture of the default sentence, the replay check and a first Plotly figure.
    Called in a thread at server start (app.py's ``lifespan``). The entries are the very ``st.cache_resource``
    entries the page reads (the same arguments), so the first session finds them made, or waits for the one
    being made; nothing is computed twice."""
    import plotly.graph_objects as go

    import attnviz.pagelogic.explore_heads  # noqa: F401 - the page's own imports (analysis, vision, the figures)
    import attnviz.viz.heads  # noqa: F401
    import attnviz.viz.vision  # noqa: F401

    bundle = _bundled_model()
    folder, name, dtype = str(default_model_dir()), DEFAULT_MODEL_NAME, "stored"
    capture = cached_capture(folder, name, DEFAULT_SENTENCE, None, bundle, None, None, dtype)
    kind = capture.kinds[0]
    record = capture.records[kind]
    if record.replayable:
        key = text_capture_key(folder, name, dtype, DEFAULT_SENTENCE, None, None, None)
        cached_replay_difference(key, kind, record, _model=bundle.model)
    go.Figure(go.Heatmap(z=[[0.0]])).to_json()  # Plotly builds its validators on a first figure


def warm_up_later() -> None:
    """The second part of the warm-up, once the first visitor's page is drawn: the Scaling page's experiments at
    their defaults (4 s of sampling on 2 cores, once per process)."""
    seed, samples = SCALING_DEFAULTS["seed"], SCALING_DEFAULTS["samples"]
    scaling_variance_rows(samples, seed)
    scaling_dot_samples(SCALING_DEFAULTS["d_hist"], samples, seed)
    scaling_saturation_rows(SCALING_DEFAULTS["n_keys"], seed)
    scaling_stability_rows(tuple(sorted(SCALING_DEFAULTS["logits"])), seed)


MECHANISM_TOKENS = 96  # the mechanism pages draw N x N masks and heads: they read the first this-many tokens


class CurrentCapture(NamedTuple):
    """The sidebar model, its capture of a text, and the key that names that capture (what its replay check and
    statistics are cached by)."""

    bundle: ModelBundle
    capture: object  # attnviz.models.capture.Capture
    key: tuple


def capture_current(text: str, text_pair: str | None = None, max_tokens: int | None = None, *,
                    notice: bool = True) -> CurrentCapture:
    """Capture the sidebar model on ``text`` (its first ``max_tokens`` tokens, if given, with a notice when that
    cuts it, unless ``notice`` is off); an error in the page (not a traceback) if that fails."""
    bundle = current_bundle()
    name = current_model_name()
    if bundle.modality == "image":
        st.info(f"{name} is a vision transformer: this part of the page works on text. Explore heads shows its "
                "attention on an image; choose a text model in the sidebar for this one.", icon=":material/image:")
        st.stop()
    if not text.strip():
        st.warning("The text is empty. Type a sentence in the sidebar.")
        st.stop()
    fallback = st.session_state.get("fallback_tokenizer") if bundle.uses_fallback_tokenizer else None
    folder, dtype = registered_models()[name], model_dtype(name)
    try:
        result = cached_capture(folder, name, text, text_pair or None, bundle, fallback, max_tokens, dtype)
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, the page says so in words
        st.error(f"{name} could not run on this text: {problem_text(problem)}. Try another text, or choose another "
                 "model in the sidebar.", icon=":material/error:")
        st.stop()
    warn_if_not_finite(bundle, result)
    if notice and max_tokens is not None and result.truncated and max_tokens < bundle.max_positions:
        st.info(f"This page reads the first {len(result.tokens)} of the text's {result.length_of_text} "
                "tokens (Explore heads reads all of them).", icon=":material/content_cut:")
    return CurrentCapture(bundle, result, text_capture_key(folder, name, dtype, text, text_pair, max_tokens, fallback))


def problem_text(problem: BaseException) -> str:
    """An exception as one line a person can read (its type when it has no message)."""
    text = str(problem).strip().splitlines()[0][:200] if str(problem).strip() else ""
    return text if isinstance(problem, (ValueError, CheckpointRefused)) and text else (
        f"{type(problem).__name__}{': ' + text if text else ''}")


STRICT_ERRORS = "ATTNVIZ_STRICT_ERRORS"  # set by the tests: a page's unexpected exception fails them


def show_unexpected_error(problem: BaseException, page: str) -> None:
    """The last line of defence: an exception no page caught becomes a message in words (and a line in the
    server's log with the traceback), never a traceback in the browser. With ``ATTNVIZ_STRICT_ERRORS=1`` (the
    tests) it is raised instead, so that a bug cannot hide behind this message."""
    if os.environ.get(STRICT_ERRORS) == "1":
        raise problem
    logging.getLogger("attnviz").error("Unexpected error on %s", page, exc_info=problem)
    st.error(f"Something went wrong on this page ({problem_text(problem)}). Try another text, model or setting, or "
             "reload the page; the server's log has the details.", icon=":material/error:")


def warn_if_not_finite(bundle: ModelBundle, capture=None) -> None:
    """Say, in words, when the model's weights, its outputs at load or this capture hold NaN or infinity: the
    figures then show blanks, and no number computed from them means anything."""
    parts = []
    if bundle.nonfinite:
        parts.append(f"{len(bundle.nonfinite)} of its weight tensors (for example `{bundle.nonfinite[0]}`)")
    if capture is not None and capture.nonfinite:
        parts += capture.nonfinite
    elif capture is None and bundle.nonfinite_outputs:
        parts.append(bundle.nonfinite_outputs)
    if parts:
        st.warning(f"**Not finite:** {bundle.name} gives NaN or infinity in {'; '.join(parts)}. Heatmaps leave those "
                   "cells blank, and statistics or checks computed from them mean nothing. The checkpoint's weights "
                   "or config (a huge weight, a zero rope_theta, a NaN epsilon) make its arithmetic overflow.",
                   icon=":material/warning:")


def queries_unavailable(bundle, record, what: str) -> bool:
    """True (with a note in the page) when ``record`` holds transformers' eager weights only, so ``what`` (a view
    that needs the model's queries and keys) cannot be drawn for this model."""
    if record.replayable:
        return False
    st.info(f"{what} needs the model's queries and keys, which {bundle.model_type} does not expose: attnviz shows "
            "its eager attention weights only (see the note on Explore heads). Choose another model in the sidebar "
            "to see it.", icon=":material/info:")
    return True
