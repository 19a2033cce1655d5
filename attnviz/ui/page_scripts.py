"""The browser-side scripts every run installs (assets/*.js, read once per process): an SVG download on every
Plotly toolbar, the lines view's hover highlight, and this browser's key cookie."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import streamlit as st

from attnviz.checkpoints import keep
from attnviz.ui.session_models import browser_store

ASSETS = Path(__file__).resolve().parent / "assets"
PAGE_SCRIPTS = ("svg_downloads.js", "lines_highlight.js", "narrow_sidebar.js")
COOKIE_SCRIPT = "browser_cookie.js"
# The hidden element the scripts are installed from (in the sidebar).
_SCRIPT_HOST = """
<div id="attnviz-svg-downloads"></div>
<style>div[data-testid="stElementContainer"]:has(#attnviz-svg-downloads) { display: none; }</style>
"""


@functools.lru_cache(maxsize=None)
def asset_script(name: str) -> str:
    """The text of ``assets/<name>``, read once per process."""
    return (ASSETS / name).read_text()


@functools.lru_cache(maxsize=1)
def page_scripts() -> str:
    """The page scripts as the HTML that installs them."""
    return _SCRIPT_HOST + "".join(f"<script>\n{asset_script(name)}</script>\n" for name in PAGE_SCRIPTS)


def install_page_scripts() -> None:
    """Once per run from app.py: every figure's toolbar gets an SVG download next to Plotly's PNG one, and the
    browser gets (or renews) its key cookie, so that a reload finds the models it added."""
    store = browser_store()
    with st.sidebar:
        st.html(page_scripts() + browser_cookie_script(store), unsafe_allow_javascript=True)
    if store is not None:
        store.touch()  # a visit: the browser's models are kept keep_hours() after the last one


def browser_cookie_script(store: keep.BrowserStore | None) -> str:
    """A script that sets the browser's key cookie, renewed on every visit so that it lasts as long as the kept
    models (``keep_hours`` after the last visit); ``SameSite=Strict`` (not sent with requests from other sites) and
    ``Secure`` over HTTPS. Browsers share cookies between all ports of one host name: on a host that serves other
    web apps, give attnviz a host name of its own (docs/deployment.md, Run it for a group)."""
    if store is None:
        return ""
    settings = {"name": keep.COOKIE, "key": st.session_state["browser_key"],  # [A-Za-z0-9_-] only (keep.valid_key)
                "maxAge": int(keep.keep_hours() * 3600)}
    return f"<script>\nwindow.attnvizCookie = {json.dumps(settings)};\n{asset_script(COOKIE_SCRIPT)}</script>"
