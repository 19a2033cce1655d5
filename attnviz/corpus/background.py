"""Scans, corpus importance and patching runs and series of checkpoints the pages start: each runs as ``python -m
attnviz.corpus.scan`` (or ``attnviz.corpus.importance``, ``attnviz.corpus.patching``, ``attnviz.corpus.series``) in a
process of its own (it goes on while the page is left or reloaded, and a crash in it cannot take the server down),
through the server's queue (:mod:`attnviz.corpus.jobs`: at most ``ATTNVIZ_JOBS`` at once, all browsers together, one
per browser and per session), writing its progress to a JSON file beside its database and stopping, resumably, when a
stop file appears.

A job is ``(kind, key, settings)``: the run of ``kind`` (``scan``, ``importance``, ``patching`` or ``series``) whose
files are named by ``key``, told everything by one JSON file, ``<key>.settings.json`` (:mod:`attnviz.corpus.command`:
its options and settings, as the command line's ``--settings`` reads them). A scans folder holds, per scan ``<key>``
(:func:`attnviz.corpus.scan.runner.scan_key`): ``<key>.duckdb``, ``<key>.settings.json``, ``<key>.progress.json``,
``<key>.log`` and, while it runs, ``<key>.stop`` when asked to stop; uploaded corpora are
kept as ``<name>-<sha256>.<format>``, at most :data:`MAX_CORPORA`; projections the Queries and keys page makes
of any scan go to ``projections/<scan key>.duckdb``. At most :data:`MAX_SCANS` scans are kept per folder: starting
another deletes the oldest.

Disk: a corpus, a scan or a run reserves the bytes it may write before it writes any
(:func:`attnviz.checkpoints.disk.reserve`), in the same accounting as checkpoint uploads (``ATTNVIZ_UPLOADS_GB``, all
browsers together) and within what one browser may keep (:func:`browser_limit_bytes`).

Scans made on the command line can be opened from ``ATTNVIZ_SCAN_ROOT``: the ``.duckdb`` files directly in that
folder (no links, nothing outside it), read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from attnviz.checkpoints import disk
from attnviz.checkpoints.keep import counted_with_uploads
from attnviz.corpus import jobs
from attnviz.corpus.command import RunOptions, job_command, write_settings_file
from attnviz.corpus.documents import BUNDLED, FORMATS, format_of
from attnviz.corpus.importance.runner import ImportanceSettings
from attnviz.corpus.jobs import Job
from attnviz.corpus.patching.runner import PatchingSettings
from attnviz.corpus.scan.runner import ScanSettings
from attnviz.corpus.series.runner import SeriesOptions, SeriesSettings

MAX_SCANS = 6  # kept per scans folder (per browser); the oldest goes first
MAX_CORPORA = 3  # uploaded corpora kept per browser; the oldest not in use goes first
BROWSER_GB_VARIABLE = "ATTNVIZ_BROWSER_GB"


def max_page_documents() -> int:
    """The most documents a scan started from the page reads (``ATTNVIZ_SCAN_MAX_DOCS``, 20,000: about 3 GB of
    database for 128-token documents of a 6 x 12 model); the command line has no such bound."""
    try:
        return max(1, int(os.environ.get("ATTNVIZ_SCAN_MAX_DOCS", "20000")))
    except ValueError:
        return 20_000


def browser_limit_bytes() -> int:
    """The most one browser's corpora, scans, runs, exports and projections may take on disk
    (``ATTNVIZ_BROWSER_GB``; by default a quarter of ``ATTNVIZ_UPLOADS_GB``: 10 GiB)."""
    try:
        chosen = os.environ.get(BROWSER_GB_VARIABLE, "").strip()
        if chosen:
            return int(max(0.0, float(chosen)) * 1024**3)
    except ValueError:
        pass
    return disk.uploads_limit_bytes() // 4


SCAN_ROOT_VARIABLE = "ATTNVIZ_SCAN_ROOT"


class ScanFolder:
    """The scans (or importance runs) of one browser (or session): start, watch, stop, list, bound.

    ``owner``: the browser's folder of scans, corpora and runs (its disk is counted together, and it has one job
    at a time); by default this folder. ``queue``: the server's (:func:`attnviz.corpus.jobs.server_queue`)."""

    def __init__(self, folder: str | Path, owner: str | Path | None = None, queue: jobs.JobQueue | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.owner = Path(owner) if owner is not None else self.folder
        self.queue = queue

    def _queue(self) -> jobs.JobQueue:
        return self.queue if self.queue is not None else jobs.server_queue()

    def database(self, key: str) -> Path:
        return self.folder / f"{key}.duckdb"

    def progress_file(self, key: str) -> Path:
        return self.folder / f"{key}.progress.json"

    def stop_file(self, key: str) -> Path:
        return self.folder / f"{key}.stop"

    # -- the job ---------------------------------------------------------------------------------------------------
    def job(self) -> Job | None:
        """This folder's job, waiting (``job.waiting``, with its place) or running, or None."""
        return self._queue().job_of(self.folder)

    def progress(self, key: str) -> dict | None:
        try:
            return json.loads(self.progress_file(key).read_text())
        except (OSError, ValueError):
            return None

    def log_tail(self, key: str, characters: int = 600) -> str:
        try:
            return (self.folder / f"{key}.log").read_text(errors="replace")[-characters:]
        except OSError:
            return ""

    def settings_file(self, key: str) -> Path:
        return self.folder / f"{key}.settings.json"

    def start(self, key: str, corpus: str | Path, model_folder: str | Path, settings: ScanSettings, *,
              split: str = "line", field_name: str | None = None, dtype: str = "stored",
              model_name: str | None = None, disk_bytes: int = 0, session: str | None = None) -> Job:
        """Start the scan ``key`` (or resume it) in a process of its own, through the server's queue, with
        ``disk_bytes`` reserved for its files. Refused (:class:`JobRefused`, or a refusal of the disk in words)
        while this browser or session has a job, when the queue is full or the disk would be."""
        options = self._options(key, str(corpus), model_folder, dtype, model_name, disk_bytes,
                                split=split, field_name=field_name or None)
        return self._launch("scan", key, options, settings, disk_bytes, session)

    def start_importance(self, key: str, corpus: str, model_folder: str | Path, settings: ImportanceSettings, *,
                         dtype: str = "stored", model_name: str | None = None, disk_bytes: int = 0,
                         session: str | None = None) -> Job:
        """Start (or resume) a corpus importance run ``key`` (:mod:`attnviz.corpus.importance`; ``corpus`` as its
        command line takes it) in a process of its own, through the server's queue, like :meth:`start`."""
        options = self._options(key, corpus, model_folder, dtype, model_name, disk_bytes)
        return self._launch("importance", key, options, settings, disk_bytes, session)

    def start_patching(self, key: str, corpus: str, model_folder: str | Path, settings: PatchingSettings, *,
                       split: str = "line", field_name: str | None = None, dtype: str = "stored",
                       model_name: str | None = None, disk_bytes: int = 0, session: str | None = None) -> Job:
        """Start (or resume) a corpus patching run ``key`` (:mod:`attnviz.corpus.patching`; ``corpus`` as its command
        line takes it, a kept file read with ``split`` and ``field_name``) in a process of its own, through the
        server's queue, like :meth:`start`."""
        options = self._options(key, corpus, model_folder, dtype, model_name, disk_bytes, split=split,
                                field_name=field_name or None)
        return self._launch("patching", key, options, settings, disk_bytes, session)

    def start_series(self, key: str, folder: str | Path, settings: SeriesSettings, *, dtype: str = "fp32",
                     name: str | None = None, disk_bytes: int = 0, session: str | None = None) -> Job:
        """Start (or go on with) the measures of a series of checkpoints ``key`` (:mod:`attnviz.corpus.series`;
        ``folder`` the series folder, checked by the caller as a server folder) in a process of its own, through the
        server's queue, like :meth:`start`."""
        options = SeriesOptions(folder=str(folder), db=str(self.database(key)), name=name or None, dtype=dtype,
                                threads=_threads(), progress_file=str(self.progress_file(key)),
                                stop_file=str(self.stop_file(key)), disk_limit=int(disk_bytes), quiet=True)
        return self._launch("series", key, options, settings, disk_bytes, session, reads=str(folder))

    def _options(self, key: str, corpus: str, model_folder: str | Path, dtype: str, model_name: str | None,
                 disk_bytes: int, **reading) -> RunOptions:
        """A page's job as the command line would be told it: quiet, its progress and stop files beside its
        database, half the cores, and its files bounded by what was reserved for them."""
        return RunOptions(corpus=corpus, model=str(model_folder), out=str(self.database(key)), name=model_name or None,
                          dtype=dtype, threads=_threads(), progress_file=str(self.progress_file(key)),
                          stop_file=str(self.stop_file(key)), disk_limit=int(disk_bytes), quiet=True, **reading)

    def _launch(self, kind: str, key: str, options, settings, disk_bytes: int, session: str | None,
                reads: str | None = None) -> Job:
        """The job ``(kind, key, settings)`` queued: its settings file is written beside its database once the
        queue takes it, and its process is told nothing else."""
        written = disk.written_bytes(self.folder, key)  # a resumed job's files are on disk already
        needed = max(0, int(disk_bytes) - written)

        def reserve() -> str | None:  # once the queue takes the job, before it can start
            write_settings_file(self.settings_file(key), kind, options, settings)
            if needed:
                reservation = self.reserve(needed, key, f"this {'scan' if kind == 'scan' else 'run'}")
            self.progress_file(key).unlink(missing_ok=True)  # what it says belongs to this start, not an earlier
            self.stop_file(key).unlink(missing_ok=True)
            return str(reservation.entry) if needed else None

        job = self._queue().submit(folder=self.folder, key=key, kind=kind,
                                   command=job_command(kind, self.settings_file(key)),
                                   corpus=options.corpus if reads is None else reads,
                                   log=self.folder / f"{key}.log", owner=str(self.owner), session=session,
                                   reserve=reserve)
        self.bound(keep=key)
        return job

    def stop(self, key: str) -> None:
        """A waiting job leaves the queue; a running one is asked to stop after its current chunk (it keeps what it
        did; starting it again resumes it)."""
        if not self._queue().cancel(self.folder, key):
            self.stop_file(key).touch()

    def kill(self) -> None:
        """End the running job now (a stop that takes too long); its last committed chunk is kept."""
        self._queue().kill(self.folder)

    # -- kept scans ----------------------------------------------------------------------------------------------
    def scans(self) -> list[Path]:
        """This folder's scan databases, newest first (the running one included)."""
        # a name starting with "." is a scan's database being rewritten (attnviz.corpus.scan.disk.rewrite_compactly):
        # not a scan yet
        found = [path for path in self.folder.glob("*.duckdb")
                 if not path.name.startswith(".") and path.is_file() and not path.is_symlink()]
        return sorted(found, key=_modified, reverse=True)

    def bound(self, keep: str | None = None) -> None:
        """Delete the oldest scans beyond MAX_SCANS - 1 (room for one more), never ``keep`` or the job's."""
        running = self.job()
        protected = {keep, running.key if running else None}
        for path in self.scans()[MAX_SCANS - 1:]:
            if path.stem not in protected:
                self.delete(path.stem)

    def delete(self, key: str) -> None:
        """A scan's files deleted (never its job's: stop it first)."""
        running = self.job()
        if running is not None and running.key == key:
            raise RuntimeError("stop the scan before deleting it")
        for leftover in self.folder.glob(f"{key}.*"):
            leftover.unlink(missing_ok=True)
        projections = self.projections(self.database(key), key)
        for leftover in projections.parent.glob(f"{projections.name}*"):
            leftover.unlink(missing_ok=True)

    def corpora(self) -> list[Path]:
        """The uploaded corpora kept here, newest first."""
        found = [path for path in self.folder.iterdir() if path.suffix in FORMATS and path.is_file()
                 and not path.name.startswith(".") and not path.is_symlink()]
        return sorted(found, key=_modified, reverse=True)

    def keep_corpus(self, data: bytes, name: str, in_use: set[str] = frozenset()) -> Path:
        """An uploaded corpus saved under its own name's letters and its content's hash (the same file twice is
        kept once; nothing of the name but letters, digits, ``-`` and ``_`` reaches the path). Its bytes are
        reserved before they are written; the oldest of more than :data:`MAX_CORPORA` goes, unless ``in_use``
        (paths a job reads)."""
        suffix = format_of(name)
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(name).stem).strip("_-")[:40] or "corpus"
        path = self.folder / f"{stem}-{hashlib.sha256(data).hexdigest()[:12]}{suffix}"
        if path.exists():
            os.utime(path)
            return path
        for old in self.corpora()[MAX_CORPORA - 1:]:
            if str(old) not in in_use:
                old.unlink(missing_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        with self.reserve(len(data), scratch.name, "this corpus"):
            scratch.write_bytes(data)
            scratch.replace(path)
        return path

    def reserve(self, size: int, part: str, what: str, where: Path | None = None) -> disk.Reservation:
        """Room for ``size`` bytes that the files ``part`` (:func:`attnviz.checkpoints.disk.is_part`) in ``where`` (this
        folder, or one inside this browser's) may take, counted with every upload and within what one browser may
        keep; refused with the numbers (``what`` names it)."""
        return disk.reserve(where or self.folder, size, counted_with_uploads(), part=part, owner=self.owner,
                            owner_limit=browser_limit_bytes(), what=what)

    def projections(self, scan: str | Path, key: str) -> Path:
        """Where the Queries and keys page keeps the projections this browser makes of the scan at ``scan`` (its
        file, any scan's, the server's included: they are never written into the scan's own file) whose settings
        name it ``key``. The file's name is a hash of both: nothing a scan's file says reaches a path."""
        folder = self.folder / PROJECTIONS
        folder.mkdir(mode=0o700, exist_ok=True)
        name = hashlib.sha256(f"{Path(scan).resolve()}\0{key}".encode()).hexdigest()[:32]
        return folder / f"{name}.duckdb"


def _threads() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


PROJECTIONS = "projections"


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # gone since it was listed (renamed over by a rewrite, deleted)
        return 0.0


def server_scans() -> list[Path]:
    """Scans made on the command line and put in ``ATTNVIZ_SCAN_ROOT``: its ``.duckdb`` files, no links, nothing
    outside it. None when it is not set."""
    root = os.environ.get(SCAN_ROOT_VARIABLE, "").strip()
    if not root or not Path(root).is_dir():
        return []
    resolved = Path(root).resolve()
    found = []
    for path in Path(root).iterdir():
        if path.suffix == ".duckdb" and path.is_file() and not path.is_symlink() and \
                path.resolve().parent == resolved:
            found.append(path)
    return sorted(found)


def corpus_argument(corpus: str | Path | None) -> str:
    """What the command line is given for a corpus: ``bundled``, or the kept file's path."""
    return BUNDLED if corpus is None else str(corpus)
