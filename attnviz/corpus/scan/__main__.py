"""``python -m attnviz.corpus.scan CORPUS --model DIR --out FILE.duckdb``: scan a model over a corpus (see
:mod:`attnviz.corpus.scan`). CORPUS is ``bundled`` or a ``.txt``, ``.jsonl``, ``.csv`` or ``.parquet`` file; ``--model``
a checkpoint folder or the name of a bundled model; ``--settings FILE.json`` any of the options as one JSON object.
Run again with the same arguments to resume a stopped scan.

The options are the fields of :class:`~attnviz.corpus.command.RunOptions` and
:class:`~attnviz.corpus.scan.runner.ScanSettings`
(:mod:`attnviz.corpus.command`).
"""

from __future__ import annotations

import sys

from attnviz.corpus.command import RunCommand, RunOptions, chosen_model
from attnviz.corpus.command import main as run_command
from attnviz.corpus.scan.runner import ScanSettings


def scan(options: RunOptions, settings: ScanSettings, progress, should_stop, measure):
    """The corpus read (what the reader left out said on stderr), the model loaded, and the scan run."""
    from attnviz.corpus.document_files import open_corpus
    from attnviz.corpus.documents import CorpusRefused
    from attnviz.corpus.scan.runner import run_scan
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import bundled_models

    corpus = open_corpus(options.corpus, split=options.split, field_name=options.field_name, keep=settings.max_docs)
    for line in corpus.report.lines():
        print(line, file=sys.stderr)
    if not corpus.documents:
        raise CorpusRefused("the corpus holds no document to scan")
    folder, bundled_name = chosen_model(options.model, bundled_models())
    bundle = load_model_dir(folder, name=options.name or bundled_name, dtype=options.dtype)
    return run_scan(corpus, bundle, options.out, settings, progress=progress, should_stop=should_stop,
                    measure=measure, dtype=options.dtype)


SCAN = RunCommand(
    kind="scan", description=__doc__.split("\n\n")[0], settings=ScanSettings,
    helps={"corpus": "'bundled', or a .txt, .jsonl, .csv or .parquet file",
           "out": "the scan's DuckDB file (created, or resumed)",
           "stop_file": "stop (resumably) after the chunk during which this file appears"},
    results_words="a scan's database", refusals=(), verb="scan", run=scan)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    return run_command(SCAN, argv, prog)


if __name__ == "__main__":
    sys.exit(main())
