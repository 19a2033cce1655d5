"""What the first visits compute, done once per process at server start (see :mod:`attnviz.ui.lifespan`)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

import attnviz.pagelogic.explore_heads  # noqa: F401 - the page's own imports (analysis, vision, the figures)
import attnviz.viz.heads  # noqa: F401
import attnviz.viz.vision  # noqa: F401
from attnviz.models.shipped import BUNDLED_GPT_NAME, DEFAULT_MODEL_NAME, bundled_models, default_model_dir
from attnviz.pagelogic import flash as flash_page
from attnviz.ui.caches.explore_heads import cached_replay_difference
from attnviz.ui.caches.flash import cached_tiling
from attnviz.ui.caches.generation import (
    REQUEST_DEFAULTS,
    cached_circuits,
    cached_float64_check,
    cached_generation,
    default_sampling_key,
)
from attnviz.ui.caches.scaling import (
    SCALING_DEFAULTS,
    scaling_dot_samples,
    scaling_saturation_rows,
    scaling_stability_rows,
    scaling_variance_rows,
)
from attnviz.ui.caches.shared_measurements import shared_measurements
from attnviz.ui.captures import cached_capture, text_capture_key
from attnviz.ui.loaded_models import _bundled_model, generation_model
from attnviz.ui.sidebar import DEFAULT_SENTENCE


def warm_up() -> None:
    """Everything the first visit to Explore heads computes, done once per process before a browser asks: the
    imports, the bundled model, its capture of the default sentence, the replay check and a first Plotly figure.
    Called in a thread at server start (app.py's ``lifespan``). The entries are the very ``st.cache_resource``
    entries the page reads (the same arguments), so the first session finds them made, or waits for the one
    being made; nothing is computed twice."""
    bundle = _bundled_model()
    folder, name, dtype = str(default_model_dir()), DEFAULT_MODEL_NAME, "stored"
    capture = cached_capture(folder, name, DEFAULT_SENTENCE, None, bundle, None, None, dtype)
    kind = capture.kinds[0]
    record = capture.records[kind]
    if record.replayable:
        key = text_capture_key(folder, name, dtype, DEFAULT_SENTENCE, None, None, None)
        cached_replay_difference(key, kind, record, _model=bundle.model)
    go.Figure(go.Heatmap(z=[[0.0]])).to_json()  # Plotly builds its validators on a first figure


def warm_up_later() -> None:
    """The second part of the warm-up, once the first visitor's page is drawn: the Scaling page's experiments at
    their defaults (4 s of sampling on 2 cores, once per process); the Generation page's first visit: the
    bundled tiny GPT with its LM head, the heads it learned (measured on its own text), and the default prompt's
    generation; and the Flash page's first visit (:func:`warm_flash_page`)."""
    seed, samples = SCALING_DEFAULTS["seed"], SCALING_DEFAULTS["samples"]
    scaling_variance_rows(samples, seed)
    scaling_dot_samples(SCALING_DEFAULTS["d_hist"], samples, seed)
    scaling_saturation_rows(SCALING_DEFAULTS["n_keys"], seed)
    scaling_stability_rows(tuple(sorted(SCALING_DEFAULTS["logits"])), seed)
    folder = bundled_models().get(BUNDLED_GPT_NAME)
    if folder is not None:
        folder = str(folder)
        generation_model(folder, BUNDLED_GPT_NAME)
        cached_circuits(folder, BUNDLED_GPT_NAME)
        request = REQUEST_DEFAULTS
        for use_cache in (True, False):  # the page compares the two
            cached_generation(folder, BUNDLED_GPT_NAME, request["prompt"], request["new_tokens"],
                              default_sampling_key(), use_cache, request["keep"])
        cached_float64_check(folder, BUNDLED_GPT_NAME, request["prompt"], request["new_tokens"],
                             default_sampling_key(), request["keep"])
    warm_flash_page()


def warm_flash_page() -> None:
    """The Flash page's backends timed at its opening settings, into the store its sessions share (stamped with the
    time they were measured, as a first visit's would be); the tiling's trace at those settings; and pandas' Styler
    (its import compiles Jinja templates: 0.2 s of the page's first run), which the online-softmax table uses."""
    case, names = flash_page.default_case(), list(flash_page.DEFAULT_CONTENDERS)
    interpreter = case.device != "cuda" and flash_page.interpreter_by_default(case.n)  # as the page chooses
    shared_measurements().get(flash_page.measurement_key(case, names, interpreter),
                              lambda: flash_page.run_contenders(case, names, allow_interpreter=interpreter))
    block = flash_page.DEFAULT_BLOCK
    cached_tiling(repr(case), case, block, block, flash_page.default_trace_block(-(-case.n // block)))
    pd.DataFrame({"x": [0.0]}).style.format(precision=4).to_html()
