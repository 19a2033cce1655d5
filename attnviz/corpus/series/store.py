"""A series' measures in DuckDB: one database file per series, one row per measured checkpoint written in one
transaction (a stopped run goes on with the steps it lacks), read back as a
:class:`~attnviz.interventions.training_runs.Run` (:func:`open_series`) by the Over training page and by a notebook.

The writer holds the file only while it commits a checkpoint (:class:`SeriesStore`), so that a page can read the
measured steps while the run goes on; a reader opens it as a file anyone may have written (read-only, external
access off, its catalog checked: :class:`~attnviz.corpus.database.DatabaseFile`).

Tables (``layer`` and ``head`` count from 0):

* ``settings``: the run's key, the series folder, the probe (its settings, text and fingerprint), the tokenizer it
  came from, the model's shape (``layers``, ``heads``), versions, times and status (key -> JSON).
* ``steps``: one row per measured checkpoint: ``step``, ``name`` (its folder's name in the series folder),
  ``fingerprint`` (its config and weights), ``loss``, ``icl``, ``early_loss``, ``late_loss``, ``copy_loss`` (see
  :mod:`attnviz.interventions.training_measures`), and the seconds its loading and its measures took.
* ``head_scores``: one row per measured checkpoint and head: ``step``, ``layer``, ``head``, ``previous_token``,
  ``induction``, ``duplicate_token``, ``ablation_cost``.
* ``scan_steps`` (when a corpus is chosen): one row per checkpoint scanned over the corpus
  (:mod:`attnviz.corpus.series.scans`): ``step``, ``scan_key`` (the corpus and the scan's limits), ``documents``,
  ``tokens``, ``scan_seconds``, ``scanned_at``.
* ``scan_heads``: one row per scanned checkpoint, head and statistic: ``step``, ``layer``, ``head``, ``statistic``
  (a name of :data:`attnviz.corpus.scan.heads.SCAN_STATISTICS` or :data:`~attnviz.corpus.scan.heads.LABELS`),
  ``value`` (its mean over the corpus's queries, as the Heads across a corpus page maps it; for a label, the share of
  documents where the head got it).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from attnviz.checkpoints.checked_files import plain_name_problem
from attnviz.corpus.database import DatabaseFile, NotAResultsFile, insert_frame
from attnviz.corpus.scan.heads import LABELS, SCAN_STATISTICS
from attnviz.corpus.scan.store import STATUS_FINISHED, STATUS_RUNNING, STATUS_STOPPED, versions
from attnviz.interventions import training_measures as tm
from attnviz.interventions.training_runs import Run

__all__ = ["HEAD_COLUMNS", "SCAN_HEAD_COLUMNS", "SCAN_STEP_COLUMNS", "STATUS_FINISHED", "STATUS_RUNNING",
           "STATUS_STOPPED", "STEP_COLUMNS", "SeriesReader", "SeriesStore", "open_series", "scan_maps",
           "scan_statistics", "versions"]

SCHEMA_VERSION = 1
SCALARS = ("loss", "icl", "early_loss", "late_loss", "copy_loss")  # what measure() gives once per checkpoint
STEP_COLUMNS = ["step", "name", "fingerprint", *SCALARS, "load_seconds", "measure_seconds", "measured_at"]
HEAD_COLUMNS = ["step", "layer", "head", *tm.HEAD_MEASURES]
MOST_STEPS_READ = 10_000  # a file with more rows than any series attnviz measures is not read
MOST_HEADS = 100_000  # layers x heads of the largest model a reader accepts
LOCK_WAIT = 60.0  # seconds the writer waits for a reader that holds the file (a page reads it in milliseconds)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS settings (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS steps (step BIGINT PRIMARY KEY, name VARCHAR, fingerprint VARCHAR,
    {", ".join(f"{name} DOUBLE" for name in SCALARS)}, load_seconds DOUBLE, measure_seconds DOUBLE,
    measured_at DOUBLE);
CREATE TABLE IF NOT EXISTS head_scores (step BIGINT, layer SMALLINT, head SMALLINT,
    {", ".join(f"{name} DOUBLE" for name in tm.HEAD_MEASURES)});
CREATE TABLE IF NOT EXISTS scan_steps (step BIGINT PRIMARY KEY, scan_key VARCHAR, documents INTEGER, tokens BIGINT,
    scan_seconds DOUBLE, scanned_at DOUBLE);
CREATE TABLE IF NOT EXISTS scan_heads (step BIGINT, layer SMALLINT, head SMALLINT, statistic VARCHAR, value DOUBLE);
"""
SCAN_STEP_COLUMNS = ["step", "scan_key", "documents", "tokens", "scan_seconds", "scanned_at"]
SCAN_HEAD_COLUMNS = ["step", "layer", "head", "statistic", "value"]


def _locked(problem: duckdb.Error) -> bool:
    return isinstance(problem, (duckdb.IOException, duckdb.ConnectionException)) and "lock" in str(problem).lower()


class SeriesStore:
    """The writing side of a series' database at ``path`` (created, or reopened to go on): each call opens the
    file, does its work in one transaction and closes it, waiting (up to :data:`LOCK_WAIT` seconds) while a reader
    holds it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with self._connected():
            pass  # the schema exists from here on

    @contextlib.contextmanager
    def _connected(self) -> Iterator[DatabaseFile]:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                opened = DatabaseFile(self.path, _SCHEMA)
                break
            except duckdb.Error as problem:
                if not _locked(problem) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            yield opened
        finally:
            opened.close()

    def settings(self) -> dict:
        with self._connected() as opened:
            return opened.read_settings()

    def set(self, **values) -> None:
        with self._connected() as opened:
            opened.set(**values)

    def done_steps(self) -> dict[int, str]:
        """The steps measured already, with their checkpoint's fingerprint."""
        with self._connected() as opened:
            return {int(step): str(fingerprint) for step, fingerprint in opened.connection.execute(
                "SELECT step, fingerprint FROM steps").fetchall()}

    def scanned_steps(self) -> dict[int, str]:
        """The steps scanned over a corpus already, with the key of their scan (its corpus and limits)."""
        with self._connected() as opened:
            return {int(step): str(key) for step, key in opened.connection.execute(
                "SELECT step, scan_key FROM scan_steps").fetchall()}

    def commit(self, step_row: dict | None, heads: pd.DataFrame | None, scan_row: dict | None = None,
               scan_heads: pd.DataFrame | None = None) -> None:
        """One checkpoint's row (``STEP_COLUMNS``) and its heads' rows (``HEAD_COLUMNS``), and its corpus scan's row
        (``SCAN_STEP_COLUMNS``) and maps (``SCAN_HEAD_COLUMNS``) where it was scanned, in one transaction (either
        part may be None: a checkpoint measured before, scanned now)."""
        with self._connected() as opened:
            connection = opened.connection
            connection.execute("BEGIN TRANSACTION")
            try:
                if step_row is not None:
                    insert_frame(connection, "steps", pd.DataFrame([step_row], columns=STEP_COLUMNS))
                    insert_frame(connection, "head_scores", heads[HEAD_COLUMNS])
                if scan_row is not None:
                    insert_frame(connection, "scan_steps", pd.DataFrame([scan_row], columns=SCAN_STEP_COLUMNS))
                    insert_frame(connection, "scan_heads", scan_heads[SCAN_HEAD_COLUMNS])
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise


def head_rows(step: int, measured: dict) -> pd.DataFrame:
    """A checkpoint's per-head measures (``[layers][heads]`` lists of :func:`training_measures.measure`) as rows."""
    grids = {name: np.asarray(measured[name], dtype=float) for name in tm.HEAD_MEASURES}
    layers, heads = grids[tm.HEAD_MEASURES[0]].shape
    layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    return pd.DataFrame({"step": np.full(layers * heads, step, dtype=np.int64),
                         "layer": layer.ravel().astype(np.int16), "head": head.ravel().astype(np.int16),
                         **{name: grid.ravel() for name, grid in grids.items()}})


class SeriesReader(DatabaseFile):
    """A series' database opened read-only (as a file anyone may have written): its rows as the measures give them."""

    REQUIRED = ("settings", "steps", "head_scores")
    WHAT = "a series' database"

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA, read_only=True)

    def shape(self) -> tuple[int, int]:
        """(layers, heads) as the settings say, bounded."""
        layers, heads = self.settings.get("layers"), self.settings.get("heads")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (layers, heads)) \
                or layers * heads > MOST_HEADS:
            raise NotAResultsFile("its settings give no model shape (layers, heads): it is not read")
        return layers, heads

    def steps(self) -> pd.DataFrame:
        """The steps table, ascending by step."""
        count = self.connection.execute("SELECT count(*) FROM steps").fetchone()[0]
        if count > MOST_STEPS_READ:
            raise NotAResultsFile(f"it holds {count:,} steps, more than a series has ({MOST_STEPS_READ:,}): it is "
                                  "not read")
        return self.connection.execute(f"SELECT {', '.join(STEP_COLUMNS)} FROM steps ORDER BY step").df()

    def rows(self) -> list[dict]:
        """One dict per measured step, ascending: ``step`` and every key
        :func:`attnviz.interventions.training_measures.measure` returns (the per-head ones ``[layers][heads]``)."""
        layers, heads = self.shape()
        steps = self.steps()
        found = self.connection.execute(
            f"SELECT {', '.join(HEAD_COLUMNS)} FROM head_scores WHERE step IN (SELECT step FROM steps) "
            "ORDER BY step, layer, head LIMIT ?", [len(steps) * layers * heads + 1]).fetchnumpy()
        expected_steps = np.repeat(steps["step"].to_numpy(dtype=np.int64), layers * heads)
        expected_layers = np.tile(np.repeat(np.arange(layers), heads), len(steps))
        expected_heads = np.tile(np.arange(heads), len(steps) * layers)
        if len(found["step"]) != len(expected_steps) or not (
                np.array_equal(np.asarray(found["step"], dtype=np.int64), expected_steps)
                and np.array_equal(np.asarray(found["layer"], dtype=np.int64), expected_layers)
                and np.array_equal(np.asarray(found["head"], dtype=np.int64), expected_heads)):
            raise NotAResultsFile(f"its head scores are not one row per step, layer and head ({layers} x {heads}): "
                                  "it is not read")
        grids = {name: np.ma.filled(np.ma.asarray(found[name], dtype=float), np.nan).reshape(len(steps), layers,
                                                                                            heads)
                 for name in tm.HEAD_MEASURES}
        rows = []
        for at, step in enumerate(steps.itertuples(index=False)):
            rows.append({"step": int(step.step), **{name: float(getattr(step, name)) for name in SCALARS},
                         **{name: grids[name][at].tolist() for name in tm.HEAD_MEASURES}})
        return rows

    def has_scans(self) -> bool:
        """Whether the file has the corpus scans' tables (a file written before they existed has not)."""
        return self.connection.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
                                       "AND schema_name = 'main' AND table_name = 'scan_heads'").fetchone()[0] > 0

    def scan_facts(self) -> tuple[list[int], int]:
        """The steps scanned so far (ascending) and the most documents a scan of them read (([], 0) without scans)."""
        if not self.has_scans():
            return [], 0
        steps = [int(step) for step, in self.connection.execute("SELECT step FROM scan_steps ORDER BY step").fetchall()]
        documents = self.connection.execute("SELECT max(documents) FROM scan_steps").fetchone()[0] if steps else 0
        return steps, int(documents or 0)

    def scan_statistics(self) -> list[str]:
        """The statistics and labels whose maps the file holds for some scanned step, in the scan's order
        (:data:`~attnviz.corpus.scan.heads.SCAN_STATISTICS`, then :data:`~attnviz.corpus.scan.heads.LABELS`): as
        :meth:`attnviz.corpus.scan.store.ScanReader.statistics_that_apply` chooses them, a statistic or label that
        no head of any step has (0 or missing everywhere) is left out."""
        if not self.has_scans():
            return []
        present = {name for name, in self.connection.execute(
            "SELECT statistic FROM scan_heads WHERE step IN (SELECT step FROM scan_steps) GROUP BY statistic "
            "HAVING max(value) > 0 OR (count(value) > 0 AND statistic IN ('entropy', 'normalised_entropy', "
            "'mean_distance'))").fetchall()}
        return [name for name in (*SCAN_STATISTICS, *LABELS) if name in present]

    def scan_maps(self, statistic: str) -> dict[int, np.ndarray]:
        """``{step: [layers, heads] array}`` of ``statistic`` for every scanned step, ascending (NaN where a head has
        no value); refused for a statistic no scan keeps, or rows outside the model's shape."""
        if statistic not in (*SCAN_STATISTICS, *LABELS):
            raise ValueError(f"{statistic!r} is not a statistic a scan keeps; these are: "
                             f"{', '.join((*SCAN_STATISTICS, *LABELS))}")
        if not self.has_scans():
            return {}
        layers, heads = self.shape()
        steps = [int(step) for step, in self.connection.execute(
            "SELECT step FROM scan_steps ORDER BY step LIMIT ?", [MOST_STEPS_READ + 1]).fetchall()]
        if len(steps) > MOST_STEPS_READ:
            raise NotAResultsFile(f"it holds more scanned steps than a series has ({MOST_STEPS_READ:,}): it is not "
                                  "read")
        maps = {step: np.full((layers, heads), np.nan) for step in steps}
        found = self.connection.execute(
            "SELECT step, layer, head, value FROM scan_heads WHERE statistic = ? AND step IN (SELECT step FROM "
            "scan_steps) LIMIT ?", [statistic, len(steps) * layers * heads + 1]).fetchnumpy()
        if len(found["step"]) > len(steps) * layers * heads:
            raise NotAResultsFile("its scans hold more rows than one per step, layer and head: it is not read")
        for step, layer, head, value in zip(found["step"], found["layer"], found["head"],
                                            np.ma.filled(np.ma.asarray(found["value"], dtype=float), np.nan),
                                            strict=True):
            if not (0 <= layer < layers and 0 <= head < heads):
                raise NotAResultsFile(f"its scans name head {layer}.{head}, outside the model's {layers} x {heads}: "
                                      "it is not read")
            maps[int(step)][layer, head] = value
        return maps


def scan_statistics(path: str | Path) -> list[str]:
    """The statistics whose per-head maps the series' DuckDB file at ``path`` holds for its scanned steps (none when
    the series was measured without a corpus); see :meth:`SeriesReader.scan_statistics`."""
    with SeriesReader(path) as reader:
        return reader.scan_statistics()


def scan_maps(path: str | Path, statistic: str) -> dict[int, list[list[float]]]:
    """``{step: [layers][heads] values}`` of ``statistic`` (e.g. ``"previous"``, ``"entropy"``, a label such as
    ``"induction head"``) for every checkpoint scanned over the corpus, ascending by step; NaN where a head has no
    value. Each map is what the Heads across a corpus page maps for a scan of that checkpoint alone (the mean over
    the corpus's queries; for a label, the share of documents where the head got it)."""
    with SeriesReader(path) as reader:
        return {step: grid.tolist() for step, grid in reader.scan_maps(statistic).items()}


def checkpoint_folders(root: str | None, names: dict[int, str]) -> dict[int, Path]:
    """The checkpoints of a series that are still on disk, by step: each a plain folder name inside ``root`` (a name
    that a file's row could make reach elsewhere is left out)."""
    if not root:
        return {}
    found = {}
    for step, name in names.items():
        if plain_name_problem(name) is None:
            folder = Path(root) / name
            with contextlib.suppress(OSError):
                if folder.is_dir():
                    found[step] = folder
    return found


def open_series(path: str | Path) -> Run:
    """The series measured into the DuckDB file at ``path`` (finished or not) as a
    :class:`~attnviz.interventions.training_runs.Run`: its rows ascending by step, the phase change where
    :func:`attnviz.interventions.training_measures.phase_change` puts it, its checkpoint folders still on disk by
    step, and its settings as ``facts``. Raises :class:`~attnviz.corpus.database.NotAResultsFile` for a file that is
    not a series' database, :class:`~attnviz.corpus.database.DatabaseBusy` while a writer holds it."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist")
    with SeriesReader(path) as reader:
        settings = dict(reader.settings)
        rows = reader.rows()
        names = {int(step): str(name) for step, name in reader.connection.execute(
            "SELECT step, name FROM steps").fetchall()}
    steps = [row["step"] for row in rows]
    phase = tm.phase_change(steps, [row["induction"] for row in rows])
    root = settings.get("folder") if isinstance(settings.get("folder"), str) else None
    name = settings.get("name") if isinstance(settings.get("name"), str) else None
    title = name or f"the series in {os.path.basename(root or str(path))}"
    return Run(title, rows, phase, checkpoint_folders(root, names), settings)
