"""A user's series of checkpoints measured over training: every checkpoint of a folder measured as the bundled tiny
GPT's own run is measured (:func:`attnviz.interventions.training_measures.measure` on one fixed
:class:`~attnviz.interventions.training_measures.Probe`), one checkpoint at a time, into DuckDB
(:mod:`attnviz.corpus.series.store`), resumable, and on Ray when asked (:mod:`attnviz.corpus.series.on_ray`) with the
same results.

The series (:func:`find_series`) is a folder whose sub-folders are checkpoints, each named with its step: laid out
like Pythia's revisions (``step1000/``, ``step2000/``) or as trainers save them (``checkpoint-500/``,
``ckpt_step_1200/``, ``run-step=300/``). A step is the number after "step" in the folder's name, else its last
number. Folders without a ``config.json`` (and names starting with ".") are passed over; a checkpoint whose name has
no number, two with the same step, more than :data:`MOST_CHECKPOINTS`, a link that leads out of the series folder,
a checkpoint that is not a decoder attnviz loads, and checkpoints of different shapes or vocabularies are refused in
words. Every checkpoint is checked as any model folder is (:func:`attnviz.checkpoints.preflight.inspect`: safetensors
only, every file bounded, no code) before anything is loaded. The tokenizer may be in each checkpoint, or only in the
series folder or the last checkpoints: the series folder's is used first, else the latest step's, and every
checkpoint's own must have the same vocabulary.

The probe (:func:`series_probe`): held-out text (by default the held-out Python documentation the bundled tiny GPT
was measured on; or a text file given) in windows of 128 tokens of the series' tokenizer, and random ordinary tokens
typed twice after the BOS where the tokenizer has one. The same probe measures every checkpoint; a run goes on only
with the probe it began with.

The run (:func:`run_series`) loads each checkpoint (:func:`load_step`), measures it and lets it go, and commits its
row before the next; a stop is asked between checkpoints, and a stopped run (or a series that gained checkpoints
since) goes on with the steps it lacks. The command line is :mod:`attnviz.corpus.series`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnviz.checkpoints import preflight
from attnviz.checkpoints.checked_files import CONFIG, CheckedFile, LinkRule, shown
from attnviz.checkpoints.safety import CheckpointRefused, first_line
from attnviz.checkpoints.uploads import link_rule_for
from attnviz.core.circuits import ordinary_token_ids
from attnviz.corpus.documents import Document
from attnviz.corpus.options import as_json, option
from attnviz.corpus.runner import ChunkWork, Documents, Measure, Progress, Stopped, report, run_chunks
from attnviz.corpus.scan.runner import ScanRefused
from attnviz.corpus.series import store as sstore
from attnviz.interventions import training_measures as tm
from attnviz.models.loading import architecture_of_config
from attnviz.models.text_tokenizers import TOKENIZER_FILES, tokenizer_of, tokenizer_problem

MOST_CHECKPOINTS = 200  # checkpoints in one series
MOST_ENTRIES = 10_000  # entries of the series folder looked at
MOST_STEP = 10**15
LENGTH = tm.LATE[1]  # tokens per held-out window: the late tokens of the in-context score end there
MOST_TEXT_BYTES = 8 * 1024**2  # a text file given for the probe
DTYPES = ("fp32", "stored")
STEP_AFTER_WORD = re.compile(r"step\D{0,3}?(\d+)", re.IGNORECASE)
NUMBER = re.compile(r"\d+")
DEFAULT_TEXT_WORDS = "the held-out Python documentation the bundled tiny GPT was measured on"


class SeriesRefused(ScanRefused):
    """A series that cannot be measured as asked (no checkpoint, two with one step, another shape...); says why."""


# -- the settings ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeriesSettings:
    """The probe every checkpoint of a series is measured on; its fields are also the JSON a background run is given
    and the options of ``python -m attnviz.corpus.series`` (:mod:`attnviz.corpus.options`)."""

    windows: int = field(default=16, metadata=option(
        f"windows of {LENGTH} held-out tokens, evenly spaced over the text"))
    period: int = field(default=40, metadata=option("random tokens in each sequence typed twice"))
    sequences: int = field(default=8, metadata=option("sequences of random tokens typed twice"))
    seed: int = field(default=0, metadata=option("the random tokens' seed"))
    text_file: str | None = field(default=None, metadata=option(
        "a UTF-8 text file for the held-out windows", default_words=DEFAULT_TEXT_WORDS))

    def __post_init__(self):
        if not 1 <= self.windows <= 256:
            raise SeriesRefused(f"windows: 1 to 256, not {self.windows}")
        if not 4 <= self.period <= 1024:
            raise SeriesRefused(f"the period is 4 to 1,024 tokens, not {self.period}")
        if not 1 <= self.sequences <= 64:
            raise SeriesRefused(f"sequences: 1 to 64, not {self.sequences}")
        if self.seed < 0:
            raise SeriesRefused("the seed is a whole number, 0 or more")


DEFAULT_SETTINGS = SeriesSettings()


@dataclass(frozen=True)
class SeriesOptions:
    """What a series run is told besides its probe: the command line's options and a background job's JSON."""

    folder: str = field(metadata=option("the folder of checkpoints (step1000/, checkpoint-500/, ...)",
                                        positional=True))
    db: str = field(metadata=option("the series' DuckDB file (created, or gone on with)", flag="--db",
                                    metavar="FILE.duckdb"))
    name: str | None = field(default=None, metadata=option(
        "the series' name in the results (default: the folder's)"))
    dtype: str = field(default="fp32", metadata=option("the weights measured in fp32, or as stored",
                                                       choices=DTYPES))
    ray: bool = field(default=False, metadata=option("measure the checkpoints on Ray (see --ray-address)"))
    ray_address: str = field(default="auto", metadata=option(
        "Ray: 'auto' (a local cluster, started if none runs) or a cluster's address", metavar="auto|ADDRESS"))
    workers: int = field(default=2, metadata=option("Ray: checkpoints measured at once (actors)"))
    threads: int | None = field(default=None, metadata=option("torch threads (in-process), per worker on Ray"))
    progress_file: str | None = field(default=None, metadata=option(
        "write progress as JSON here after every checkpoint"))
    stop_file: str | None = field(default=None, metadata=option(
        "stop (resumably) after the checkpoint during which this file appears"))
    disk_limit: int = field(default=0, metadata=option(
        "stop, failed, once the output's files pass this many bytes (what the server reserved for them)",
        metavar="BYTES", default_words="no limit"))
    quiet: bool = field(default=False, metadata=option("no progress line on the terminal"))


@dataclass
class SeriesProgress(Progress):
    """Progress counted in checkpoints (``done``, ``planned``); ``step``: the last one measured."""

    step: int | None = None
    seconds: float = 0.0  # the last checkpoint's loading and measures


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


@functools.lru_cache(maxsize=1)
def default_text() -> str:
    """The held-out part of the bundled tiny GPT's training text (Python's documentation)."""
    from attnviz.tiny_gpt.text import HELD_OUT_SHARE, documentation_text, split_text

    return split_text(documentation_text(), HELD_OUT_SHARE)[1]


def probe_text(text_file: str | None) -> str:
    """The probe's held-out text: the default, or a UTF-8 text file of at most :data:`MOST_TEXT_BYTES`."""
    if text_file is None:
        return default_text()
    try:
        with open(text_file, "rb") as handle:
            data = handle.read(MOST_TEXT_BYTES + 1)
    except OSError as problem:
        raise SeriesRefused(f"the text file cannot be read ({problem.strerror})") from None
    if len(data) > MOST_TEXT_BYTES:
        raise SeriesRefused(f"the text file is larger than {MOST_TEXT_BYTES // 1024**2} MB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SeriesRefused("the text file is not UTF-8 text") from None


def series_probe(tokenizer, text: str, settings: SeriesSettings, shape: dict) -> tm.Probe:
    """The probe every checkpoint is measured on: ``settings.windows`` windows of :data:`LENGTH` tokens of ``text``
    and ``settings.sequences`` sequences of ``settings.period`` ordinary tokens typed twice (after the BOS where the
    tokenizer has one); refused in words when it does not fit the checkpoints (``shape``: their context, their
    vocabulary) or the text is too short."""
    vocabulary = int(shape.get("vocabulary") or 0)
    bos = tokenizer.bos_token_id
    start = 0 if bos is None else 1
    positions = shape.get("positions")
    needed = max(LENGTH, start + 2 * settings.period)
    if isinstance(positions, int) and positions < needed:
        raise SeriesRefused(f"the checkpoints read at most {positions:,} positions: the measures need {needed:,} "
                            f"(windows of {LENGTH} held-out tokens, and {settings.period} random tokens typed twice"
                            f"{' after the BOS' if start else ''})")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < LENGTH + 1:
        raise SeriesRefused(f"the text is {len(ids):,} tokens long with this tokenizer: at least {LENGTH + 1} are "
                            "needed")
    if vocabulary and max(ids) >= vocabulary:
        raise SeriesRefused(f"the tokenizer gives token ids up to {max(ids):,}, but the checkpoints' vocabulary has "
                            f"{vocabulary:,} entries")
    pool = [token for token in ordinary_token_ids(tokenizer) if not vocabulary or token < vocabulary]
    if len(pool) < 2:
        raise SeriesRefused("the tokenizer has too few ordinary tokens to draw random ones from")
    return tm.make_probe(torch.tensor(ids), pool, bos=bos, length=LENGTH, windows=settings.windows,
                         period=settings.period, sequences=settings.sequences, seed=settings.seed)


def probe_fingerprint(probe: tm.Probe) -> str:
    """The probe's token ids and shape, hashed: a run goes on only with the probe it began with."""
    digest = hashlib.sha256(f"{probe.period}:{probe.start}:{tuple(probe.held_out.shape)}:"
                            f"{tuple(probe.repeated.shape)}".encode())
    digest.update(probe.held_out.numpy().astype("int64").tobytes())
    digest.update(probe.repeated.numpy().astype("int64").tobytes())
    return digest.hexdigest()[:32]


# -- one checkpoint -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepWork:
    """What measuring any checkpoint of a series needs, in this process or a Ray actor (picklable)."""

    probe: tm.Probe
    root: Path
    tokenizer: tuple[CheckedFile, ...]  # the series' tokenizer files, for checkpoints without their own
    own_tokenizer: frozenset[int]  # the steps whose folders hold their own (same) tokenizer
    layers: int
    dtype: str = "fp32"


def load_step(folder: Path, work: StepWork, own_tokenizer: bool) -> torch.nn.Module:
    """A checkpoint's causal LM, loaded as :func:`attnviz.models.with_heads.load_causal_lm` loads any (every file
    checked; eager attention). A checkpoint without tokenizer files is loaded from a private folder of links to its
    checked files and the series' tokenizer files (which are checked again there)."""
    from attnviz.models.with_heads import load_causal_lm

    if own_tokenizer:
        model, _ = load_causal_lm(folder)
    else:
        checked = preflight.inspect(folder, series_links(work.root))
        scratch = Path(tempfile.mkdtemp(prefix="attnviz-series-"))
        try:
            for item in [*checked.weights, *([checked.index] if checked.index else []), *checked.others,
                         *work.tokenizer]:
                if item.replacement is not None:
                    (scratch / item.name).write_bytes(item.replacement)
                else:
                    os.symlink(item.real, scratch / item.name)
            model, _ = load_causal_lm(scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if work.dtype == "fp32":
        model = model.float()
    return model.eval()


def measure_step(step: int, folder: Path, work: StepWork) -> dict:
    """One checkpoint loaded, measured on the probe and let go: ``step``, every key of
    :func:`~attnviz.interventions.training_measures.measure`, and the seconds of its loading and of its measures."""
    began = time.perf_counter()
    words = f"step {step:,} ({shown(folder.name)})"
    try:
        model = load_step(folder, work, step in work.own_tokenizer)
    except CheckpointRefused as problem:
        raise SeriesRefused(f"{words} cannot be loaded: {str(problem).rstrip('.')}") from None
    loaded = time.perf_counter()
    try:
        layers = len(tm.output_projections(model))
        if layers != work.layers:
            raise SeriesRefused(f"{words} has {layers} layers where the series has {work.layers}")
        measured = tm.measure(model, work.probe)
    except SeriesRefused:
        raise
    except ValueError as problem:  # the measures' own refusal (its heads' output projections not found)
        raise SeriesRefused(f"{words} cannot be measured: {first_line(problem, 200)}") from None
    except Exception as problem:  # noqa: BLE001 - whatever its forward raises: said in words, with the step
        raise SeriesRefused(f"{words} could not be measured ({type(problem).__name__}: "
                            f"{first_line(problem, 200)})") from None
    finally:
        del model
        gc.collect()
    return {"step": step, **measured, "load_seconds": loaded - began,
            "measure_seconds": time.perf_counter() - loaded}


def measure_chunk(work: StepWork, chunk: Documents) -> list[dict]:
    """The checkpoints of a chunk (each a document whose text is its folder), measured in order."""
    return [measure_step(step, Path(document.text), work) for step, document in chunk]


def series_replica(work: StepWork) -> Callable[[Documents], list[dict]]:
    """:func:`measure_chunk` in another process (a Ray actor)."""
    return functools.partial(measure_chunk, work)


# -- the run --------------------------------------------------------------------------------------------------------
def series_key(folder: str | Path, settings: SeriesSettings = DEFAULT_SETTINGS, dtype: str = "fp32") -> str:
    """The same series folder, probe settings and dtype give the same key (and the page the same file): gone on
    with, or reopened."""
    wanted = {"folder": os.path.realpath(folder), **as_json(settings), "dtype": dtype,
              "schema": sstore.SCHEMA_VERSION}
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:24]


def open_store(path: str | Path, series: Series, settings: SeriesSettings, dtype: str, probe: tm.Probe,
               name: str | None) -> sstore.SeriesStore:
    """The series' database: new (its settings written), or the same series' to go on with; refused when it holds
    another series, another probe (the text or the tokenizer changed), or a measured checkpoint changed since."""
    key = series_key(series.root, settings, dtype)
    store = sstore.SeriesStore(path)
    existing = store.settings()
    label = Path(path).name
    if existing and existing.get("key") != key:
        raise SeriesRefused(f"{label} holds another series (another folder, probe or dtype): choose a new file, or "
                            "delete it")
    if existing and existing.get("probe_fingerprint") != probe_fingerprint(probe):
        raise SeriesRefused(f"{label} was measured on another probe (its text or the tokenizer changed since): "
                            "choose a new file, or delete it")
    if not existing:
        store.set(key=key, folder=str(series.root), name=name, dtype=dtype, **as_json(settings),
                  text=settings.text_file or DEFAULT_TEXT_WORDS, length=LENGTH, early=list(tm.EARLY),
                  late=list(tm.LATE), probe_fingerprint=probe_fingerprint(probe), bos=bool(probe.start),
                  tokenizer_from=series.tokenizer_from, model_type=series.shape["model type"], layers=series.layers,
                  heads=series.heads, width=series.shape["width"], vocabulary=series.shape["vocabulary"],
                  rule=tm.PHASE_RULE, versions=sstore.versions(), started=time.time(),
                  status=sstore.STATUS_RUNNING)
    return store


def run_series(folder: str | Path, path: str | Path, settings: SeriesSettings = DEFAULT_SETTINGS, *,
               dtype: str = "fp32", name: str | None = None,
               progress: Callable[[SeriesProgress], None] | None = None,
               should_stop: Callable[[], bool] | None = None, measure: Measure | None = None) -> SeriesProgress:
    """Measure every checkpoint of the series in ``folder`` (:func:`find_series`) into the DuckDB file at ``path``
    (created, or gone on with: the steps it lacks). ``measure``: where the checkpoints are measured (default: here,
    one after the other, a stop asked before each; :func:`attnviz.corpus.on_ray.on_ray`: on Ray). Returns the last
    progress (``status`` finished or stopped)."""
    if dtype not in DTYPES:
        raise SeriesRefused(f"dtype is {' or '.join(DTYPES)}, not {dtype!r}")
    series = find_series(folder)
    tokenizer = series_tokenizer(series)
    probe = series_probe(tokenizer, probe_text(settings.text_file), settings, series.shape)
    store = open_store(path, series, settings, dtype, probe, name)
    done = store.done_steps()
    changed = [checkpoint for checkpoint in series.checkpoints
               if checkpoint.step in done and done[checkpoint.step] != checkpoint.fingerprint]
    if changed:
        raise SeriesRefused(f"step {changed[0].step:,} ({shown(changed[0].name)}) changed since it was measured into "
                            f"{Path(path).name}: choose a new file, or delete it")
    todo = [(checkpoint.step, Document(str(checkpoint.folder), checkpoint.name)) for checkpoint in series.checkpoints
            if checkpoint.step not in done]
    planned = len(set(done) | set(series.steps))
    state = SeriesProgress(done=planned - len(todo), planned=planned, started=time.time(), finished_before=not todo)
    store.set(status=sstore.STATUS_RUNNING)
    report(progress, state)
    work = StepWork(probe, series.root, series.tokenizer,
                    frozenset(checkpoint.step for checkpoint in series.checkpoints if checkpoint.tokenizer),
                    series.layers, dtype)
    by_step = {checkpoint.step: checkpoint for checkpoint in series.checkpoints}
    try:
        run_chunks(ChunkWork(here=functools.partial(measure_chunk, work),
                             replica=functools.partial(series_replica, work), chunk_docs=1),
                   todo, lambda _chunk, rows: record(store, state, rows, by_step), state, measure=measure,
                   progress=progress, should_stop=should_stop)
        state.status = sstore.STATUS_FINISHED
    except Stopped:
        state.status = sstore.STATUS_STOPPED
    finally:
        if state.status == sstore.STATUS_RUNNING:  # failed: what was committed is kept, and it goes on when asked
            with contextlib.suppress(Exception):
                store.set(status=sstore.STATUS_STOPPED)
    store.set(status=state.status, finished=time.time() if state.status == sstore.STATUS_FINISHED else None)
    report(progress, state)
    return state


def record(store: sstore.SeriesStore, state: SeriesProgress, rows: list[dict],
           by_step: dict[int, Checkpoint]) -> None:
    """Each measured checkpoint committed (its row and its heads' rows, one transaction each); counted in ``state``."""
    for row in rows:
        checkpoint = by_step[row["step"]]
        store.commit({"step": row["step"], "name": checkpoint.name, "fingerprint": checkpoint.fingerprint,
                      **{column: row[column] for column in sstore.SCALARS}, "load_seconds": row["load_seconds"],
                      "measure_seconds": row["measure_seconds"], "measured_at": time.time()},
                     sstore.head_rows(row["step"], row))
        state.done += 1
        state.done_this_run += 1
        state.step = row["step"]
        state.seconds = row["load_seconds"] + row["measure_seconds"]
