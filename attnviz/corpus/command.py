"""The command line both corpus runs share (``python -m attnviz.corpus.scan``, ``python -m attnviz.corpus.importance``),
and the one file a background job is given.

A run is told two things: its :class:`RunOptions` (what it reads, with which model, where it writes, how it runs,
the files the page watches) and its kind's settings (:class:`~attnviz.corpus.scan.runner.ScanSettings`,
:class:`~attnviz.corpus.importance.runner.ImportanceSettings`). Both are dataclasses, and both reach the run the same
two ways: as command-line options generated from their fields (:mod:`attnviz.corpus.options`, each with its default
in ``--help``), or as one JSON object, ``--settings FILE.json``, whose keys are the same fields. A page's job is only
the latter: the server writes the file beside the run's database (:func:`write_settings_file`) and starts
``python -m attnviz.corpus.<kind> --settings FILE`` (:func:`job_command`), so a new setting is one field, never a
flag written by hand on either side.

What a run says while it runs (:class:`Reporter`), how it is stopped (:func:`stopper`), which model ``--model`` names
(:func:`chosen_model`) and how a failure is said (:func:`main`) are the same for both runs and live here once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnviz.corpus.options import (
    SettingsRefused,
    add_options,
    as_json,
    built,
    checked_values,
    field_names,
    given,
    option,
    required,
)

MOST_SETTINGS_BYTES = 64 * 1024  # a settings file is a few hundred bytes; a larger one is not read


@dataclass(frozen=True)
class RunOptions:
    """What every corpus run is told besides its settings."""

    corpus: str = field(metadata=option("what the run reads", positional=True))
    model: str = field(metadata=option("a checkpoint folder, or a bundled model's name"))
    out: str = field(metadata=option("the run's DuckDB file (created, or resumed)"))
    name: str | None = field(default=None, metadata=option(
        "the model's name in the results (default: the bundled model's name, or the folder's)"))
    split: str = field(default="line", metadata=option(".txt: one document per ...", choices=("line", "paragraph")))
    field_name: str | None = field(default=None, metadata=option(
        ".jsonl field, .csv or .parquet column (default: text)", flag="--field"))
    dtype: str = field(default="stored", metadata=option("the model's dtype: stored or fp32"))
    ray: str | None = field(default=None, metadata=option(
        "run on Ray: 'auto' (a local cluster, started if none runs) or a cluster's address", metavar="auto|ADDRESS"))
    workers: int = field(default=2, metadata=option("Ray: model replicas (actors)"))
    threads: int | None = field(default=None, metadata=option("torch threads (in-process), per worker on Ray"))
    progress_file: str | None = field(default=None, metadata=option("write progress as JSON here after every chunk"))
    stop_file: str | None = field(default=None, metadata=option("stop (resumably) once this file appears"))
    disk_limit: int = field(default=0, metadata=option(
        "stop, failed, once the output's files pass this many bytes (what the server reserved for them)",
        metavar="BYTES", default_words="no limit"))
    quiet: bool = field(default=False, metadata=option("no progress line on the terminal"))


@dataclass(frozen=True)
class RunCommand:
    """What one kind of run brings to the shared command line: its ``kind`` (``python -m attnviz.corpus.<kind>``), its
    ``settings`` dataclass, words for ``--help`` and for its failures, and ``run``: ``(options, settings, progress,
    should_stop, measure) -> Progress``, which reads the corpus, chooses the model and runs (``measure``: None in
    this process, or the Ray strategy)."""

    kind: str
    description: str
    settings: type
    helps: dict[str, str]  # help of RunOptions' fields in this run's words (corpus, out, stop_file)
    results_words: str  # what --out holds, as a failure to write it says
    refusals: tuple[type[Exception], ...]  # besides those every run has: failures said in words, no traceback
    verb: str  # "scan": as "Ray is not installed: ..., or scan in-process" says
    run: Callable[..., Any]


# -- the settings file -------------------------------------------------------------------------------------------
def settings_json(kind: str, options: RunOptions, settings) -> dict[str, Any]:
    """One run as one JSON object: its kind, its options and its settings, by field name."""
    return {"kind": kind, **as_json(options), **as_json(settings)}


def write_settings_file(path: Path, kind: str, options: RunOptions, settings) -> Path:
    write_json(path, settings_json(kind, options, settings))
    return path


def job_command(kind: str, settings_file: Path) -> list[str]:
    """The command a background job runs: the run of ``kind`` told everything by its settings file."""
    return [sys.executable, "-m", f"attnviz.corpus.{kind}", "--settings", str(settings_file)]


def read_settings_file(path: str, command: RunCommand, options: type = RunOptions) -> dict[str, Any]:
    """A settings file's values, checked: a JSON object of at most :data:`MOST_SETTINGS_BYTES`, its keys fields of
    ``options`` (:class:`RunOptions`, or a run's own) or of the run's settings (and ``kind``, this run's), each of its
    field's type."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MOST_SETTINGS_BYTES + 1)
    except OSError as problem:
        raise SettingsRefused(f"--settings {path}: {problem.strerror or problem}") from None
    if len(data) > MOST_SETTINGS_BYTES:
        raise SettingsRefused(f"--settings {path} is larger than a settings file ({MOST_SETTINGS_BYTES:,} bytes)")
    try:
        values = json.loads(data)
    except ValueError as problem:
        raise SettingsRefused(f"--settings {path} is not JSON ({problem})") from None
    if not isinstance(values, dict):
        raise SettingsRefused(f"--settings {path} holds no JSON object of settings")
    kind = values.pop("kind", command.kind)
    if kind != command.kind:
        raise SettingsRefused(f"--settings {path} is the settings of {kind!r}, not of {command.kind!r}"[:300])
    return checked_values((options, command.settings), values, f"--settings {path}")


# -- parsing -----------------------------------------------------------------------------------------------------
def parser_of(command: RunCommand, prog: str | None = None, options: type = RunOptions,
              examples: str = "corpus, model, out, max_docs") -> argparse.ArgumentParser:
    """The run's command line (``prog``: how ``--help`` names it: ``attnviz scan`` from the installed command), its
    options the fields of ``options`` (:class:`RunOptions`, or a run's own) and of the run's settings."""
    helps = dict(command.helps)
    if options is RunOptions:
        from attnviz.models.shipped import bundled_models

        bundled = ", ".join(repr(name) for name in bundled_models())
        helps = {"model": f"a checkpoint folder, or a bundled model's name ({bundled}; any start that names one alone)",
                 **helps}
    parser = argparse.ArgumentParser(prog=prog or f"python -m attnviz.corpus.{command.kind}",
                                     description=command.description)
    parser.add_argument("--settings", metavar="FILE.json", default=None,
                        help=f"the run's options and settings as one JSON object, by field name ({examples}, ...); "
                             "an option also given on the command line takes the command line's value")
    add_options(parser, options, helps)
    add_options(parser, command.settings)
    return parser


def parse(command: RunCommand, argv: list[str] | None = None, prog: str | None = None, *, options: type = RunOptions,
          parser: argparse.ArgumentParser | None = None) -> tuple[Any, dict[str, Any]]:
    """The run's options (an ``options``: :class:`RunOptions`, or a run's own), and its settings' values (checked by
    type; their ranges are checked as the settings are built, by the run, which says a refusal like any other). Each
    value from the command line, else the settings file, else the field's default."""
    parser = parser or parser_of(command, prog, options)
    namespace = parser.parse_args(argv)
    try:
        from_file = read_settings_file(namespace.settings, command, options) if namespace.settings else {}
    except SettingsRefused as problem:
        parser.error(str(problem))
    values = {**from_file, **given(namespace, options), **given(namespace, command.settings)}
    missing = [name for name in required(options) if name not in values]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    return built(options, values), {name: value for name, value in values.items()
                                    if name in field_names(command.settings)}


# -- running -----------------------------------------------------------------------------------------------------
def main(command: RunCommand, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parse, run, and say how it ended: 0 when it finished or stopped; 2, the problem said on stderr and in the
    progress file (the page shows it), when it was refused or failed."""
    options, values = parse(command, argv, prog)
    from attnviz.system.runtime import configure_environment

    configure_environment()  # before torch is imported
    import duckdb
    import torch

    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.corpus.documents import CorpusRefused
    from attnviz.corpus.on_ray import on_ray
    from attnviz.corpus.scan.runner import ScanRefused

    started = time.time()
    try:
        settings = command.settings(**values)
        if options.threads and not options.ray:
            torch.set_num_threads(options.threads)
        measure = on_ray(options.ray, options.workers, options.threads or 1, what=command.verb) if options.ray \
            else None
        state = command.run(options, settings, Reporter(options.progress_file, options.quiet),
                            stopper(options.stop_file, options.out, options.disk_limit), measure)
    except (CorpusRefused, ScanRefused, CheckpointRefused, OSError, duckdb.Error, *command.refusals) as problem:
        return failed(command, problem, options.out, options.progress_file)
    return finished(state, "documents", options.out, started, options.quiet)


def failed(command: RunCommand, problem: Exception, results: str | Path, progress_file: str | None) -> int:
    """A run refused or failed: said on stderr and in the progress file (the page shows it); the exit status, 2."""
    import duckdb

    if isinstance(problem, duckdb.Error):
        problem = unwritable(results, problem, command.results_words)
    if progress_file:
        write_json(Path(progress_file), {"status": "failed", "error": str(problem), "updated": time.time()})
    print(f"\nattnviz.corpus.{command.kind}: {problem}", file=sys.stderr)
    return 2


def finished(state, unit: str, results: str | Path, started: float, quiet: bool) -> int:
    """A run that finished or stopped: how far it got, unless ``quiet``; the exit status, 0."""
    if not quiet:
        print(f"\n{state.status}: {state.done:,} of {state.planned:,} {unit} in {results} "
              f"({time.time() - started:.1f} s)", file=sys.stderr)
    return 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def progress_bar(state) -> str:
    return "[" + f"{'#' * int(state.done / max(state.planned, 1) * 30):<30}" + "]"


def documents_line(state) -> str:
    """A corpus run's progress: documents done, their rate, the time left."""
    return (f"{progress_bar(state)} {state.done:,}/{state.planned:,} documents · "
            f"{state.documents_per_second:.1f} doc/s · {state.tokens_per_second:,.0f} tok/s · "
            f"ETA {_duration(state.eta)} · {state.status}"
            + (f" · queries and keys of {state.sampled}/{state.sample_planned} documents kept"
               if state.sample_planned else ""))


class Reporter:
    """A progress line on the terminal (``line(state)``: a corpus run's :func:`documents_line`, or a run's own), and
    the JSON progress file the page reads."""

    def __init__(self, progress_file: str | None, quiet: bool, line: Callable[[Any], str] = documents_line):
        self.progress_file = Path(progress_file) if progress_file else None
        self.quiet = quiet
        self.line = line

    def __call__(self, state) -> None:
        if self.progress_file is not None:
            write_json(self.progress_file, state.as_dict())
        if not self.quiet:
            print("\r" + self.line(state) + "   ", end="", file=sys.stderr, flush=True)


def write_json(path: Path, value: dict) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(value))
    scratch.replace(path)  # atomic: the page never reads half a file


def unwritable(out: str, problem: Exception, what: str) -> str:
    """A DuckDB error at ``--out`` in words: the file is not a DuckDB file, or its folder cannot be written."""
    return f"{out} cannot be written as {what}: {str(problem).splitlines()[0]}"


def stopper(stop_file: str | None, out: str, disk_limit: int):
    """What a run asks between chunks: whether its stop file has appeared. Past ``disk_limit`` bytes of its files
    (those in the output's folder whose name holds the output's stem), it refuses to go on instead."""
    from attnviz.checkpoints.disk import written_bytes
    from attnviz.corpus.scan.runner import ScanRefused

    stop = Path(stop_file) if stop_file else None
    if stop is None and not disk_limit:
        return None

    def should_stop() -> bool:
        if disk_limit and written_bytes(Path(out).parent, Path(out).stem) > disk_limit:
            raise ScanRefused(f"its files passed the {disk_limit / 1024**2:,.0f} MB of disk this server reserved for "
                              "it, so it stopped there (what it did is kept)")
        return stop is not None and stop.exists()

    return should_stop


def chosen_model(name: str, bundled: dict) -> tuple[Path, str | None]:
    """``--model``: (folder, bundled name or None). A bundled model's name, or its start when that names one model
    alone (``all-MiniLM-L6-v2``, ``tiny GPT``, any case); otherwise a folder. Refused, with the bundled names, when
    it is neither."""
    from attnviz.checkpoints.safety import CheckpointRefused

    if name in bundled:
        return Path(bundled[name]), name
    if Path(name).is_dir():
        return Path(name), None
    starting = [known for known in bundled if known.lower().startswith(name.strip().lower())] if name.strip() else []
    if len(starting) == 1:
        return Path(bundled[starting[0]]), starting[0]
    raise CheckpointRefused(f"--model {name!r} is not a folder here, nor a bundled model's name; the bundled models "
                            f"are {', '.join(map(repr, bundled))}")
