"""The "Does this head matter?" page's maps as it draws them, for texts and for a corpus run alike: one heatmap per
measure side by side, and whether the measures agree."""

from __future__ import annotations

import streamlit as st

from attnviz.interventions import importance as imp
from attnviz.pagelogic.importance import MEASURES, METHOD_TITLES, agreement_rows, disagreement_rows, map_caption
from attnviz.ui.figures import show_figure
from attnviz.viz import importance as figures


def show_maps(maps: dict[str, imp.ImportanceMap], labels: list[str], objective: str, key: str,
              over: str = "texts") -> None:
    """One heatmap per measure, side by side."""
    for column, (method, one_map) in zip(st.columns(len(maps)), maps.items(), strict=True):
        with column:
            signed = method != "gradient" and objective != "hidden"  # a distance, like a gradient's size, is >= 0
            figure = figures.importance_heatmap(
                one_map.values, labels, title=METHOD_TITLES[method],
                measure="|dL/dg|" if method == "gradient" else MEASURES[objective], signed=signed,
                width=1000 // len(maps))
            show_figure(figure, map_caption(method, objective, over), key=f"{key}_{method}")


def agreement_tables(maps: dict[str, imp.ImportanceMap]) -> None:
    left, right = st.columns([2, 3])
    with left:
        st.subheader("Do the measures agree?")
        st.dataframe(agreement_rows(maps), hide_index=True, width="stretch")
        either = next(iter(maps.values())).objective != "hidden"  # a distance is never negative
        st.caption("Rank correlation over every head of the size of its effect"
                   + (", either way (removing a head can also lower the loss)" if either else "")
                   + ": 1, the same order of importance; 0, unrelated.")
    with right:
        second, rows = disagreement_rows(maps)
        st.subheader(f"Where zero ablation and {METHOD_TITLES[second].lower()} disagree most")
        st.dataframe(rows, hide_index=True, width="stretch")
        st.caption("Ranks among every head (1: the largest effect by that measure"
                   + (", either way)." if either else ")."))
