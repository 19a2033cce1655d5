"""``attnviz``: the installed command, one subcommand per thing attnviz runs from a terminal.

    attnviz serve [--port 8501] [--address HOST] [streamlit options]   the app, from the installed package
    attnviz scan CORPUS --model NAME --out FILE.duckdb [...]          heads across a corpus (DuckDB)
    attnviz importance CORPUS --model NAME --out FILE.duckdb [...]    does a head matter, across a corpus
    attnviz series FOLDER --db FILE.duckdb [--ray] [...]              a series of checkpoints, measured over training
    attnviz bench {flash,pages,scan,...} [...]                        the benchmarks (ratios measured in one run)
    attnviz train-tiny [--out tiny-gpt] [...]                         train attnviz's tiny GPT again

``attnviz COMMAND --help`` lists that command's options with their defaults. Each subcommand is the same code as
its module's own command line (``python -m attnviz.corpus.scan``, ``python -m attnviz.corpus.importance``,
``python -m attnviz.corpus.series``, ``python -m attnviz.bench``, ``python -m attnviz.tiny_gpt.train``), which keep
working; ``python -m attnviz`` is this command.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
import threading
from pathlib import Path

from attnviz.app import SCRIPT

COMMANDS = {  # name -> what it does, for the overview
    "serve": "run the app (Streamlit) from the installed package, in any folder",
    "scan": "scan a corpus: every head's statistics and labels, in one DuckDB file (resumable)",
    "importance": "does a head matter across a corpus: ablation costs per document, in one DuckDB file (resumable)",
    "patch": "activation and path patching across a corpus: each document's text typed twice (DuckDB, resumable)",
    "series": "a folder of checkpoints (step1000/, ...) measured over training: losses, heads, phase change (DuckDB)",
    "bench": "the benchmarks: speed and memory, as ratios measured in one run",
    "train-tiny": "train attnviz's tiny GPT again (16 to 27 minutes on 2 cores, by the machine)",
}


def overview() -> str:
    """``attnviz --help``: the commands, the bundled models and where each command's options are listed."""
    from attnviz.models.shipped import bundled_models

    width = max(map(len, COMMANDS))
    lines = ["usage: attnviz COMMAND [options]", "", "See how transformer attention works: the app, corpus scans, "
             "importance and patching runs, benchmarks.", "", "commands:"]
    lines += [f"  {name:<{width}}  {words}" for name, words in COMMANDS.items()]
    lines += ["", "bundled models (for --model, or any start that names one alone):"]
    lines += [f"  {name!r}  ({folder})" for name, folder in bundled_models().items()]
    lines += ["", "attnviz COMMAND --help lists a command's options with their defaults.",
              "In Python: import attnviz; attnviz.capture(...), attnviz.show, attnviz.detect, attnviz.scan, "
              "attnviz.importance, attnviz.patch, attnviz.paths, attnviz.attribute, attnviz.open_series."]
    return "\n".join(lines)


def serve(argv: list[str]) -> int:
    """Streamlit on the installed app's script, with the app's own settings (they sit beside the script, where
    Streamlit reads them from any folder). Options other than ``--port``/``--address`` go to ``streamlit run``."""
    parser = argparse.ArgumentParser(prog="attnviz serve", description="Run the app (Streamlit) from the installed "
                                     "package; other options (e.g. --server.headless false) go to streamlit run.")
    parser.add_argument("--port", type=int, default=None, help="the port (default: Streamlit's, 8501)")
    parser.add_argument("--address", default=None, help="the address to listen on (default: every interface)")
    args, streamlit_options = parser.parse_known_args(argv)
    if importlib.util.find_spec("streamlit") is None:
        print("attnviz serve: the app needs Streamlit, an extra of the package: pip install \"attnviz[app]\" (or "
              "pip install -r requirements.txt in a checkout)", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", "streamlit", "run", str(SCRIPT)]
    if args.port is not None:
        command += ["--server.port", str(args.port)]
    if args.address is not None:
        command += ["--server.address", args.address]
    return run_until_stopped(command + streamlit_options)


def run_until_stopped(command: list[str]) -> int:
    """Run ``command`` (the server) and wait for it; its exit status (128 + the signal when a signal ended it).
    Ctrl-C reaches the server too (the same process group). SIGTERM, how systemd, ``docker stop`` or a test stops
    ``attnviz serve``, reaches this process alone: it is passed on, so that the server stops with it instead of
    running on without a parent."""
    process = subprocess.Popen(command)
    forwarding = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: process.send_signal(signum)) if forwarding else None
    try:
        code = process.wait()
    except KeyboardInterrupt:
        code = process.wait()
    finally:
        if forwarding:
            signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code  # ended by a signal: the shell's status for it (SIGTERM: 143)


def _train_tiny(argv: list[str]) -> int:
    from attnviz.tiny_gpt import train

    train.main(argv, prog="attnviz train-tiny", out=Path("tiny-gpt"))
    return 0


def _scan(argv: list[str]) -> int:
    from attnviz.corpus.scan.__main__ import main

    return main(argv, prog="attnviz scan")


def _importance(argv: list[str]) -> int:
    from attnviz.corpus.importance.__main__ import main

    return main(argv, prog="attnviz importance")


def _patch(argv: list[str]) -> int:
    from attnviz.corpus.patching.__main__ import main

    return main(argv, prog="attnviz patch")


def _series(argv: list[str]) -> int:
    from attnviz.corpus.series.__main__ import main

    return main(argv, prog="attnviz series")


def _bench(argv: list[str]) -> int:
    from attnviz.bench.__main__ import main

    return main(argv, prog="attnviz bench")


RUNNERS = {"serve": serve, "scan": _scan, "importance": _importance, "patch": _patch, "series": _series,
           "bench": _bench, "train-tiny": _train_tiny}


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv`` (default: the command line) to its subcommand; its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        try:
            print(overview())
        except BrokenPipeError:  # `attnviz --help | head`: the reader had enough
            sys.stdout = None
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from attnviz import __version__

        print(f"attnviz {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in RUNNERS:
        print(f"attnviz: no command {name!r}; the commands are {', '.join(COMMANDS)} (attnviz --help)",
              file=sys.stderr)
        return 2
    return RUNNERS[name](rest) or 0
