"""The Generation page's caches, process-wide (``st.cache_resource``): a generation, its float64 check, how the prompt
fits, the whole sequence's attention, readable labels, and the heads a decoder learned. In a module, not in the page,
so that the warm-up at server start (:mod:`attnviz.ui.warm_up`) can fill the entries a first visit reads."""

from __future__ import annotations

import streamlit as st

from attnviz.models.shipped import BUNDLED_GPT_NAME
from attnviz.pagelogic.generation import decode as gen
from attnviz.pagelogic.generation import heads as gen_heads
from attnviz.pagelogic.generation import sequence as gen_sequence
from attnviz.ui.loaded_models import generation_model

DEFAULT_PROMPT = ("The for statement is used to iterate over the elements of a sequence (such as a string, tuple "
                  "or list) or other iterable object.")

REQUEST_DEFAULTS = {"prompt": DEFAULT_PROMPT, "new_tokens": 12, "strategy": "greedy", "temperature": 1.0, "top_k": 0,
                    "top_p": 1.0, "seed": 0, "keep": "first"}


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_generation(folder: str, name: str, prompt: str, new_tokens: int, sampling: tuple, use_cache: bool,
                      keep: str = "first"):
    model, tokenizer = generation_model(folder, name)
    return gen.generate(model, tokenizer, prompt, new_tokens, gen.Sampling(*sampling), use_cache=use_cache,
                        keep=keep)


@st.cache_resource(max_entries=16, show_spinner=False)
def cached_float64_check(folder: str, name: str, prompt: str, new_tokens: int, sampling: tuple, keep: str = "first"):
    model, tokenizer = generation_model(folder, name)
    return gen.float64_cache_agreement(model, tokenizer, prompt, new_tokens, gen.Sampling(*sampling), keep=keep)


@st.cache_data(max_entries=16, show_spinner=False)
def cached_fit(folder: str, name: str, prompt: str, new_tokens: int, keep: str) -> gen.PromptFit:
    model, tokenizer = generation_model(folder, name)
    return gen.fit_prompt(model, tokenizer, prompt, new_tokens, keep)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_sequence_attention(folder: str, name: str, ids: tuple[int, ...], layer: int):
    """Every head of ``layer`` over the whole sequence ``[heads, n, n]``: one cache-free forward pass."""
    model, _ = generation_model(folder, name)
    return gen_sequence.sequence_attention(model, list(ids), layer)


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_labels(folder: str, name: str, ids: tuple[int, ...]) -> list[str]:
    _, tokenizer = generation_model(folder, name)
    return gen_sequence.readable_labels(tokenizer, list(ids))


@st.cache_resource(max_entries=4, show_spinner="Measuring the heads…")
def cached_circuits(folder: str, name: str):
    model, tokenizer = generation_model(folder, name)
    if name == BUNDLED_GPT_NAME:  # the pool it was trained to repeat
        report = gen_heads.bundled_training_report()
        pool = report["repeat_token_ids"]
        words = (f"the {len(pool)} most frequent tokens of its training text" if report["recipe"].get("repeat_pool")
                 else f"any of its {len(pool):,} ordinary tokens")
        return gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text(), pool=pool, pool_words=words)
    return gen_heads.find_circuits(model, tokenizer, gen_heads.held_out_text())


def default_sampling_key() -> tuple:
    """The sampling of :data:`REQUEST_DEFAULTS` as the caches are keyed (the page's ``sampling_key``)."""
    return (REQUEST_DEFAULTS["strategy"], REQUEST_DEFAULTS["temperature"], REQUEST_DEFAULTS["top_k"],
            REQUEST_DEFAULTS["top_p"], REQUEST_DEFAULTS["seed"])
