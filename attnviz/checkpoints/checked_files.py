"""The files of a model folder as attnviz checks them: plain names that stay in their folder, regular files (a
link only where :class:`LinkRule` allows), and JSON read within a size bound checked before reading. The checks
of the weights, the config and the tokenizer (:mod:`attnviz.checkpoints.weight_files`,
:mod:`attnviz.checkpoints.config_numbers`, :mod:`attnviz.checkpoints.tokenizer_files`) and of the whole folder
(:mod:`attnviz.checkpoints.preflight`) build on these."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from attnviz.checkpoints.safety import MAX_NAME_BYTES, CheckpointRefused

MiB = 1024**2

SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"

# What a config's dtype (or an index's metadata) may name: transformers looks the name up on the torch module.
DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto"}


@dataclass(frozen=True)
class LinkRule:
    """Where a link inside a model folder may point. Uploads hold plain files only (``allowed=False``); a folder
    on the server may hold links (Hugging Face's cache is made of them) that resolve inside ``root``
    (``ATTNVIZ_MODEL_ROOT``), or anywhere when the server has no root (one local user)."""

    allowed: bool
    root: Path | None = None
    forbidden: tuple[Path, ...] = ()  # never into these (everyone's uploads), wherever the root is


@dataclass
class CheckedFile:
    name: str  # its plain name inside the folder
    real: Path  # the regular file it is (a link's target)
    size: int
    replacement: bytes | None = None  # what the view holds instead (a tokenizer config with path keys left out)


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name that stays in its folder (None if it is)."""
    if not isinstance(name, str) or not name:
        return "it is not a file name"
    if "/" in name or "\\" in name or name in (".", "..") or (len(name) > 1 and name[1] == ":"):
        return "it names a path, not a file of the model's folder"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "it has control characters"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"it is longer than {MAX_NAME_BYTES} bytes"
    return None


def shown(name: object, limit: int = 60) -> str:
    """A name from a checkpoint, safe to print (control characters escaped, shortened)."""
    text = str(name).encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def regular_file(folder: Path, name: str, links: LinkRule) -> CheckedFile | None:
    """The plain file ``name`` in ``folder`` (None if there is none); refused if it is anything but a regular
    file, or a link that :class:`LinkRule` does not allow. Never blocks: a FIFO or a device is seen by
    ``lstat``/``stat``, not opened."""
    problem = plain_name_problem(name)
    if problem:
        raise CheckpointRefused(f"the file name {shown(name)!r} cannot be used: {problem}")
    path = folder / name
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as failure:
        raise CheckpointRefused(f"{shown(name)} cannot be read ({failure.strerror})") from None
    real = path
    if stat.S_ISLNK(info.st_mode):
        if not links.allowed:
            raise CheckpointRefused(f"{shown(name)} is a link; an uploaded checkpoint holds plain files only")
        real = Path(os.path.realpath(path))
        if links.root is not None and real != links.root and links.root not in real.parents:
            raise CheckpointRefused(f"{shown(name)} is a link that points outside {links.root}; files are read from "
                                    "inside that folder only")
        if any(real == place or place in real.parents for place in links.forbidden):
            raise CheckpointRefused(f"{shown(name)} is a link into the uploads of this server; uploaded models open "
                                    "only in the browser that added them")
        try:
            info = os.stat(real)
        except OSError:
            return None  # a dangling link: as if the file were not there
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointRefused(f"{shown(name)} is not a regular file (a folder, a device or a pipe)")
    return CheckedFile(name, real, info.st_size)


def read_json(checked: CheckedFile, limit: int, what: str | None = None):
    """A checked file as JSON, refused if it is larger than ``limit`` (checked before reading), not UTF-8 JSON,
    or nested too deeply for Python's parser."""
    what = what or checked.name
    if checked.size > limit:
        raise CheckpointRefused(f"{what} is {checked.size / MiB:.1f} MiB; more than {limit / MiB:g} MiB is not a "
                                "file a checkpoint needs")
    try:
        with open(checked.real, "rb") as file:
            data = file.read(limit + 1)
        if len(data) > limit:
            raise CheckpointRefused(f"{what} grew past {limit / MiB:g} MiB while it was read")
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as problem:
        raise CheckpointRefused(f"{what} is not valid JSON ({str(problem)[:100]})") from None
    except RecursionError:
        raise CheckpointRefused(f"{what} is nested too deeply to be a real file") from None
    except OSError as failure:
        raise CheckpointRefused(f"{what} cannot be read ({failure.strerror})") from None


def whole_number(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
