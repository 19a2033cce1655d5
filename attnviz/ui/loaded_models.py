"""Models loaded once per process: the bundled ones in slots of their own, the added ones in a bounded,
least-recently-used cache shared by every session."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attnviz.models.loading import ModelBundle, load_model_dir
from attnviz.models.shipped import BUNDLED_GPT_NAME, DEFAULT_MODEL_NAME, bundled_models, default_model_dir
from attnviz.models.with_heads import load_causal_lm

MAX_LOADED_UPLOADS = 4  # uploaded or server-folder models held in memory, process-wide (least recently used go)


@st.cache_resource(max_entries=1, show_spinner="Loading the model (first time only)…")
def _bundled_model() -> ModelBundle:
    return load_model_dir(default_model_dir(), name=DEFAULT_MODEL_NAME)


@st.cache_resource(max_entries=MAX_LOADED_UPLOADS, show_spinner="Loading the model (first time only)…")
def _added_model(folder: str, name: str, dtype: str = "stored", _progress=None) -> ModelBundle:
    return load_model_dir(folder, name=name, dtype=dtype, progress=_progress)


@st.cache_resource(max_entries=1, show_spinner="Loading the tiny GPT (first time only)…")
def _bundled_gpt(folder: str) -> ModelBundle:
    return load_model_dir(folder, name=BUNDLED_GPT_NAME)


def load_bundle(folder: str, name: str, dtype: str = "stored", progress=None) -> ModelBundle:
    """A model, loaded once per process. The bundled models have their own slots, so that many sessions' uploads
    never push them out; the others share :data:`MAX_LOADED_UPLOADS` slots. ``progress(text)`` hears each step
    of a load (and a wait for another one)."""
    if name == DEFAULT_MODEL_NAME and Path(folder) == default_model_dir():
        return _bundled_model()
    if name == BUNDLED_GPT_NAME and Path(folder) == bundled_models().get(BUNDLED_GPT_NAME):
        return _bundled_gpt(folder)
    return _added_model(folder, name, dtype, _progress=progress)


@st.cache_resource(max_entries=2, show_spinner="Loading the model with its language-model head…")
def generation_model(folder: str, name: str):
    """A decoder or an encoder-decoder with its LM head and eager attention, for the Generation page
    (``(model, tokenizer)``)."""
    return load_causal_lm(folder)


def forget_loaded(folder: str, name: str, dtype: str) -> None:
    """Drop a removed model from the process-wide cache (its memory goes with the last session using it)."""
    _added_model.clear(folder, name, dtype)
