"""``python -m attnviz.corpus.importance CORPUS --model DIR --out FILE.duckdb``: measure whether each head matters over
a
corpus (:mod:`attnviz.corpus.importance.runner`). CORPUS is ``bundled``, a ``.txt``, ``.jsonl``, ``.csv`` or
``.parquet`` file, or ``scan:FILE.duckdb`` (the documents of a scan). Run again with the same arguments to resume.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from attnviz.corpus.documents import CorpusRefused
from attnviz.corpus.importance.runner import METHODS, ImportanceSettings, read_corpus_spec, run_importance
from attnviz.corpus.scan.runner import ScanRefused


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from attnviz.corpus.scan.__main__ import add_run_arguments

    parser = argparse.ArgumentParser(prog="python -m attnviz.corpus.importance", description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", help="'bundled', a .txt, .jsonl, .csv or .parquet file, or scan:FILE.duckdb")
    add_run_arguments(parser, out="the run's DuckDB file (created, or resumed)", max_docs=200, max_tokens=64,
                      chunk=16, stop="stop (resumably) as soon as this file appears")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: zero, mean, gradient")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import duckdb

    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.corpus.scan.__main__ import Reporter, chosen_model, stopper, unwritable, write_json
    from attnviz.models.loading import bundled_models
    from attnviz.system.runtime import configure_environment

    args = parse(argv)
    configure_environment()
    reporter = Reporter(args.progress_file, args.quiet)
    should_stop = stopper(args.stop_file, args.out, args.disk_limit)
    try:
        settings = ImportanceSettings(max_docs=args.max_docs, max_tokens=args.max_tokens, chunk_docs=args.chunk,
                                      methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()))
        if args.threads and not args.ray:
            torch.set_num_threads(args.threads)
        corpus = read_corpus_spec(args.corpus, split=args.split, field_name=args.field, keep=settings.max_docs)
        folder, bundled_name = chosen_model(args.model, bundled_models())
        name = args.name or bundled_name or folder.name
        if args.ray:
            from attnviz.corpus.importance.on_ray import run_importance_on_ray

            state = run_importance_on_ray(corpus, folder, args.out, settings, name=name, dtype=args.dtype,
                                          address=args.ray, workers=args.workers,
                                          threads_per_worker=args.threads or 1, progress=reporter, source=args.corpus,
                                          should_stop=should_stop)
        else:
            state = run_importance(corpus, folder, args.out, settings, name=name, dtype=args.dtype,
                                   progress=reporter, should_stop=should_stop, source=args.corpus)
    except (CorpusRefused, ScanRefused, CheckpointRefused, OSError, ValueError, duckdb.Error) as problem:
        if isinstance(problem, duckdb.Error):
            problem = unwritable(args.out, problem, "a DuckDB file")
        if args.progress_file:
            write_json(Path(args.progress_file), {"status": "failed", "error": str(problem), "updated": time.time()})
        print(f"\nattnviz.corpus.importance: {problem}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"\n{state.status}: {state.done:,} of {state.planned:,} documents in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
