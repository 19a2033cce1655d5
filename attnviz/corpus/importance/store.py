"""A corpus importance run's results in DuckDB: one database file per run, written a chunk of documents at a time in
one transaction (a stopped run resumes where its last chunk ended), read by the page and by SQL.

Tables (``module`` counts attention modules in call order from 0, ``head`` from 0):

* ``settings``: the run's key, model, objective, corpus, limits, versions, times and status (key -> JSON).
* ``modules``: each attention module: its name in the model, kind ("self", "encoder", "decoder", "cross"), its
  place among its kind (the layer the pages show) and its heads.
* ``head_means``: each head's mean output over every token of the corpus (what mean ablation puts in).
* ``documents``: every document measured: its source, text, tokens read, and the objective without edits.
* ``head_effects``: one row per document, head and method ("zero", "mean": the objective's change when the head is
  ablated; "gradient": |dL/dg|); NULL where the document has nothing to predict.
* view ``importance``: per method and head, the mean effect over the documents, its spread and how many.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.corpus.database import DatabaseFile, storable
from attnviz.corpus.scan.store import STATUS_FINISHED, STATUS_RUNNING, STATUS_STOPPED, versions
from attnviz.interventions.edits import AttentionModule

__all__ = ["ImportanceReader", "ImportanceWriter", "STATUS_FINISHED", "STATUS_RUNNING", "STATUS_STOPPED",
           "versions"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS modules (module SMALLINT PRIMARY KEY, name VARCHAR, kind VARCHAR, layer SMALLINT,
    heads SMALLINT);
CREATE TABLE IF NOT EXISTS head_means (module SMALLINT, head SMALLINT, mean FLOAT[]);
CREATE TABLE IF NOT EXISTS documents (doc INTEGER PRIMARY KEY, source VARCHAR, text VARCHAR, n_tokens INTEGER,
    truncated BOOLEAN, clean DOUBLE);
CREATE TABLE IF NOT EXISTS head_effects (doc INTEGER, method VARCHAR, module SMALLINT, head SMALLINT,
    value DOUBLE);
CREATE OR REPLACE VIEW importance AS SELECT method, module, head, avg(value) AS mean, stddev_samp(value) AS spread,
    count(value) AS documents FROM head_effects GROUP BY ALL;
"""


def estimated_run_bytes(documents: int, heads: int, methods: int, characters: int, width: int = 1024) -> int:
    """At most what a corpus importance run's file takes on disk: a row per document, head and method, each
    document's text, each head's mean output. What the page reserves before it starts."""
    return int(documents * (heads * methods * 48 + 256) + 4 * characters + heads * width * 8 + 4 * 1024**2)


class ImportanceWriter(DatabaseFile):
    """The writing side of a run's database: created or reopened (to resume) at ``path``."""

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA)

    def settings(self) -> dict:
        return self.read_settings()

    def write_modules(self, modules: list[AttentionModule]) -> None:
        if self.connection.execute("SELECT count(*) FROM modules").fetchall()[0][0]:
            return
        frame = pd.DataFrame([(row, module.name, module.kind, module.index, module.heads)
                              for row, module in enumerate(modules)],
                             columns=["module", "name", "kind", "layer", "heads"])
        self._insert("modules", frame)

    def modules(self) -> list[AttentionModule]:
        return [AttentionModule(name, heads, kind, layer) for name, kind, layer, heads in self.connection.execute(
            "SELECT name, kind, layer, heads FROM modules ORDER BY module").fetchall()]

    def write_means(self, modules: list[AttentionModule], means: dict[str, torch.Tensor]) -> None:
        """Each head's corpus mean (``[heads, d_v]`` by module name), once: the mean pass is then done."""
        rows = [(row, head, means[module.name][head].float().tolist())
                for row, module in enumerate(modules) for head in range(module.heads)]
        self.connection.execute("BEGIN TRANSACTION")
        self.connection.execute("DELETE FROM head_means")
        self._insert("head_means", pd.DataFrame(rows, columns=["module", "head", "mean"]))
        self.connection.execute("INSERT OR REPLACE INTO settings VALUES ('means_done', 'true')")
        self.connection.execute("COMMIT")

    def means(self, modules: list[AttentionModule]) -> dict[str, torch.Tensor] | None:
        """The corpus means written by :meth:`write_means`, or None when the mean pass has not finished."""
        if not self.settings().get("means_done"):
            return None
        found: dict[int, dict[int, list[float]]] = {}
        for row, head, mean in self.connection.execute("SELECT module, head, mean FROM head_means").fetchall():
            found.setdefault(row, {})[head] = mean
        return {module.name: torch.tensor([found[row][head] for head in range(module.heads)])
                for row, module in enumerate(modules)}

    def commit(self, documents: pd.DataFrame, effects: pd.DataFrame) -> None:
        """One chunk's documents and head effects, in one transaction."""
        self.connection.execute("BEGIN TRANSACTION")
        try:
            self._insert("documents", documents.assign(text=documents["text"].map(storable)))
            self._insert("head_effects", effects)
            self.connection.execute("COMMIT")
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise


class ImportanceReader(DatabaseFile):
    """A run's database opened read-only: what the page shows."""

    WHAT = "an importance run's database"

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA, read_only=True)

    @property
    def documents(self) -> int:
        return int(self.connection.execute("SELECT count(*) FROM documents").fetchall()[0][0])

    def modules(self) -> list[AttentionModule]:
        return [AttentionModule(name, heads, kind, layer) for name, kind, layer, heads in self.connection.execute(
            "SELECT name, kind, layer, heads FROM modules ORDER BY module").fetchall()]

    def methods(self) -> list[str]:
        found = {row[0] for row in self.connection.execute("SELECT DISTINCT method FROM head_effects").fetchall()}
        return [method for method in ("zero", "mean", "gradient") if method in found]

    def clean(self) -> float:
        """The mean objective without edits over the documents that have one."""
        value = self.connection.execute("SELECT avg(clean) FROM documents").fetchall()[0][0]
        return float("nan") if value is None else float(value)

    def maps(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """By method: ``(mean, spread, documents)`` as ``[modules, heads]`` arrays (NaN where a module has fewer
        heads, or nothing was measured)."""
        modules = self.modules()
        width = max((module.heads for module in modules), default=0)
        found = {}
        for method in self.methods():
            mean, spread = np.full((len(modules), width), np.nan), np.full((len(modules), width), np.nan)
            count = np.zeros((len(modules), width))
            for row, head, m, s, n in self.connection.execute(
                    "SELECT module, head, mean, spread, documents FROM importance WHERE method = ?",
                    [method]).fetchall():
                mean[row, head] = np.nan if m is None else m
                spread[row, head] = np.nan if s is None else s
                count[row, head] = n
            found[method] = (mean, spread, count)
        return found

    def per_document(self, method: str, module: int, head: int, count: int = 5) -> pd.DataFrame:
        """The documents where ablating one head moves the objective most, each way: doc, text, change."""
        return self.connection.execute(
            "SELECT e.doc, d.text, e.value AS change FROM head_effects e JOIN documents d USING (doc) "
            "WHERE e.method = ? AND e.module = ? AND e.head = ? AND e.value IS NOT NULL "
            "ORDER BY abs(e.value) DESC LIMIT ?", [method, module, head, count]).df()
