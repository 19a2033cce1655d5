"""A user's series of checkpoints measured over training: every checkpoint of a folder measured as the bundled tiny
GPT's own run is measured (:func:`attnviz.interventions.training_measures.measure` on one fixed
:class:`~attnviz.interventions.training_measures.Probe`), one checkpoint at a time, into DuckDB
(:mod:`attnviz.corpus.series.store`), resumable, and on Ray when asked (:mod:`attnviz.corpus.series.on_ray`) with the
same results; and, where a corpus is chosen, each checkpoint scanned over it (:mod:`attnviz.corpus.series.scans`).

The series is found and checked by :mod:`attnviz.corpus.series.folder`, the probe made by
:mod:`attnviz.corpus.series.probe`, each checkpoint loaded, measured and scanned by :mod:`attnviz.corpus.series.steps`.
Here: the settings (:class:`SeriesSettings`, :class:`SeriesOptions`), the series' key and file, and the run
(:func:`run_series`), which commits each checkpoint's row before the next; a stop is asked between checkpoints, and a
stopped run (or a series that gained checkpoints since) goes on with the steps it lacks. The command line is
:mod:`attnviz.corpus.series`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.checkpoints.checked_files import shown
from attnviz.corpus.documents import BUNDLED, CorpusRefused, Document
from attnviz.corpus.options import as_json, option
from attnviz.corpus.runner import ChunkWork, Measure, Progress, Stopped, report, run_chunks
from attnviz.corpus.scan.runner import token_limit
from attnviz.corpus.series import store as sstore
from attnviz.corpus.series.folder import Checkpoint, Series, SeriesRefused, find_series, series_tokenizer
from attnviz.corpus.series.probe import DEFAULT_TEXT_WORDS, LENGTH, probe_fingerprint, probe_text, series_probe
from attnviz.corpus.series.scans import SeriesScan, series_scan
from attnviz.corpus.series.steps import StepWork, measure_chunk, series_replica
from attnviz.interventions import training_measures as tm

DTYPES = ("fp32", "stored")
MOST_SCAN_DOCUMENTS = 10_000  # documents of the corpus each checkpoint is scanned over
MOST_SCAN_TOKENS = 4_096
# The corpus scan's settings are not part of a series' key: the same series scanned over a corpus, or not yet, is the
# same file (a corpus chosen later scans the measured checkpoints without measuring them again).
SCAN_FIELDS = ("corpus", "scan_docs", "scan_tokens", "keep_scans")


# -- the settings ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeriesSettings:
    """The probe every checkpoint of a series is measured on; its fields are also the JSON a background run is given
    and the options of ``python -m attnviz.corpus.series`` (:mod:`attnviz.corpus.options`)."""

    windows: int = field(default=16, metadata=option(
        f"windows of {LENGTH} held-out tokens, evenly spaced over the text"))
    period: int = field(default=40, metadata=option("random tokens in each sequence typed twice"))
    sequences: int = field(default=8, metadata=option("sequences of random tokens typed twice"))
    seed: int = field(default=0, metadata=option("the random tokens' seed"))
    text_file: str | None = field(default=None, metadata=option(
        "a UTF-8 text file for the held-out windows", default_words=DEFAULT_TEXT_WORDS))
    corpus: str | None = field(default=None, metadata=option(
        "scan each checkpoint over this corpus too: 'bundled', or a .txt, .jsonl, .csv or .parquet file",
        default_words="no scan"))
    scan_docs: int = field(default=64, metadata=option("the corpus's first documents each checkpoint scans"))
    scan_tokens: int = field(default=64, metadata=option("each document's first tokens a scan reads"))
    keep_scans: bool = field(default=False, metadata=option(
        "keep each checkpoint's scan file (<db's stem>.stepN.scan.duckdb) for the Heads across a corpus page"))

    def __post_init__(self):
        if not 1 <= self.windows <= 256:
            raise SeriesRefused(f"windows: 1 to 256, not {self.windows}")
        if not 4 <= self.period <= 1024:
            raise SeriesRefused(f"the period is 4 to 1,024 tokens, not {self.period}")
        if not 1 <= self.sequences <= 64:
            raise SeriesRefused(f"sequences: 1 to 64, not {self.sequences}")
        if self.seed < 0:
            raise SeriesRefused("the seed is a whole number, 0 or more")
        if not 1 <= self.scan_docs <= MOST_SCAN_DOCUMENTS:
            raise SeriesRefused(f"a checkpoint's scan reads 1 to {MOST_SCAN_DOCUMENTS:,} documents, not "
                                f"{self.scan_docs}")
        if not 2 <= self.scan_tokens <= MOST_SCAN_TOKENS:
            raise SeriesRefused(f"a scan reads 2 to {MOST_SCAN_TOKENS:,} tokens of each document, not "
                                f"{self.scan_tokens}")
        if self.corpus is not None and not self.corpus.strip():
            raise SeriesRefused("the corpus is 'bundled' or a file's path, not empty")


DEFAULT_SETTINGS = SeriesSettings()


@dataclass(frozen=True)
class SeriesOptions:
    """What a series run is told besides its probe: the command line's options and a background job's JSON."""

    folder: str = field(metadata=option("the folder of checkpoints (step1000/, checkpoint-500/, ...)",
                                        positional=True))
    db: str = field(metadata=option("the series' DuckDB file (created, or gone on with)", flag="--db",
                                    metavar="FILE.duckdb"))
    name: str | None = field(default=None, metadata=option(
        "the series' name in the results (default: the folder's)"))
    dtype: str = field(default="fp32", metadata=option("the weights measured in fp32, or as stored",
                                                       choices=DTYPES))
    ray: bool = field(default=False, metadata=option("measure the checkpoints on Ray (see --ray-address)"))
    ray_address: str = field(default="auto", metadata=option(
        "Ray: 'auto' (a local cluster, started if none runs) or a cluster's address", metavar="auto|ADDRESS"))
    workers: int = field(default=2, metadata=option("Ray: checkpoints measured at once (actors)"))
    threads: int | None = field(default=None, metadata=option("torch threads (in-process), per worker on Ray"))
    progress_file: str | None = field(default=None, metadata=option(
        "write progress as JSON here after every checkpoint"))
    stop_file: str | None = field(default=None, metadata=option(
        "stop (resumably) after the checkpoint during which this file appears"))
    disk_limit: int = field(default=0, metadata=option(
        "stop, failed, once the output's files pass this many bytes (what the server reserved for them)",
        metavar="BYTES", default_words="no limit"))
    quiet: bool = field(default=False, metadata=option("no progress line on the terminal"))


@dataclass
class SeriesProgress(Progress):
    """Progress counted in checkpoints (``done``, ``planned``); ``step``: the last one measured."""

    step: int | None = None
    seconds: float = 0.0  # the last checkpoint's loading and measures


# -- the run --------------------------------------------------------------------------------------------------------
def series_key(folder: str | Path, settings: SeriesSettings = DEFAULT_SETTINGS, dtype: str = "fp32") -> str:
    """The same series folder, probe settings and dtype give the same key (and the page the same file): gone on
    with, or reopened."""
    probe = {name: value for name, value in as_json(settings).items() if name not in SCAN_FIELDS}
    wanted = {"folder": os.path.realpath(folder), **probe, "dtype": dtype, "schema": sstore.SCHEMA_VERSION}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def open_store(path: str | Path, series: Series, settings: SeriesSettings, dtype: str, probe: tm.Probe,
               name: str | None) -> sstore.SeriesStore:
    """The series' database: new (its settings written), or the same series' to go on with; refused when it holds
    another series, another probe (the text or the tokenizer changed), or a measured checkpoint changed since."""
    key = series_key(series.root, settings, dtype)
    store = sstore.SeriesStore(path)
    existing = store.settings()
    label = Path(path).name
    if existing and existing.get("key") != key:
        raise SeriesRefused(f"{label} holds another series (another folder, probe or dtype): choose a new file, or "
                            "delete it")
    if existing and existing.get("probe_fingerprint") != probe_fingerprint(probe):
        raise SeriesRefused(f"{label} was measured on another probe (its text or the tokenizer changed since): "
                            "choose a new file, or delete it")
    if not existing:
        probe_settings = {name: value for name, value in as_json(settings).items() if name not in SCAN_FIELDS}
        store.set(key=key, folder=str(series.root), name=name, dtype=dtype, **probe_settings,
                  text=settings.text_file or DEFAULT_TEXT_WORDS, length=LENGTH, early=list(tm.EARLY),
                  late=list(tm.LATE), probe_fingerprint=probe_fingerprint(probe), bos=bool(probe.start),
                  tokenizer_from=series.tokenizer_from, model_type=series.shape["model type"], layers=series.layers,
                  heads=series.heads, width=series.shape["width"], vocabulary=series.shape["vocabulary"],
                  rule=tm.PHASE_RULE, versions=sstore.versions(), started=time.time(),
                  status=sstore.STATUS_RUNNING)
    return store


def run_series(folder: str | Path, path: str | Path, settings: SeriesSettings = DEFAULT_SETTINGS, *,
               dtype: str = "fp32", name: str | None = None,
               progress: Callable[[SeriesProgress], None] | None = None,
               should_stop: Callable[[], bool] | None = None, measure: Measure | None = None) -> SeriesProgress:
    """Measure every checkpoint of the series in ``folder`` (:func:`find_series`) into the DuckDB file at ``path``
    (created, or gone on with: the steps it lacks), and scan each over ``settings.corpus`` where one is given
    (:mod:`attnviz.corpus.series.scans`: a checkpoint measured before is scanned only, one scanned before is not
    scanned again). ``measure``: where the checkpoints are measured (default: here, one after the other, a stop asked
    before each; :func:`attnviz.corpus.on_ray.on_ray`: on Ray, each actor scanning its checkpoints too). Returns the
    last progress (``status`` finished or stopped)."""
    if dtype not in DTYPES:
        raise SeriesRefused(f"dtype is {' or '.join(DTYPES)}, not {dtype!r}")
    series = find_series(folder)
    tokenizer = series_tokenizer(series)
    probe = series_probe(tokenizer, probe_text(settings.text_file), settings, series.shape)
    store = open_store(path, series, settings, dtype, probe, name)
    done = store.done_steps()
    changed = [checkpoint for checkpoint in series.checkpoints
               if checkpoint.step in done and done[checkpoint.step] != checkpoint.fingerprint]
    if changed:
        raise SeriesRefused(f"step {changed[0].step:,} ({shown(changed[0].name)}) changed since it was measured into "
                            f"{Path(path).name}: choose a new file, or delete it")
    scan = corpus_scan(settings, path, series, store)
    scanned = store.scanned_steps() if scan is not None else {}
    todo = [(checkpoint.step, Document(str(checkpoint.folder), checkpoint.name)) for checkpoint in series.checkpoints
            if checkpoint.step not in done or (scan is not None and checkpoint.step not in scanned)]
    planned = len(set(done) | set(series.steps))
    state = SeriesProgress(done=planned - len(todo), planned=planned, started=time.time(), finished_before=not todo)
    store.set(status=sstore.STATUS_RUNNING)
    report(progress, state)
    work = StepWork(probe, series.root, series.tokenizer,
                    frozenset(checkpoint.step for checkpoint in series.checkpoints if checkpoint.tokenizer),
                    series.layers, dtype, frozenset(done), scan)
    by_step = {checkpoint.step: checkpoint for checkpoint in series.checkpoints}
    try:
        run_chunks(ChunkWork(here=functools.partial(measure_chunk, work),
                             replica=functools.partial(series_replica, work), chunk_docs=1),
                   todo, lambda _chunk, rows: record(store, state, rows, by_step), state, measure=measure,
                   progress=progress, should_stop=should_stop)
        state.status = sstore.STATUS_FINISHED
    except Stopped:
        state.status = sstore.STATUS_STOPPED
    finally:
        if state.status == sstore.STATUS_RUNNING:  # failed: what was committed is kept, and it goes on when asked
            with contextlib.suppress(Exception):
                store.set(status=sstore.STATUS_STOPPED)
    store.set(status=state.status, finished=time.time() if state.status == sstore.STATUS_FINISHED else None)
    report(progress, state)
    return state


def corpus_scan(settings: SeriesSettings, path: str | Path, series: Series,
                store: sstore.SeriesStore) -> SeriesScan | None:
    """The corpus scan each checkpoint gets (None without ``settings.corpus``): the corpus read, and the series'
    file checked to hold no scans of another corpus or other limits (refused in words), its scan noted in its
    settings."""
    if settings.corpus is None:
        return None
    scan_token_limit = token_limit(series.layers, series.heads)  # before the corpus is read: a refusal costs nothing
    if settings.scan_tokens > scan_token_limit:
        raise SeriesRefused(f"{settings.scan_tokens:,} tokens per document x {series.layers} layers x {series.heads} "
                            f"heads: a scan reads up to {scan_token_limit:,} tokens a document for this model")
    try:
        scan = series_scan(settings.corpus, settings.scan_docs, settings.scan_tokens, path, settings.keep_scans)
    except CorpusRefused as problem:
        raise SeriesRefused(f"the corpus cannot be scanned: {str(problem).rstrip('.')}") from None
    others = {key for key in store.scanned_steps().values() if key != scan.key}
    if others:
        raise SeriesRefused(f"{Path(path).name} holds scans of another corpus (or of other limits: documents, tokens) "
                            "than this one: measure the series into a new file to scan it over this corpus")
    store.set(scan={"corpus": scan.corpus.name if settings.corpus == BUNDLED else settings.corpus,
                    "documents": settings.scan_docs, "tokens": settings.scan_tokens, "key": scan.key,
                    "corpus_fingerprint": scan.corpus.fingerprint})
    return scan


def record(store: sstore.SeriesStore, state: SeriesProgress, rows: list[dict],
           by_step: dict[int, Checkpoint]) -> None:
    """Each checkpoint committed, in one transaction: its measures' row and its heads' rows (where it was measured
    now), and its scan's row and maps (where it was scanned); counted in ``state``."""
    for row in rows:
        checkpoint = by_step[row["step"]]
        measured = "loss" in row
        step_row = {"step": row["step"], "name": checkpoint.name, "fingerprint": checkpoint.fingerprint,
                    **{column: row[column] for column in sstore.SCALARS}, "load_seconds": row["load_seconds"],
                    "measure_seconds": row["measure_seconds"], "measured_at": time.time()} if measured else None
        scan_row = {**row["scan_row"], "scanned_at": time.time()} if "scan_row" in row else None
        store.commit(step_row, sstore.head_rows(row["step"], row) if measured else None, scan_row,
                     row.get("scan_heads"))
        state.done += 1
        state.done_this_run += 1
        state.step = row["step"]
        state.seconds = (row.get("load_seconds", 0.0) + row.get("measure_seconds", 0.0)
                         + (scan_row["scan_seconds"] if scan_row else 0.0))
