"""Refuse anything in a checkpoint that could run code, fill the disk, or escape its folder.

Nothing here unpickles (no .bin/.pt/.pkl weights), nothing allows ``trust_remote_code``, and a zip is extracted
member by member with checks on paths, links, member count and the bytes actually written.
"""

from __future__ import annotations

import json
import stat
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

STREAMLIT_CONFIG = Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml"


def _configured_upload_bytes() -> int:
    """The upload limit, set in one place: ``server.maxUploadSize`` of .streamlit/config.toml (Streamlit's
    megabytes are MiB). Streamlit refuses larger uploads itself; attnviz checks the same number."""
    with open(STREAMLIT_CONFIG, "rb") as config:
        return int(tomllib.load(config)["server"]["maxUploadSize"]) * 1024**2


MAX_UPLOAD_BYTES = _configured_upload_bytes()
MAX_EXTRACTED_BYTES = 2 * MAX_UPLOAD_BYTES  # safetensors hardly compress: a zip unpacks to about its own size
MAX_MEMBERS = 200
MAX_CONFIG_BYTES = 1024**2

MAX_NAME_BYTES = 255  # a file name longer than this cannot be created on common file systems
MAX_TOKENIZER_BYTES = 64 * 1024**2  # a tokenizer file larger than this is not read (a large real one is ~20 MB)

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy"}
ARCHIVE_SUFFIXES = {".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar"}
CODE_SUFFIXES = {".py", ".pyc", ".so", ".sh", ".ipynb"}
ALLOWED_SUFFIXES = {".json", ".safetensors", ".txt", ".model", ".md", ".jinja", ".tiktoken"}


class CheckpointRefused(ValueError):
    """A checkpoint (or upload) that attnviz will not load; the message says why and what to do."""


@dataclass
class ExtractionReport:
    root: Path
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name (why)"


def _member_is_link(info: zipfile.ZipInfo) -> bool:
    mode = info.external_attr >> 16
    return stat.S_ISLNK(mode)


def name_problem(name: str) -> str | None:
    """Why a file name cannot be used as it is (control characters, or too long for a file system), or None."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "its name has control characters"
    if any(len(part.encode("utf-8")) > MAX_NAME_BYTES for part in name.replace("\\", "/").split("/")):
        return f"its name is longer than {MAX_NAME_BYTES} bytes"
    return None


def _safe_member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise CheckpointRefused(f"the zip holds an absolute path ({name!r}); refusing it")
    if ".." in path.parts:
        raise CheckpointRefused(f"the zip holds a path that climbs out of its folder ({name!r}); refusing it")
    return path


def extract_zip(
    source, destination: Path, *, max_bytes: int = MAX_EXTRACTED_BYTES, max_members: int = MAX_MEMBERS
) -> ExtractionReport:
    """Extract a checkpoint zip (path or file object) into ``destination``, member by member.

    Refuses absolute or climbing paths, symlinks, more than ``max_members`` members and more than ``max_bytes``
    written in total (counted while writing, so a lying header cannot fool it). Pickle files, code and unknown
    file types are not extracted; each skip is reported with its reason.
    """
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    report = ExtractionReport(root=destination)
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError) as problem:
        raise CheckpointRefused(f"this file is not a readable zip archive ({problem})") from None
    with archive:
        members = archive.infolist()
        if len(members) > max_members:
            raise CheckpointRefused(
                f"the zip has {len(members)} entries; a checkpoint needs far fewer (limit {max_members})"
            )
        written = 0
        for info in members:
            path = _safe_member_path(info.filename)
            if _member_is_link(info):
                raise CheckpointRefused(f"the zip holds a symbolic link ({info.filename!r}); refusing it")
            if info.is_dir():
                continue
            if any(part.startswith("__MACOSX") for part in path.parts) or path.name.startswith("._"):
                continue
            problem = name_problem(info.filename)
            if problem:
                report.skipped.append(f"{info.filename.encode('unicode_escape').decode()[:80]} ({problem})")
                continue
            suffix = path.suffix.lower()
            if suffix in ARCHIVE_SUFFIXES:
                report.skipped.append(f"{info.filename} (an archive inside the archive: not opened)")
                continue
            if suffix in PICKLE_SUFFIXES:
                report.skipped.append(f"{info.filename} (pickle format: never loaded, it could run code)")
                continue
            if suffix in CODE_SUFFIXES:
                report.skipped.append(f"{info.filename} (code: never run)")
                continue
            if suffix not in ALLOWED_SUFFIXES:
                report.skipped.append(f"{info.filename} (not a file type a checkpoint needs)")
                continue
            target = destination.joinpath(*path.parts)
            if destination.resolve() not in target.resolve().parents:
                raise CheckpointRefused(f"the zip member {info.filename!r} would land outside its folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as member, open(target, "wb") as out:
                while chunk := member.read(1024 * 1024):
                    written += len(chunk)
                    if written > max_bytes:
                        raise CheckpointRefused(
                            f"the zip unpacks to more than {max_bytes / 1024**3:.1f} GiB (a zip bomb, or a model too "
                            "large for this app); refusing it"
                        )
                    out.write(chunk)
            report.files.append(str(path))
    return report


def find_model_folder(root: Path) -> Path:
    """The folder under ``root`` that holds ``config.json`` (a zip often wraps the model in one folder)."""
    root = Path(root)
    if (root / "config.json").is_file():
        return root
    candidates = sorted(p.parent for p in root.rglob("config.json") if p.is_file())
    if not candidates:
        raise CheckpointRefused("no config.json found: a Hugging Face model folder needs one")
    if len(candidates) > 1:
        names = ", ".join(str(c.relative_to(root)) for c in candidates[:4])
        raise CheckpointRefused(f"several config.json files found ({names}); upload one model at a time")
    return candidates[0]


def read_config(folder: Path) -> dict:
    """config.json as a dict, refused if it is broken, too large, or asks to run custom code."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointRefused("no config.json found: a Hugging Face model folder needs one")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointRefused("config.json is larger than 1 MiB; that is not a model config")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise CheckpointRefused(f"config.json is not valid JSON ({problem})") from None
    if not isinstance(config, dict):
        raise CheckpointRefused("config.json must hold a JSON object")
    if "auto_map" in config:
        raise CheckpointRefused(
            "config.json has an 'auto_map': this model needs its own Python code (trust_remote_code). attnviz never "
            "runs code from a checkpoint; use an architecture that transformers ships"
        )
    if "model_type" not in config:
        raise CheckpointRefused("config.json has no 'model_type', so the architecture is unknown")
    return config


def check_weights(folder: Path) -> list[Path]:
    """The ``*.safetensors`` files of a model folder; refuses a folder whose weights are only pickles."""
    folder = Path(folder)
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointRefused(
            f"the weights are in pickle format ({', '.join(pickles[:3])}), which can run code when loaded; attnviz "
            "never unpickles. Convert them with `model.save_pretrained(dir, safe_serialization=True)`"
        )
    raise CheckpointRefused("no *.safetensors weights found next to config.json")
