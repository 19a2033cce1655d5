"""The process environment attnviz needs, set in one place, and what this installation can do (optional
dependencies and the features that need them).

Call :func:`configure_environment` at process start (``app.py``, the tests and the benchmarks do), before
anything imports transformers or triton.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass


def configure_environment() -> None:
    """Everything offline (never reach for a model hub), and Triton's interpreter when there is no GPU."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    configure_triton()


def configure_triton() -> None:
    """Without a GPU, Triton kernels can only run in its interpreter, and Triton decides that when it is first
    imported (its standard library is decorated then). transformers imports triton while loading a model, so this
    must run at process start, before any model is loaded."""
    if "triton" in sys.modules:
        return
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
    the pages need and loads the bundled model into the cache the pages read (:func:`attnviz.ui.warm_up`). The
    server answers at once; a session that arrives first waits for the entry being made, never makes it twice.
    ``ATTNVIZ_WARM_UP=0`` turns it off (the first visit then does the work, as with a plain script). Also opens
    the browser when the server is not headless, as ``streamlit run`` does for a plain script."""
    if os.environ.get("ATTNVIZ_WARM_UP", "1") != "0":
        threading.Thread(target=_warm_up, name=WARM_UP_THREAD, daemon=True).start()
    from attnviz.streamlit_compat import open_browser_unless_headless

    open_browser_unless_headless()
    yield None


class _NotFromTheWarmUp(logging.Filter):
    """Streamlit warns about every cached call made outside a session's run: the warm-up's are meant to be."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != WARM_UP_THREAD


def _quiet_streamlit_about_the_warm_up() -> None:
    from attnviz.streamlit_compat import SCRIPT_CONTEXT_LOGGER

    logger = logging.getLogger(SCRIPT_CONTEXT_LOGGER)
    if not any(isinstance(existing, _NotFromTheWarmUp) for existing in logger.filters):
        logger.addFilter(_NotFromTheWarmUp())


def _warm_up() -> None:
    log = logging.getLogger("attnviz")
    _quiet_streamlit_about_the_warm_up()
    started = time.perf_counter()
    try:
        configure_environment()
        from attnviz.ui import warm_up, warm_up_later

        warm_up()
    except Exception:  # noqa: BLE001 - the pages then compute for themselves and show what went wrong
        _log_run(WARM_UP_LINE, started, "failed")
        log.exception("attnviz: the warm-up at server start failed")
        return
    _log_run(WARM_UP_LINE, started, "finished")
    if SESSION_RAN.wait(timeout=VISITOR_WAIT_S):
        time.sleep(DRAWING_WAIT_S)
    later = time.perf_counter()
    try:
        warm_up_later()
    except Exception:  # noqa: BLE001 - as above
        _log_run(WARM_UP_LATER_LINE, later, "failed")
        log.exception("attnviz: the warm-up of the other pages failed")
        return
    _log_run(WARM_UP_LATER_LINE, later, "finished")


def _log_run(page: str, started: float, ending: str) -> None:
    from attnviz.run_log import append_run_log

    append_run_log(page, time.perf_counter() - started, ending)


@dataclass(frozen=True)
class OptionalFeature:
    package: str
    available: bool
    version: str | None
    needed_for: str


OPTIONAL_PACKAGES = {
    "triton": "the Triton flash-attention kernel (on an NVIDIA GPU, or the CPU interpreter for small inputs)",
}


def optional_features() -> list[OptionalFeature]:
    """Each optional package, whether it imports here, and what it is needed for."""
    features = []
    for package, needed_for in OPTIONAL_PACKAGES.items():
        try:
            module = importlib.import_module(package)
            features.append(OptionalFeature(package, True, getattr(module, "__version__", None), needed_for))
        except Exception:  # noqa: BLE001 - a broken install is as unavailable as a missing one
            features.append(OptionalFeature(package, False, None, needed_for))
    return features
