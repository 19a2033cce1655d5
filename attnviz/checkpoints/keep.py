"""Models a browser added, kept on the server for a while, so that a reload of that browser brings them back.

A browser is known by a random key in a cookie (:data:`COOKIE`: 256 bits from :mod:`secrets`, never in a URL).
The server keeps only the key's SHA-256, as the name of the browser's folder under the keep root: a folder name
gives nobody the key, and no name or path a user chose can select another browser's folder. Each browser folder
holds its uploads (moved there once they have loaded) and ``models.json``, one entry per model: the name it is
shown under, ``upload`` or ``folder`` (a folder on the server, used in place and never deleted), where it is and
the dtype it was loaded in.

Bounds: a browser keeps at most :data:`MAX_KEPT_MODELS` models (the per-session limit), and the keep root as a
whole at most ``ATTNVIZ_KEEP_GB`` (20 by default): an upload that would pass it stays with its session only, and
the page says so. Kept or not, every upload counts against ``ATTNVIZ_UPLOADS_GB`` (:mod:`attnviz.checkpoints.disk`).
A browser folder unused for ``ATTNVIZ_KEEP_HOURS`` (24 by default) expires and is deleted by
:func:`sweep_expired`; ``ATTNVIZ_KEEP_HOURS=0`` switches keeping off (uploads then go with their session).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from attnviz.checkpoints import disk

COOKIE = "attnviz_browser"
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{43}")  # what secrets.token_urlsafe(32) makes (matched in full)
BROWSER_FOLDER = re.compile(r"[0-9a-f]{40}")  # a browser folder's name: the first 160 bits of its key's SHA-256
MARKER = ".attnviz-keep-root"  # the sweep deletes only inside a folder that says it is a keep root
MAX_KEPT_MODELS = 4
MANIFEST = "models.json"
UPLOADS = "uploads"


def keep_hours() -> float:
    """How long a browser's models are kept after its last visit (``ATTNVIZ_KEEP_HOURS``; 0 = not kept)."""
    try:
        return max(0.0, float(os.environ.get("ATTNVIZ_KEEP_HOURS", "24")))
    except ValueError:
        return 24.0


def keep_limit_bytes() -> int:
    """The most the keep root may hold on disk, all browsers together (``ATTNVIZ_KEEP_GB``)."""
    try:
        return int(float(os.environ.get("ATTNVIZ_KEEP_GB", "20")) * 1024**3)
    except ValueError:
        return 20 * 1024**3


def keep_root() -> Path:
    """Where kept models live: ``ATTNVIZ_KEEP_DIR``, else a folder of this user's in the system's temporary
    directory. It must be a folder of its own, private to the user that runs the app (:func:`usable_root`)."""
    return Path(os.environ.get("ATTNVIZ_KEEP_DIR") or Path(tempfile.gettempdir()) / f"attnviz-kept-{os.getuid()}")


def usable_root(root: Path | None = None) -> Path | None:
    """The keep root, created private (0700) if need be; None if it is not safe to use (see :func:`_checked_root`).
    Checked once per process and path (it is asked on every script run), again if the folder has gone since."""
    path = str(root or keep_root())
    checked = _checked_root(path)
    if checked is not None and not (checked / MARKER).is_file():  # removed (a temporary-folder cleaner): anew
        _checked_root.cache_clear()
        checked = _checked_root(path)
    return checked


@functools.lru_cache(maxsize=8)
def _checked_root(root: str) -> Path | None:
    """None for a link, or a folder someone else owns or others may write to (in a shared /tmp another account
    could have made it first)."""
    checked = disk.private_folder(Path(root), forbidden_mode=0o022)
    if checked is not None:
        (checked / MARKER).touch(exist_ok=True)
    return checked


def new_key() -> str:
    return secrets.token_urlsafe(32)


def valid_key(key: object) -> bool:
    return isinstance(key, str) and bool(KEY_PATTERN.fullmatch(key))


folder_bytes = disk.folder_bytes


def counted_with_uploads() -> list[Path]:
    """Where the bytes that count against ``ATTNVIZ_UPLOADS_GB`` lie besides the uploads' own folder: the keep root
    (kept models, and each browser's scans, corpora, runs, exports and projections)."""
    return [keep_root()]


@dataclass
class KeptModel:
    name: str
    kind: str  # "upload" (files in the browser folder) or "folder" (a folder on the server, used in place)
    folder: str  # an upload's: relative to the browser folder; a server folder's: its absolute path
    dtype: str = "stored"
    added: float = 0.0


class BrowserStore:
    """The kept models of one browser (one key)."""

    def __init__(self, key: str, root: Path | None = None):
        if not valid_key(key):
            raise ValueError("not a browser key")
        self.root = Path(root or keep_root())
        self.folder = self.root / hashlib.sha256(key.encode()).hexdigest()[:40]

    @classmethod
    def at(cls, folder: Path) -> BrowserStore:
        """The store of an existing browser folder (for the sweep, which has folders, not keys)."""
        store = cls.__new__(cls)
        store.root, store.folder = folder.parent, folder
        return store

    @contextlib.contextmanager
    def _locked(self):
        """One change of this browser's list at a time, across tabs, sessions and processes."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _safe(self, model: KeptModel) -> bool:
        """A manifest entry is trusted only as far as it points where this store would have put it."""
        if model.kind == "upload":
            where = Path(model.folder)
            if where.is_absolute() or ".." in where.parts:
                return False
            return (self.folder / where).resolve().is_relative_to((self.folder / UPLOADS).resolve())
        return model.kind == "folder" and Path(model.folder).is_absolute()

    # -- reading ---------------------------------------------------------------------------------------------
    def _read(self) -> list[KeptModel]:
        try:
            entries = json.loads((self.folder / MANIFEST).read_text())
            models = [KeptModel(**{k: entry[k] for k in ("name", "kind", "folder", "dtype", "added")})
                      for entry in entries[:MAX_KEPT_MODELS]]
            return [model for model in models if self._safe(model)]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _write(self, models: list[KeptModel]) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = self.folder / f".{MANIFEST}.{secrets.token_hex(4)}"
        scratch.write_text(json.dumps([asdict(model) for model in models]))
        scratch.replace(self.folder / MANIFEST)  # atomic: a reader never sees half a file

    def path_of(self, model: KeptModel) -> Path:
        return self.folder / model.folder if model.kind == "upload" else Path(model.folder)

    def models(self) -> list[tuple[KeptModel, Path]]:
        """The kept models whose files are still there, with their folders; marks the browser as seen now."""
        if not self.folder.is_dir():
            return []
        with self._locked():
            found = [(model, self.path_of(model)) for model in self._read()]
            present = [(model, path) for model, path in found if (path / "config.json").is_file()]
            if len(present) != len(found):
                self._write([model for model, _ in present])
        self.touch()
        return present

    def names(self) -> set[str]:
        return {model.name for model in self._read()}

    def touch(self) -> None:
        """A visit: the browser's models expire ``keep_hours()`` after the last one."""
        if self.folder.is_dir():
            os.utime(self.folder)

    # -- changing --------------------------------------------------------------------------------------------
    def adopt_upload(self, folder: Path) -> Path | None:
        """Move an upload (``folder``, inside its temporary workspace) into this browser's folder before it is
        loaded; returns its new path, or None if it cannot be kept (this browser holds :data:`MAX_KEPT_MODELS`
        already, or the keep root would pass its limit). Record it with :meth:`record` once it has loaded. The
        check and the move happen under the lock of everything uploads occupy (:func:`attnviz.checkpoints.disk.locked`),
        so that browsers adopting at once cannot together pass the limit."""
        with disk.locked():
            if len(self._read()) >= MAX_KEPT_MODELS:
                return None
            if root_bytes(self.root) + folder_bytes(folder) > keep_limit_bytes():
                return None
            workspace = folder.parent  # attnviz-upload-XXXX/<name>: the whole workspace moves
            target = self.folder / UPLOADS / workspace.name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.folder, 0o700)
            shutil.move(str(workspace), str(target))
            return target / folder.name

    def record(self, name: str, kind: str, folder: Path, dtype: str) -> bool:
        """Add a loaded model to this browser's list (an upload adopted here, or a server folder). Refused (False)
        when the list is full or already has this name (names are unique per browser: pick one with
        :meth:`names`)."""
        where = str(Path(folder).relative_to(self.folder)) if kind == "upload" else str(folder)
        with self._locked():
            models = self._read()
            if len(models) >= MAX_KEPT_MODELS or any(model.name == name for model in models):
                return False
            models.append(KeptModel(name, kind, where, dtype, time.time()))
            self._write(models)
        return True

    def forget(self, folder: str | Path) -> None:
        """Remove the model kept at ``folder`` from this browser (matched by where it is, not by its name, which
        another tab may show differently); an upload's files are deleted."""
        target = Path(folder).resolve()
        with self._locked():
            models = self._read()
            gone = [model for model in models if self.path_of(model).resolve() == target]
            for model in gone:
                if model.kind == "upload":
                    shutil.rmtree(self.path_of(model).parent, ignore_errors=True)  # uploads/<workspace>/<name>
            if gone:
                self._write([model for model in models if model not in gone])

    def holds(self, folder: str | Path) -> bool:
        """Whether a path lies inside this browser's folder (its files are deleted by this store, not the session)."""
        return Path(folder).resolve().is_relative_to(self.folder.resolve())


def _sweep_orphans(folder: Path, older_than: float) -> None:
    """Upload workspaces in a browser folder that no entry refers to (a crash between moving an upload in and
    recording it): deleted once they are older than ``older_than`` seconds."""
    store = BrowserStore.at(folder)
    referenced = {store.path_of(model).parent.resolve() for model in store._read() if model.kind == "upload"}
    uploads = folder / UPLOADS
    if not uploads.is_dir():
        return
    for workspace in uploads.iterdir():
        if workspace.resolve() not in referenced and time.time() - workspace.stat().st_mtime > older_than:
            shutil.rmtree(workspace, ignore_errors=True)


def root_bytes(root: Path | None = None) -> int:
    root = Path(root or keep_root())
    return folder_bytes(root) if root.is_dir() else 0


def sweep_expired(root: Path | None = None, hours: float | None = None, now: float | None = None,
                  before_delete=None) -> list[Path]:
    """Delete every browser folder not visited for ``hours``; returns what was deleted. Only folders named as
    this module names them, in a root that carries its marker: a keep root set to the wrong folder by mistake
    loses nothing. ``before_delete(folder)`` is called first (the janitor ends the folder's background jobs)."""
    root = Path(root or keep_root())
    hours = keep_hours() if hours is None else hours
    now = time.time() if now is None else now
    removed = []
    if not (root / MARKER).is_file() or root.is_symlink():
        return removed
    for folder in root.iterdir():
        if not BROWSER_FOLDER.fullmatch(folder.name) or not folder.is_dir() or folder.is_symlink():
            continue
        if now - folder.stat().st_mtime > hours * 3600:
            if before_delete is not None:
                before_delete(folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        else:
            _sweep_orphans(folder, older_than=3600)
    return removed
