"""A series measured on a Ray cluster: :func:`attnviz.corpus.series.runner.run_series` with its checkpoints measured by
the one Ray runner (:mod:`attnviz.corpus.on_ray`), each actor loading and measuring the checkpoints it is given as
:func:`attnviz.corpus.series.steps.measure_chunk` does in-process; the driver commits each checkpoint's row like an
in-process one, so the database is the same either way and a series stopped on Ray goes on in-process or on Ray
alike. The checkpoints' folders must be readable at the same paths on every node.

Ray is an optional extra (``pip install "ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnviz.corpus.on_ray import on_ray
from attnviz.corpus.series.runner import DEFAULT_SETTINGS, SeriesProgress, SeriesSettings, run_series


def run_series_on_ray(folder: str | Path, path: str | Path, settings: SeriesSettings = DEFAULT_SETTINGS, *,
                      dtype: str = "fp32", name: str | None = None, address: str | None = "auto", workers: int = 2,
                      threads_per_worker: int = 1, progress: Callable[[SeriesProgress], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> SeriesProgress:
    """:func:`attnviz.corpus.series.runner.run_series` with its checkpoints on Ray: ``workers`` actors, each measuring
    one checkpoint at a time. ``address``: a cluster's address, or "auto" (the local cluster, started if none
    runs)."""
    return run_series(folder, path, settings, dtype=dtype, name=name, progress=progress, should_stop=should_stop,
                      measure=on_ray(address, workers, threads_per_worker, what="measure the series"))
