"""``python -m attnviz.corpus.scan CORPUS --model DIR --out FILE.duckdb``: scan a model over a corpus (see
:mod:`attnviz.corpus.scan`). CORPUS is ``bundled`` or a ``.txt``, ``.jsonl``, ``.csv`` or ``.parquet`` file; ``--model``
a checkpoint folder or the name of a bundled model. Run again with the same arguments to resume a stopped scan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from attnviz.system.runtime import configure_environment


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Reporter:
    """A progress line on the terminal, and the JSON progress file the page reads."""

    def __init__(self, progress_file: str | None, quiet: bool):
        self.progress_file = Path(progress_file) if progress_file else None
        self.quiet = quiet

    def __call__(self, state) -> None:
        if self.progress_file is not None:
            write_json(self.progress_file, state.as_dict())
        if not self.quiet:
            share = state.done / max(state.planned, 1)
            bar = "#" * int(share * 30)
            print(f"\r[{bar:<30}] {state.done:,}/{state.planned:,} documents · "
                  f"{state.documents_per_second:.1f} doc/s · {state.tokens_per_second:,.0f} tok/s · "
                  f"ETA {_duration(state.eta)} · {state.status}"
                  + (f" · queries and keys of {state.sampled}/{state.sample_planned} documents kept"
                     if state.sample_planned else "") + "   ", end="", file=sys.stderr, flush=True)


def write_json(path: Path, value: dict) -> None:
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(value))
    scratch.replace(path)  # atomic: the page never reads half a file


def unwritable(out: str, problem: Exception, what: str) -> str:
    """A DuckDB error at ``--out`` in words: the file is not a DuckDB file, or its folder cannot be written."""
    return f"{out} cannot be written as {what}: {str(problem).splitlines()[0]}"


def stopper(stop_file: str | None, out: str, disk_limit: int):
    """What a run asks before each chunk: whether its stop file has appeared. Past ``disk_limit`` bytes of its
    files (those in the output's folder whose name holds the output's stem), it refuses to go on instead."""
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


def add_run_arguments(parser: argparse.ArgumentParser, *, out: str, max_docs: int, max_tokens: int, chunk: int,
                      stop: str) -> None:
    """The options a scan and a corpus importance run share: the model, the output, the limits, the corpus file's
    reading, Ray, threads, and the files the page watches and stops it by."""
    parser.add_argument("--model", required=True, help="a checkpoint folder, or a bundled model's name")
    parser.add_argument("--name", default=None, help="the model's name in the results (default: the bundled "
                                                     "model's name, or the folder's)")
    parser.add_argument("--out", required=True, help=out)
    parser.add_argument("--max-docs", type=int, default=max_docs,
                        help=f"the corpus's first documents read (default {max_docs:,})")
    parser.add_argument("--max-tokens", type=int, default=max_tokens,
                        help=f"each document's first tokens read, special tokens included (default {max_tokens})")
    parser.add_argument("--chunk", type=int, default=chunk,
                        help=f"documents per committed chunk (and Ray batch; default {chunk})")
    parser.add_argument("--split", choices=("line", "paragraph"), default="line", help=".txt: one document per ...")
    parser.add_argument("--field", default=None, help=".jsonl field, .csv or .parquet column (default: text)")
    parser.add_argument("--dtype", default="stored", help="the model's dtype: stored or fp32")
    parser.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                        help="run on Ray: 'auto' (a local cluster, started if none runs) or a cluster's address")
    parser.add_argument("--workers", type=int, default=2, help="Ray: model replicas (actors)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (in-process), per worker on Ray")
    parser.add_argument("--progress-file", default=None, help="write progress as JSON here after every chunk")
    parser.add_argument("--stop-file", default=None, help=stop)
    parser.add_argument("--disk-limit", type=int, default=0, metavar="BYTES",
                        help="stop, failed, once the output's files pass this many bytes (what the server reserved "
                             "for them; default: no limit)")
    parser.add_argument("--quiet", action="store_true")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m attnviz.corpus.scan", description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", help="'bundled', or a .txt, .jsonl, .csv or .parquet file")
    add_run_arguments(parser, out="the scan's DuckDB file (created, or resumed)", max_docs=1000, max_tokens=128,
                      chunk=64, stop="stop (resumably) after the chunk during which this file appears")
    parser.add_argument("--qk-points", type=int, default=None, metavar="N",
                        help="tokens per head whose queries, keys and values are kept for the Queries and keys page "
                             "(whole documents drawn evenly across the corpus; 0: none; default 2048)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    configure_environment()
    import duckdb
    import torch

    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.corpus.document_files import open_corpus
    from attnviz.corpus.documents import CorpusRefused
    from attnviz.corpus.scan.runner import ScanRefused, ScanSettings, run_scan
    from attnviz.models.loading import bundled_models, load_model_dir

    reporter = Reporter(args.progress_file, args.quiet)
    try:
        settings = ScanSettings(max_docs=args.max_docs, max_tokens=args.max_tokens, chunk_docs=args.chunk,
                                **({} if args.qk_points is None else {"qk_points": args.qk_points}))
        if args.threads and not args.ray:
            torch.set_num_threads(args.threads)
        corpus = open_corpus(args.corpus, split=args.split, field_name=args.field, keep=settings.max_docs)
        for line in corpus.report.lines():
            print(line, file=sys.stderr)
        if not corpus.documents:
            raise CorpusRefused("the corpus holds no document to scan")
        folder, bundled_name = chosen_model(args.model, bundled_models())
        bundle = load_model_dir(folder, name=args.name or bundled_name, dtype=args.dtype)
        should_stop = stopper(args.stop_file, args.out, args.disk_limit)
        started = time.time()
        if args.ray:
            from attnviz.corpus.scan.on_ray import run_scan_on_ray

            state = run_scan_on_ray(corpus, bundle, args.out, settings, address=args.ray, workers=args.workers,
                                    threads_per_worker=args.threads or 1, dtype=args.dtype, progress=reporter,
                                    should_stop=should_stop)
        else:
            state = run_scan(corpus, bundle, args.out, settings, progress=reporter, should_stop=should_stop)
    except (CorpusRefused, ScanRefused, CheckpointRefused, OSError, duckdb.Error) as problem:
        if isinstance(problem, duckdb.Error):
            problem = unwritable(args.out, problem, "a scan's database")
        if args.progress_file:
            write_json(Path(args.progress_file), {"status": "failed", "error": str(problem), "updated": time.time()})
        print(f"\nattnviz.corpus.scan: {problem}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"\n{state.status}: {state.done:,} of {state.planned:,} documents in {args.out} "
              f"({time.time() - started:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
