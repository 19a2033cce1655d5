"""``ATTNVIZ_RUN_LOG=<file>`` (benchmarks and operators): one JSON line per script run and per part of the warm-up
at server start, written by :func:`attnviz.ui.logged_run` and :mod:`attnviz.system.runtime`."""

from __future__ import annotations

import json
import os
import time


def append_run_log(page: str, seconds: float, ending: str) -> None:
    """Append one line, if ``ATTNVIZ_RUN_LOG`` is set: what ran (a page, or a part of the warm-up), how long it took
    and how it ended. Nothing about the user (no text, no session id)."""
    run_log = os.environ.get("ATTNVIZ_RUN_LOG")
    if run_log:
        line = {"page": page, "seconds": seconds, "ending": ending, "time": time.time()}
        with open(run_log, "a") as file:
            file.write(json.dumps(line) + "\n")
