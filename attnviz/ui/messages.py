"""What a page says when something is wrong: an exception in words, the last line of defence, weights that
are not finite, views a model cannot give."""

from __future__ import annotations

import logging
import os

import streamlit as st

from attnviz.checkpoints.safety import CheckpointRefused
from attnviz.models.loading import ModelBundle


def problem_text(problem: BaseException) -> str:
    """An exception as one line a person can read (its type too, unless its message was written for people:
    refusals, and exceptions marked ``in_words``)."""
    text = str(problem).strip().splitlines()[0][:200] if str(problem).strip() else ""
    worded = isinstance(problem, (ValueError, CheckpointRefused)) or getattr(problem, "in_words", False)
    return text if worded and text else (
        f"{type(problem).__name__}{': ' + text if text else ''}")


STRICT_ERRORS = "ATTNVIZ_STRICT_ERRORS"  # set by the tests: a page's unexpected exception fails them


def show_unexpected_error(problem: BaseException, page: str) -> None:
    """The last line of defence: an exception no page caught becomes a message in words (and a line in the
    server's log with the traceback), never a traceback in the browser. With ``ATTNVIZ_STRICT_ERRORS=1`` (the
    tests) it is raised instead, so that a bug cannot hide behind this message."""
    if os.environ.get(STRICT_ERRORS) == "1":
        raise problem
    logging.getLogger("attnviz").error("Unexpected error on %s", page, exc_info=problem)
    st.error(f"Something went wrong on this page ({problem_text(problem)}). Try another text, model or setting, or "
             "reload the page; the server's log has the details.", icon=":material/error:")


def warn_if_not_finite(bundle: ModelBundle, capture=None) -> None:
    """Say, in words, when the model's weights, its outputs at load or this capture hold NaN or infinity: the
    figures then show blanks, and no number computed from them means anything."""
    parts = []
    if bundle.nonfinite:
        parts.append(f"{len(bundle.nonfinite)} of its weight tensors (for example `{bundle.nonfinite[0]}`)")
    if capture is not None and capture.nonfinite:
        parts += capture.nonfinite
    elif capture is None and bundle.nonfinite_outputs:
        parts.append(bundle.nonfinite_outputs)
    if parts:
        st.warning(f"**Not finite:** {bundle.name} gives NaN or infinity in {'; '.join(parts)}. Heatmaps leave those "
                   "cells blank, and statistics or checks computed from them mean nothing. The checkpoint's weights "
                   "or config (a huge weight, a zero rope_theta, a NaN epsilon) make its arithmetic overflow.",
                   icon=":material/warning:")


def queries_unavailable(bundle, record, what: str) -> bool:
    """True (with a note in the page) when ``record`` holds transformers' eager weights only, so ``what`` (a view
    that needs the model's queries and keys) cannot be drawn for this model."""
    if record.replayable:
        return False
    st.info(f"{what} needs the model's queries and keys, which {bundle.model_type} does not expose: attnviz shows "
            "its eager attention weights only (see the note on Explore heads). Choose another model in the sidebar "
            "to see it.", icon=":material/info:")
    return True
