"""The Flash page's tiling trace, computed once per inputs and shared by every session; the page's opening
settings are traced at server start (:mod:`attnviz.ui.warm_up`). On a 2-core laptop whose browser is drawing the
page, the trace of N = 1,024 took 0.8 s of the page's first run (0.06 s on an idle machine)."""

from __future__ import annotations

import streamlit as st

from attnviz.flash.cases import AttentionCase
from attnviz.pagelogic import flash as flash_page


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_tiling(case_key: str, _case: AttentionCase, block_q: int, block_k: int, trace_query_block: int):
    """:func:`attnviz.pagelogic.flash.tiling` of ``_case`` (named by ``case_key``, its ``repr``): the output and
    the trace, which the page reads and never changes."""
    return flash_page.tiling(_case, block_q, block_k, trace_query_block)
