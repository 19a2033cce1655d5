"""A corpus scan per checkpoint of a series: when a series is measured with a corpus (``corpus`` in
:class:`~attnviz.corpus.series.runner.SeriesSettings`), each checkpoint is also scanned over it by the scan of the
Heads across a corpus page (:func:`attnviz.corpus.scan.runner.run_scan`, the same code, not a second scanner), and
every statistic's per-head map of that scan is committed into the series' DuckDB file with the checkpoint, so that a
map can be played over training (:func:`attnviz.corpus.series.store.scan_maps`).

Each checkpoint's scan is a scan file of its own beside the series' file (``<file's stem>.step<N>.scan.duckdb``: a
name that belongs to the series' file, so that a server's disk bound counts it and deleting the series deletes it): a
scan cut short goes on from its last chunk, as any scan does; once its maps are committed, the scan file is deleted
(a scan of every query of every document is tens of MB per checkpoint) unless ``keep_scans`` is asked, which leaves
each one to open on the Heads across a corpus page. A checkpoint whose maps are in the series' file is not scanned
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.corpus.documents import Corpus, CorpusRefused
from attnviz.corpus.scan.heads import LABELS, SCAN_STATISTICS
from attnviz.corpus.scan.runner import ScanSettings, run_scan
from attnviz.corpus.scan.store import STATUS_FINISHED, ScanReader
from attnviz.models.loading import ModelBundle

MAPPED = (*SCAN_STATISTICS, *LABELS)  # every map a scan of the Heads across a corpus page draws


@dataclass(frozen=True)
class SeriesScan:
    """What scanning each checkpoint of a series needs, in this process or a Ray actor (picklable): the corpus (its
    first ``settings.max_docs`` documents only), the scan's settings, the series' file (its checkpoints' scan files
    go beside it), and whether they are kept."""

    corpus: Corpus
    settings: ScanSettings
    database: Path
    keep: bool = False

    @property
    def key(self) -> str:
        """The corpus (its fingerprint) and the scan's limits: a series' file holds the scans of one key."""
        return scan_identity(self.corpus.fingerprint, self.settings)

    def path(self, step: int) -> Path:
        return scan_path(self.database, step)


def scan_identity(corpus_fingerprint: str, settings: ScanSettings) -> str:
    wanted = {"corpus": corpus_fingerprint, "max_docs": settings.max_docs, "max_tokens": settings.max_tokens}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def scan_path(database: str | Path, step: int) -> Path:
    """The scan file of step ``step`` of the series' file ``database``: ``<its stem>.step<step>.scan.duckdb`` beside
    it."""
    database = Path(database)
    return database.with_name(f"{database.stem}.step{step}.scan.duckdb")


def series_scan(corpus_spec: str, documents: int, tokens: int, database: str | Path, keep: bool = False) -> SeriesScan:
    """The corpus ``corpus_spec`` (``"bundled"`` or a .txt, .jsonl, .csv or .parquet file, as ``attnviz scan``
    reads it) read for scanning each checkpoint: its first ``documents`` documents, each at most ``tokens`` tokens;
    refused in words (:class:`~attnviz.corpus.documents.CorpusRefused`) when it holds none."""
    from attnviz.corpus.document_files import open_corpus

    corpus = open_corpus(corpus_spec, keep=documents)
    if not corpus.documents:
        raise CorpusRefused("the corpus holds no document to scan")
    # The first documents only travel (to Ray actors too), under the whole corpus's fingerprint and count.
    kept = Corpus(corpus.name, corpus.documents[:documents], corpus.report, size=corpus.count,
                  digest=corpus.fingerprint, chars_every=corpus.chars_every, characters=corpus.characters)
    # One chunk per checkpoint (a stop is asked between checkpoints) and no sample of queries and keys: the series
    # keeps the maps only.
    settings = ScanSettings(max_docs=documents, max_tokens=tokens, chunk_docs=documents, qk_points=0)
    return SeriesScan(kept, settings, Path(database), keep)


def scan_checkpoint(bundle: ModelBundle, step: int, scan: SeriesScan) -> dict:
    """The checkpoint ``bundle`` (the series' step ``step``) scanned over the corpus by
    :func:`attnviz.corpus.scan.runner.run_scan` into its own scan file (gone on with where a run was cut short), and
    every statistic's map read back from it as the Heads across a corpus page reads it
    (:meth:`attnviz.corpus.scan.store.ScanReader.statistic_map`): ``{"scan_row": ..., "scan_heads": DataFrame}`` in
    :data:`attnviz.corpus.series.store.SCAN_STEP_COLUMNS` / ``SCAN_HEAD_COLUMNS`` (``scanned_at`` set on commit)."""
    began = time.perf_counter()
    path = scan.path(step)
    state = run_scan(scan.corpus, bundle, path, scan.settings)
    if state.status != STATUS_FINISHED:  # nothing asks it to stop: a scan that did not finish is a failure
        raise RuntimeError(f"the scan of step {step:,} ended {state.status}")
    with ScanReader(path) as reader:
        layers, heads = reader.n_layers, reader.n_heads
        maps = {name: reader.statistic_map(name)[0] for name in MAPPED}  # each [layers, heads]
        documents = reader.documents
        tokens = int(reader.connection.execute("SELECT coalesce(sum(n_tokens), 0) FROM documents").fetchone()[0])
    if not scan.keep:
        for leftover in (path, path.with_name(path.name + ".wal")):
            with contextlib.suppress(OSError):
                leftover.unlink()
    layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.concat([pd.DataFrame({"step": np.full(layers * heads, step, dtype=np.int64),
                                     "layer": layer.ravel().astype(np.int16), "head": head.ravel().astype(np.int16),
                                     "statistic": name, "value": grid.ravel()})
                       for name, grid in maps.items()], ignore_index=True)
    return {"scan_row": {"step": step, "scan_key": scan.key, "documents": documents, "tokens": tokens,
                         "scan_seconds": time.perf_counter() - began},
            "scan_heads": frame}
