"""This session's models: the registry of name -> folder (the bundled ones, those this browser kept, those
added now), this browser's key cookie and kept models, adding and removing a checkpoint, a link's model."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import streamlit as st

from attnviz.checkpoints import keep
from attnviz.checkpoints.safety import MAX_UPLOAD_BYTES, CheckpointRefused
from attnviz.checkpoints.uploads import prepare_folder_path
from attnviz.models.loading import ModelBundle
from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models
from attnviz.ui.loaded_models import forget_loaded, load_bundle
from attnviz.ui.messages import problem_text
from attnviz.ui.session_uploads import session_uploads

MAX_UPLOADED_MODELS = 4  # per session; with the bounded cache below, memory cannot grow without limit


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


def _restore_kept_models(models: dict[str, str]) -> None:
    """A new session of a browser that added models before: they come back, with their names and dtypes."""
    store = browser_store()
    if store is None:
        return
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
    return min(MAX_UPLOAD_BYTES, int(st.get_option("server.maxUploadSize")) * 1024**2)


def model_dtype(name: str) -> str:
    """The dtype a registered model was loaded in: "stored" (as its weights are saved) or "fp32"."""
    return st.session_state.get("model_dtypes", {}).get(name, "stored")


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
    """Prepare a folder (``prepare``: one of attnviz.checkpoints.uploads' ``prepare_*``), keep it for this browser if it
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
