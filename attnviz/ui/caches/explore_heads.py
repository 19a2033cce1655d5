"""Explore heads' caches, process-wide: the replay check and the head statistics of a capture, keyed by the
capture's key (:class:`attnviz.ui.captures.CurrentCapture`) and the attention kind."""

from __future__ import annotations

import streamlit as st

from attnviz.models.replay_check import replay_difference
from attnviz.pagelogic.explore_heads.detectors import detector_scores, pattern_targets
from attnviz.pagelogic.explore_heads.statistics import statistics_table


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_replay_difference(capture_key: tuple, kind: str, _record, _progress=None, _model=None) -> float:
    """Keyed by the capture's key (model, texts, token limit) and the attention kind."""
    return replay_difference(_record, progress=_progress, model=_model)


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_detector(capture_key: tuple, kind: str, pattern: str, spec: str, _capture):
    """Every head's score on a pattern (:func:`attnviz.pagelogic.explore_heads.detectors.detector_scores`), kept by
    the capture and the pattern as typed."""
    targets = pattern_targets(pattern, spec, _capture, _capture.records[kind].key_tokens)
    return detector_scores(_capture, kind, targets)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_statistics(capture_key: tuple, kind: str, _capture, _progress=None):
    return statistics_table(_capture, kind, progress=_progress)
