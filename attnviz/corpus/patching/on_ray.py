"""A corpus patching run on a Ray cluster: :func:`attnviz.corpus.patching.runner.run_patching` with its chunks measured
by the one Ray runner (:mod:`attnviz.corpus.on_ray`), each actor a replica of the model measuring its blocks as
:func:`attnviz.corpus.patching.runner.measure_chunk` does in-process; the driver commits each block's rows like an
in-process chunk, so the database is the same either way and a run stopped on Ray resumes in-process or on Ray alike.

Ray is an optional extra (``pip install "ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnviz.corpus.documents import Corpus
from attnviz.corpus.on_ray import on_ray
from attnviz.corpus.patching.runner import DEFAULT_SETTINGS, PatchingProgress, PatchingSettings, run_patching


def run_patching_on_ray(corpus: Corpus, folder: str | Path, path: str | Path,
                        settings: PatchingSettings = DEFAULT_SETTINGS, *, name: str | None = None,
                        dtype: str = "stored", address: str | None = "auto", workers: int = 2,
                        threads_per_worker: int = 1, loaded: tuple | None = None, source: str | None = None,
                        progress: Callable[[PatchingProgress], None] | None = None,
                        should_stop: Callable[[], bool] | None = None) -> PatchingProgress:
    """:func:`attnviz.corpus.patching.runner.run_patching` with its chunks on Ray: ``workers`` actors each load the
    checkpoint from ``folder``. ``address``: a cluster's address, or "auto" (the local cluster, started if none
    runs)."""
    return run_patching(corpus, folder, path, settings, name=name, dtype=dtype, loaded=loaded, source=source,
                        progress=progress, should_stop=should_stop,
                        measure=on_ray(address, workers, threads_per_worker, what="run"))
