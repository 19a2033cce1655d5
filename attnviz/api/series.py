"""A series of checkpoints measured over training from Python: :func:`measure_series`, on the same runner as ``python
-m attnviz.corpus.series`` and ``attnviz series`` (:func:`attnviz.corpus.series.runner.run_series`), so a notebook and
the command line write the same DuckDB file; :func:`open_series` reads one back, finished or not, as the
:class:`~attnviz.interventions.training_runs.Run` the Over training page draws: ``rows`` ascending by step (each the
step, ``loss``, ``icl``, ``early_loss``, ``late_loss``, ``copy_loss``, and every head's ``previous_token``,
``induction``, ``duplicate_token`` and ``ablation_cost`` as ``[layers][heads]`` lists), ``phase`` (where the phase
change is, or None), ``checkpoints`` (the folders by step) and ``facts`` (the run's settings). Measured with a
``corpus``, each checkpoint is also scanned over it as the Heads across a corpus page scans a model:
:func:`series_scan_statistics` lists the statistics whose per-head maps the file holds, and
:func:`series_scan_maps` gives one statistic's ``{step: [layers][heads]}`` maps, to play a scan's map over training.

A series is a folder of checkpoint folders named with their steps (``step1000/``, ``checkpoint-500/``, ...; see
:mod:`attnviz.corpus.series.folder` for what is accepted and refused). Like the corpus runs, a run shows a progress
bar (``tqdm.auto``) and stops when the notebook's stop button is pressed (after the checkpoint in progress: call it
again with the same path to go on).
"""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from attnviz.api.run_control import StopRequests
from attnviz.api.runs import _settings_of
from attnviz.corpus.series.runner import SeriesSettings, run_series
from attnviz.corpus.series.store import STATUS_STOPPED
from attnviz.corpus.series.store import open_series as _open_series
from attnviz.corpus.series.store import scan_maps as _scan_maps
from attnviz.corpus.series.store import scan_statistics as _scan_statistics
from attnviz.interventions.training_runs import Run


def measure_series(folder: str | Path, path: str | Path, *, progress: bool = True, ray: str | None = None,
                   workers: int = 2, dtype: str = "fp32", name: str | None = None, **settings) -> Run:
    """Measure every checkpoint of the series in ``folder`` into the DuckDB file at ``path`` (created, or gone on with:
    the steps it lacks), and return it as :func:`open_series` reads it.

    ``settings``: the fields of :class:`~attnviz.corpus.series.runner.SeriesSettings`: ``windows`` (16 windows of 128
    held-out tokens), ``period`` (40 random tokens typed twice), ``sequences`` (8), ``seed`` (0), ``text_file`` (a
    UTF-8 text for the held-out windows; by default the held-out Python documentation the bundled tiny GPT was
    measured on); ``corpus`` (``"bundled"`` or a .txt, .jsonl, .csv or .parquet file: each checkpoint is also
    scanned over its first ``scan_docs`` documents (64), ``scan_tokens`` tokens each (64), read back with
    :func:`series_scan_maps`; ``keep_scans=True`` keeps each checkpoint's scan file,
    ``<path's stem>.step<N>.scan.duckdb``).
    ``dtype``: "fp32" (default) or "stored". ``ray``: ``"auto"`` (a local cluster, started if none runs) or a
    cluster's address, with ``workers`` checkpoints measured (and scanned) at once. Interrupting stops after the
    checkpoint in progress."""
    chosen = _settings_of(SeriesSettings, settings, "measure_series")
    measure = None
    if ray:
        from attnviz.corpus.on_ray import on_ray

        measure = on_ray(ray, int(workers), 1, what="measure the series")
    stops = StopRequests()
    bar = tqdm(total=0, unit="checkpoint", desc="checkpoints") if progress else None

    def shown(state) -> None:
        if bar is not None:
            bar.total = state.planned
            bar.update(state.done - bar.n)

    try:
        with stops.listening():
            state = run_series(folder, path, chosen, dtype=dtype, name=name, progress=stops.guarded(shown),
                               should_stop=stops, measure=measure)
    finally:
        if bar is not None:
            bar.close()
    if state.status == STATUS_STOPPED:
        print(f"Stopped: {state.done:,} of {state.planned:,} checkpoints are in {path}. Call measure_series(...) "
              "again with the same arguments to go on from there.", flush=True)
    return open_series(path)


def open_series(path: str | Path) -> Run:
    """The series measured into the DuckDB file at ``path`` (by :func:`measure_series`, ``attnviz series`` or the Over
    training page; finished or not) as a :class:`~attnviz.interventions.training_runs.Run`: its rows ascending by
    step, the phase change (:func:`attnviz.interventions.training_measures.phase_change`), the checkpoint folders
    still on disk by step, and the run's settings as ``facts``. The file is read as one anyone may have written
    (read-only, its tables checked)."""
    return _open_series(path)


def series_scan_statistics(path: str | Path) -> list[str]:
    """The statistics (``"entropy"``, ``"previous"``, ``"induction"``, ...) and head labels (``"induction head"``,
    ...) whose per-head maps the series' DuckDB file at ``path`` holds for its checkpoints scanned over a corpus
    (``measure_series(..., corpus=...)``); empty when it was measured without one. A statistic no head of any step
    has (0 everywhere) is left out, as the Heads across a corpus page leaves it out."""
    return _scan_statistics(path)


def series_scan_maps(path: str | Path, statistic: str) -> dict[int, list[list[float]]]:
    """``{step: [layers][heads] values}`` of ``statistic`` (one of :func:`series_scan_statistics`) for every
    checkpoint of the series at ``path`` scanned over its corpus, ascending by step (NaN where a head has no value). A
    step's map is the one the Heads across a corpus page draws for a scan of that checkpoint alone: the statistic's
    mean over the corpus's queries, or for a label the share of documents where the head got it. For example, layer 1
    head 0's previous-token weight over training:
    ``{step: grid[1][0] for step, grid in series_scan_maps(path, "previous").items()}``."""
    return _scan_maps(path, statistic)
