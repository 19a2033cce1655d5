"""The same scan on a Ray cluster: :func:`attnviz.corpus.scan.runner.run_scan` with its chunks measured by the one
Ray runner (:mod:`attnviz.corpus.on_ray`), each actor a replica of the model, each block's
:class:`~attnviz.corpus.scan.heads.Partial` merged on the driver and committed like an in-process chunk: the database
is the same either way, and a stopped Ray scan resumes in-process or on Ray alike.

Ray is an optional extra (``pip install "ray[data]"``; the README's test setup installs it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from attnviz.corpus.documents import Corpus
from attnviz.corpus.on_ray import on_ray
from attnviz.corpus.runner import Progress
from attnviz.corpus.scan.runner import DEFAULT_SETTINGS, ScanSettings, run_scan
from attnviz.models.loading import ModelBundle


def run_scan_on_ray(corpus: Corpus, bundle: ModelBundle, path: str | Path, settings: ScanSettings = DEFAULT_SETTINGS,
                    *, address: str | None = "auto", workers: int = 2, threads_per_worker: int = 1,
                    dtype: str = "stored", progress: Callable[[Progress], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> Progress:
    """:func:`attnviz.corpus.scan.runner.run_scan` on Ray: ``workers`` actors each load the model from ``bundle.folder``
    in ``dtype`` (``bundle`` on the driver gives the scan's settings and keeps its sample of queries and keys).
    ``address``: a cluster's address, or "auto" (the local cluster, started if none runs)."""
    return run_scan(corpus, bundle, path, settings, progress=progress, should_stop=should_stop, dtype=dtype,
                    measure=on_ray(address, workers, threads_per_worker, what="scan"))
