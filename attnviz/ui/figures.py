"""Figures as every page shows them: one caption saying what to notice, scaled up in presentation mode, with
PNG and SVG downloads named after the title."""

from __future__ import annotations

import re

import plotly.graph_objects as go
import streamlit as st

from attnviz.viz import framing


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
    framing.title_below_toolbar(figure)
    config = figure_config(figure)
    if on_select is None:
        st.plotly_chart(figure, key=key, config=config)
    else:
        st.plotly_chart(figure, key=key, config=config, on_select=on_select, selection_mode="points")
    st.caption(caption)
