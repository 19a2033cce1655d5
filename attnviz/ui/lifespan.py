"""The server's lifespan (app.py's ``st.App``): at server start, a thread warms the caches the first visits read
(:mod:`attnviz.ui.warm_up`), its second part once the first visitor's page is drawn.

This module imports only the standard library and attnviz's environment code: app.py imports it before anything
else (before transformers or triton), and the warm-up's own imports happen in its thread, after
:func:`attnviz.system.runtime.configure_environment`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time

from attnviz.system.run_log import append_run_log
from attnviz.system.runtime import configure_environment

# Streamlit warns, on this logger of its own, about every cached call made outside a session's run (the warm-up's
# are meant to be; the name was checked on Streamlit 1.67.0)
SCRIPT_CONTEXT_LOGGER = "streamlit.runtime.scriptrunner_utils.script_run_context"
WARM_UP_THREAD = "attnviz-warm-up"
WARM_UP_LINE = "(warm-up at server start)"  # the run log's lines (ATTNVIZ_RUN_LOG) for the two parts
WARM_UP_LATER_LINE = "(warm-up: other pages)"
# Set by app.py after every session's run: the warm-up's second part waits for the first visitor's page (or a
# while without one), so that it does not take the CPU from the browser drawing that page.
SESSION_RAN = threading.Event()
VISITOR_WAIT_S = 20.0  # without a visitor by then, the second part goes ahead
DRAWING_WAIT_S = 3.0  # after the first run, while its browser draws the page


@contextlib.asynccontextmanager
async def server_lifespan(app):
    """The lifespan of app.py's ``st.App``: at server start, before any browser connects, a thread imports what
    the pages need and loads the bundled model into the cache the pages read (:func:`attnviz.ui.warm_up.warm_up`). The
    server answers at once; a session that arrives first waits for the entry being made, never makes it twice.
    ``ATTNVIZ_WARM_UP=0`` turns it off (the first visit then does the work, as with a plain script). Also opens
    the browser when the server is not headless, as ``streamlit run`` does for a plain script."""
    if os.environ.get("ATTNVIZ_WARM_UP", "1") != "0":
        threading.Thread(target=_warm_up, name=WARM_UP_THREAD, daemon=True).start()
    open_browser_unless_headless()
    yield None


class _NotFromTheWarmUp(logging.Filter):
    """Streamlit warns about every cached call made outside a session's run: the warm-up's are meant to be."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != WARM_UP_THREAD


def _quiet_streamlit_about_the_warm_up() -> None:
    logger = logging.getLogger(SCRIPT_CONTEXT_LOGGER)
    if not any(isinstance(existing, _NotFromTheWarmUp) for existing in logger.filters):
        logger.addFilter(_NotFromTheWarmUp())


def _warm_up() -> None:
    log = logging.getLogger("attnviz")
    _quiet_streamlit_about_the_warm_up()
    started = time.perf_counter()
    try:
        configure_environment()
        warm_up = importlib.import_module("attnviz.ui.warm_up")  # here, after the environment is set
        warm_up.warm_up()
    except Exception:  # noqa: BLE001 - the pages then compute for themselves and show what went wrong
        _log_run(WARM_UP_LINE, started, "failed")
        log.exception("attnviz: the warm-up at server start failed")
        return
    _log_run(WARM_UP_LINE, started, "finished")
    if SESSION_RAN.wait(timeout=VISITOR_WAIT_S):
        time.sleep(DRAWING_WAIT_S)
    later = time.perf_counter()
    try:
        warm_up.warm_up_later()
    except Exception:  # noqa: BLE001 - as above
        _log_run(WARM_UP_LATER_LINE, later, "failed")
        log.exception("attnviz: the warm-up of the other pages failed")
        return
    _log_run(WARM_UP_LATER_LINE, later, "finished")


def _log_run(page: str, started: float, ending: str) -> None:
    append_run_log(page, time.perf_counter() - started, ending)


def open_browser_unless_headless() -> None:
    """Open the app in a browser tab unless ``server.headless``, as ``streamlit.web.bootstrap._on_server_start``
    does for a plain script (``streamlit run`` opens none for an ``st.App``; the internals used here were checked on
    Streamlit 1.67.0). Does nothing if the internals are gone or no browser opens."""
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
