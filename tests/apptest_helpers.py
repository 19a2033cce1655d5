"""Helpers for AppTest: start from app.py as a user does, go to a page, read figures."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from attnviz.app import SCRIPT

ROOT = Path(__file__).resolve().parents[1]


def open_page(page: str, timeout: float = 120, **session_state) -> AppTest:
    at = AppTest.from_file(str(SCRIPT), default_timeout=timeout)
    for key, value in session_state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]  # app.py itself (sidebar, navigation)
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def figures(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def figure_titled(at: AppTest, prefix: str) -> dict:
    for spec in figures(at):
        if spec["layout"].get("title", {}).get("text", "").startswith(prefix):
            return spec
    titles = [spec["layout"].get("title", {}).get("text") for spec in figures(at)]
    raise AssertionError(f"no figure titled {prefix!r}; titles: {titles}")


def plotly_array(value):
    """A Plotly data array as numpy: plain JSON lists, or Plotly's typed arrays ``{"dtype", "bdata", "shape"}``."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            array = array.reshape([int(s) for s in str(shape).split(",")])
        return array
    return np.array(value, dtype=float)


def figure_containing(at: AppTest, text: str) -> dict:
    for spec in figures(at):
        if text in spec["layout"].get("title", {}).get("text", ""):
            return spec
    titles = [spec["layout"].get("title", {}).get("text") for spec in figures(at)]
    raise AssertionError(f"no figure title contains {text!r}; titles: {titles}")


def assert_no_failure(at: AppTest, allowed: tuple[str, ...] = ()) -> None:
    """Neither an exception nor an ``st.error``: a page that catches what went wrong says so with ``st.error``, which
    ``at.exception`` does not see. ``allowed``: texts of errors the page shows on purpose (a callout, not a failure)."""
    assert not at.exception, [e.value for e in at.exception]
    problems = [e.value for e in at.error if not any(text in e.value for text in allowed)]
    assert not problems, problems


def wait_while_progress(at: AppTest, seconds: float, what: str = "the run") -> AppTest:
    """Rerun ``at`` each second until the page shows no progress bar (its background job ended), at most
    ``seconds``; an exception on the page fails at once."""
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if not at.get("progress"):
            return at
        time.sleep(1)
    raise AssertionError(f"{what} did not end")
