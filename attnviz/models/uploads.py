"""Turn what a person uploads or types into a model folder on disk, refusing anything unsafe.

Each ``prepare_*`` returns ``(folder, owned, notes)``: the folder to load, whether it is a temporary folder of
ours (deleted when the model is removed), and notes for the page (for example the files that were skipped).
"""

from __future__ import annotations

import atexit
import io
import os
import re
import shutil
import tempfile
from pathlib import Path

from attnviz.models.safety import (
    ALLOWED_SUFFIXES,
    CODE_SUFFIXES,
    MAX_UPLOAD_BYTES,
    PICKLE_SUFFIXES,
    CheckpointRefused,
    extract_zip,
    find_model_folder,
    name_problem,
)

MODEL_ROOT_VARIABLE = "ATTNVIZ_MODEL_ROOT"  # folders typed on the Checkpoints page must lie inside this one

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _workspace() -> Path:
    """A temporary folder for one upload; removed when the model is removed, and at the latest when the app exits."""
    workspace = Path(tempfile.mkdtemp(prefix="attnviz-upload-"))
    atexit.register(shutil.rmtree, workspace, ignore_errors=True)
    return workspace


def _check_size(size: int, what: str) -> None:
    if size > MAX_UPLOAD_BYTES:
        raise CheckpointRefused(f"{what} is {size / 1024**2:.0f} MB; the limit is {MAX_UPLOAD_BYTES // 1024**2} MB")
    if size == 0:
        raise CheckpointRefused(f"{what} is empty")


def _model_name(filename: str) -> str:
    stem = Path(filename).name
    for suffix in (".zip", ".safetensors"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    return SAFE_NAME.sub("-", stem).strip("-._")[:60] or "uploaded-model"


def prepare_zip(data, filename: str = "model.zip") -> tuple[Path, bool, list[str]]:
    """A zip of a model folder: ``data`` as bytes or a binary file object (an upload, read in place: a 2 GB
    upload is not copied once more in memory)."""
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    source.seek(0, io.SEEK_END)
    _check_size(source.tell(), "the zip")
    source.seek(0)
    workspace = _workspace()
    try:
        report = extract_zip(source, workspace / "extracted")
        found = find_model_folder(report.root)
        folder = workspace / _model_name(filename)
        found.rename(folder)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    notes = [f"Skipped {len(report.skipped)} file(s): " + "; ".join(report.skipped[:6])] if report.skipped else []
    return folder, True, notes


def _size_of(data) -> int:
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    data.seek(0, io.SEEK_END)
    size = data.tell()
    data.seek(0)
    return size


def prepare_single_files(files: list[tuple[str, object]]) -> tuple[Path, bool, list[str]]:
    """``.safetensors`` files (one, or the shards with their index) with ``config.json`` (and optional tokenizer
    files), uploaded together; each file as bytes or a binary file object, copied to disk without a second copy
    in memory."""
    names = [Path(name).name for name, _ in files]
    if "config.json" not in names:
        raise CheckpointRefused("config.json is missing: upload it together with the .safetensors file")
    weights = [n for n in names if n.lower().endswith(".safetensors")]
    if not weights:
        raise CheckpointRefused("no .safetensors file among the uploaded files")
    _check_size(sum(_size_of(data) for _, data in files), "the upload")
    for base in names:  # never a path from the browser: base names only, checked before anything is written
        problem = name_problem(base)
        if problem:
            raise CheckpointRefused(f"a file cannot be used: {problem} ({base.encode('unicode_escape').decode()[:60]})")
    workspace = _workspace()
    try:
        folder = workspace / _model_name(weights[0])
        folder.mkdir()
        notes = _write_files(files, folder, single_weights=len(weights) == 1)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    return folder, True, notes


def _write_files(files: list[tuple[str, object]], folder: Path, *, single_weights: bool) -> list[str]:
    notes = []
    for name, data in files:
        base = Path(name).name
        suffix = Path(base).suffix.lower()
        if suffix in PICKLE_SUFFIXES or suffix in CODE_SUFFIXES or suffix not in ALLOWED_SUFFIXES:
            notes.append(f"Skipped {base}: not a file type a checkpoint needs (pickles and code are never loaded).")
            continue
        target = folder / ("model.safetensors" if suffix == ".safetensors" and single_weights else base)
        with open(target, "wb") as out:
            if isinstance(data, (bytes, bytearray)):
                out.write(data)
            else:
                shutil.copyfileobj(data, out, length=1024 * 1024)
    return notes


def model_root() -> Path | None:
    """The folder that typed paths must lie in (``ATTNVIZ_MODEL_ROOT``), or None: any folder (a local user)."""
    root = os.environ.get(MODEL_ROOT_VARIABLE, "").strip()
    return Path(root).expanduser().resolve() if root else None


def _inside_uploads(folder: Path) -> bool:
    """Whether a path lies in an upload's workspace or in the folder of kept uploads (attnviz.models.keep)."""
    from attnviz.models.keep import keep_root

    resolved = Path(os.path.realpath(folder))
    kept = Path(os.path.realpath(keep_root()))
    return (resolved == kept or kept in resolved.parents
            or any(part.startswith("attnviz-upload-") for part in resolved.parts))


def prepare_folder_path(typed: str, root: Path | None = None) -> tuple[Path, bool, list[str]]:
    """A model folder on the server's disk, used in place (never modified or deleted).

    With a model ``root`` (default :func:`model_root`), the path must resolve, links followed, inside it; a path
    outside gets one message whether it exists or not, so the form cannot be used to probe the server's disk.
    """
    text = typed.strip().strip('"').strip("'")
    if not text:
        raise CheckpointRefused("type the path of a model folder")
    root = model_root() if root is None else root
    folder = Path(text).expanduser()
    if root is not None:
        candidate = (root / folder) if not folder.is_absolute() else folder
        resolved = Path(os.path.realpath(candidate))  # links followed, whether or not the path exists
        if resolved != root and root not in resolved.parents:
            raise CheckpointRefused(f"folders are read from {root} on this server; give a path inside it")
        folder = resolved
    if _inside_uploads(folder):
        raise CheckpointRefused("uploaded checkpoints open only in the session or browser that added them, "
                                "not by their path")
    if not folder.exists():
        raise CheckpointRefused(f"{folder} does not exist on this server")
    if not folder.is_dir():
        raise CheckpointRefused(f"{folder} is a file; give the folder that holds config.json")
    return folder.resolve(), False, []
