import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from attnviz.runtime import configure_triton  # noqa: E402

configure_triton()  # no GPU here or in CI: Triton kernels run in the interpreter


@pytest.fixture
def clean_streamlit_caches():
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()
