"""The Scaling page's experiments depend only on their widgets: cached by them, process-wide, so that a rerun
costs nothing (each is bounded); the page's defaults are sampled at server start (:mod:`attnviz.ui.warm_up`)."""

from __future__ import annotations

import streamlit as st
import torch

from attnviz.core import scaling

# The Scaling page's experiments depend only on their widgets: cached by them, process-wide, so that a rerun costs
# nothing (each is bounded); the page's defaults are sampled at server start (warm_up).
SCALING_DEFAULTS = {"seed": 0, "samples": 4000, "d_hist": 64, "n_keys": 32, "logits": (10, 12, 50, 100)}


STABILITY_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


@st.cache_data(max_entries=32, show_spinner="Sampling dot products…")
def scaling_variance_rows(samples: int, seed: int) -> list[dict]:
    return scaling.dot_product_variance(scaling.D_K_VALUES, samples, seed)


@st.cache_data(max_entries=32, show_spinner=False)
def scaling_dot_samples(d_k: int, samples: int, seed: int):
    return scaling.dot_samples(d_k, samples, seed)


@st.cache_data(max_entries=32, show_spinner="Measuring softmax saturation…")
def scaling_saturation_rows(n_keys: int, seed: int) -> list[dict]:
    return scaling.softmax_statistics(scaling.D_K_VALUES, n_keys=n_keys, seed=seed)


@st.cache_data(max_entries=32, show_spinner=False)
def scaling_stability_rows(scales: tuple[float, ...], seed: int) -> list[dict]:
    return scaling.stability_table(list(scales), STABILITY_DTYPES, seed)
