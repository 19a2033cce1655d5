"""Turn what a person uploads or types into a model folder on disk, refusing anything unsafe.

Each ``prepare_*`` returns ``(folder, owned, notes)``: the folder to load, whether it is a temporary folder of
ours (deleted when the model is removed), and notes for the page (for example the files that were skipped).

An upload is written into a workspace of its own (:func:`attnviz.checkpoints.disk.new_workspace`), after reserving the
most it may write against the server's limit for all uploads (:func:`attnviz.checkpoints.disk.reserve`), and only
the files a model needs are written: ``config.json``, the weights transformers will read (``model.safetensors``,
or the shards the index names), the tokenizer's files and the generation and image-processor configs, each
within its size bound (:mod:`attnviz.checkpoints.preflight`). Everything else is skipped, and the notes say so.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import shutil
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from attnviz.checkpoints import disk, preflight
from attnviz.checkpoints.keep import counted_with_uploads
from attnviz.checkpoints.preflight import CONFIG, SINGLE_WEIGHTS, WEIGHTS_INDEX, LinkRule, shown
from attnviz.checkpoints.safety import (
    ARCHIVE_SUFFIXES,
    CODE_SUFFIXES,
    MAX_EXTRACTED_BYTES,
    MAX_MEMBERS,
    MAX_UPLOAD_BYTES,
    PICKLE_SUFFIXES,
    CheckpointRefused,
)

MODEL_ROOT_VARIABLE = "ATTNVIZ_MODEL_ROOT"  # folders typed on the Checkpoints page must lie inside this one

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# A zip of safetensors hardly compresses (bf16 weights: 10-20%); one that unpacks to far more than its own size is
# a bomb, or mostly zeros. It may unpack to this many times its size, and at least this much.
MAX_EXPANSION = 8
REQUIRED_BOUNDED = {CONFIG, WEIGHTS_INDEX}  # too large, and the upload is refused (others are left out)
MIN_EXTRACTED_ALLOWANCE = 512 * 1024**2


# ---------------------------------------------------------------------------------------------------------------
# Which files a model needs


def bounded_names() -> dict[str, int]:
    """Every file a model folder may need besides its weights, with its size bound."""
    return {**preflight.CONFIG_LIMITS, **preflight.IMAGE_PROCESSOR_FILES, **preflight.TOKENIZER_LIMITS}


def size_bound(name: str) -> int | None:
    """The most bytes ``name`` may have (None: a weights file, bounded by the upload's total only)."""
    if name.endswith(".tiktoken"):
        return preflight.TIKTOKEN_LIMIT
    return bounded_names().get(name)


def needed_names(names: set[str], read_index) -> tuple[set[str], list[str]]:
    """Of the plain ``names`` in a model folder, those a model needs, and notes on what it leaves out.
    ``read_index()`` gives the index's JSON (called only for a sharded checkpoint)."""
    needed = {name for name in names if name in bounded_names() or name.endswith(".tiktoken")}
    needed.discard(WEIGHTS_INDEX)
    notes = []
    if SINGLE_WEIGHTS in names:
        needed.add(SINGLE_WEIGHTS)
    elif WEIGHTS_INDEX in names:
        weight_map = preflight.check_index(read_index())
        shards = set(weight_map.values())
        missing = sorted(shards - names)
        if missing:
            raise CheckpointRefused(f"{WEIGHTS_INDEX} names the shard {shown(missing[0])}, which is not in the upload")
        needed |= shards | {WEIGHTS_INDEX}
    unused = sorted(name for name in names if name.endswith(".safetensors") and name not in needed)
    if unused:
        notes.append(f"Not used (the weights transformers reads are {SINGLE_WEIGHTS} or the shards of "
                     f"{WEIGHTS_INDEX}): {', '.join(shown(n) for n in unused[:4])}" + (" …" if len(unused) > 4 else ""))
    return needed, notes


def _skip_reason(name: str) -> str:
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return "pickle format: never loaded, it could run code"
    if suffix in CODE_SUFFIXES:
        return "code: never run"
    if suffix in ARCHIVE_SUFFIXES:
        return "an archive inside the archive: not opened"
    return "not a file the model needs"


def _model_name(filename: str) -> str:
    stem = Path(filename).name
    for suffix in (".zip", ".safetensors"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    return SAFE_NAME.sub("-", stem).strip("-._")[:60] or "uploaded-model"


def _check_size(size: int, what: str) -> None:
    if size > MAX_UPLOAD_BYTES:
        raise CheckpointRefused(f"{what} is {size / 1024**2:.0f} MiB; the limit is {MAX_UPLOAD_BYTES // 1024**2} MiB")
    if size == 0:
        raise CheckpointRefused(f"{what} is empty")


def _workspace() -> Path:
    """A private folder for one upload, counted against the server's limit; removed when the model is removed,
    and at the latest when the app exits."""
    workspace = disk.new_workspace()
    atexit.register(shutil.rmtree, workspace, ignore_errors=True)
    return workspace


def _skipped_note(skipped: list[str]) -> list[str]:
    return [f"Skipped {len(skipped)} file(s): " + "; ".join(skipped[:6]) + (" …" if len(skipped) > 6 else "")] \
        if skipped else []


# ---------------------------------------------------------------------------------------------------------------
# Zips


@dataclass
class ExtractionReport:
    root: Path
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "name (why)"
    notes: list[str] = field(default_factory=list)


def _member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise CheckpointRefused(f"the zip holds an absolute path ({shown(name)!r}); refusing it")
    if ".." in path.parts:
        raise CheckpointRefused(f"the zip holds a path that climbs out of its folder ({shown(name)!r}); refusing it")
    return path


def _is_link(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    if info.file_size > limit:
        raise CheckpointRefused(f"{shown(info.filename)} is larger than {limit / 1024**2:g} MiB")
    with archive.open(info) as member:
        data = member.read(limit + 1)
    if len(data) > limit:
        raise CheckpointRefused(f"{shown(info.filename)} unpacks to more than {limit / 1024**2:g} MiB")
    return data


def _zip_problem(problem: BaseException) -> CheckpointRefused:
    """What a damaged or unusual zip raised while it was read, said to the user."""
    if isinstance(problem, CheckpointRefused):
        return problem
    if isinstance(problem, RuntimeError) and "encrypt" in str(problem).lower():
        return CheckpointRefused("the zip is encrypted; upload an unencrypted zip")
    if isinstance(problem, NotImplementedError):
        return CheckpointRefused(f"the zip uses a compression method this server cannot read ({str(problem)[:80]}); "
                                 "zip it again with the standard one (deflate)")
    if isinstance(problem, (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, ValueError)):
        return CheckpointRefused(f"the zip is damaged ({str(problem)[:100] or type(problem).__name__}); "
                                 "make it again")
    if isinstance(problem, OSError):
        return CheckpointRefused(f"the zip could not be unpacked on this server ({problem.strerror or problem})")
    return CheckpointRefused(f"the zip could not be read ({type(problem).__name__})")


def extract_zip(source, destination: Path, *, max_bytes: int = MAX_EXTRACTED_BYTES,
                max_members: int = MAX_MEMBERS, reserve=None) -> ExtractionReport:
    """Extract the model of a checkpoint zip (path or file object) into ``destination``, as plain files.

    The model's folder is the one that holds ``config.json`` (at the top, or inside one wrapper folder or more);
    of its files only those a model needs are written (:func:`needed_names`), each within its size bound, and
    at most ``max_bytes`` in total. ``reserve(n)`` (a context manager; :func:`attnviz.checkpoints.disk.reserve`) is
    called with the bytes the needed files declare before anything is written, and writing stops at that number
    (counted while writing, so a lying header cannot fool it). Refuses absolute or
    climbing paths, links, repeated names, more than ``max_members`` entries, and damaged, encrypted or
    unusually compressed zips with a message; every file left out is reported with its reason.
    """
    destination = Path(destination)
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as problem:
        raise CheckpointRefused(f"this file is not a readable zip archive ({str(problem)[:100]})") from None
    try:
        with archive:
            return _extract(archive, destination, max_bytes, max_members, reserve or _no_reservation)
    except Exception as problem:  # noqa: BLE001 - whatever a crafted zip raises becomes a refusal
        raise _zip_problem(problem) from None


@contextlib.contextmanager
def _no_reservation(size: int):
    yield


def _extract(archive: zipfile.ZipFile, destination: Path, max_bytes: int, max_members: int,
             reserve) -> ExtractionReport:
    report = ExtractionReport(root=destination)
    files = _member_files(archive, max_members)
    usable = _usable_in_model_folder(files, report)
    chosen = _chosen_members(archive, usable, report)
    declared = sum(info.file_size for _, info in chosen)
    if declared > max_bytes:
        raise CheckpointRefused(
            f"the zip unpacks to {declared / 1024**3:.2f} GiB, more than {max_bytes / 1024**3:.2f} GiB for a zip of "
            "its size (a zip bomb, or a model too large for this app); refusing it")
    destination.mkdir(parents=True, exist_ok=True)
    with reserve(declared):
        _write_members(archive, chosen, destination, declared)
    report.files.extend(name for name, _ in chosen)
    return report


def _member_files(archive: zipfile.ZipFile, max_members: int) -> dict[PurePosixPath, zipfile.ZipInfo]:
    """The zip's files by their checked path: no links, no repeated names; folders and macOS's metadata skipped."""
    members = archive.infolist()
    if len(members) > max_members:
        raise CheckpointRefused(f"the zip has {len(members)} entries; a checkpoint needs far fewer "
                                f"(limit {max_members})")
    files: dict[PurePosixPath, zipfile.ZipInfo] = {}
    for info in members:
        path = _member_path(info.filename)
        if _is_link(info):
            raise CheckpointRefused(f"the zip holds a symbolic link ({shown(info.filename)!r}); refusing it")
        if info.is_dir() or any(part.startswith("__MACOSX") for part in path.parts) or path.name.startswith("._"):
            continue
        if path in files:
            raise CheckpointRefused(f"the zip holds {shown(info.filename)!r} twice; refusing it")
        files[path] = info
    return files


def _usable_in_model_folder(files: dict[PurePosixPath, zipfile.ZipInfo],
                            report: ExtractionReport) -> dict[str, zipfile.ZipInfo]:
    """The files of the one folder that holds config.json, by name, if their names are plain; the rest are
    reported as skipped."""
    configs = sorted(path.parent for path in files if path.name == CONFIG)
    if not configs:
        raise CheckpointRefused("no config.json found: a Hugging Face model folder needs one")
    if len(configs) > 1:
        names = ", ".join(shown(str(c)) for c in configs[:4])
        raise CheckpointRefused(f"several config.json files found ({names}); upload one model at a time")
    model_folder = configs[0]
    report.skipped.extend(f"{shown(info.filename)} (outside the model's folder)"
                          for path, info in files.items() if path.parent != model_folder)
    usable = {}
    for path, info in files.items():
        if path.parent != model_folder:
            continue
        problem = preflight.plain_name_problem(path.name)
        if problem:
            report.skipped.append(f"{shown(info.filename, 80)} ({problem})")
        else:
            usable[path.name] = info
    return usable


def _chosen_members(archive: zipfile.ZipFile, usable: dict[str, zipfile.ZipInfo],
                    report: ExtractionReport) -> list[tuple[str, zipfile.ZipInfo]]:
    """The files a model needs (:func:`needed_names`), each within its size bound, in name order; the others are
    reported as skipped (a required file over its bound refuses the zip)."""
    def read_index():
        return json.loads(_read_member(archive, usable[WEIGHTS_INDEX], preflight.CONFIG_LIMITS[WEIGHTS_INDEX]))

    try:
        needed, report.notes = needed_names(set(usable), read_index)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CheckpointRefused(f"{WEIGHTS_INDEX} is not valid JSON") from None
    chosen = []
    for name, info in sorted(usable.items()):
        bound = size_bound(name)
        if name not in needed:
            report.skipped.append(f"{shown(info.filename)} ({_skip_reason(name)})")
        elif bound is not None and info.file_size > bound and name in REQUIRED_BOUNDED:
            raise CheckpointRefused(f"{name} is {info.file_size / 1024**2:.1f} MiB; more than {bound / 1024**2:g} MiB "
                                    "is not a file a checkpoint needs")
        elif bound is not None and info.file_size > bound:
            report.skipped.append(f"{shown(info.filename)} (larger than {bound / 1024**2:g} MiB: not a file a model "
                                  "needs at that size)")
        else:
            chosen.append((name, info))
    return chosen


def _write_members(archive: zipfile.ZipFile, chosen: list[tuple[str, zipfile.ZipInfo]], destination: Path,
                   declared: int) -> None:
    """Write the chosen files, counting the bytes as they come: more than their headers ``declared`` in all (a
    zip bomb's lying headers) stops the extraction."""
    written = 0
    for name, info in chosen:
        with archive.open(info) as member, open(destination / name, "xb") as out:
            while chunk := member.read(1024 * 1024):
                written += len(chunk)
                if written > declared:
                    raise CheckpointRefused("the zip unpacks to more than its entries say (a zip bomb); refusing it")
                out.write(chunk)


def prepare_zip(data, filename: str = "model.zip") -> tuple[Path, bool, list[str]]:
    """A zip of a model folder: ``data`` as bytes or a binary file object (an upload, read in place: a 2 GB
    upload is not copied once more in memory)."""
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    source.seek(0, io.SEEK_END)
    size = source.tell()
    _check_size(size, "the zip")
    source.seek(0)
    allowance = min(MAX_EXTRACTED_BYTES, max(MAX_EXPANSION * size, MIN_EXTRACTED_ALLOWANCE))
    workspace = _workspace()
    try:
        report = extract_zip(source, workspace / _model_name(filename), max_bytes=allowance,
                             reserve=lambda size: disk.reserve(workspace, size, counted_with_uploads()))
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    return report.root, True, _skipped_note(report.skipped) + report.notes


# ---------------------------------------------------------------------------------------------------------------
# Files uploaded one by one


def _size_of(data) -> int:
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    data.seek(0, io.SEEK_END)
    size = data.tell()
    data.seek(0)
    return size


def _read_small(data, limit: int, what: str) -> bytes:
    if _size_of(data) > limit:
        raise CheckpointRefused(f"{what} is larger than {limit / 1024**2:g} MiB")
    if isinstance(data, (bytes, bytearray)):
        return bytes(data)
    content = data.read()
    data.seek(0)
    return content


def prepare_single_files(files: list[tuple[str, object]]) -> tuple[Path, bool, list[str]]:
    """``.safetensors`` files (one, or the shards with their index) with ``config.json`` (and optional tokenizer
    files), uploaded together; each file as bytes or a binary file object, copied to disk without a second copy
    in memory. Names from the browser are reduced to their last part; only the files a model needs are written."""
    named: dict[str, object] = {}
    for name, data in files:
        base = name.replace("\\", "/").rsplit("/", 1)[-1]  # never a path from the browser
        problem = preflight.plain_name_problem(base)
        if problem:
            raise CheckpointRefused(f"a file cannot be used: {problem} ({shown(base)})")
        if base in named:
            raise CheckpointRefused(f"two files are named {shown(base)}; upload each file once")
        named[base] = data
    if CONFIG not in named:
        raise CheckpointRefused("config.json is missing: upload it together with the .safetensors file")
    weights = sorted(n for n in named if n.lower().endswith(".safetensors"))
    if not weights:
        raise CheckpointRefused("no .safetensors file among the uploaded files")
    _check_size(sum(_size_of(data) for data in named.values()), "the upload")
    index = _json_of(named[WEIGHTS_INDEX]) if WEIGHTS_INDEX in named else None  # read once
    renamed = {}
    if len(weights) == 1 and SINGLE_WEIGHTS not in named and weights[0] not in _shards_of(index):
        renamed[SINGLE_WEIGHTS] = weights[0]  # one weights file, however it is called, is the model's weights
        named[SINGLE_WEIGHTS] = named.pop(weights[0])
    elif len(weights) > 1 and SINGLE_WEIGHTS not in named and WEIGHTS_INDEX not in named:
        raise CheckpointRefused(f"{len(weights)} .safetensors files but no {WEIGHTS_INDEX} to say how they fit "
                                "together; add it (save_pretrained writes it beside the shards)")
    needed, notes = needed_names(set(named), lambda: index)
    skipped, written = [], []
    for name in sorted(named):
        bound = size_bound(name)
        if name not in needed:
            skipped.append(f"{shown(renamed.get(name, name))} ({_skip_reason(name)})")
        elif bound is not None and _size_of(named[name]) > bound and name in REQUIRED_BOUNDED:
            raise CheckpointRefused(f"{name} is {_size_of(named[name]) / 1024**2:.1f} MiB; more than "
                                    f"{bound / 1024**2:g} MiB is not a file a checkpoint needs")
        elif bound is not None and _size_of(named[name]) > bound:
            skipped.append(f"{shown(name)} (larger than {bound / 1024**2:g} MiB: not a file a model needs at that "
                           "size)")
        else:
            written.append(name)
    workspace = _workspace()
    try:
        with disk.reserve(workspace, sum(_size_of(named[name]) for name in written), counted_with_uploads()):
            folder = workspace / _model_name(renamed.get(SINGLE_WEIGHTS, weights[0]))
            folder.mkdir()
            for name in written:
                _write(named[name], folder / name)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    return folder, True, _skipped_note(skipped) + notes


def _shards_of(index: object) -> set[str]:
    """The shard names of an index (none if there is no index, or it is refused: needed_names says why)."""
    try:
        return set() if index is None else set(preflight.check_index(index).values())
    except CheckpointRefused:
        return set()


def _json_of(data) -> object:
    try:
        return json.loads(_read_small(data, preflight.CONFIG_LIMITS[WEIGHTS_INDEX], WEIGHTS_INDEX))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CheckpointRefused(f"{WEIGHTS_INDEX} is not valid JSON") from None


def _write(data, target: Path) -> None:
    with open(target, "xb") as out:
        if isinstance(data, (bytes, bytearray)):
            out.write(data)
        else:
            data.seek(0)
            shutil.copyfileobj(data, out, length=1024 * 1024)


# ---------------------------------------------------------------------------------------------------------------
# Folders on the server


def model_root() -> Path | None:
    """The folder that typed paths must lie in (``ATTNVIZ_MODEL_ROOT``), or None: any folder (a local user)."""
    root = os.environ.get(MODEL_ROOT_VARIABLE, "").strip()
    return Path(root).expanduser().resolve() if root else None


def _private_roots() -> list[Path]:
    """Where uploads live: every upload's workspace and the kept uploads (attnviz.checkpoints.keep)."""
    from attnviz.checkpoints.keep import keep_root

    return [Path(os.path.realpath(disk.uploads_root())), Path(os.path.realpath(keep_root()))]


def inside_uploads(folder: Path) -> bool:
    """Whether a path lies in an upload's workspace or in the folder of kept uploads."""
    resolved = Path(os.path.realpath(folder))
    return (any(resolved == root or root in resolved.parents for root in _private_roots())
            or any(part.startswith(disk.WORKSPACE_PREFIX) for part in resolved.parts))


def link_rule_for(folder: Path) -> LinkRule:
    """Uploads hold no links; a server folder's links must stay inside ``ATTNVIZ_MODEL_ROOT`` when it is set, and
    never lead into anyone's uploads."""
    if inside_uploads(folder):
        return LinkRule(allowed=False)
    return LinkRule(allowed=True, root=model_root(), forbidden=tuple(_private_roots()))


def prepare_folder_path(typed: str, root: Path | None = None) -> tuple[Path, bool, list[str]]:
    """A model folder on the server's disk, used in place (never modified or deleted).

    With a model ``root`` (default :func:`model_root`), the path must resolve, links followed, inside it; a path
    outside gets one message whether it exists or not, so the form cannot be used to probe the server's disk.
    """
    text = typed.strip().strip('"').strip("'")
    if not text:
        raise CheckpointRefused("type the path of a model folder")
    root = model_root() if root is None else root
    if "\0" in text or any(ord(ch) < 32 for ch in text):
        raise CheckpointRefused("a folder path cannot hold control characters" + (
            f"; folders are read from {root} on this server" if root else ""))
    folder = Path(text).expanduser()
    if root is not None:
        candidate = (root / folder) if not folder.is_absolute() else folder
        resolved = Path(os.path.realpath(candidate))  # links followed, whether or not the path exists
        if resolved != root and root not in resolved.parents:
            raise CheckpointRefused(f"folders are read from {root} on this server; give a path inside it")
        folder = resolved
    if inside_uploads(folder):
        raise CheckpointRefused("uploaded checkpoints open only in the session or browser that added them, "
                                "not by their path")
    try:
        if not folder.exists():
            raise CheckpointRefused(f"{shown(folder, 200)} does not exist on this server")
        if not folder.is_dir():
            raise CheckpointRefused(f"{shown(folder, 200)} is a file; give the folder that holds config.json")
        return folder.resolve(), False, []
    except OSError as problem:
        raise CheckpointRefused(f"{shown(folder, 200)} cannot be read ({problem.strerror})") from None
