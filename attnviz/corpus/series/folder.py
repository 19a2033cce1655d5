"""Finding and checking a series of checkpoints: a folder whose sub-folders are checkpoints, each named with its step,
laid out like Pythia's revisions (``step1000/``, ``step2000/``) or as trainers save them (``checkpoint-500/``,
``ckpt_step_1200/``, ``run-step=300/``). A step is the number after "step" in the folder's name, else its last
number (:func:`step_of`). Folders without a ``config.json`` (and names starting with ".") are passed over; a checkpoint
whose name has no number, two with the same step, more than :data:`MOST_CHECKPOINTS`, a link that leads out of the
series folder, a checkpoint that is not a decoder attnviz loads, and checkpoints of different shapes or vocabularies
are refused in words (:class:`SeriesRefused`). Every checkpoint is checked as any model folder is
(:func:`attnviz.checkpoints.preflight.inspect`: safetensors only, every file bounded, no code) before anything is
loaded (:func:`find_series`). The tokenizer may be in each checkpoint, or only in the series folder or the last
checkpoints: the series folder's is used first, else the latest step's, and every checkpoint's own must have the same
vocabulary (:func:`series_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.checkpoints import preflight
from attnviz.checkpoints.checked_files import CONFIG, CheckedFile, LinkRule, shown
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.checkpoints.uploads import link_rule_for
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.models.loading import architecture_of_config
from attnviz.models.text_tokenizers import TOKENIZER_FILES, tokenizer_of, tokenizer_problem

MOST_CHECKPOINTS = 200  # checkpoints in one series
MOST_ENTRIES = 10_000  # entries of the series folder looked at
MOST_STEP = 10**15
STEP_AFTER_WORD = re.compile(r"step\D{0,3}?(\d+)", re.IGNORECASE)
NUMBER = re.compile(r"\d+")


class SeriesRefused(ScanRefused):
    """A series that cannot be measured as asked (no checkpoint, two with one step, another shape...); says why."""


# -- finding the series ---------------------------------------------------------------------------------------------
def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name carries: the number after "step" (the last such), else the last number
    in it; None when it has none. ``checkpoint-500`` -> 500, ``ckpt_step_1200`` -> 1200, ``run-step=300`` -> 300,
    ``epoch2-step1500`` -> 1500."""
    found = STEP_AFTER_WORD.findall(name) or NUMBER.findall(name)
    return int(found[-1]) if found else None


SHAPE = {  # what checkpoints of one series must share, each read from the first name its config.json has
    "model type": ("model_type",),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "key/value heads": ("num_key_value_heads", "multi_query"),
    "width": ("hidden_size", "n_embd", "d_model"),
    "vocabulary": ("vocab_size",),
    "positions": ("n_positions", "max_position_embeddings", "max_seq_len", "seq_length"),
}


def shape_of(config: dict) -> dict:
    """The shape a checkpoint's config.json gives (:data:`SHAPE`; None where it names none)."""
    found = {}
    for what, names in SHAPE.items():
        found[what] = next((config[name] for name in names if name in config and config[name] is not None), None)
    return found


@dataclass(frozen=True)
class Checkpoint:
    """One checked checkpoint of a series."""

    step: int
    name: str  # its folder's name in the series folder
    folder: Path
    shape: dict
    fingerprint: str  # its config and weights: a run refuses to mix a changed checkpoint's measures with its own
    tokenizer: tuple[CheckedFile, ...] = ()  # its own tokenizer files (none: it has no vocabulary file)
    tokenizer_fingerprint: str | None = None


@dataclass
class Series:
    """A folder of checkpoints, checked: ascending by step, the tokenizer they are measured with, their shape."""

    root: Path
    checkpoints: list[Checkpoint]
    tokenizer: tuple[CheckedFile, ...]  # the tokenizer's files (the series folder's, or the latest step's)
    tokenizer_from: str  # "the series folder" or "step 1000 (step1000)"
    config: CheckedFile  # the last checkpoint's config.json (the tokenizer is read beside it)
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [checkpoint.step for checkpoint in self.checkpoints]

    @property
    def shape(self) -> dict:
        return self.checkpoints[-1].shape

    @property
    def layers(self) -> int:
        return int(self.shape["layers"])

    @property
    def heads(self) -> int:
        return int(self.shape["heads"])

    def describe(self) -> str:
        """The series in a line: how many checkpoints, which steps, the model's shape, where the tokenizer is."""
        steps = self.steps
        shape = self.shape
        return (f"{len(steps)} checkpoint{'s' if len(steps) != 1 else ''} (steps {steps[0]:,} to {steps[-1]:,}) of a "
                f"{shape['model type']} of {shape['layers']} layers x {shape['heads']} heads, width {shape['width']}, "
                f"vocabulary {shape['vocabulary']:,}; the tokenizer is {self.tokenizer_from}'s")


def files_fingerprint(files) -> str:
    """A fingerprint of checked files: their names and contents (a replaced tokenizer config's replacement)."""
    digest = hashlib.sha256()
    for checked in sorted(files, key=lambda item: item.name):
        digest.update(checked.name.encode() + b"\0")
        if checked.replacement is not None:
            digest.update(checked.replacement)
            continue
        with open(checked.real, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def checkpoint_fingerprint(checked: preflight.CheckedFolder) -> str:
    """What tells a checkpoint from another cheaply: its config.json and each weight file's name, size and first
    64 KB (the checked files only: nothing else of the folder is opened)."""
    digest = hashlib.sha256(json.dumps(checked.config, sort_keys=True).encode())
    for weights in checked.weights:
        digest.update(f"{weights.name}\0{weights.size}\0".encode())
        with open(weights.real, "rb") as handle:
            digest.update(handle.read(65_536))
    return digest.hexdigest()[:32]


def series_links(root: Path) -> LinkRule:
    """Links inside a series may lead anywhere inside the series folder (and, where the server has one, its model
    root), never into anyone's uploads; an upload holds none."""
    rule = link_rule_for(root)
    return LinkRule(allowed=rule.allowed, root=root, forbidden=rule.forbidden)


def _candidates(root: Path) -> list[tuple[str, Path]]:
    """The sub-folders of ``root`` that hold a config.json, as ``(name, folder)``; a link that leads out of the
    series folder is refused."""
    found = []
    try:
        entries = os.scandir(root)
    except OSError as problem:
        raise SeriesRefused(f"the folder cannot be read ({problem.strerror})") from None
    with entries:
        for count, entry in enumerate(entries):
            if count >= MOST_ENTRIES:
                raise SeriesRefused(f"the folder holds more than {MOST_ENTRIES:,} entries: give a folder of "
                                    "checkpoints")
            if entry.name.startswith("."):
                continue
            folder = Path(entry.path)
            try:
                if entry.is_symlink():
                    real = Path(os.path.realpath(folder))
                    if real == root:
                        continue
                    if root not in real.parents:
                        if folder.is_dir():  # a file's link is the tokenizer check's (links stay inside, too)
                            raise SeriesRefused(f"{shown(entry.name)} is a link that leads out of the series "
                                                "folder; every checkpoint must be inside it")
                        continue
                if not folder.is_dir() or not (folder / CONFIG).exists():
                    continue
            except OSError:
                continue
            found.append((entry.name, folder))
    return found


def find_series(folder: str | Path, *, most: int = MOST_CHECKPOINTS) -> Series:
    """The checked series in ``folder`` (see the module's docstring), or :class:`SeriesRefused` in words."""
    given = Path(folder)
    try:
        if not given.is_dir():
            raise SeriesRefused(f"{shown(given, 200)} is not a folder")
    except OSError:
        raise SeriesRefused(f"{shown(given, 200)} cannot be read") from None
    root = Path(os.path.realpath(given))
    candidates = _candidates(root)
    if not candidates:
        single = (root / CONFIG).exists()
        raise SeriesRefused(
            ("it is one checkpoint, not a series: give the folder that holds a folder per checkpoint" if single else
             "no checkpoint found in it: a series is a folder of checkpoint folders, each with its config.json and "
             "named with its step (step1000/, checkpoint-500/, ...)"))
    by_step: dict[int, str] = {}
    for name, _ in candidates:
        step = step_of(name)
        if step is None:
            raise SeriesRefused(f"{shown(name)} holds a checkpoint, but its name has no step number: name each "
                                "checkpoint's folder with its step (step1000, checkpoint-1000, ...)")
        if step > MOST_STEP:
            raise SeriesRefused(f"{shown(name)}: its step number is too large to be a step")
        if step in by_step:
            first, second = sorted((by_step[step], name))
            raise SeriesRefused(f"{shown(first)} and {shown(second)} both name step {step:,}: one checkpoint per "
                                "step")
        by_step[step] = name
    if len(by_step) > most:
        raise SeriesRefused(f"it holds {len(by_step):,} checkpoints; a series is measured on at most {most:,}: give "
                            "a folder with fewer (every few steps)")
    links = series_links(root)
    checkpoints, configs = [], {}
    for step in sorted(by_step):
        name = by_step[step]
        words = f"step {step:,} ({shown(name)})"
        try:
            checked = preflight.inspect(root / name, links)
            architecture = architecture_of_config(checked.config)
            if architecture != "decoder":
                raise SeriesRefused(f"{words} is an {architecture} ({shown(checked.config.get('model_type'))}): a "
                                    "series is measured on decoders (causal language models)")
            own = tuple(checked.tokenizer) if not checked.tokenizer_problem and any(
                checked.has(vocabulary) for vocabulary in TOKENIZER_FILES) else ()
            if checked.tokenizer_problem and any((root / name / vocabulary).exists() for vocabulary in TOKENIZER_FILES):
                raise SeriesRefused(f"{words}: {checked.tokenizer_problem}")
            checkpoint = Checkpoint(step, name, root / name, shape_of(checked.config), checkpoint_fingerprint(checked),
                                    own, files_fingerprint(own) if own else None)
        except CheckpointRefused as problem:
            raise SeriesRefused(f"{words} cannot be used: {str(problem).rstrip('.')}") from None
        except OSError as problem:
            raise SeriesRefused(f"{words} cannot be read ({problem.strerror})") from None
        if checkpoints:
            _check_same_shape(checkpoints[0], checkpoint)
        checkpoints.append(checkpoint)
        configs[step] = next(item for item in checked.others if item.name == CONFIG)
    tokenizer, tokenizer_from, notes = _series_tokenizer_files(root, links, checkpoints)
    return Series(root, checkpoints, tokenizer, tokenizer_from, configs[checkpoints[-1].step], notes)


def _check_same_shape(first: Checkpoint, other: Checkpoint) -> None:
    for what, value in first.shape.items():
        if other.shape[what] != value:
            raise SeriesRefused(f"step {other.step:,} ({shown(other.name)}) has {what} {shown(other.shape[what])}, "
                                f"step {first.step:,} ({shown(first.name)}) has {shown(value)}: the checkpoints of a "
                                "series share one architecture")


def _series_tokenizer_files(root: Path, links: LinkRule,
                            checkpoints: list[Checkpoint]) -> tuple[tuple[CheckedFile, ...], str, list[str]]:
    """The series folder's tokenizer files when it has a vocabulary file, else the latest step's that has one."""
    files, problem, notes = preflight.check_tokenizer(root, links)
    if problem and any((root / name).exists() for name in TOKENIZER_FILES):
        raise SeriesRefused(f"the series folder's tokenizer cannot be used: {problem}")
    if files and any(checked.name in TOKENIZER_FILES for checked in files):
        return tuple(files), "the series folder", notes
    for checkpoint in reversed(checkpoints):
        if checkpoint.tokenizer:
            return checkpoint.tokenizer, f"step {checkpoint.step:,} ({shown(checkpoint.name)})", []
    raise SeriesRefused("no tokenizer found: put the tokenizer's files (tokenizer.json, ...) in the series folder or "
                        "in a checkpoint's folder")


# -- the tokenizer and the probe ------------------------------------------------------------------------------------
def tokenizer_from_files(files, config: CheckedFile | None = None):
    """A tokenizer read from checked files only (a private view of them, beside a checkpoint's ``config``)."""
    checked = preflight.CheckedFolder(Path("."), {}, [], None, 0, 0, others=[config] if config else [],
                                      tokenizer=list(files))
    view = preflight.make_view(checked)
    try:
        return tokenizer_of(view)
    finally:
        preflight.remove_view(view)


def series_tokenizer(series: Series):
    """The series' tokenizer, checked against the checkpoints: its ids fit their vocabulary, and each checkpoint's
    own tokenizer (where it has one that differs) has the same vocabulary; refused in words, naming the step."""
    try:
        tokenizer = tokenizer_from_files(series.tokenizer, series.config)
    except Exception as problem:  # noqa: BLE001 - whatever transformers raises: this tokenizer cannot be read
        raise SeriesRefused(f"the tokenizer ({series.tokenizer_from}'s) cannot be read: "
                            f"{first_line(problem, 160)}") from None
    problem = tokenizer_problem(tokenizer, int(series.shape["vocabulary"] or 0))
    if problem:
        raise SeriesRefused(f"the tokenizer ({series.tokenizer_from}'s) does not fit the checkpoints: {problem}")
    reference = files_fingerprint(series.tokenizer)
    vocabulary = tokenizer.get_vocab()
    compared: dict[str, bool] = {reference: True}
    for checkpoint in series.checkpoints:
        fingerprint = checkpoint.tokenizer_fingerprint
        if fingerprint is None:
            continue
        if fingerprint not in compared:
            try:
                own = tokenizer_from_files(checkpoint.tokenizer, series.config).get_vocab()
            except Exception as failure:  # noqa: BLE001
                raise SeriesRefused(f"step {checkpoint.step:,} ({shown(checkpoint.name)}): its tokenizer cannot be "
                                    f"read ({first_line(failure, 160)})") from None
            compared[fingerprint] = own == vocabulary
        if not compared[fingerprint]:
            raise SeriesRefused(f"step {checkpoint.step:,} ({shown(checkpoint.name)}) has a tokenizer with another "
                                f"vocabulary than {series.tokenizer_from}'s: the checkpoints of a series are measured "
                                "on the same token ids")
    return tokenizer
