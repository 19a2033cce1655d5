"""One checkpoint of a series, in this process or a Ray actor: loaded from its checked files (a private folder of
links where the tokenizer is the series'), measured on the probe
(:func:`attnviz.interventions.training_measures.measure`) and, where a corpus was chosen, scanned over it
(:mod:`attnviz.corpus.series.scans`), then let go (:func:`measure_step`); :func:`measure_chunk` is what the one runner
of corpus runs (:mod:`attnviz.corpus.runner`) calls, here or on Ray.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from attnviz.checkpoints import preflight
from attnviz.checkpoints.checked_files import CheckedFile, shown
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.corpus.runner import Documents
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.corpus.series.folder import SeriesRefused, series_links
from attnviz.corpus.series.scans import SeriesScan, scan_checkpoint
from attnviz.interventions import training_measures as tm
from attnviz.models.loading import ModelBundle


# -- one checkpoint -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepWork:
    """What measuring any checkpoint of a series needs, in this process or a Ray actor (picklable)."""

    probe: tm.Probe
    root: Path
    tokenizer: tuple[CheckedFile, ...]  # the series' tokenizer files, for checkpoints without their own
    own_tokenizer: frozenset[int]  # the steps whose folders hold their own (same) tokenizer
    layers: int
    dtype: str = "fp32"
    measured: frozenset[int] = frozenset()  # the steps measured before: scanned only
    scan: SeriesScan | None = None  # the corpus each checkpoint is scanned over, if one was chosen


@contextlib.contextmanager
def loadable_folder(folder: Path, work: StepWork, own_tokenizer: bool) -> Iterator[Path]:
    """The folder a checkpoint is loaded from: its own where it holds its tokenizer, else a private folder of links
    to its checked files and the series' tokenizer files (which are checked again when loaded), removed after."""
    if own_tokenizer:
        yield folder
        return
    checked = preflight.inspect(folder, series_links(work.root))
    scratch = Path(tempfile.mkdtemp(prefix="attnviz-series-"))
    try:
        for item in [*checked.weights, *([checked.index] if checked.index else []), *checked.others,
                     *work.tokenizer]:
            if item.replacement is not None:
                (scratch / item.name).write_bytes(item.replacement)
            else:
                os.symlink(item.real, scratch / item.name)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_step(folder: Path, work: StepWork, own_tokenizer: bool) -> torch.nn.Module:
    """A checkpoint's causal LM, loaded as :func:`attnviz.models.with_heads.load_causal_lm` loads any (every file
    checked; eager attention), from :func:`loadable_folder`."""
    from attnviz.models.with_heads import load_causal_lm

    with loadable_folder(folder, work, own_tokenizer) as loadable:
        model, _ = load_causal_lm(loadable)
    if work.dtype == "fp32":
        model = model.float()
    return model.eval()


def load_step_bundle(step: int, folder: Path, work: StepWork, own_tokenizer: bool) -> ModelBundle:
    """A checkpoint loaded as the Heads across a corpus page loads a model to scan
    (:func:`attnviz.models.loading.load_model_dir`, in the series' dtype), named for its step and with its own
    folder (the scan's key fingerprints it there, and a kept scan file names it)."""
    from attnviz.models.loading import load_model_dir

    with loadable_folder(folder, work, own_tokenizer) as loadable:
        bundle = load_model_dir(loadable, name=f"{folder.name} (step {step:,})", dtype=work.dtype)
    bundle.folder = folder
    return bundle


def measure_step(step: int, folder: Path, work: StepWork) -> dict:
    """One checkpoint loaded, measured on the probe and let go: ``step``, every key of
    :func:`~attnviz.interventions.training_measures.measure`, and the seconds of its loading and of its measures
    (none of them for a step in ``work.measured``); and, where ``work.scan`` names a corpus, the checkpoint scanned
    over it (:func:`attnviz.corpus.series.scans.scan_checkpoint`: ``scan_row`` and ``scan_heads``)."""
    words = f"step {step:,} ({shown(folder.name)})"
    found: dict = {"step": step}
    if step not in work.measured:
        found.update(measure_loaded(step, folder, work, words))
    if work.scan is not None:
        found.update(scan_step(step, folder, work, words))
    return found


def measure_loaded(step: int, folder: Path, work: StepWork, words: str) -> dict:
    """:func:`measure_step`'s measures: every key of :func:`~attnviz.interventions.training_measures.measure`, and
    the seconds of the loading and of the measures."""
    began = time.perf_counter()
    try:
        model = load_step(folder, work, step in work.own_tokenizer)
    except CheckpointRefused as problem:
        raise SeriesRefused(f"{words} cannot be loaded: {str(problem).rstrip('.')}") from None
    loaded = time.perf_counter()
    try:
        layers = len(tm.output_projections(model))
        if layers != work.layers:
            raise SeriesRefused(f"{words} has {layers} layers where the series has {work.layers}")
        measured = tm.measure(model, work.probe)
    except SeriesRefused:
        raise
    except ValueError as problem:  # the measures' own refusal (its heads' output projections not found)
        raise SeriesRefused(f"{words} cannot be measured: {first_line(problem, 200)}") from None
    except Exception as problem:  # noqa: BLE001 - whatever its forward raises: said in words, with the step
        raise SeriesRefused(f"{words} could not be measured ({type(problem).__name__}: "
                            f"{first_line(problem, 200)})") from None
    finally:
        del model
        gc.collect()
    return {**measured, "load_seconds": loaded - began, "measure_seconds": time.perf_counter() - loaded}


def scan_step(step: int, folder: Path, work: StepWork, words: str) -> dict:
    """:func:`measure_step`'s scan: the checkpoint loaded as a scan loads it, scanned, and let go."""
    try:
        bundle = load_step_bundle(step, folder, work, step in work.own_tokenizer)
    except CheckpointRefused as problem:
        raise SeriesRefused(f"{words} cannot be loaded for the corpus scan: {str(problem).rstrip('.')}") from None
    try:
        return scan_checkpoint(bundle, step, work.scan)
    except ScanRefused as problem:  # the scan's own refusal in words (documents too long for this model, ...)
        raise SeriesRefused(f"{words} cannot be scanned: {str(problem).rstrip('.')}") from None
    except Exception as problem:  # noqa: BLE001 - whatever its forward raises: said in words, with the step
        raise SeriesRefused(f"{words} could not be scanned ({type(problem).__name__}: "
                            f"{first_line(problem, 200)})") from None
    finally:
        del bundle
        gc.collect()


def measure_chunk(work: StepWork, chunk: Documents) -> list[dict]:
    """The checkpoints of a chunk (each a document whose text is its folder), measured in order."""
    return [measure_step(step, Path(document.text), work) for step, document in chunk]


def series_replica(work: StepWork) -> Callable[[Documents], list[dict]]:
    """:func:`measure_chunk` in another process (a Ray actor)."""
    return functools.partial(measure_chunk, work)
