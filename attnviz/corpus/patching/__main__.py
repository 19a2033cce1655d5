"""``python -m attnviz.corpus.patching CORPUS --model DIR --out FILE.duckdb``: activation and path patching over a
corpus, each document's own text typed twice (:mod:`attnviz.corpus.patching.runner`). CORPUS is ``bundled``, a
``.txt``, ``.jsonl``, ``.csv`` or ``.parquet`` file, or ``scan:FILE.duckdb`` (the documents of a scan); ``--settings
FILE.json`` any of the options as one JSON object. Run again with the same arguments to resume.

The options are the fields of :class:`~attnviz.corpus.command.RunOptions` and
:class:`~attnviz.corpus.patching.runner.PatchingSettings` (:mod:`attnviz.corpus.command`).
"""

from __future__ import annotations

import sys

from attnviz.corpus.command import RunCommand, RunOptions, chosen_model
from attnviz.corpus.command import main as run_command
from attnviz.corpus.patching.runner import PatchingSettings


def measure_patching(options: RunOptions, settings: PatchingSettings, progress, should_stop, measure):
    """The corpus read, the model chosen (the run loads it), and every map measured."""
    from attnviz.corpus.importance.runner import read_corpus_spec
    from attnviz.corpus.patching.runner import run_patching
    from attnviz.models.shipped import bundled_models

    corpus = read_corpus_spec(options.corpus, split=options.split, field_name=options.field_name,
                              keep=settings.max_docs)
    folder, bundled_name = chosen_model(options.model, bundled_models())
    return run_patching(corpus, folder, options.out, settings, name=options.name or bundled_name or folder.name,
                        dtype=options.dtype, progress=progress, should_stop=should_stop, source=options.corpus,
                        measure=measure)


PATCHING = RunCommand(
    kind="patching", description=__doc__.split("\n\n")[0], settings=PatchingSettings,
    helps={"corpus": "'bundled', a .txt, .jsonl, .csv or .parquet file, or scan:FILE.duckdb",
           "out": "the run's DuckDB file (created, or resumed)",
           "stop_file": "stop (resumably) as soon as this file appears"},
    results_words="a DuckDB file", refusals=(ValueError,), verb="run", run=measure_patching)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_command(PATCHING, argv, prog)


if __name__ == "__main__":
    sys.exit(main())
