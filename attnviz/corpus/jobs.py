"""Background jobs, server-wide: every scan, corpus importance run and corpus patching run that a page starts is a
process of its own, and at most :func:`job_limit` of them run at once, all browsers together (``ATTNVIZ_JOBS``; by
default the machine's cores). The rest wait in one queue, first come first served, each with its place shown; at most
:func:`waiting_limit` wait at once (``ATTNVIZ_JOBS_WAITING``), past which a start is refused in words.

Each browser has at most one job (scan or run) waiting or running, and so has each session: a client that sends no
cookie gets a new browser key per session, never more than one job per session. The check and the queueing happen
under one file lock (:meth:`JobQueue._locked`), so sessions asking at once cannot pass a limit together.

The queue is one JSON file in a private folder (``ATTNVIZ_JOBS_DIR``, else ``attnviz-jobs-<uid>`` in the temporary
folder). Whoever looks at it (a page every second while a job of its own is shown, the server's janitor every
second or two) moves it on (:meth:`JobQueue.tick`): jobs whose process ended leave it, and their disk reservation
(:func:`attnviz.checkpoints.disk.reserve`) is released; a job whose folder has gone (its browser's store expired, its
session ended) is ended, its process group killed; waiting jobs start while fewer than the limit run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from attnviz.checkpoints.disk import private_folder
from attnviz.system.runtime import child_environment

JOBS_VARIABLE = "ATTNVIZ_JOBS"
WAITING_VARIABLE = "ATTNVIZ_JOBS_WAITING"
DIR_VARIABLE = "ATTNVIZ_JOBS_DIR"
QUEUE_FILE = "queue.json"
RUNNING, WAITING = "running", "waiting"
_CHILDREN: dict[int, subprocess.Popen] = {}  # the processes this server started: polled, so none stays a zombie


class JobRefused(RuntimeError):
    """A job cannot start or wait now (one of this browser's already does, the queue is full); says why."""

    in_words = True  # its message is for people (attnviz.ui.messages.problem_text)


def job_limit() -> int:
    """How many jobs run at once on this server (``ATTNVIZ_JOBS``; default: the cores, at least 1)."""
    try:
        return max(1, int(os.environ.get(JOBS_VARIABLE, "") or (os.cpu_count() or 1)))
    except ValueError:
        return max(1, os.cpu_count() or 1)


def waiting_limit() -> int:
    """How many jobs may wait at once (``ATTNVIZ_JOBS_WAITING``, 16)."""
    try:
        return max(0, int(os.environ.get(WAITING_VARIABLE, "16")))
    except ValueError:
        return 16


def jobs_root() -> Path:
    root = Path(os.environ.get(DIR_VARIABLE) or Path(tempfile.gettempdir()) / f"attnviz-jobs-{os.getuid()}")
    checked = private_folder(root)
    if checked is None:
        raise JobRefused("this server cannot run background jobs safely (its folder for them is a link, or belongs "
                         "to another account); ask its operator")
    return checked


@dataclass(frozen=True)
class Job:
    key: str  # the scan's (or run's) key: its files are <key>.duckdb, <key>.progress.json, ...
    pid: int  # 0 while it waits
    started: float  # when it started running (while it waits: when it was queued)
    state: str = RUNNING  # RUNNING or WAITING
    place: int = 0  # while it waits: 1 = the next to run
    kind: str = "scan"
    running: int = 0  # jobs running on the server, all browsers together (while it waits)
    limit: int = 1
    corpus: str = ""  # what it reads: a kept corpus file's path, "bundled" or "scan:FILE"

    @property
    def waiting(self) -> bool:
        return self.state == WAITING


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells it apart from a later process
    that got the same id; None where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start_time: str | None) -> bool:
    if pid <= 0:  # never started (0 would name this process's own group)
        return False
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a child of this process that ended stays a zombie until reaped
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    except ChildProcessError:
        pass
    return start_time is None or _start_time(pid) in (None, start_time)


def _end(entry: dict) -> None:
    """Kill a running job's process group (the job and anything it started)."""
    if entry.get("pid") and _alive(entry["pid"], entry.get("start_time")):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry["pid"], signal.SIGTERM)


def _release(entry: dict) -> None:
    if entry.get("reservation"):
        Path(entry["reservation"]).unlink(missing_ok=True)


def _hand_over(reservation: Path, pid: int) -> str:
    """A disk reservation (``<pid>-<token>-<bytes>``, :func:`attnviz.checkpoints.disk.reserve`) renamed to the job's
    process, so that it is released when that process ends, whoever else lives or dies."""
    _, token, size = reservation.name.split("-")
    target = reservation.with_name(f"{pid}-{token}-{size}")
    try:
        reservation.replace(target)
        return str(target)
    except OSError:
        return str(reservation)


def _inside(path: str, folder: Path) -> bool:
    return Path(path) == folder or folder in Path(path).parents


class JobQueue:
    """The server's jobs: waiting and running, all browsers together."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else jobs_root()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self):
        """The queue's entries, read and (when changed in place) written back, under one lock across threads,
        sessions and processes."""
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    entries = json.loads((self.root / QUEUE_FILE).read_text())
                    entries = [entry for entry in entries if isinstance(entry, dict)]
                except (OSError, ValueError):
                    entries = []
                before = json.dumps(entries)
                try:
                    yield entries
                finally:  # a step that refuses after moving the queue on (a process started) is still written
                    if json.dumps(entries) != before:
                        scratch = self.root / f".{QUEUE_FILE}.{os.getpid()}"
                        scratch.write_text(json.dumps(entries))
                        scratch.replace(self.root / QUEUE_FILE)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- asking ----------------------------------------------------------------------------------------------------
    def submit(self, *, folder: Path, key: str, kind: str, command: list[str], log: Path, owner: str,
               session: str | None = None, reserve=None, corpus: str = "") -> Job:
        """Queue a job (it starts at once when fewer than the limit run); ``corpus``: what it reads (a kept corpus
        file is not deleted while a job reads it). Refused in words when this owner (a
        browser) or this session has a job waiting or running, or when the queue is full. ``reserve``: called
        under the lock once the job may queue (before anything starts), returns the path of its disk reservation
        (or raises to refuse: nothing is queued then)."""
        with self._locked() as entries:
            self._move_on(entries)
            for entry in entries:
                if entry["owner"] == owner or (session is not None and entry.get("session") == session):
                    what = {"scan": "scan", "patching": "patching run", "series": "series' measures"}.get(
                        entry["kind"], "importance run")
                    doing = "running" if entry["state"] == RUNNING else "waiting"
                    raise JobRefused(f"a {what} of this browser is {doing} already: one job at a time per browser. "
                                     "Wait for it, or stop it")
            waiting = sum(entry["state"] == WAITING for entry in entries)
            running = len(entries) - waiting
            if running >= job_limit() and waiting >= waiting_limit():
                raise JobRefused(f"this server runs {running} job{'s' if running != 1 else ''} and {waiting} wait, "
                                 "the most it queues: try again in a while")
            reservation = reserve() if reserve is not None else None
            entries.append({"id": secrets.token_hex(8), "folder": str(folder), "key": key, "kind": kind,
                            "command": command, "corpus": corpus, "log": str(log),
                            "owner": owner, "session": session, "state": WAITING, "pid": 0, "start_time": None,
                            "queued": time.time(), "started": None, "reservation": reservation})
            self._move_on(entries)
        return self.job_of(folder)

    def job_of(self, folder: str | Path) -> Job | None:
        """The job of ``folder`` (waiting or running), or None. Moves the queue on first."""
        folder = str(folder)
        with self._locked() as entries:
            self._move_on(entries)
            running = sum(entry["state"] == RUNNING for entry in entries)
            place = 0
            for entry in entries:
                if entry["state"] == WAITING:
                    place += 1
                if entry["folder"] == folder:
                    waiting = entry["state"] == WAITING
                    return Job(entry["key"], entry["pid"], entry["started"] or entry["queued"], entry["state"],
                               place if waiting else 0, entry["kind"], running, job_limit(),
                               entry.get("corpus", ""))
        return None

    def counts(self) -> tuple[int, int]:
        """(running, waiting), all browsers together."""
        with self._locked() as entries:
            self._move_on(entries)
            waiting = sum(entry["state"] == WAITING for entry in entries)
            return len(entries) - waiting, waiting

    def tick(self) -> None:
        """Move the queue on: forget ended jobs, end orphaned ones, start waiting ones while there is room."""
        with self._locked() as entries:
            self._move_on(entries)

    # -- changing --------------------------------------------------------------------------------------------------
    def cancel(self, folder: str | Path, key: str) -> bool:
        """A waiting job leaves the queue (True); a running one is left alone (False: ask it to stop)."""
        with self._locked() as entries:
            for entry in list(entries):
                if entry["folder"] == str(folder) and entry["key"] == key and entry["state"] == WAITING:
                    entries.remove(entry)
                    _release(entry)
                    return True
        return False

    def kill(self, folder: str | Path) -> None:
        """End the running job of ``folder`` now (its last committed chunk is kept)."""
        with self._locked() as entries:
            for entry in entries:
                if entry["folder"] == str(folder) and entry["state"] == RUNNING:
                    _end(entry)

    def end_under(self, folder: str | Path) -> int:
        """End every job whose folder is ``folder`` or inside it (a browser's store or a session's folder about to
        be deleted): waiting ones leave the queue, running ones are killed. Returns how many."""
        folder = Path(folder)
        ended = 0
        with self._locked() as entries:
            for entry in list(entries):
                if _inside(entry["folder"], folder):
                    _end(entry)
                    _release(entry)
                    entries.remove(entry)
                    ended += 1
            self._move_on(entries)
        return ended

    def _move_on(self, entries: list[dict]) -> None:
        for entry in list(entries):
            gone = not Path(entry["folder"]).is_dir()
            if entry["state"] == RUNNING and (gone or not _alive(entry["pid"], entry.get("start_time"))):
                if gone:
                    _end(entry)
                _release(entry)
                entries.remove(entry)
            elif entry["state"] == WAITING and gone:
                _release(entry)
                entries.remove(entry)
        running = sum(entry["state"] == RUNNING for entry in entries)
        for entry in entries:
            if running >= job_limit():
                break
            if entry["state"] == WAITING:
                self._launch(entry)
                running += 1

    def _launch(self, entry: dict) -> None:
        try:
            with open(entry["log"], "w") as log:
                process = subprocess.Popen(entry["command"], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                           env=child_environment(),
                                           start_new_session=True)  # its own group: a page rerun leaves it
        except OSError as problem:  # the folder went, or the command cannot start: the job ends here
            with contextlib.suppress(OSError):
                Path(entry["log"]).write_text(f"the job could not start: {problem}")
            entry.update(state=RUNNING, pid=0)
            return
        _CHILDREN[process.pid] = process
        entry.update(state=RUNNING, pid=process.pid, start_time=_start_time(process.pid), started=time.time())
        if entry.get("reservation"):  # the job holds its own disk reservation now: it outlives a server restart
            entry["reservation"] = _hand_over(Path(entry["reservation"]), process.pid)


_QUEUES: dict[str, JobQueue] = {}


def server_queue() -> JobQueue:
    """This server's queue (one per jobs folder)."""
    root = jobs_root()
    if str(root) not in _QUEUES:
        _QUEUES[str(root)] = JobQueue(root)
    return _QUEUES[str(root)]
