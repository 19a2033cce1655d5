"""The disk that uploads take on the server, all browsers together, accounted for atomically.

Every upload is written into a workspace inside one private folder, :func:`uploads_root`; kept models live in the
keep root (:mod:`attnviz.checkpoints.keep`). Before an upload writes anything it reserves the most it may write
(:func:`reserve`); the check "what is on disk + what others have reserved + this <= the limit" and the
reservation happen under one lock (:func:`locked`: a file lock, so it holds across threads and processes), and so
do the moves of uploads into the keep root. Three browsers uploading at once, with room for one, get one upload
and two refusals.

``ATTNVIZ_UPLOADS_GB`` (40 by default) bounds everything uploads occupy at once: kept, with their session only,
and being written. ``ATTNVIZ_KEEP_GB`` (:mod:`attnviz.checkpoints.keep`) bounds the kept share of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import secrets
import tempfile
from pathlib import Path

from attnviz.checkpoints.safety import CheckpointRefused

LIMIT_VARIABLE = "ATTNVIZ_UPLOADS_GB"
DEFAULT_LIMIT_GB = 40.0
WORKSPACE_PREFIX = "attnviz-upload-"  # one upload's folder (a model folder inside it)
RESERVATIONS = ".reservations"


def uploads_limit_bytes() -> int:
    try:
        return int(max(0.0, float(os.environ.get(LIMIT_VARIABLE, DEFAULT_LIMIT_GB))) * 1024**3)
    except ValueError:
        return int(DEFAULT_LIMIT_GB * 1024**3)


def uploads_root() -> Path:
    """The private folder every upload's workspace is made in (``attnviz-uploads-<uid>`` in the system's temporary
    folder). Refused (no uploads on this server) if it is a link, belongs to another account or others may write
    to it: in a shared /tmp another account could have made it first."""
    root = _checked(str(Path(tempfile.gettempdir()) / f"attnviz-uploads-{os.getuid()}"))
    if root is None or not root.is_dir():
        _checked.cache_clear()
        root = _checked(str(Path(tempfile.gettempdir()) / f"attnviz-uploads-{os.getuid()}"))
    if root is None:
        raise CheckpointRefused("this server cannot store uploads safely (its folder for them in the temporary "
                                "directory is a link, or belongs to another account); ask its operator")
    return root


def private_folder(path: Path, forbidden_mode: int = 0o077) -> Path | None:
    """``path`` as a folder of this account's, created 0700 if need be; None if it is a link, belongs to another
    account, or has any of ``forbidden_mode``'s permission bits (in a shared /tmp another account could have made
    it first, to read or plant files)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if os.path.islink(path) or not os.path.isdir(path) or info.st_uid != os.getuid() or info.st_mode & forbidden_mode:
        return None
    return path


@functools.lru_cache(maxsize=8)
def _checked(path: str) -> Path | None:
    return private_folder(Path(path))


def new_workspace() -> Path:
    """A private folder for one upload, inside :func:`uploads_root` (so that its bytes are counted)."""
    return Path(tempfile.mkdtemp(prefix=WORKSPACE_PREFIX, dir=uploads_root()))


@contextlib.contextmanager
def locked():
    """One change of what uploads occupy at a time, across threads, sessions and processes."""
    with open(uploads_root() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under ``folder`` (links not followed)."""
    total = 0
    for directory, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            total += info.st_size if not os.path.islink(os.path.join(directory, name)) else 0
    return total


def _entries(root: Path) -> list[tuple[Path, int, dict]]:
    """The live reservations: (entry, bytes, what it reserves for: its workspace, and the file-name part and owner
    it is for, if any). Entries of processes that died are removed."""
    found = []
    folder = root / RESERVATIONS
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        try:
            pid, _token, size = entry.name.split("-")
            text = entry.read_text()
            facts = json.loads(text) if text.startswith("{") else {"workspace": text}
        except (ValueError, OSError):
            continue
        if not _alive(int(pid)):
            entry.unlink(missing_ok=True)  # a process that died mid-upload
            continue
        found.append((entry, int(size), facts))
    return found


def is_part(name: str, part: str) -> bool:
    """Whether a file named ``name`` belongs to ``part``: ``part`` itself, ``part.<anything>`` (a scan's database,
    log and progress; a database's write-ahead log) or ``.part.<anything>`` (the copy a scan is compacted into)."""
    return name == part or name.startswith(f"{part}.") or name.startswith(f".{part}.")


def written_bytes(workspace: Path, part: str | None = None) -> int:
    """What a reservation's holder has written so far: its workspace's files, or, with ``part``, those of its files
    that belong to ``part`` (:func:`is_part`: a scan's key, a file's name)."""
    if part is None:
        return folder_bytes(workspace) if workspace.is_dir() else 0
    total = 0
    try:
        for path in workspace.iterdir():
            if is_part(path.name, part) and not path.is_symlink() and path.is_file():
                total += path.stat().st_size
    except OSError:
        pass
    return total


def _pending(root: Path, owner: str | None = None) -> int:
    """What live reservations (of ``owner`` only, if given) may still write: each one's bytes less what it has
    written already."""
    pending = 0
    for _entry, size, facts in _entries(root):
        if owner is not None and facts.get("owner") != owner:
            continue
        pending += max(0, size - written_bytes(Path(facts["workspace"]), facts.get("part")))
    return pending


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_use(also: list[Path] = ()) -> int:
    """Bytes uploads occupy or have reserved: the uploads root, the folders in ``also`` (the keep root), and
    what reservations may still write. Call inside :func:`locked` for a number that stays true."""
    root = uploads_root()
    return folder_bytes(root) + sum(folder_bytes(p) for p in also if p.is_dir()) + _pending(root)


class Reservation:
    """Room for one upload: ``size`` bytes it may write into ``workspace``. Release it once the files are
    written (they are counted on disk from then on)."""

    def __init__(self, entry: Path, size: int):
        self.entry, self.size = entry, size

    def release(self) -> None:
        self.entry.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def reserve(workspace: Path, size: int, also: list[Path] = (), *, part: str | None = None,
            owner: Path | None = None, owner_limit: int | None = None, what: str = "this upload") -> Reservation:
    """Reserve ``size`` bytes for what is written into ``workspace`` (only its files whose name holds ``part``,
    when given), or refuse with the numbers when everything uploads, corpora and scans occupy would pass
    :func:`uploads_limit_bytes`, or when ``owner`` (a browser's folder of scans and corpora) would pass
    ``owner_limit`` with what it holds and has reserved. ``what`` names it in a refusal."""
    limit = uploads_limit_bytes()
    with locked():
        used = in_use(also)
        if used + size > limit:
            raise CheckpointRefused(
                f"this server's space for uploads is full ({used / 1024**3:.2f} of {limit / 1024**3:g} GiB in use by "
                f"everyone's models, corpora and scans; {what} needs up to {_amount(size)}). Remove a model or a scan "
                "you added, or try again later")
        if owner is not None and owner_limit is not None:
            mine = (folder_bytes(owner) if owner.is_dir() else 0) + _pending(uploads_root(), str(owner))
            if mine + size > owner_limit:
                raise CheckpointRefused(
                    f"this browser's corpora, scans and runs take {_amount(mine)} of the {_amount(owner_limit)} one "
                    f"browser may keep on this server, and {what} needs up to {_amount(size)} more. Delete a scan "
                    "or a kept corpus, or ask for fewer documents")
        folder = uploads_root() / RESERVATIONS
        folder.mkdir(mode=0o700, exist_ok=True)
        entry = folder / f"{os.getpid()}-{secrets.token_hex(6)}-{int(size)}"
        entry.write_text(json.dumps({"workspace": str(workspace), "part": part,
                                     "owner": None if owner is None else str(owner)}))
    return Reservation(entry, size)


def _amount(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB" if size >= 1024**3 else f"{size / 1024**2:,.1f} MB"
