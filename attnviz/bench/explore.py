"""Benchmarks: ``python -m attnviz.bench explore``, ``python -m attnviz.bench flash [--gpu]``.

Every contender is measured in the same run and reported as medians of repeats, with ratios; results are also
written as JSON. Machines are shared and noisy: read the ratios, not single numbers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def median_seconds(function, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def environment() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
    }


# ---------------------------------------------------------------------------------------------------------------
# explore: the Explore heads page's computation on the default model


def sentence_of(n_tokens: int, tokenizer) -> str:
    """A natural-looking text whose tokenization (with [CLS]/[SEP]) has exactly ``n_tokens`` tokens."""
    words = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree " * 64).split()
    ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"][: n_tokens - 2]
    return tokenizer.decode(ids)


def bench_explore(repeats: int) -> dict:
    from attnviz import explore
    from attnviz.models.capture import capture, replay_difference
    from attnviz.models.loading import load_default_model

    start = time.perf_counter()
    bundle = load_default_model()
    load_seconds = time.perf_counter() - start
    rows = []
    for n_tokens in (32, 512):
        text = sentence_of(n_tokens, bundle.tokenizer)
        result = capture(bundle, text)
        assert len(result.tokens) == n_tokens, (len(result.tokens), n_tokens)
        record = result.records["self"]

        def page_views():
            # What a rerun of the page does with a cached capture: build the figure and serialise it for the browser.
            sizes = {}
            for view in explore.VIEWS:
                figure, _ = explore.view_figure(result, explore.ViewOptions(view=view, layer=2, head=5))
                sizes[view] = len(figure.to_json())
            return sizes

        def new_sentence():
            # A new sentence: run the model, replay-check every head, build and serialise the head view.
            fresh = capture(bundle, text)
            replay_difference(fresh.records["self"])
            figure, _ = explore.view_figure(fresh, explore.ViewOptions(view="head"))
            figure.to_json()

        sizes = page_views()
        rows.append(
            {
                "tokens": n_tokens,
                "capture_s": median_seconds(lambda: capture(bundle, text), repeats),
                "replay_s": median_seconds(lambda: replay_difference(record), repeats),
                "statistics_s": median_seconds(lambda: explore.statistics_table(result, "self"), repeats),
                "rerun_all_views_s": median_seconds(page_views, repeats),
                "new_sentence_s": median_seconds(new_sentence, repeats),
                "figure_bytes": sizes,
            }
        )
    return {"benchmark": "explore", "model": bundle.name, "load_s": load_seconds, "repeats": repeats,
            "environment": environment(), "results": rows}


def print_explore(report: dict) -> None:
    print(f"Explore heads on {report['model']} (model load {report['load_s']:.2f} s, medians of {report['repeats']})")
    columns = ("capture_s", "replay_s", "statistics_s", "rerun_all_views_s", "new_sentence_s")
    print(f"{'tokens':>6} {'capture':>10} {'replay':>10} {'stats':>10} {'5 views':>10} {'new text':>10}  figure sizes sent (KB)")
    for row in report["results"]:
        sizes = ", ".join(f"{view} {size / 1024:.0f}" for view, size in row["figure_bytes"].items())
        times = " ".join(f"{row[c] * 1000:>8.1f}ms" for c in columns)
        print(f"{row['tokens']:>6} {times}  {sizes}")
    short, long = report["results"]
    target = 0.5
    verdict = "meets" if short["new_sentence_s"] < target else "misses"
    print(
        f"32-token warm path (new sentence: model + replay + figure): {short['new_sentence_s']:.3f} s, {verdict} the "
        f"{target} s target; 512 tokens take {long['new_sentence_s'] / short['new_sentence_s']:.1f}x as long."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnviz.bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    explore_parser = commands.add_parser("explore", help="the Explore heads page on the default model")
    explore_parser.add_argument("--repeats", type=int, default=7)
    explore_parser.add_argument("--out", type=Path, default=None)
    flash_parser = commands.add_parser("flash", help="flash attention: naive, tiled, SDPA (CPU) or Triton (--gpu)")
    flash_parser.add_argument("--gpu", action="store_true", help="Triton vs SDPA kernels on a CUDA GPU, bf16")
    flash_parser.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    flash_parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    flash_parser.add_argument("--heads", type=int, default=8)
    flash_parser.add_argument("--d", type=int, default=64)
    flash_parser.add_argument("--causal", action="store_true")
    flash_parser.add_argument("--repeats", type=int, default=3)
    flash_parser.add_argument("--no-memory", action="store_true", help="skip the per-point memory subprocesses")
    flash_parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    if args.command == "explore":
        report = bench_explore(args.repeats)
        print_explore(report)
    elif args.command == "flash":
        from attnviz import flash_bench

        if args.gpu:
            report = flash_bench.bench_gpu(quick=args.quick)
            lines = flash_bench.print_gpu(report)
        else:
            lengths = [512, 1024] if args.quick else args.lengths
            report = flash_bench.bench_cpu(lengths, heads=args.heads, d=args.d, causal=args.causal,
                                           repeats=args.repeats, memory=not args.no_memory)
            lines = flash_bench.print_cpu(report)
        report["environment"] = environment()
        print("\n".join(lines))
        args.out = args.out or Path("bench-results") / ("flash-gpu.json" if args.gpu else "flash-cpu.json")
    args.out = args.out or Path("bench-results/explore.json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"JSON written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
