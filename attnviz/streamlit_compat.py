"""The one place where attnviz reaches into Streamlit beyond its public API, with the version it was checked on.

Why: the product keeps its page files in ``pages/`` beside ``app.py``. Streamlit treats such a folder as its
legacy multipage layout until some run calls ``st.navigation``, so on a freshly started server the very first
request for ``/masks`` would run that page alone, without app.py's navigation and sidebar. Streamlit's public
answer is to name the folder anything but ``pages/``; the layout is fixed, so instead the first page run leaves
the legacy mode and reruns, which runs app.py (tested end to end in ``tests/e2e/test_pages_in_browser.py``).
"""

from __future__ import annotations

import streamlit as st

CHECKED_ON_STREAMLIT = "1.67.0"
_left_in_this_process = False  # the mode is process-wide: leaving it once is enough


def leave_legacy_pages_mode() -> None:
    """Rerun through app.py if Streamlit is still in its legacy ``pages/`` mode. Acts once per process (a rerun
    drops the click that started a run, so it must not happen again); does nothing once app.py has called
    ``st.navigation`` (Streamlit then leaves that mode for every session), or if the internal is gone."""
    global _left_in_this_process
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a Streamlit without this internal has no legacy mode to leave
        return
    if not _left_in_this_process and getattr(PagesManager, "uses_pages_directory", False):
        _left_in_this_process = True
        PagesManager.uses_pages_directory = False
        st.rerun()
