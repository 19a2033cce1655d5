"""The files of corpus runs read from Python: a scan's (:class:`ScanRun`) and an importance run's
(:class:`ImportanceRun`), their tables as DataFrames, SQL over them, and a scan's head detectors; :func:`open_scan`
and :func:`open_importance` reopen one. :mod:`attnviz.api.runs` starts the runs and returns these."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnviz.core.analysis import LABEL_RULES
from attnviz.corpus.importance.store import ImportanceReader
from attnviz.corpus.scan.heads import SCAN_STATISTICS
from attnviz.corpus.scan.store import ScanReader

# What each detector kind is called (the label without " head": "induction", "previous-token", ...) -> the statistic a
# scan keeps for it, from the labelling rules of Explore heads: one list of kinds for labels and detectors alike.
DETECTOR_KINDS = {label.removesuffix(" head"): statistic for label, (statistic, _) in LABEL_RULES.items()}


# -- the results -------------------------------------------------------------------------------------------------
class _RunFile:
    """What a scan's and an importance run's file have in common: its settings, status and counts, its tables as
    DataFrames, and SQL over it. The file is opened read-only (external access off, as the pages open it) for each
    call and closed after, so a run that resumes into it is never locked out."""

    reader: type = ScanReader
    default_table: str = ""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _open(self):
        return self.reader(self.path)

    @property
    def settings(self) -> dict:
        """The run's settings as it recorded them (key, model, corpus, limits, versions, times, status)."""
        with self._open() as reader:
            return dict(reader.settings)

    @property
    def status(self) -> str:
        """"running" (being written, or cut short without a stop), "stopped" (resumable) or "finished"."""
        return str(self.settings.get("status", "?"))

    @property
    def done(self) -> int:
        """Documents read so far."""
        with self._open() as reader:
            return reader.documents

    @property
    def planned(self) -> int:
        """Documents the run reads when it finishes."""
        return int(self.settings.get("planned") or 0)

    def tables(self) -> list[str]:
        """The tables and views the file holds (the names :meth:`df` reads)."""
        with self._open() as reader:
            return _table_names(reader.connection)

    def df(self, table: str | None = None, *, limit: int | None = None) -> pd.DataFrame:
        """One table or view of :meth:`tables` as a DataFrame (its first ``limit`` rows where given: some tables
        have a row per document, head and query)."""
        table = table or self.default_table
        with self._open() as reader:
            names = _table_names(reader.connection)
            if table not in names:
                raise ValueError(f"{self.path.name} has no table {table!r}; its tables are {', '.join(names)}")
            sql = f'SELECT * FROM "{table}"' + ("" if limit is None else f" LIMIT {int(limit)}")
            return reader.connection.execute(sql).df()

    def sql(self, query: str, parameters: list | None = None) -> pd.DataFrame:
        """Any SQL over the file (read-only, DuckDB's dialect, ``?`` for each of ``parameters``) as a DataFrame."""
        with self._open() as reader:
            return reader.connection.execute(query, parameters or []).df()

    def _summary(self) -> str:
        said = self.settings
        with self._open() as reader:
            done = reader.documents
        return (f"{self.path.name!r}: {said.get('status', '?')}, {done:,}/{int(said.get('planned') or 0):,} "
                f"documents of {said.get('corpus', '?')!r}, model {said.get('model', '?')!r}")

    def __repr__(self) -> str:
        try:
            return f"{type(self).__name__}({self._summary()})"
        except Exception as problem:  # noqa: BLE001 - a repr never raises: a file removed, busy or not a run's
            return f"{type(self).__name__}({str(self.path)!r}: cannot be read now: {problem})"


def _table_names(connection) -> list[str]:
    return [name for name, in connection.execute(
        "SELECT table_name AS name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' UNION ALL SELECT view_name FROM duckdb_views() WHERE database_name = "
        "current_database() AND schema_name = 'main' AND NOT internal ORDER BY name").fetchall()]


class ScanRun(_RunFile):
    """A scan's DuckDB file (see docs/scans.md for every table): ``path``, ``status``, ``done`` / ``planned``
    documents, ``tables()``, ``df(table)`` (default: :meth:`heads`), ``sql(query)``, :meth:`heads` and
    :meth:`detect`. Layers and heads count from 0."""

    reader = ScanReader
    default_table = "heads"

    def tables(self) -> list[str]:
        """The tables and views the scan holds, and ``heads`` (:meth:`heads`)."""
        return ["heads", *super().tables()]

    def df(self, table: str | None = None, *, limit: int | None = None) -> pd.DataFrame:
        """One table or view of :meth:`tables` as a DataFrame; ``heads`` (the default) is :meth:`heads`."""
        if (table or self.default_table) == "heads":
            return self.heads() if limit is None else self.heads().head(limit)
        return super().df(table, limit=limit)

    def heads(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head``, its most frequent ``label`` over the documents and the share of
        documents that gave it (``label_share``), then each statistic's mean over every query of the scan
        (entropy, normalised_entropy, mean_distance, self, previous, next, first, separator, punctuation,
        duplicate, induction, special, max_weight; NaN where no query has it)."""
        with self._open() as reader:
            long = reader.frame("SELECT layer, head, statistic, mean FROM head_stats")
            labels = reader.top_labels()
        statistics = list(SCAN_STATISTICS)
        if long.empty:
            return pd.DataFrame(columns=["layer", "head", "label", "label_share", *statistics])
        wide = long.pivot(index=["layer", "head"], columns="statistic", values="mean").reset_index()
        wide.columns.name = None
        wide = wide.reindex(columns=["layer", "head", *statistics])
        wide[["layer", "head"]] = wide[["layer", "head"]].astype(int)
        found = [labels.get((layer, head), ("", float("nan"))) for layer, head in zip(wide["layer"], wide["head"],
                                                                                      strict=True)]
        wide.insert(2, "label", [label for label, _ in found])
        wide.insert(3, "label_share", [share for _, share in found])
        return wide.sort_values(["layer", "head"], ignore_index=True)

    def kinds(self) -> list[str]:
        """The detector kinds this scan can score (:meth:`detect`): those some query of its documents has a target
        for (duplicate-token and induction need a token that occurred before)."""
        with self._open() as reader:
            kept = {statistic for statistic, in reader.connection.execute(
                "SELECT statistic FROM head_state GROUP BY statistic HAVING sum(count) > 0").fetchall()}
        return [kind for kind, statistic in DETECTOR_KINDS.items() if statistic in kept]

    def detect(self, kind: str, *, over: str = "queries") -> pd.DataFrame:
        """Every head's score as a detector of ``kind`` ("induction", "previous-token", "duplicate-token", or any
        of :data:`DETECTOR_KINDS`; any case, "_" or " " for "-", with or without "-head", so TransformerLens's
        "induction_head" too): a DataFrame of ``layer``, ``head``, ``score``, highest first, as
        :func:`attnviz.api.detect.detect` gives for one text.

        ``score``: the head's weight on the kind's target averaged over the queries that have one, over every query
        of the scan (``over="documents"``: each document's mean, then the mean over the documents). With
        ``over="queries"`` a ``transformerlens_mul`` column gives the same weight divided by every query of the
        scan, as TransformerLens's ``detect_head`` ("mul") divides by every query of its text (pooled over the
        documents, where ``detect_head`` given a list of texts averages each text's score); ``frame.attrs`` holds
        ``queries_with_target`` and ``queries``. See the module's notes for the rest of the difference.

        Refused, naming the kinds the scan has, where no query of its documents has a target for ``kind``."""
        name = "-".join(kind.strip().lower().replace("_", " ").replace("-", " ").split())
        name = name.removesuffix("-head").removesuffix("-heads")
        if name not in DETECTOR_KINDS:
            raise ValueError(f"no detector {kind!r}: the kinds are {', '.join(DETECTOR_KINDS)}")
        if over not in ("queries", "documents"):
            raise ValueError(f"over must be 'queries' or 'documents', not {over!r}")
        kinds = self.kinds()
        if name not in kinds:
            raise ValueError(f"this scan stores no {name!r} score: no query of its documents has a target for it "
                             f"(duplicate-token and induction need a token that occurred before). It has "
                             f"{', '.join(kinds) or 'none (no document was read)'}")
        statistic = DETECTOR_KINDS[name]
        with self._open() as reader:
            mean, _ = reader.statistic_map(statistic, over)
            counts = {(layer, head, kept): int(count) for layer, head, kept, count in reader.connection.execute(
                "SELECT layer, head, statistic, count FROM head_state WHERE statistic IN (?, 'entropy')",
                [statistic]).fetchall()}  # entropy is defined on every query: its count is every query's
        cells = [(layer, head) for layer in range(mean.shape[0]) for head in range(mean.shape[1])]
        frame = pd.DataFrame({"layer": [layer for layer, _ in cells], "head": [head for _, head in cells],
                              "score": [float(mean[cell]) for cell in cells]})
        with_target, every = counts.get((0, 0, statistic), 0), counts.get((0, 0, "entropy"), 0)
        if over == "queries":  # the share of the head's queries that have a target
            shares = [counts.get((*cell, statistic), 0) / counts[(*cell, "entropy")]
                      if counts.get((*cell, "entropy")) else float("nan") for cell in cells]
            frame["transformerlens_mul"] = frame["score"] * shares
        frame = frame.sort_values(["score", "layer", "head"], ascending=[False, True, True], na_position="last",
                                  ignore_index=True)
        frame.attrs.update(kind=name, over=over, queries_with_target=with_target, queries=every)
        return frame

    def _summary(self) -> str:
        said = self.settings
        return f"{super()._summary()}, {said.get('n_layers', '?')} layers x {said.get('n_heads', '?')} heads"


class ImportanceRun(_RunFile):
    """A corpus importance run's DuckDB file (see docs/importance.md for every table): ``path``, ``status``,
    ``done`` / ``planned`` documents, ``tables()``, ``df(table)`` (default: the ``importance`` view, per method
    and head), ``sql(query)``, :meth:`map`, ``objective`` and ``clean``. ``module`` counts attention modules in
    call order from 0; ``layer`` is the page's layer number within the module's kind."""

    reader = ImportanceReader
    default_table = "importance"

    @property
    def objective(self) -> str:
        """What a change is measured in: "next-token", "seq2seq", "masked" (a loss, nats) or "hidden"."""
        return str(self.settings.get("objective", "?"))

    @property
    def clean(self) -> float:
        """The objective without edits, averaged over the documents that have one."""
        with self._open() as reader:
            return reader.clean()

    def methods(self) -> list[str]:
        """The measures the file holds: "zero", "mean" (ablations), "gradient"."""
        with self._open() as reader:
            return reader.methods()

    def map(self, method: str | None = None) -> pd.DataFrame:
        """Every head's mean effect over the documents with its spread, the numbers the page's maps and table
        show: one row per measure and head, ``method``, ``module``, ``kind``, ``layer``, ``head``, ``mean`` (the
        objective's change when the head is ablated, or |dL/dg|), ``spread`` (sample standard deviation over the
        documents), ``documents`` (how many had a value). ``method``: one measure only."""
        with self._open() as reader:
            modules, maps = reader.modules(), reader.maps()
        if method is not None and method not in maps:
            raise ValueError(f"{self.path.name} holds no {method!r} map; it holds {', '.join(maps) or 'none yet'}")
        rows = [(name, row, module.kind, module.index, head, float(mean[row, head]), float(spread[row, head]),
                 int(count[row, head]))
                for name, (mean, spread, count) in maps.items() if method in (None, name)
                for row, module in enumerate(modules) for head in range(module.heads)]
        return pd.DataFrame(rows, columns=["method", "module", "kind", "layer", "head", "mean", "spread",
                                           "documents"])

    def _summary(self) -> str:
        return f"{super()._summary()}, {self.objective} objective"


def open_scan(path: str | Path) -> ScanRun:
    """A scan's file, reopened (checked as the pages check a file: read-only, its catalog attnviz's own)."""
    run = ScanRun(_existing(path))
    run.settings  # noqa: B018 - opened once now, so that a file that is not a scan's is refused here
    return run


def open_importance(path: str | Path) -> ImportanceRun:
    """A corpus importance run's file, reopened (checked as :func:`open_scan` checks a scan's)."""
    run = ImportanceRun(_existing(path))
    run.settings  # noqa: B018 - as in open_scan
    return run


def _existing(path: str | Path) -> Path:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no file at {str(path)!r}")
    return Path(path)
