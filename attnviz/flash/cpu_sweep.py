"""``python -m attnviz.bench flash``: naive vs tiled vs SDPA flash/math vs FlexAttention on the CPU, time and peak
memory vs N; FlexAttention's compile time (its first call) is printed apart from its run time.

Every contender runs on the same inputs in the same run; peak memory is measured in a fresh process per point
(:func:`attnviz.flash.cases.measure_peak_memory`). Imports only torch and attnviz's flash and core.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnviz.flash.cases import AttentionCase, measure_peak_memory
from attnviz.flash.dispatch import run_contender
from attnviz.system.measure import median_seconds

CPU_CONTENDERS = ("naive", "tiled", "sdpa/flash", "sdpa/math", "flex")  # keys of attnviz.flash.CONTENDERS
# The sweeps the Flash page draws as "saved benchmark" (shipped with the package: flash-*.json).
RECORDED_SWEEPS = Path(__file__).resolve().parent / "recorded"
# What the recorded figures are checked against (docs/benchmarks.md).
TARGETS = {"tiled peak / sdpa flash peak": 2.0, "tiled peak / naive peak": 1 / 20, "tiled time / sdpa flash time": 2.5}


def attention_flops(batch: int, heads: int, n: int, d: int, *, causal: bool = False, backward: bool = False,
                    density: float | None = None) -> float:
    """4 B H N^2 d for the forward (two matmuls); x0.5 causal (or x density); backward adds 2.5x the forward."""
    flops = 4.0 * batch * heads * n * n * d
    flops *= 0.5 if causal else (density if density is not None else 1.0)
    return flops * (3.5 if backward else 1.0)


def bench_cpu(lengths: list[int], *, batch: int = 1, heads: int = 8, d: int = 64, causal: bool = False,
              repeats: int = 3, memory: bool = True, progress=print) -> dict:
    threads = torch.get_num_threads()
    rows = []
    for n in lengths:
        case = AttentionCase(n, d, heads, batch=batch, mask="causal" if causal else "full")
        q, k, v = case.tensors()
        mask = case.mask_spec()
        row = {"n": n, "time_s": {}, "peak_bytes": {}, "max_abs_diff_vs_naive": {}, "first_call_s": {}}
        with torch.no_grad():
            reference = run_contender("naive", q, k, v, mask).output
            for name in CPU_CONTENDERS:
                def run(name=name, q=q, k=k, v=v, mask=mask):
                    return run_contender(name, q, k, v, mask).output
                row["first_call_s"][name] = median_seconds(run, 1, warmup=0)  # FlexAttention compiles here
                row["time_s"][name] = median_seconds(run, repeats)
                row["max_abs_diff_vs_naive"][name] = (run() - reference).abs().max().item()
                if memory:
                    row["peak_bytes"][name] = measure_peak_memory(case, name, threads=threads)
                progress(f"  N={n:>5} {name:<11} {row['time_s'][name] * 1000:>9.1f} ms"
                         + (f"  peak {row['peak_bytes'][name] / 2**20:>8.1f} MiB" if memory else ""))
        row["naive_scores_bytes"] = 2 * batch * heads * n * n * 4  # scores + softmax, fp32
        rows.append(row)
    return {"benchmark": "flash-cpu", "batch": batch, "heads": heads, "d": d, "dtype": "fp32", "causal": causal,
            "threads": threads, "repeats": repeats, "results": rows}


def print_cpu(report: dict) -> list[str]:
    names = list(report["results"][0]["time_s"])
    lines = [f"Flash attention on CPU: B={report['batch']} H={report['heads']} d={report['d']} fp32"
             f"{' causal' if report['causal'] else ''}, {report['threads']} threads, median of {report['repeats']}"]
    lines.append(f"{'N':>6} " + " ".join(f"{n + ' ms':>14}" for n in names) + "   "
                 + " ".join(f"{n + ' MiB':>14}" for n in names))
    for row in report["results"]:
        times = " ".join(f"{row['time_s'][n] * 1000:>14.1f}" for n in names)
        peaks = " ".join(f"{row['peak_bytes'].get(n, float('nan')) / 2**20:>14.1f}" for n in names)
        lines.append(f"{row['n']:>6} {times}   {peaks}")
    last = report["results"][-1]
    t, p = last["time_s"], last["peak_bytes"]
    compiles = [row["first_call_s"].get("flex") for row in report["results"] if row.get("first_call_s")]
    if compiles and None not in compiles:
        lines.append("FlexAttention's first call (compiling for the shape, not in the times above): "
                     + ", ".join(f"N={row['n']} {row['first_call_s']['flex']:.1f} s" for row in report["results"]))
    lines.append(f"Ratios at N={last['n']} (measured in this run):")
    lines.append("  time vs naive:      " + ", ".join(f"{n} {t[n] / t['naive']:.2f}x" for n in names))
    lines.append("  time vs sdpa/flash: " + ", ".join(f"{n} {t[n] / t['sdpa/flash']:.2f}x" for n in names))
    if p:
        lines.append("  peak vs naive:      " + ", ".join(f"{n} {p[n] / max(p['naive'], 1):.3f}x" for n in names))
        lines.append("  peak vs sdpa/flash: " + ", ".join(f"{n} {p[n] / max(p['sdpa/flash'], 1):.2f}x" for n in names))
        measured = {
            "tiled peak / sdpa flash peak": p["tiled"] / max(p["sdpa/flash"], 1),
            "tiled peak / naive peak": p["tiled"] / max(p["naive"], 1),
            "tiled time / sdpa flash time": t["tiled"] / t["sdpa/flash"],
        }
        lines.append("Targets: " + "; ".join(
            f"{name} {value:.3g} (<= {TARGETS[name]:.3g}: {'met' if value <= TARGETS[name] else 'MISSED'})"
            for name, value in measured.items()
        ))
    lines.append("Max |output - naive|: " + ", ".join(f"{n} {last['max_abs_diff_vs_naive'][n]:.1e}" for n in names))
    return lines
