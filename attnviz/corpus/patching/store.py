"""A corpus patching run's results in DuckDB: one database file per run, written a chunk of documents at a time in one
transaction (a stopped run resumes where its last chunk ended), read by the notebook API and by SQL.

Tables (layers and heads count from 0):

* ``settings``: the run's key, model, corpus, settings, versions, times and status (key -> JSON).
* ``maps``: one row per map the run makes, in the settings' order (``number`` from 0): ``kind`` ("map": activation
  patching of a site; "path": path patching into a receiver), ``name`` (the site, "resid", "head", ...; or the path,
  "2.1:k/frozen": receiver layer 2 head 1, through its keys, the MLPs in between held), ``axes`` (which of ``row``,
  ``head``, ``position`` index its grid, in order), ``grid`` (its shape, documents left out) and ``rows`` (each
  row's label).
* ``documents``: every document planned: its source, text, ordinary tokens read (at most the period), the metric on
  its clean and corrupted prompts, the answer, the foil (token ids), the token the corrupted prompt put in
  (``replacement``), and why it was left out (``skipped``; NULL when measured).
* ``cells``: one row per measured document and cell: ``doc``, ``kind``, ``name``, ``row`` (the map's row: the
  residual row, the layer, or the sender's layer), ``head`` (-1 for resid, attn and mlp), ``position`` (-1: every
  position), ``value`` (the metric with that cell patched) and ``share`` (of the clean-corrupted gap; NULL where the
  gap is 0).
* view ``patching``: per map and cell, the mean share and value over the documents and how many.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.corpus.database import DatabaseFile, storable
from attnviz.corpus.scan.store import STATUS_FINISHED, STATUS_RUNNING, STATUS_STOPPED, versions

__all__ = ["PatchingReader", "PatchingWriter", "SCHEMA_VERSION", "STATUS_FINISHED", "STATUS_RUNNING",
           "STATUS_STOPPED", "versions"]

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS maps (number SMALLINT PRIMARY KEY, kind VARCHAR, name VARCHAR UNIQUE, axes VARCHAR[],
    grid INTEGER[], rows VARCHAR[]);
CREATE TABLE IF NOT EXISTS documents (doc INTEGER PRIMARY KEY, source VARCHAR, text VARCHAR, n_tokens INTEGER,
    clean DOUBLE, corrupted DOUBLE, answer INTEGER, foil INTEGER, replacement INTEGER, skipped VARCHAR);
CREATE TABLE IF NOT EXISTS cells (doc INTEGER, kind VARCHAR, name VARCHAR, "row" SMALLINT, head SMALLINT,
    position INTEGER, value DOUBLE, share DOUBLE);
CREATE OR REPLACE VIEW patching AS SELECT kind, name, "row", head, position, avg(share) AS share,
    avg(value) AS value, count(share) AS documents FROM cells GROUP BY ALL;
"""

DOCUMENT_COLUMNS = ["doc", "source", "text", "n_tokens", "clean", "corrupted", "answer", "foil", "replacement",
                    "skipped"]
CELL_COLUMNS = ["doc", "kind", "name", "row", "head", "position", "value", "share"]


class PatchingWriter(DatabaseFile):
    """The writing side of a run's database: created or reopened (to resume) at ``path``."""

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA)

    def settings(self) -> dict:
        return self.read_settings()

    def write_maps(self, maps: pd.DataFrame) -> None:
        """The maps the run makes (``number, kind, name, axes, grid, rows``), once."""
        if self.connection.execute("SELECT count(*) FROM maps").fetchall()[0][0]:
            return
        self._insert("maps", maps)

    def commit(self, documents: pd.DataFrame, cells: pd.DataFrame) -> None:
        """One chunk's documents and cells, in one transaction."""
        self.connection.execute("BEGIN TRANSACTION")
        try:
            self._insert("documents", documents.assign(text=documents["text"].map(storable)))
            if len(cells):
                self._insert("cells", cells)
            self.connection.execute("COMMIT")
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise


class PatchingReader(DatabaseFile):
    """A run's database opened read-only (as a file anyone may have written): its maps as tensors per document."""

    WHAT = "a patching run's database"

    def __init__(self, path: str | Path):
        super().__init__(path, _SCHEMA, read_only=True)

    @property
    def documents(self) -> int:
        """Documents done (measured or left out)."""
        return int(self.connection.execute("SELECT count(*) FROM documents").fetchall()[0][0])

    def maps(self) -> pd.DataFrame:
        """The maps the run makes, in order: number, kind, name, axes, grid, rows."""
        return self.connection.execute("SELECT number, kind, name, axes, grid, rows FROM maps ORDER BY number").df()

    def names(self) -> list[str]:
        """Every map's name (the sites first, then the paths)."""
        return [name for name, in self.connection.execute(
            "SELECT name FROM maps ORDER BY number").fetchall()]

    def _map(self, name: str) -> tuple[str, list[str], tuple[int, ...], list[str]]:
        found = self.connection.execute("SELECT kind, axes, grid, rows FROM maps WHERE name = ?", [name]).fetchall()
        if not found:
            raise ValueError(f"no map {name!r}; the run makes {', '.join(self.names()) or 'none'}")
        kind, axes, grid, rows = found[0]
        return kind, list(axes), tuple(int(size) for size in grid), list(rows)

    def measured(self) -> list[int]:
        """The documents with cells (not left out), in order: the first dimension of :meth:`shares`."""
        return [doc for doc, in self.connection.execute(
            "SELECT doc FROM documents WHERE skipped IS NULL ORDER BY doc").fetchall()]

    def rows(self, name: str) -> list[str]:
        """The labels of a map's rows."""
        return self._map(name)[3]

    def shares(self, name: str) -> torch.Tensor:
        """One map's per-document shares of the clean-corrupted gap, ``[documents, *grid]`` float64 (documents: those
        measured, in order; NaN where a cell has none): what :func:`attnviz.interventions.activation_patching.spread`
        summarises."""
        return self._tensor(name, "share")

    def values(self, name: str) -> torch.Tensor:
        """One map's per-document metric with each cell patched, as :meth:`shares`."""
        return self._tensor(name, "value")

    def _tensor(self, name: str, column: str) -> torch.Tensor:
        kind, axes, grid, _ = self._map(name)
        docs = self.measured()
        out = np.full((len(docs), *grid), np.nan)
        cursor = self.connection.cursor()
        try:
            found = cursor.execute(
                f'SELECT doc, "row", head, position, {column} FROM cells WHERE kind = ? AND name = ?',
                [kind, name]).fetchnumpy()
        finally:
            cursor.close()
        if len(found["doc"]):
            index = {doc: at for at, doc in enumerate(docs)}
            at = np.array([index[int(doc)] for doc in found["doc"]])
            by_axis = {"row": found["row"], "head": found["head"], "position": found["position"]}
            column_values = found[column]
            values = np.asarray(column_values.filled(np.nan) if np.ma.isMaskedArray(column_values)
                                else column_values, dtype=float)
            out[(at, *(np.asarray(by_axis[axis], dtype=int) for axis in axes))] = values
        return torch.from_numpy(out)

    def documents_frame(self) -> pd.DataFrame:
        """The documents table as a DataFrame, in order."""
        return self.connection.execute(f"SELECT {', '.join(DOCUMENT_COLUMNS)} FROM documents ORDER BY doc").df()
