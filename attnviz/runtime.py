"""The process environment attnviz needs, set in one place, and what this installation can do (optional
dependencies and the features that need them).

Call :func:`configure_environment` at process start (``app.py``, the tests and the benchmarks do), before
anything imports transformers or triton.
"""

from __future__ import annotations

import contextlib
import importlib
import json
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
# Set by app.py after every session's run: the warm-up's second part waits for the first visitor's page (or a
# while without one), so that it does not take the CPU from the browser drawing that page.
SESSION_RAN = threading.Event()
VISITOR_WAIT_S = 20.0  # without a visitor by then, the second part goes ahead


@contextlib.asynccontextmanager
async def server_lifespan(app):
    """The lifespan of app.py's ``st.App``: at server start, before any browser connects, a thread imports what
    the pages need and loads the bundled model into the cache the pages read (:func:`attnviz.ui.warm_up`). The
    server answers at once; a session that arrives first waits for the entry being made, never makes it twice.
    ``ATTNVIZ_WARM_UP=0`` turns it off (the first visit then does the work, as with a plain script)."""
    if os.environ.get("ATTNVIZ_WARM_UP", "1") != "0":
        threading.Thread(target=_warm_up, name=WARM_UP_THREAD, daemon=True).start()
    yield None


def _warm_up() -> None:
    log = logging.getLogger("attnviz")
    # Streamlit warns about every cached call made outside a session's run: these are meant to be.
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(
        lambda record: record.threadName != WARM_UP_THREAD)
    started = time.perf_counter()
    try:
        configure_environment()
        from attnviz.ui import warm_up, warm_up_later

        warm_up()
        _log_run(WARM_UP_LINE, started, "finished")
        if SESSION_RAN.wait(timeout=VISITOR_WAIT_S):
            time.sleep(3)  # the browser is drawing the first page
        later = time.perf_counter()
        warm_up_later()
        _log_run(WARM_UP_LATER_LINE, later, "finished")
    except Exception:  # noqa: BLE001 - the pages then compute for themselves and show what went wrong
        _log_run(WARM_UP_LINE, started, "failed")
        log.exception("attnviz: the warm-up at server start failed")


WARM_UP_LINE = "(warm-up at server start)"
WARM_UP_LATER_LINE = "(warm-up: other pages)"


def _log_run(page: str, started: float, ending: str) -> None:
    """A line of ``ATTNVIZ_RUN_LOG`` (benchmarks and operators), as :func:`attnviz.ui.logged_run` writes it."""
    run_log = os.environ.get("ATTNVIZ_RUN_LOG")
    if run_log:
        line = {"page": page, "seconds": time.perf_counter() - started, "ending": ending, "time": time.time()}
        with open(run_log, "a") as file:
            file.write(json.dumps(line) + "\n")


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
