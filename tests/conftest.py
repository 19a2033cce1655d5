import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def clean_streamlit_caches():
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()
