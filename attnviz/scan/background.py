"""Scans the page starts: each runs as ``python -m attnviz.scan`` in a process of its own (it goes on while the
page is left or reloaded, and a crash in it cannot take the server down), one at a time per scans folder (a
browser's), writing its progress to a JSON file beside its database and stopping, resumably, when a stop file
appears.

A scans folder holds, per scan ``<key>`` (:func:`attnviz.scan.runner.scan_key`): ``<key>.duckdb``,
``<key>.progress.json``, ``<key>.log`` and, while it runs, ``<key>.stop`` when asked to stop; ``job.json`` names the
running scan (its process id and key); uploaded corpora are kept as ``corpus-<sha256>.<format>``. At most
:data:`MAX_SCANS` scans are kept per folder: starting another deletes the oldest.

Scans made on the command line can be opened from ``ATTNVIZ_SCAN_ROOT``: the ``.duckdb`` files directly in that
folder (no links, nothing outside it), read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnviz.scan.corpus import BUNDLED, format_of
from attnviz.scan.runner import ScanSettings

MAX_SCANS = 6  # kept per scans folder (per browser); the oldest goes first


def max_page_documents() -> int:
    """The most documents a scan started from the page reads (``ATTNVIZ_SCAN_MAX_DOCS``, 20,000: about 3 GB of
    database for 128-token documents of a 6 x 12 model); the command line has no such bound."""
    try:
        return max(1, int(os.environ.get("ATTNVIZ_SCAN_MAX_DOCS", "20000")))
    except ValueError:
        return 20_000
JOB = "job.json"
SCAN_ROOT_VARIABLE = "ATTNVIZ_SCAN_ROOT"
REPOSITORY = Path(__file__).resolve().parents[2]  # where ``python -m attnviz.scan`` finds the package


@dataclass(frozen=True)
class Job:
    key: str
    pid: int
    started: float


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a finished child stays a zombie until reaped: reap it here (it is ours when it is a zombie of ours)
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:  # not our child (another server process started it): alive, as kill said
        return True


class ScanFolder:
    """The scans of one browser (or session): start, watch, stop, list, bound."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def database(self, key: str) -> Path:
        return self.folder / f"{key}.duckdb"

    def progress_file(self, key: str) -> Path:
        return self.folder / f"{key}.progress.json"

    def stop_file(self, key: str) -> Path:
        return self.folder / f"{key}.stop"

    # -- the running scan ----------------------------------------------------------------------------------------
    def job(self) -> Job | None:
        """The scan running now, or None (a job whose process has ended is forgotten here)."""
        try:
            entry = json.loads((self.folder / JOB).read_text())
            job = Job(str(entry["key"]), int(entry["pid"]), float(entry["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if _alive(job.pid):
            return job
        (self.folder / JOB).unlink(missing_ok=True)
        return None

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

    def start(self, key: str, corpus: str | Path, model_folder: str | Path, settings: ScanSettings, *,
              split: str = "line", field_name: str | None = None, dtype: str = "stored",
              model_name: str | None = None) -> Job:
        """Start the scan ``key`` (or resume it) in a process of its own. Refused while another scan of this
        folder runs."""
        command = [sys.executable, "-m", "attnviz.scan", str(corpus), "--model", str(model_folder), "--out",
                   str(self.database(key)), "--max-docs", str(settings.max_docs), "--max-tokens",
                   str(settings.max_tokens), "--chunk", str(settings.chunk_docs), "--qk-points",
                   str(settings.qk_points), "--split", split, "--dtype", dtype,
                   "--progress-file", str(self.progress_file(key)), "--stop-file", str(self.stop_file(key)),
                   "--quiet", "--threads", str(max(1, (os.cpu_count() or 2) // 2))]
        if field_name:
            command += ["--field", field_name]
        if model_name:
            command += ["--name", model_name]
        return self._launch(key, command)

    def start_importance(self, key: str, corpus: str, model_folder: str | Path, settings, *, dtype: str = "stored",
                         model_name: str | None = None) -> Job:
        """Start (or resume) a corpus importance run ``key`` (:mod:`attnviz.scan.importance`; ``corpus`` as its
        command line takes it) in a process of its own. Refused while another job of this folder runs."""
        command = [sys.executable, "-m", "attnviz.scan.importance", corpus, "--model", str(model_folder), "--out",
                   str(self.database(key)), "--max-docs", str(settings.max_docs), "--max-tokens",
                   str(settings.max_tokens), "--chunk", str(settings.chunk_docs), "--methods",
                   ",".join(settings.methods), "--dtype", dtype, "--progress-file", str(self.progress_file(key)),
                   "--stop-file", str(self.stop_file(key)), "--quiet",
                   "--threads", str(max(1, (os.cpu_count() or 2) // 2))]
        if model_name:
            command += ["--name", model_name]
        return self._launch(key, command)

    def _launch(self, key: str, command: list[str]) -> Job:
        running = self.job()
        if running is not None:
            raise RuntimeError("a job is already running here: wait for it, or stop it")
        self.bound(keep=key)
        self.stop_file(key).unlink(missing_ok=True)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPOSITORY), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(self.folder / f"{key}.log", "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=environment,
                                       start_new_session=True)  # its own process group: a page rerun leaves it
        job = Job(key, process.pid, time.time())
        scratch = self.folder / f".{JOB}.{os.getpid()}"
        scratch.write_text(json.dumps(job.__dict__))
        scratch.replace(self.folder / JOB)
        return job

    def stop(self, key: str) -> None:
        """Ask the running scan to stop after its current chunk (it keeps what it did; Scan resumes it)."""
        self.stop_file(key).touch()

    def kill(self) -> None:
        """End the running scan now (a stop that takes too long); its last committed chunk is kept."""
        job = self.job()
        if job is not None:
            try:
                os.killpg(job.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    # -- kept scans ----------------------------------------------------------------------------------------------
    def scans(self) -> list[Path]:
        """This folder's scan databases, newest first (the running one included)."""
        # a name starting with "." is a scan's database being rewritten (store.rewrite_compactly): not a scan yet
        found = [path for path in self.folder.glob("*.duckdb")
                 if not path.name.startswith(".") and path.is_file() and not path.is_symlink()]
        return sorted(found, key=_modified, reverse=True)

    def bound(self, keep: str | None = None) -> None:
        """Delete the oldest scans beyond MAX_SCANS - 1 (room for one more), never ``keep`` or the running one."""
        running = self.job()
        protected = {keep, running.key if running else None}
        for path in self.scans()[MAX_SCANS - 1:]:
            if path.stem not in protected:
                for leftover in self.folder.glob(f"{path.stem}.*"):
                    leftover.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        running = self.job()
        if running is not None and running.key == key:
            raise RuntimeError("stop the scan before deleting it")
        for leftover in self.folder.glob(f"{key}.*"):
            leftover.unlink(missing_ok=True)

    def keep_corpus(self, data: bytes, name: str) -> Path:
        """An uploaded corpus saved under its own name's letters and its content's hash (the same file twice is
        kept once; nothing of the name but letters, digits, ``-`` and ``_`` reaches the path)."""
        suffix = format_of(name)
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", Path(name).stem).strip("_-")[:40] or "corpus"
        path = self.folder / f"{stem}-{hashlib.sha256(data).hexdigest()[:12]}{suffix}"
        if not path.exists():
            scratch = path.with_name(f".{path.name}.{os.getpid()}")
            scratch.write_bytes(data)
            scratch.replace(path)
        return path


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
