"""What a link's query parameters may hold before any widget reads them.

Widgets bound to the URL (``bind="query-params"``) read their value from it: Streamlit drops a number outside a
widget's range or of the wrong kind, but ``?head=inf`` or ``?layer=1e309`` (infinity once parsed) reaches an
integer conversion and fails the page, and the parameter would stay in the URL, so a reload fails again. Such
values are dropped first, for every parameter but those that hold free text."""

from __future__ import annotations

import math

FREE_TEXT = frozenset({"sentence", "explore_pair", "model"})  # what a user types: kept as typed, whatever it is
LARGEST = 1e15  # no number a page takes from a link comes near this


def unusable(key: str, value: str) -> bool:
    """Whether a parameter's value is a number no widget can take: not finite, or past :data:`LARGEST`."""
    if key in FREE_TEXT:
        return False
    try:
        number = float(value.strip())
    except (ValueError, OverflowError):
        return False  # not a number: a choice's name, which its widget checks
    return not math.isfinite(number) or abs(number) > LARGEST


def drop_unusable_numbers() -> None:
    """Remove from the URL every parameter :func:`unusable` names, then run again: widgets take their first value
    from the URL the run began with, so the run that found them must not reach a widget."""
    import streamlit as st

    dropped = [key for key in list(st.query_params.keys())
               if any(unusable(key, value) for value in st.query_params.get_all(key))]
    for key in dropped:
        del st.query_params[key]  # the browser's URL too, and the query string the rerun starts from
    if dropped:
        st.rerun()
