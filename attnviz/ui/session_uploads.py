"""Upload folders that live and die with their session, and the clean-up thread that makes that prompt."""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
import weakref
from pathlib import Path

import streamlit as st

from attnviz.checkpoints import keep


def _end_jobs(folder: str | Path) -> None:
    """The background jobs (scans, importance runs) whose files are in ``folder`` are ended before it goes."""
    from attnviz.corpus.jobs import JobRefused, server_queue

    try:
        server_queue().end_under(Path(folder))
    except (JobRefused, OSError):
        pass


def _remove_folders(folders: set[str]) -> None:
    for folder in list(folders):
        _end_jobs(folder)
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


_JANITOR = {"started": False}
JOBS_SECONDS = 2.0  # how often the server moves the queue of background jobs on


def start_janitor(every: float | None = None) -> None:
    """Once per process: collect released sessions' garbage now and then, so their uploads are deleted soon
    after Streamlit drops them rather than whenever Python's collector next runs a full pass."""
    if _JANITOR["started"]:
        return
    _JANITOR["started"] = True
    interval = every or float(os.environ.get("ATTNVIZ_JANITOR_SECONDS", "30"))

    def sweep():
        from attnviz.ui.downloads import sweep as sweep_downloads

        while True:
            time.sleep(interval)
            gc.collect()
            # browsers not seen for ATTNVIZ_KEEP_HOURS: their jobs end, their kept models and scans are deleted
            keep.sweep_expired(before_delete=_end_jobs)
            sweep_downloads()

    def move_jobs_on():
        from attnviz.corpus.jobs import server_queue

        while True:  # a job that ended makes room for the next at once, whether or not a page is watching
            time.sleep(JOBS_SECONDS)
            try:
                server_queue().tick()
            except Exception:  # noqa: BLE001 - the queue's folder unusable now: the pages say so when asked
                pass

    threading.Thread(target=sweep, name="attnviz-janitor", daemon=True).start()
    threading.Thread(target=move_jobs_on, name="attnviz-jobs", daemon=True).start()
