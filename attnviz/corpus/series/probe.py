"""The probe every checkpoint of a series is measured on (:func:`series_probe`): held-out text (by default the
held-out Python documentation the bundled tiny GPT was measured on, :func:`default_text`; or a text file given,
:func:`probe_text`) in windows of :data:`LENGTH` tokens of the series' tokenizer, and random ordinary tokens typed
twice after the BOS where the tokenizer has one. The same probe measures every checkpoint; a run goes on only with the
probe it began with (:func:`probe_fingerprint`).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Protocol

import torch

from attnviz.core.circuits import ordinary_token_ids
from attnviz.corpus.series.folder import SeriesRefused
from attnviz.interventions import training_measures as tm

LENGTH = tm.LATE[1]  # tokens per held-out window: the late tokens of the in-context score end there
MOST_TEXT_BYTES = 8 * 1024**2  # a text file given for the probe
DEFAULT_TEXT_WORDS = "the held-out Python documentation the bundled tiny GPT was measured on"


class ProbeSettings(Protocol):
    """What the probe is made of (the fields of :class:`attnviz.corpus.series.runner.SeriesSettings` it reads)."""

    windows: int
    period: int
    sequences: int
    seed: int


@functools.lru_cache(maxsize=1)
def default_text() -> str:
    """The held-out part of the bundled tiny GPT's training text (Python's documentation)."""
    from attnviz.tiny_gpt.text import HELD_OUT_SHARE, documentation_text, split_text

    return split_text(documentation_text(), HELD_OUT_SHARE)[1]


def probe_text(text_file: str | None) -> str:
    """The probe's held-out text: the default, or a UTF-8 text file of at most :data:`MOST_TEXT_BYTES`."""
    if text_file is None:
        return default_text()
    try:
        with open(text_file, "rb") as handle:
            data = handle.read(MOST_TEXT_BYTES + 1)
    except OSError as problem:
        raise SeriesRefused(f"the text file cannot be read ({problem.strerror})") from None
    if len(data) > MOST_TEXT_BYTES:
        raise SeriesRefused(f"the text file is larger than {MOST_TEXT_BYTES // 1024**2} MB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SeriesRefused("the text file is not UTF-8 text") from None


def series_probe(tokenizer, text: str, settings: ProbeSettings, shape: dict) -> tm.Probe:
    """The probe every checkpoint is measured on: ``settings.windows`` windows of :data:`LENGTH` tokens of ``text``
    and ``settings.sequences`` sequences of ``settings.period`` ordinary tokens typed twice (after the BOS where the
    tokenizer has one); refused in words when it does not fit the checkpoints (``shape``: their context, their
    vocabulary) or the text is too short."""
    vocabulary = int(shape.get("vocabulary") or 0)
    bos = tokenizer.bos_token_id
    start = 0 if bos is None else 1
    positions = shape.get("positions")
    needed = max(LENGTH, start + 2 * settings.period)
    if isinstance(positions, int) and positions < needed:
        raise SeriesRefused(f"the checkpoints read at most {positions:,} positions: the measures need {needed:,} "
                            f"(windows of {LENGTH} held-out tokens, and {settings.period} random tokens typed twice"
                            f"{' after the BOS' if start else ''})")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < LENGTH + 1:
        raise SeriesRefused(f"the text is {len(ids):,} tokens long with this tokenizer: at least {LENGTH + 1} are "
                            "needed")
    if vocabulary and max(ids) >= vocabulary:
        raise SeriesRefused(f"the tokenizer gives token ids up to {max(ids):,}, but the checkpoints' vocabulary has "
                            f"{vocabulary:,} entries")
    pool = [token for token in ordinary_token_ids(tokenizer) if not vocabulary or token < vocabulary]
    if len(pool) < 2:
        raise SeriesRefused("the tokenizer has too few ordinary tokens to draw random ones from")
    return tm.make_probe(torch.tensor(ids), pool, bos=bos, length=LENGTH, windows=settings.windows,
                         period=settings.period, sequences=settings.sequences, seed=settings.seed)


def probe_fingerprint(probe: tm.Probe) -> str:
    """The probe's token ids and shape, hashed: a run goes on only with the probe it began with."""
    digest = hashlib.sha256(f"{probe.period}:{probe.start}:{tuple(probe.held_out.shape)}:"
                            f"{tuple(probe.repeated.shape)}".encode())
    digest.update(probe.held_out.numpy().astype("int64").tobytes())
    digest.update(probe.repeated.numpy().astype("int64").tobytes())
    return digest.hexdigest()[:32]
