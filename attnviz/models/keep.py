"""Models a browser added, kept on the server for a while, so that a reload of that browser brings them back.

A browser is known by a random key in a cookie (:data:`COOKIE`: 256 bits from :mod:`secrets`, never in a URL).
The server keeps only the key's SHA-256, as the name of the browser's folder under the keep root: a folder name
gives nobody the key, and no name or path a user chose can select another browser's folder. Each browser folder
holds its uploads (moved there once they have loaded) and ``models.json``, one entry per model: the name it is
shown under, ``upload`` or ``folder`` (a folder on the server, used in place and never deleted), where it is and
the dtype it was loaded in.

Bounds: a browser keeps at most :data:`MAX_KEPT_MODELS` models (the per-session limit), and the keep root as a
whole at most ``ATTNVIZ_KEEP_GB`` (20 by default): an upload that would pass it stays with its session only, and
the page says so. A browser folder unused for ``ATTNVIZ_KEEP_HOURS`` (24 by default) expires and is deleted by
:func:`sweep_expired`; ``ATTNVIZ_KEEP_HOURS=0`` switches keeping off (uploads then go with their session).
"""

from __future__ import annotations

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

COOKIE = "attnviz_browser"
KEY_PATTERN = re.compile(r"^[A-Za-z0-9_-]{43}$")  # what secrets.token_urlsafe(32) makes
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
    """Where kept models live (``ATTNVIZ_KEEP_DIR``, else a folder in the system's temporary directory)."""
    return Path(os.environ.get("ATTNVIZ_KEEP_DIR") or Path(tempfile.gettempdir()) / "attnviz-kept")


def new_key() -> str:
    return secrets.token_urlsafe(32)


def valid_key(key: object) -> bool:
    return isinstance(key, str) and bool(KEY_PATTERN.match(key))


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file() and not path.is_symlink())


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

    # -- reading ---------------------------------------------------------------------------------------------
    def _read(self) -> list[KeptModel]:
        try:
            entries = json.loads((self.folder / MANIFEST).read_text())
            return [KeptModel(**{k: entry[k] for k in ("name", "kind", "folder", "dtype", "added")})
                    for entry in entries[:MAX_KEPT_MODELS]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _write(self, models: list[KeptModel]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        scratch = self.folder / f".{MANIFEST}.{secrets.token_hex(4)}"
        scratch.write_text(json.dumps([asdict(model) for model in models]))
        scratch.replace(self.folder / MANIFEST)  # atomic: a reader never sees half a file

    def path_of(self, model: KeptModel) -> Path:
        return self.folder / model.folder if model.kind == "upload" else Path(model.folder)

    def models(self) -> list[tuple[KeptModel, Path]]:
        """The kept models whose files are still there, with their folders; marks the browser as seen now."""
        found = [(model, self.path_of(model)) for model in self._read()]
        present = [(model, path) for model, path in found if (path / "config.json").is_file()]
        if len(present) != len(found):
            self._write([model for model, _ in present])
        if self.folder.is_dir():
            self.touch()
        return present

    def touch(self) -> None:
        """A visit: the browser's models expire ``keep_hours()`` after the last one."""
        if self.folder.is_dir():
            os.utime(self.folder)

    # -- changing --------------------------------------------------------------------------------------------
    def adopt_upload(self, folder: Path) -> Path | None:
        """Move an upload (``folder``, inside its temporary workspace) into this browser's folder before it is
        loaded; returns its new path, or None if it cannot be kept (this browser holds :data:`MAX_KEPT_MODELS`
        already, or the keep root would pass its limit). Record it with :meth:`record` once it has loaded."""
        if len(self._read()) >= MAX_KEPT_MODELS:
            return None
        if root_bytes(self.root) + folder_bytes(folder) > keep_limit_bytes():
            return None
        workspace = folder.parent  # attnviz-upload-XXXX/<name>: the whole workspace moves
        target = self.folder / UPLOADS / workspace.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(workspace), str(target))
        return target / folder.name

    def record(self, name: str, kind: str, folder: Path, dtype: str) -> bool:
        """Add a loaded model to this browser's list (an upload adopted here, or a server folder)."""
        models = [model for model in self._read() if model.name != name]
        if len(models) >= MAX_KEPT_MODELS:
            return False
        where = str(Path(folder).relative_to(self.folder)) if kind == "upload" else str(folder)
        models.append(KeptModel(name, kind, where, dtype, time.time()))
        self._write(models)
        return True

    def keep_upload(self, name: str, folder: Path, dtype: str) -> Path | None:
        """:meth:`adopt_upload` and :meth:`record` in one step."""
        moved = self.adopt_upload(folder)
        if moved is not None:
            self.record(name, "upload", moved, dtype)
        return moved

    def keep_folder(self, name: str, folder: Path, dtype: str) -> bool:
        return self.record(name, "folder", folder, dtype)

    def forget(self, name: str) -> None:
        """Remove a model from this browser; an upload's files are deleted."""
        models = self._read()
        for model in models:
            if model.name == name and model.kind == "upload":
                upload = self.path_of(model)
                workspace = upload.parent if upload.parent.parent == self.folder / UPLOADS else upload
                shutil.rmtree(workspace, ignore_errors=True)
        self._write([model for model in models if model.name != name])

    def holds(self, folder: str | Path) -> bool:
        """Whether a path lies inside this browser's folder (its files are deleted by this store, not the session)."""
        return Path(folder).resolve().is_relative_to(self.folder.resolve())


def root_bytes(root: Path | None = None) -> int:
    root = Path(root or keep_root())
    return folder_bytes(root) if root.is_dir() else 0


def sweep_expired(root: Path | None = None, hours: float | None = None, now: float | None = None) -> list[Path]:
    """Delete every browser folder not visited for ``hours``; returns what was deleted."""
    root = Path(root or keep_root())
    hours = keep_hours() if hours is None else hours
    now = time.time() if now is None else now
    removed = []
    if not root.is_dir():
        return removed
    for folder in root.iterdir():
        if folder.is_dir() and not folder.is_symlink() and now - folder.stat().st_mtime > hours * 3600:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
