"""Figures as every page shows them: one caption saying what to notice, scaled up in presentation mode, with
PNG and SVG downloads named after the title."""

from __future__ import annotations

import re

import plotly.graph_objects as go
import streamlit as st

from attnviz.viz import framing


@st.cache_resource(max_entries=256, show_spinner=False)
def figure_once(cache_key: tuple, _build):
    """The figure ``_build()`` makes, built once per ``cache_key`` (what it is drawn from: the capture's key, the
    controls' values) and kept for every session: a rerun that changes another control sends it without building it
    again. The figure is shared between sessions: it is framed here, once (its title under the toolbars), and
    :func:`show_figure` copies it before changing it again; callers must not change it. ``_build`` may return
    ``(figure, anything)``."""
    built = _build()
    framed(built[0] if isinstance(built, tuple) else built)
    return built


def framed(figure: go.Figure) -> go.Figure:
    """``figure`` with its title under the toolbars, marked so that :func:`show_figure` leaves it as it is: for a
    figure kept in a cache and shared between sessions."""
    framing.title_below_toolbar(figure)
    figure._attnviz_framed = True
    return figure


def figure_scale() -> float:
    return 1.35 if st.session_state.get("presentation_mode") else 1.0


def download_name(title: str, fallback: str = "attnviz-figure") -> str:
    """A file name from a figure title: markup and symbols dropped, words joined by dashes, at most 80 chars."""
    text = re.sub(r"<[^>]+>", " ", title or "")
    text = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")
    return (text[:80].rstrip("-") or fallback).lower()


def figure_config(figure) -> dict:
    """Plotly's toolbar config: no logo, PNG downloads at 2x named after the figure's title (the SVG button
    that :func:`install_svg_downloads` adds reads the same name)."""
    title = getattr(figure.layout.title, "text", None) or ""
    return {"displaylogo": False,
            "toImageButtonOptions": {"format": "png", "scale": 2, "filename": download_name(title)}}


def show_figure(figure, caption: str, key: str | None = None, on_select=None) -> None:
    """A figure with its one-line caption saying what to notice; scaled up in presentation mode.

    ``on_select``: a callback run when the user clicks a point (it reads ``st.session_state[key].selection``)."""
    scale = figure_scale()
    if scale != 1.0:  # on a copy: a page may keep its figures between reruns
        figure = framing.enlarge_text(go.Figure(figure), scale)  # 16 px at least for every text inside the figure
    if not getattr(figure, "_attnviz_framed", False):  # a figure_once figure is framed already, and shared
        framing.title_below_toolbar(figure, framing.TOOLBAR_BAND if scale == 1.0 else framing.PROJECTOR_TOOLBAR_BAND)
    config = figure_config(figure)
    if on_select is None:
        st.plotly_chart(figure, key=key, config=config)
    else:
        st.plotly_chart(figure, key=key, config=config, on_select=on_select, selection_mode="points")
    st.caption(caption)
