"""``python -m attnviz.corpus.series FOLDER --db FILE.duckdb [--ray]``: measure every checkpoint of a series over
training (:mod:`attnviz.corpus.series.runner`): FOLDER holds one folder per checkpoint, named with its step
(``step1000/``, ``checkpoint-500/``, ...). ``--settings FILE.json`` gives any of the options as one JSON object. Run
again with the same arguments to go on with the steps it lacks (a stopped run, or checkpoints added since).

The options are the fields of :class:`~attnviz.corpus.series.runner.SeriesOptions` and
:class:`~attnviz.corpus.series.runner.SeriesSettings`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from attnviz.corpus import command
from attnviz.corpus.command import Reporter, RunCommand, stopper
from attnviz.corpus.series.runner import SeriesOptions, SeriesSettings

DESCRIPTION = __doc__.split("\n\n")[0]


def measure_series(options: SeriesOptions, settings: SeriesSettings, progress, should_stop, measure):
    from attnviz.corpus.series.runner import run_series

    return run_series(options.folder, options.db, settings, dtype=options.dtype, name=options.name,
                      progress=progress, should_stop=should_stop, measure=measure)


SERIES = RunCommand(kind="series", description=DESCRIPTION, settings=SeriesSettings, helps={},
                    results_words="a series' database", refusals=(ValueError,), verb="measure the series",
                    run=measure_series)


def parse(argv: list[str] | None = None, prog: str | None = None) -> tuple[SeriesOptions, dict[str, Any]]:
    """The options, and the settings' values (their ranges are checked as the settings are built). Each value from the
    command line, else the settings file, else the field's default."""
    return command.parse(SERIES, argv, prog, options=SeriesOptions, parser=command.parser_of(
        SERIES, prog, SeriesOptions, examples="folder, db, windows"))


def checkpoints_line(state) -> str:
    """The series' progress: checkpoints done, the last one's step and seconds."""
    last = f" · step {state.step:,} in {state.seconds:.1f} s" if state.step is not None else ""
    return f"{command.progress_bar(state)} {state.done:,}/{state.planned:,} checkpoints{last} · {state.status}"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parse, run, and say how it ended: 0 when it finished or stopped; 2, the problem said on stderr and in the
    progress file (the page shows it), when it was refused or failed."""
    options, values = parse(argv, prog)
    from attnviz.system.runtime import configure_environment

    configure_environment()  # before torch is imported
    import duckdb
    import torch

    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.corpus.on_ray import on_ray
    from attnviz.corpus.scan.runner import ScanRefused

    started = time.time()
    try:
        settings = SeriesSettings(**values)
        if options.threads and not options.ray:
            torch.set_num_threads(options.threads)
        measure = on_ray(options.ray_address, options.workers, options.threads or 1, what=SERIES.verb) \
            if options.ray else None
        state = measure_series(options, settings, Reporter(options.progress_file, options.quiet, checkpoints_line),
                               stopper(options.stop_file, options.db, options.disk_limit), measure)
    except (ScanRefused, CheckpointRefused, OSError, duckdb.Error, ValueError) as problem:
        return command.failed(SERIES, problem, options.db, options.progress_file)
    return command.finished(state, "checkpoints", options.db, started, options.quiet)


if __name__ == "__main__":
    sys.exit(main())
