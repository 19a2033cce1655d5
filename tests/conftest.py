import pytest

from attnviz.runtime import configure_environment

configure_environment()  # offline; no GPU here or in CI, so Triton kernels run in the interpreter


@pytest.fixture
def clean_streamlit_caches():
    import streamlit as st

    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()
