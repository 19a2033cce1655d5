"""Pre-norm or post-norm? A section for the "Over training" page: the bundled tiny GPT's shape built both ways, each
block's gradient norm at initialisation (drawn at once: one backward pass each), and, behind a button, four short
training runs (each way, with and without warm-up) with their gradients and losses, kept by their settings for every
session. At most :func:`training_limit` sessions train at once on a server; the others are told to press again. The
measuring is :mod:`attnviz.interventions.norm_placement`; the words and figures :mod:`attnviz.pagelogic.norm_placement`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import streamlit as st

from attnviz.interventions import norm_placement as npl
from attnviz.pagelogic import norm_placement as logic
from attnviz.ui.caches.importance import keep_form
from attnviz.ui.caches.store import BoundedStore
from attnviz.ui.figures import figure_once, show_figure

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
TRAININGS_VARIABLE = "ATTNVIZ_NORM_TRAININGS"
FORM = ("np_lr", "np_steps", "np_warmup", "np_seed")


@st.cache_resource(show_spinner=False)
def _results() -> BoundedStore:
    """Finished experiments by their settings, for every session (the runs are deterministic)."""
    return BoundedStore(8)


@st.cache_resource(show_spinner="Reading the tiny GPT's training text…")
def _text() -> npl.TrainingText:
    return logic.bundled_text()


@st.cache_resource(max_entries=32, show_spinner="One backward pass each way…")
def _init_gradients(settings: npl.Settings) -> tuple[dict[str, list[float]], float]:
    """Each placement's gradient norm per block at initialisation, and the seconds the two passes took, timed a
    second time (the first passes of a process also warm it up)."""
    npl.init_gradients(settings, _text())
    started = time.perf_counter()
    gradients = npl.init_gradients(settings, _text())
    return gradients, time.perf_counter() - started


def training_limit() -> int:
    """How many sessions may train these runs at once on this server (``ATTNVIZ_NORM_TRAININGS``; default 1: each
    training takes the cores it is given, and the runs are short)."""
    try:
        return max(1, int(os.environ.get(TRAININGS_VARIABLE, "") or 1))
    except ValueError:
        return 1


@st.cache_resource(show_spinner=False)
def _training_slots() -> threading.BoundedSemaphore:
    """The server's training slots, shared by every session of this process (the server)."""
    return threading.BoundedSemaphore(training_limit())


def _settings(base: npl.Settings) -> npl.Settings:
    """The widgets, started from ``base`` through the session state (a widget given a value as well as a session
    state value draws Streamlit's warning) and kept across page changes."""
    for key, value in zip(FORM, (base.learning_rate, base.steps, base.warmup, base.seed), strict=True):
        st.session_state.setdefault(key, value)
    keep_form(FORM)
    columns = st.columns(4)
    rate = columns[0].select_slider("Peak learning rate", LEARNING_RATES, key="np_lr",
                                    format_func=lambda value: f"{value:g}",
                                    help="Xiong et al. (2020) saw post-norm fail most clearly with a large learning "
                                         "rate and no warm-up.")
    steps = columns[1].number_input("Steps per run", 5, 2000, step=50, key="np_steps")
    warmup = columns[2].number_input("Warm-up steps (the warm-up runs)", 1, 1000, step=10, key="np_warmup",
                                     help="The warm-up runs rise linearly to the peak over these steps; the other "
                                          "two start at the peak.")
    seed = columns[3].number_input("Seed", 0, 10_000, key="np_seed",
                                   help="The weights (the same for both placements) and the batches.")
    return replace(base, learning_rate=rate, steps=int(steps), warmup=min(int(warmup), int(steps)), seed=int(seed))


def _train(settings: npl.Settings, slot) -> npl.Result | None:
    """The four runs, with a progress bar and a Stop button in ``slot`` (the place of the button that started them;
    a click on Stop reruns the page, which ends the runs), emptied when they end. None (said in the page) when every
    training slot of the server is taken: nothing waits in a request thread."""
    slots = _training_slots()
    if not slots.acquire(blocking=False):
        limit = training_limit()
        with slot.container():
            st.warning(f"{'Another session is' if limit == 1 else f'{limit} sessions are'} training these runs on "
                       f"this server now (at most {limit} at once): try again in a minute.",
                       icon=":material/hourglass_top:")
            st.button("Try again", key="np_retry", icon=":material/refresh:")
        return None
    try:
        with slot.container():
            st.button("Stop", key="np_stop", icon=":material/stop:", help="ends the runs; nothing is kept")
            bar = st.progress(0.0, text="Training…")
        result = npl.experiment(settings, _text(),
                                progress=lambda share, what: bar.progress(min(1.0, share), text=f"Training: {what}"))
    finally:
        slots.release()  # also when Stop's rerun ends the thread
    slot.empty()
    _results().put(settings, result)
    return result


def norm_placement_section(base: npl.Settings | None = None) -> None:
    """The section: settings, the gradients at initialisation, and the four runs behind "Train both ways".
    ``base``: the settings the widgets start from and do not set (the model's shape, batch, length)."""
    base = base or npl.Settings()
    st.subheader("Pre-norm or post-norm?")
    st.markdown("The tiny GPT's shape built two ways: **pre-norm** (GPT-2: `x + attn(LN(x))`) and **post-norm** (the "
                "original Transformer, BERT: `LN(x + attn(x))`), then trained four short runs, each way with and "
                "without learning-rate warm-up, on the tiny GPT's own text.")
    settings = _settings(base)
    st.caption(logic.settings_words(settings))
    gradients, seconds = _init_gradients(replace(base, seed=settings.seed))
    figure, caption = logic.init_figure(gradients)
    show_figure(figure, caption, key="np_init_figure")
    st.markdown(logic.init_words(gradients))
    result = _results().get(settings)
    if result is None:
        slot = st.empty()
        retried = st.session_state.get("np_retry", False)  # "Try again", shown when the server's slots were taken
        if not retried and not slot.button("Train both ways", key="np_train", type="primary",
                                           icon=":material/play_arrow:"):
            if st.session_state.get("np_stop"):
                st.warning("Stopped: nothing was kept. Press *Train both ways* to start again.", icon=":material/stop:")
            else:
                # the two forward and backward passes above took ``seconds``; a step is one, plus AdamW's update
                st.info(f"Press the button: four runs of {settings.steps:,} steps, a forward and backward pass "
                        f"each, {4 * settings.steps:,} in all (the two passes above took {seconds:.2f} s: about "
                        f"{2 * settings.steps * seconds:.0f} s on this server).", icon=":material/info:")
            return
        result = _train(settings, slot)
        if result is None:
            return
    st.caption(logic.timing_words(result))
    show_figure(*figure_once(("np_gradients", settings), lambda: logic.gradients_figure(result)),
                key="np_gradients_figure")
    st.markdown(logic.early_words(result))
    show_figure(*figure_once(("np_losses", settings), lambda: logic.losses_figure(result)), key="np_loss_figure")
    st.markdown(logic.loss_words(result) + "\n\n" + logic.warmup_words(result))
