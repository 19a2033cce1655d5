"""The sidebar model's captures, cached process-wide by what names them (model, texts, token limit), and the
one call a page makes for the capture of its text."""

from __future__ import annotations

from typing import NamedTuple

import streamlit as st

from attnviz.models.capture import capture, capture_image, tokens_read
from attnviz.models.loading import ModelBundle
from attnviz.ui.messages import problem_text, warn_if_not_finite
from attnviz.ui.session_models import current_bundle, current_model_name, model_dtype, registered_models


@st.cache_resource(max_entries=4, show_spinner="Running the model and capturing its attention…")
def cached_capture(
    folder: str, name: str, text: str, text_pair: str | None, _bundle: ModelBundle, fallback: str | None = None,
    max_tokens: int | None = None, dtype: str = "stored",
):
    """Captures are treated as read-only; keyed by the model (folder, name, dtype), the texts, the fallback
    tokenizer and the token limit."""
    return capture(_bundle, text, text_pair, fallback_tokenizer=fallback, max_tokens=max_tokens)


@st.cache_resource(max_entries=4, show_spinner="Running the model on the image and capturing its attention…")
def cached_image_capture(folder: str, name: str, dtype: str, image_key: str, _bundle: ModelBundle, _image,
                         label: str):
    """A vision model's capture of one image, keyed by the model and the image (its bytes' digest, or the
    sample's name)."""
    return capture_image(_bundle, _image, label)


def text_capture_key(folder: str, name: str, dtype: str, text: str, text_pair: str | None,
                     max_tokens: int | None, fallback: str | None) -> tuple:
    """What names one capture (as :func:`cached_capture` is keyed): the key of its replay check and statistics."""
    return (folder, name, dtype, text, text_pair or None, max_tokens, fallback)


MECHANISM_TOKENS = 96  # the mechanism pages draw N x N masks and heads: they read the first this-many tokens


def truncation_notice(result, explore_reads: int, name: str) -> str:
    """What a page that reads the first tokens of a text says: how many of the text's tokens it reads, and how
    many Explore heads reads with this model (``explore_reads``: :func:`attnviz.models.capture.tokens_read`)."""
    total = result.n_tokens_before_truncation  # negative: more than this many (a text longer than COUNTED_CHARS)
    shown = len(result.tokens)
    if shown >= explore_reads:
        return (f"{name} reads at most {explore_reads:,} tokens: this page, like Explore heads, reads the first "
                f"{shown:,} of the text's {result.length_of_text} tokens.")
    explore = ("Explore heads reads all of them" if 0 <= total <= explore_reads else
               f"Explore heads reads the first {explore_reads:,}, the most it reads with {name}")
    return f"This page reads the first {shown:,} of the text's {result.length_of_text} tokens ({explore})."


class CurrentCapture(NamedTuple):
    """The sidebar model, its capture of a text, and the key that names that capture (what its replay check and
    statistics are cached by)."""

    bundle: ModelBundle
    capture: object  # attnviz.models.capture.Capture
    key: tuple


def capture_current(text: str, text_pair: str | None = None, max_tokens: int | None = None, *,
                    notice: bool = True) -> CurrentCapture:
    """Capture the sidebar model on ``text`` (its first ``max_tokens`` tokens, if given, with a notice when that
    cuts it, unless ``notice`` is off); an error in the page (not a traceback) if that fails."""
    bundle = current_bundle()
    name = current_model_name()
    if bundle.modality == "image":
        st.info(f"{name} is a vision transformer: this part of the page works on text. Explore heads shows its "
                "attention on an image; choose a text model in the sidebar for this one.", icon=":material/image:")
        st.stop()
    if not text.strip():
        st.warning("The text is empty. Type a sentence in the sidebar.")
        st.stop()
    fallback = st.session_state.get("fallback_tokenizer") if bundle.uses_fallback_tokenizer else None
    folder, dtype = registered_models()[name], model_dtype(name)
    try:
        result = cached_capture(folder, name, text, text_pair or None, bundle, fallback, max_tokens, dtype)
    except Exception as problem:  # noqa: BLE001 - whatever a checkpoint's code raises, the page says so in words
        st.error(f"{name} could not run on this text: {problem_text(problem)}. Try another text, or choose another "
                 "model in the sidebar.", icon=":material/error:")
        st.stop()
    warn_if_not_finite(bundle, result)
    if notice and max_tokens is not None and result.truncated:
        st.info(truncation_notice(result, tokens_read(bundle), name), icon=":material/content_cut:")
    return CurrentCapture(bundle, result, text_capture_key(folder, name, dtype, text, text_pair, max_tokens, fallback))
