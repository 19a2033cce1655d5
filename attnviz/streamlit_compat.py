"""The one place where attnviz reaches into Streamlit beyond its public API; every reach here was checked on
Streamlit 1.67.0.

First, the legacy ``pages/`` mode. The product keeps its page files in ``pages/`` beside ``app.py``. Streamlit
treats such a folder as its legacy multipage layout until some run calls ``st.navigation``, so on a freshly
started server the very first request for ``/masks`` would run that page alone, without app.py's navigation and
sidebar. Streamlit's public answer is to name the folder anything but ``pages/``; the layout is fixed, so instead
the first page run leaves the legacy mode and reruns, which runs app.py (tested end to end in
``tests/e2e/test_pages_in_browser.py``).

Second, app.py's ``st.App``: ``streamlit run`` opens a browser tab for a plain script but not for an ``st.App``
(:func:`open_browser_unless_headless` does what it does), and Streamlit warns, on a logger of its own, about
every cached call made outside a session's run (the warm-up's are meant to be: :data:`SCRIPT_CONTEXT_LOGGER`).
"""

from __future__ import annotations

import streamlit as st

SCRIPT_CONTEXT_LOGGER = "streamlit.runtime.scriptrunner_utils.script_run_context"
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


def open_browser_unless_headless() -> None:
    """Open the app in a browser tab unless ``server.headless``, as ``streamlit.web.bootstrap._on_server_start``
    does for a plain script. Does nothing if the internals are gone or no browser opens."""
    import logging

    try:
        from streamlit import cli_util, config
        from streamlit.web.server import server_util

        if config.get_option("server.headless"):
            return
        address = "localhost"
        if config.is_manually_set("browser.serverAddress"):
            address = config.get_option("browser.serverAddress")
        elif config.is_manually_set("server.address"):
            address = server_util.get_display_address(config.get_option("server.address"))
        cli_util.open_browser(server_util.get_url(address))
    except Exception:  # noqa: BLE001 - a browser that does not open is no reason to stop the server
        logging.getLogger("attnviz").debug("could not open a browser", exc_info=True)
