"""The command line: ``python -m attnviz.bench explore``, ``... flash [--gpu]``, ``... long``, ``... pages``,
``... load``, ``... startup``, ``... scan``, ``... ablation``, ``... queries-keys``, ``... patching``,
``... series``, ``... train-step``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnviz.system.runtime import configure_environment


def build_parser(prog: str = "python -m attnviz.bench") -> argparse.ArgumentParser:
    """One sub-command per benchmark, with its own options."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    explore_parser = commands.add_parser("explore", help="the Explore heads page on the default model")
    explore_parser.add_argument("--repeats", type=int, default=7)
    explore_parser.add_argument("--out", type=Path, default=Path("bench-results/explore.json"))
    flash_parser = commands.add_parser("flash", help="flash attention: naive, tiled, SDPA (CPU) or Triton (--gpu)")
    flash_parser.add_argument("--gpu", action="store_true", help="Triton vs SDPA kernels on a CUDA GPU, bf16")
    flash_parser.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    flash_parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    flash_parser.add_argument("--heads", type=int, default=8)
    flash_parser.add_argument("--d", type=int, default=64)
    flash_parser.add_argument("--causal", action="store_true")
    flash_parser.add_argument("--repeats", type=int, default=3)
    flash_parser.add_argument("--no-memory", action="store_true", help="skip the per-point memory subprocesses")
    flash_parser.add_argument("--out", type=Path, default=None)  # by default named after --gpu
    long_parser = commands.add_parser("long", help="long inputs on a Llama-shaped checkpoint: forward, capture, figure")
    long_parser.add_argument("--lengths", type=int, nargs="+", default=None)
    long_parser.add_argument("--out", type=Path, default=Path("bench-results/long.json"))
    pages_parser = commands.add_parser("pages", help="every page in AppTest: first visit and warm reruns")
    pages_parser.add_argument("--repeats", type=int, default=5)
    pages_parser.add_argument("--only", nargs="+", default=None, help="pages whose title contains these words")
    pages_parser.add_argument("--out", type=Path, default=Path("bench-results/pages.json"))
    load_parser = commands.add_parser("load", help="N browser sessions at once on one server (needs Chromium)")
    load_parser.add_argument("--sessions", type=int, default=8)
    load_parser.add_argument("--rounds", type=int, default=2, help="rounds of N sessions (memory must not grow)")
    load_parser.add_argument("--out", type=Path, default=Path("bench-results/load.json"))
    startup_parser = commands.add_parser("startup", help="cold starts of streamlit run app.py to the first chart")
    startup_parser.add_argument("--repeats", type=int, default=3)
    startup_parser.add_argument("--out", type=Path, default=Path("bench-results/startup.json"))
    scan_parser = commands.add_parser("scan", help="a scan over the bundled corpus against the model's forward")
    scan_parser.add_argument("--documents", type=int, default=1000, help="the command line's default scan")
    scan_parser.add_argument("--max-tokens", type=int, default=128)
    scan_parser.add_argument("--ray-workers", type=int, nargs="*", default=[1, 2], help="none: skip Ray")
    scan_parser.add_argument("--memory-docs", type=int, nargs="*", default=[1000, 10000],
                             help="corpus sizes whose command-line scans' peak memory is compared (none: skip)")
    scan_parser.add_argument("--model", default=None, help="a checkpoint folder or bundled model (default: the BERT)")
    scan_parser.add_argument("--out", type=Path, default=Path("bench-results/scan.json"))
    queries_keys_parser = commands.add_parser(
        "queries-keys", help="pictures of queries and keys: PCA per head, t-SNE, UMAP")
    queries_keys_parser.add_argument("--points", type=int, default=10_000, help="queries and keys per head (about)")
    queries_keys_parser.add_argument("--tokens", type=int, default=128, help="per document")
    queries_keys_parser.add_argument("--embed-points", type=int, default=2_000, help="for t-SNE and UMAP, on one head")
    queries_keys_parser.add_argument("--shape", type=int, nargs=3, default=[12, 12, 768], metavar=("LAYERS", "HEADS",
                                                                                           "WIDTH"))
    queries_keys_parser.add_argument("--out", type=Path, default=Path("bench-results/queries_keys.json"))
    ablation_parser = commands.add_parser("ablation", help="a head-importance map against the model's forwards")
    ablation_parser.add_argument("--texts", type=int, default=50)
    ablation_parser.add_argument("--max-tokens", type=int, default=32, help="per sentence (most have fewer)")
    ablation_parser.add_argument("--repeats", type=int, default=5, help="plain forwards timed (their median counts)")
    ablation_parser.add_argument("--model", default=None, help="a checkpoint folder (default: GPT-2-small-shaped)")
    ablation_parser.add_argument("--shape", type=int, nargs=3, default=[12, 12, 768], metavar=("LAYERS", "HEADS",
                                                                                               "WIDTH"))
    ablation_parser.add_argument("--out", type=Path, default=Path("bench-results/ablation.json"))
    patching_parser = commands.add_parser("patching", help="activation-patching maps against the forwards they need")
    patching_parser.add_argument("--repeats", type=int, default=5)
    patching_parser.add_argument("--period", type=int, default=60, help="the induction prompt's period (n = 1.5p + 1)")
    patching_parser.add_argument("--rows", type=int, default=16, help="cells patched per forward (rows_per_forward)")
    patching_parser.add_argument("--model", default=None, help="a causal LM folder (default: the bundled tiny GPT)")
    patching_parser.add_argument("--out", type=Path, default=Path("bench-results/patching.json"))
    series_parser = commands.add_parser("series", help="a series' checkpoint measured against the forwards it needs")
    series_parser.add_argument("--checkpoints", type=int, default=6)
    series_parser.add_argument("--repeats", type=int, default=3, help="rounds per checkpoint")
    series_parser.add_argument("--shape", type=int, nargs=3, default=[3, 4, 128], metavar=("LAYERS", "HEADS", "WIDTH"))
    series_parser.add_argument("--out", type=Path, default=Path("bench-results/series.json"))
    train_step_parser = commands.add_parser(
        "train-step", help="the tiny GPT's training step: PyTorch's cross-entropy against the fused LM-head loss")
    train_step_parser.add_argument("--repeats", type=int, default=5, help="rounds, plain and fused in turn")
    train_step_parser.add_argument("--steps", type=int, default=10, help="timed steps of each kind per round")
    train_step_parser.add_argument("--threads", type=int, default=2)
    train_step_parser.add_argument("--out", type=Path, default=Path("bench-results/train-step.json"))
    return parser


# Each benchmark: args -> (report, printed lines, where its JSON goes). Each imports its module only when chosen:
# the flash ones must run on a bare GPU machine, without what the others need (Streamlit, Chromium).


def _explore(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import explore

    report = explore.bench_explore(args.repeats)
    return report, explore.print_explore(report), args.out


def _pages(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import pages

    report = pages.bench_pages(args.repeats, args.only)
    return report, pages.print_pages(report), args.out


def _load(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import load

    report = load.bench_load(args.sessions, args.rounds)
    return report, load.print_load(report), args.out


def _startup(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import startup

    report = startup.bench_startup(args.repeats)
    return report, startup.print_startup(report), args.out


def _long(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import long

    report = long.bench_long(args.lengths or long.LENGTHS)
    return report, long.print_long(report), args.out


def _flash(args) -> tuple[dict, list[str], Path]:
    if args.gpu:
        from attnviz.bench import flash_gpu

        report = flash_gpu.bench_gpu(quick=args.quick)
        return report, flash_gpu.print_gpu(report), args.out or Path("bench-results/flash-gpu.json")
    from attnviz.flash import cpu_sweep

    lengths = [512, 1024] if args.quick else args.lengths
    report = cpu_sweep.bench_cpu(lengths, heads=args.heads, d=args.d, causal=args.causal, repeats=args.repeats,
                                 memory=not args.no_memory)
    return report, cpu_sweep.print_cpu(report), args.out or Path("bench-results/flash-cpu.json")


def _scan(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import scan

    report = scan.bench_scan(args.documents, args.max_tokens, tuple(args.ray_workers), tuple(args.memory_docs),
                             args.model)
    return report, scan.print_scan(report), args.out


def _queries_keys(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import queries_keys

    report = queries_keys.bench_queries_keys(args.points, args.tokens, args.embed_points, *args.shape)
    return report, queries_keys.print_queries_keys(report), args.out


def _ablation(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import ablation

    layers, heads, width = args.shape
    report = ablation.bench_ablation(args.texts, args.max_tokens, args.repeats, args.model, layers, heads, width)
    return report, ablation.print_ablation(report), args.out


def _patching(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import patching

    report = patching.bench_patching(args.repeats, args.period, args.rows, args.model)
    return report, patching.print_patching(report), args.out


def _series(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import series

    report = series.bench_series(args.checkpoints, args.repeats, *args.shape)
    return report, series.print_series(report), args.out


def _train_step(args) -> tuple[dict, list[str], Path]:
    from attnviz.bench import train_step

    report = train_step.bench_train_step(args.repeats, args.steps, args.threads)
    return report, train_step.print_train_step(report), args.out


BENCHMARKS = {"queries-keys": _queries_keys, "ablation": _ablation, "scan": _scan, "explore": _explore, "pages": _pages,
              "load": _load, "startup": _startup, "long": _long, "flash": _flash,
              "patching": _patching, "series": _series, "train-step": _train_step}


def write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"JSON written to {out}")


def main(argv: list[str] | None = None, prog: str = "python -m attnviz.bench") -> int:
    configure_environment()
    args = build_parser(prog).parse_args(argv)

    from attnviz.system.measure import environment

    report, lines, out = BENCHMARKS[args.command](args)
    report["environment"] = environment()
    print("\n".join(lines))
    write_report(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
