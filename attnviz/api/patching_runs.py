"""Activation and path patching over a corpus from Python: :func:`patch_corpus`, on the same runner as ``python -m
attnviz.corpus.patching`` and ``attnviz patch`` (:func:`attnviz.corpus.patching.runner.run_patching`), so a notebook
and the command line write the same DuckDB file. Like :func:`attnviz.api.runs.importance`, a run shows a progress bar
(``tqdm.auto``), stops when the notebook's stop button is pressed (at the next batched forward, the chunk in flight
dropped: call it again with the same path to go on) and returns its file, here as a :class:`PatchingRun`, whose maps
read as tensors per document (:meth:`PatchingRun.shares`) and as their mean with a bootstrap interval
(:meth:`PatchingRun.spread`). :func:`open_patching` reopens a file.

Each document gives one example, its own text typed twice as the induction preset types random tokens (see
:mod:`attnviz.corpus.patching.runner`); shares are per example, as :mod:`attnviz.api.patching` defines them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from attnviz.api.run_control import ProgressBar, StopRequests, mark_stopped
from attnviz.api.run_files import _existing, _RunFile
from attnviz.api.runs import (
    _NOT_ON_RAY,
    _check_reading,
    _check_same_run,
    _corpus_of,
    _default_path,
    _edits_reach,
    _folder_of,
    _importance_model,
    _in_memory,
    _measure_on_ray,
    _returned,
    _settings_of,
    _source_of,
)
from attnviz.corpus.options import as_json
from attnviz.corpus.patching.runner import PatchingSettings, patching_key, run_patching
from attnviz.corpus.patching.store import PatchingReader, PatchingWriter
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.interventions import activation_patching as ap

LISTS = ("sites", "receivers", "mlps")  # the settings given as lists, or as the command line's comma-separated text


class PatchingRun(_RunFile):
    """A corpus patching run's DuckDB file (its tables: :mod:`attnviz.corpus.patching.store`): ``path``, ``status``,
    ``done`` / ``planned`` documents, ``tables()``, ``df(table)`` (default: the ``patching`` view, the mean per map
    and cell), ``sql(query)``; :meth:`names` (its maps), :meth:`shares` and :meth:`values` (``[documents, *grid]``
    tensors), :meth:`spread`, :meth:`summary` and :meth:`documents`."""

    reader = PatchingReader
    default_table = "patching"

    def names(self) -> list[str]:
        """The maps: the sites ("resid", "head", ...), then the paths ("2.1:k/frozen": into layer 2 head 1's keys,
        the MLPs between held)."""
        with self._open() as reader:
            return reader.names()

    def maps(self) -> pd.DataFrame:
        """Each map's kind, name, axes (which of row, head, position index its grid), grid and row labels."""
        with self._open() as reader:
            return reader.maps()

    def shares(self, name: str) -> torch.Tensor:
        """One map's per-document shares of the clean-corrupted gap, ``[documents, *grid]`` (the measured documents
        in order; NaN where a cell has none): as :attr:`PatchMap.shares` is for examples given directly."""
        with self._open() as reader:
            return reader.shares(name)

    def values(self, name: str) -> torch.Tensor:
        """One map's per-document metric with each cell patched, as :meth:`shares`."""
        with self._open() as reader:
            return reader.values(name)

    def spread(self, name: str, *, of: str = "shares", draws: int = 2000, seed: int = 0) -> ap.Spread:
        """The mean over the documents of one map's shares (``of="values"``: its values), their standard deviation
        and a 95 % bootstrap interval of the mean (:func:`attnviz.interventions.activation_patching.spread`). A
        document whose clean and corrupted runs measure the same has no share at all, and is left out."""
        if of not in ("shares", "values"):
            raise ValueError(f"of must be 'shares' or 'values', not {of!r}")
        found = self.shares(name) if of == "shares" else self.values(name)
        kept = found[~found.reshape(len(found), -1).isnan().all(-1)]
        return ap.spread(kept, draws=draws, seed=seed)

    def summary(self, name: str, *, of: str = "shares") -> pd.DataFrame:
        """One map's :meth:`spread` as a table: a row per cell (``row``, its label ``row_label``, ``head`` and
        ``position``, -1 where the map has no such axis), ``mean``, ``std``, ``low``, ``high`` and ``documents``."""
        with self._open() as reader:
            maps = reader.maps()
        chosen = maps[maps["name"] == name]
        if chosen.empty:
            raise ValueError(f"no map {name!r}; the run makes {', '.join(maps['name']) or 'none'}")
        axes, labels = list(chosen["axes"].iloc[0]), list(chosen["rows"].iloc[0])
        found = self.spread(name, of=of)
        cells = torch.nonzero(torch.ones_like(found.mean, dtype=torch.bool)).tolist()
        rows = []
        for cell in cells:
            at = dict(zip(axes, cell, strict=True))
            mean = float(found.mean[tuple(cell)])
            if mean != mean and found.examples:  # a cell the model has not (a layer with fewer heads)
                continue
            rows.append((at["row"], labels[at["row"]], at.get("head", -1), at.get("position", -1), mean,
                         float(found.std[tuple(cell)]), float(found.low[tuple(cell)]),
                         float(found.high[tuple(cell)]), found.examples))
        return pd.DataFrame(rows, columns=["row", "row_label", "head", "position", "mean", "std", "low", "high",
                                           "documents"])

    def documents(self) -> pd.DataFrame:
        """The documents table: doc, source, text, n_tokens, clean, corrupted, answer, foil, replacement, skipped."""
        with self._open() as reader:
            return reader.documents_frame()

    def _summary(self) -> str:
        said = self.settings
        return f"{super()._summary()}, maps {', '.join(self.names())}, period {said.get('period', '?')}"


def patch_corpus(corpus, model, path: str | Path | None = None, *, tokenizer=None, progress: bool = True,
                 ray: bool | str | None = False, workers: int = 2, split: str = "line", field: str | None = None,
                 dtype: str = "stored", **settings) -> PatchingRun:
    """Activation (and path) patching of ``model`` over ``corpus`` into the DuckDB file at ``path``, as ``python -m
    attnviz.corpus.patching`` and ``attnviz patch`` do, returned as a :class:`PatchingRun`: each document's own text
    typed twice (its first ``period`` tokens, then their first half), its copied token (or the one before it)
    changed in the corrupted prompt, and every cell of every site and path measured per document.

    ``corpus``, ``path``, ``progress``, ``workers``, ``split``, ``field``, ``dtype``, interrupting and resuming: as
    :func:`attnviz.api.runs.scan` (default file ``patching-<model>-<corpus>-<key>.duckdb``). ``model``: a bundled
    model's name, a checkpoint folder (a causal LM), or a causal LM in memory with its ``tokenizer=`` (switched to
    attnviz's attention for the run). ``ray``: True or "auto" (a local cluster, started if none runs), or a
    cluster's address.

    ``settings``: the fields of :class:`~attnviz.corpus.patching.runner.PatchingSettings`: ``max_docs`` (200),
    ``period`` (16), ``change`` ("copied" or "previous"), ``seed`` (0), ``sites`` (("resid", "head"); a list, or
    comma-separated text), ``by_position`` (False), ``direction`` ("denoising"), ``metric`` ("logit difference"),
    ``receivers`` (path patching: e.g. ["2.1:k"]), ``mlps`` (("frozen",); "free" too), ``chunk_docs`` (8); another
    name or a value of the wrong type is refused with the valid names."""
    for name in LISTS:
        if isinstance(settings.get(name), str):
            settings[name] = tuple(part.strip() for part in settings[name].split(",") if part.strip())
        elif isinstance(settings.get(name), list):
            settings[name] = tuple(settings[name])
    chosen = _settings_of(PatchingSettings, settings, "patch_corpus")
    if ray is True:
        ray = "auto"
    elif ray is False:
        ray = None
    _check_reading(split, dtype, ray, workers)
    if isinstance(model, torch.nn.Module) and tokenizer is None:
        raise TypeError("a loaded model needs its tokenizer: patch_corpus(corpus, model, tokenizer=tokenizer)")
    stops = StopRequests()
    with stops.listening():
        documents, corpus_name = _corpus_of(corpus, split, field, chosen.max_docs)
        source = _source_of(corpus)
        if ray and _in_memory(model):
            raise ScanRefused(_NOT_ON_RAY)
        folder, name, loaded, dtype = _importance_model(model, tokenizer, dtype, _folder_of(path))
        key = patching_key(documents, folder, chosen, dtype)
        path = Path(path) if path is not None else _default_path("patching", name, corpus_name, key)
        wanted = {"corpus_fingerprint": documents.fingerprint, "model_folder": str(folder),
                  **{setting: value for setting, value in as_json(chosen).items() if setting != "chunk_docs"}}
        done = _check_same_run(path, key, PatchingReader, "patching run", wanted)
        measure = _measure_on_ray(ray, workers, "run")
        with ProgressBar(progress, min(chosen.max_docs, documents.count), done) as bar, \
                _edits_reach(loaded[0] if loaded else None):
            try:
                run_patching(documents, folder, path, chosen, name=name, dtype=dtype, loaded=loaded, source=source,
                             progress=stops.guarded(bar.show), should_stop=stops, measure=measure)
            except KeyboardInterrupt:  # interrupted again, mid-chunk: the chunk in flight was never committed
                mark_stopped(PatchingWriter, path)
    return _returned(PatchingRun(path), "patch_corpus")


def open_patching(path: str | Path) -> PatchingRun:
    """A corpus patching run's file, reopened (checked as the pages check a file: read-only, its catalog
    attnviz's own)."""
    run = PatchingRun(_existing(path))
    run.settings  # noqa: B018 - opened once now, so that a file that is not a patching run's is refused here
    return run
