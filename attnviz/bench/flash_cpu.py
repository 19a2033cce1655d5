"""``python -m attnviz.bench flash``: naive vs tiled vs SDPA on CPU, and Triton vs SDPA on a GPU (``--gpu``).

Imports only torch, triton, numpy and the standard library besides attnviz.flash, so it runs on the GPU machine.
Every contender runs in the same process and run; peak CPU memory is measured in a fresh subprocess per point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from attnviz.bench import median_seconds

CPU_CONTENDERS = {
    "naive": {"backend": "naive"},
    "tiled": {"backend": "tiled", "block_q": 256, "block_k": 512},
    "sdpa/flash": {"backend": "sdpa", "sdpa_kernel": "flash"},
    "sdpa/math": {"backend": "sdpa", "sdpa_kernel": "math"},
}
PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16 (the brief's yardstick)


def attention_flops(batch: int, heads: int, n: int, d: int, *, causal: bool = False, backward: bool = False,
                    density: float | None = None) -> float:
    """4 B H N^2 d for the forward (two matmuls); x0.5 causal (or x density); backward adds 2.5x the forward."""
    flops = 4.0 * batch * heads * n * n * d
    flops *= 0.5 if causal else (density if density is not None else 1.0)
    return flops * (3.5 if backward else 1.0)


def _make_inputs(batch, heads, n, d, dtype, device, seed=0):
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=generator, device=device, dtype=dtype) for _ in range(3)]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def print_peak_of(call) -> None:
    """Run ``call`` twice in this (fresh) process and print, as JSON, the extra peak resident memory of the second.

    The first run is a warm-up (thread pools, packing buffers do not count). The kernel's high-water mark (VmHWM)
    is reset just before the second (``echo 5 > /proc/self/clear_refs``), so the import of torch and the inputs
    do not count either: peak = VmHWM after the run - VmRSS before it.
    """
    import gc

    import torch

    with torch.no_grad():
        call()
        gc.collect()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM to the current RSS
        before = _status_kib("VmRSS")
        call()
        after = _status_kib("VmHWM")
    print(json.dumps({"peak_bytes": max(after - before, 0) * 1024}))


def _peak_memory_child(spec_json: str) -> None:
    import torch

    from attnviz.flash import attention

    spec = json.loads(spec_json)
    torch.set_num_threads(spec["threads"])
    q, k, v = _make_inputs(spec["batch"], spec["heads"], spec["n"], spec["d"], torch.float32, "cpu")
    print_peak_of(lambda: attention(q, k, v, causal=spec["causal"], **CPU_CONTENDERS[spec["name"]]))


# glibc hands freed blocks of up to 32 MiB back to the next allocation instead of to the OS, so a second call
# could reuse the first one's memory and show no new peak. A fixed mmap threshold makes every block over 64 KiB
# its own mapping, returned on free: the measured peak is then the call's own.
MEASURING_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
                 "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536:glibc.malloc.trim_threshold=0"}


def run_memory_child(module: str, function: str, spec: str, timeout: float = 600) -> int:
    """Run ``module.function(spec)`` in a fresh Python process and return the peak bytes it prints as JSON."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, **MEASURING_ENV, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, "-c", f"from {module} import {function}; {function}({spec!r})"],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=root,
    )
    if result.returncode != 0:
        raise RuntimeError((result.stderr.strip().splitlines() or ["the measuring process failed"])[-1][:200])
    return int(json.loads(result.stdout.strip().splitlines()[-1])["peak_bytes"])


def measure_peak_memory(name: str, n: int, *, batch: int, heads: int, d: int, causal: bool, threads: int) -> int:
    spec = json.dumps({"name": name, "n": n, "batch": batch, "heads": heads, "d": d, "causal": causal,
                       "threads": threads})
    return run_memory_child("attnviz.flash_bench", "_peak_memory_child", spec)


def bench_cpu(lengths: list[int], *, batch: int = 1, heads: int = 8, d: int = 64, causal: bool = False,
              repeats: int = 3, memory: bool = True, progress=print) -> dict:
    import torch

    from attnviz.flash import attention

    threads = torch.get_num_threads()
    rows = []
    for n in lengths:
        q, k, v = _make_inputs(batch, heads, n, d, torch.float32, "cpu")
        row = {"n": n, "time_s": {}, "peak_bytes": {}, "max_abs_diff_vs_naive": {}}
        with torch.no_grad():
            reference = attention(q, k, v, backend="naive", causal=causal).output
            for name, options in CPU_CONTENDERS.items():
                run = lambda: attention(q, k, v, causal=causal, **options).output  # noqa: E731
                row["time_s"][name] = median_seconds(run, repeats)
                row["max_abs_diff_vs_naive"][name] = (run() - reference).abs().max().item()
                if memory:
                    row["peak_bytes"][name] = measure_peak_memory(name, n, batch=batch, heads=heads, d=d,
                                                                  causal=causal, threads=threads)
                progress(f"  N={n:>5} {name:<11} {row['time_s'][name] * 1000:>9.1f} ms"
                         + (f"  peak {row['peak_bytes'][name] / 2**20:>8.1f} MiB" if memory else ""))
        row["naive_scores_bytes"] = 2 * batch * heads * n * n * 4  # scores + softmax, fp32
        rows.append(row)
    return {"benchmark": "flash-cpu", "batch": batch, "heads": heads, "d": d, "dtype": "fp32", "causal": causal,
            "threads": threads, "repeats": repeats, "results": rows}


def print_cpu(report: dict) -> list[str]:
    names = list(CPU_CONTENDERS)
    lines = [f"Flash attention on CPU: B={report['batch']} H={report['heads']} d={report['d']} fp32"
             f"{' causal' if report['causal'] else ''}, {report['threads']} threads, median of {report['repeats']}"]
    lines.append(f"{'N':>6} " + " ".join(f"{n + ' ms':>14}" for n in names) + "   " + " ".join(f"{n + ' MiB':>14}" for n in names))
    for row in report["results"]:
        times = " ".join(f"{row['time_s'][n] * 1000:>14.1f}" for n in names)
        peaks = " ".join(f"{row['peak_bytes'].get(n, float('nan')) / 2**20:>14.1f}" for n in names)
        lines.append(f"{row['n']:>6} {times}   {peaks}")
    last = report["results"][-1]
    t, p = last["time_s"], last["peak_bytes"]
    lines.append(f"Ratios at N={last['n']} (measured in this run):")
    lines.append("  time vs naive:      " + ", ".join(f"{n} {t[n] / t['naive']:.2f}x" for n in names))
    lines.append("  time vs sdpa/flash: " + ", ".join(f"{n} {t[n] / t['sdpa/flash']:.2f}x" for n in names))
    if p:
        lines.append("  peak vs naive:      " + ", ".join(f"{n} {p[n] / max(p['naive'], 1):.3f}x" for n in names))
        lines.append("  peak vs sdpa/flash: " + ", ".join(f"{n} {p[n] / max(p['sdpa/flash'], 1):.2f}x" for n in names))
        checks = [
            ("tiled peak <= 2x sdpa/flash", p["tiled"] <= 2 * max(p["sdpa/flash"], 1)),
            ("tiled peak <= 1/20 naive", p["tiled"] <= p["naive"] / 20),
            ("tiled time <= 2.5x sdpa/flash", t["tiled"] <= 2.5 * t["sdpa/flash"]),
        ]
        lines.append("Targets: " + "; ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in checks))
    lines.append("Max |output - naive|: " + ", ".join(f"{n} {last['max_abs_diff_vs_naive'][n]:.1e}" for n in names))
    return lines


# ---------------------------------------------------------------------------------------------------------------
# GPU: Triton vs SDPA's flash, cuDNN and memory-efficient kernels (bf16)


def gpu_cases(quick: bool = False, lengths: list[int] | None = None, head_dims: tuple[int, ...] = (64, 128)) -> list[dict]:
    lengths = lengths or ([1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384])
    return [{"d": d, "n": n, "mask": mask} for d in head_dims for n in lengths
            for mask in ("full", "causal", "window", "bigbird")]


def bench_gpu(*, batch: int = 4, heads: int = 32, quick: bool = False, device: str = "cuda", timer=None,
              lengths: list[int] | None = None, head_dims: tuple[int, ...] = (64, 128), window: int = 1024,
              bigbird_block: int = 128, progress=print) -> dict:
    """Triton vs SDPA's flash, cuDNN and efficient kernels, bf16, forward and forward + backward.

    ``device``, ``timer`` (ms per call), ``lengths`` and ``head_dims`` exist so the same code can be smoke-tested
    on a CPU with the Triton interpreter; the real run is ``python -m attnviz.bench flash --gpu``.
    """
    import torch
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnviz import masks
    from attnviz.flash.triton_kernel import triton_attention

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA GPU")
    if timer is None:
        timer = lambda function: triton.testing.do_bench(function, warmup=5, rep=20)  # noqa: E731
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke test, Triton interpreter)"
    rows = []
    started = time.perf_counter()
    for case in gpu_cases(quick, lengths, head_dims):
        d, n, mask = case["d"], case["n"], case["mask"]
        q, k, v = (t.requires_grad_() for t in _make_inputs(batch, heads, n, d, dtype, device))
        grad = torch.randn_like(q)
        kwargs, dense, density, causal = {}, None, None, False
        if mask == "causal":
            kwargs, causal = {"causal": True}, True
        elif mask == "window":
            kwargs = {"window": (window - 1, 0)}
            dense = masks.sliding_window(n, window - 1, 0).to(device)
            density = masks.density(dense)
        elif mask == "bigbird":
            layout = masks.bigbird(n, bigbird_block, 2, 3, 2, seed=0)
            kwargs = {"block_layout": layout.layout, "block_size": bigbird_block}
            dense = layout.mask.to(device)
            density = masks.density(layout.mask)
        contenders = {"triton": lambda: triton_attention(q, k, v, **kwargs)[0]}
        for label, backend in (("sdpa/flash", SDPBackend.FLASH_ATTENTION), ("sdpa/cudnn", SDPBackend.CUDNN_ATTENTION),
                               ("sdpa/efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel([backend]):
                    if dense is not None:  # SDPA gets the same mask, dense
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            contenders[label] = run
        row = {**case, "density": density, "forward_ms": {}, "forward_backward_ms": {}, "errors": {}}
        reference = None
        for label, function in contenders.items():
            try:
                with torch.no_grad():
                    output = function()
                if reference is None and label != "triton":
                    reference = output
                row["forward_ms"][label] = timer(function)

                def forward_backward(function=function):
                    q.grad = k.grad = v.grad = None
                    function().backward(grad)
                row["forward_backward_ms"][label] = timer(forward_backward)
            except Exception as problem:  # noqa: BLE001 - a kernel that cannot run this case is reported, not fatal
                row["errors"][label] = str(problem).splitlines()[0][:160]
        with torch.no_grad():
            ours = contenders["triton"]()
            if reference is not None:
                row["max_abs_diff_vs_sdpa"] = (ours.float() - reference.float()).abs().max().item()
        for key in ("forward_ms", "forward_backward_ms"):
            backward = key == "forward_backward_ms"
            flops = attention_flops(batch, heads, n, d, causal=causal, backward=backward, density=density)
            row[key.replace("_ms", "_tflops")] = {lab: flops / (ms * 1e-3) / 1e12 for lab, ms in row[key].items()}
        rows.append(row)
        progress(f"  d={d:<3} N={n:>5} {mask:<7} triton fwd {row['forward_ms'].get('triton', float('nan')):7.2f} ms "
                 f"({row['forward_tflops'].get('triton', float('nan')):6.1f} TFLOPS) | "
                 + ", ".join(f"{lab} {ms:.2f}" for lab, ms in row["forward_ms"].items() if lab != "triton")
                 + (f" | errors: {row['errors']}" if row["errors"] else ""))
        contenders = reference = ours = None  # let the GPU memory of this case go before the next
        if device == "cuda":
            torch.cuda.empty_cache()
    return {
        "benchmark": "flash-gpu", "gpu": device_name, "batch": batch, "heads": heads, "dtype": str(dtype).split(".")[-1],
        "window": window, "bigbird": f"block {bigbird_block}, 2 global, 3 window, 2 random blocks",
        "peak_tflops": PEAK_TFLOPS, "torch": torch.__version__, "triton": triton.__version__,
        "seconds": time.perf_counter() - started, "results": rows,
    }


def targets_gpu(report: dict) -> list[str]:
    """The issue's GPU targets, checked on a report's numbers."""
    rows = report["results"]
    lines = []
    big_d128 = [r for r in rows if r["d"] == 128 and r["n"] >= 4096 and r["mask"] == "full"]
    ok = [r["forward_ms"]["sdpa/flash"] / r["forward_ms"]["triton"] >= 1.0 for r in big_d128
          if "triton" in r["forward_ms"] and "sdpa/flash" in r["forward_ms"]]
    lines.append(f"forward >= 1.0x SDPA flash at N >= 4k, d = 128: {sum(ok)} of {len(ok)} sizes")
    pairs = {(r["d"], r["n"]): r for r in rows if r["mask"] == "full"}
    causal_ratios = [r["forward_ms"]["triton"] / pairs[(r["d"], r["n"])]["forward_ms"]["triton"]
                     for r in rows if r["mask"] == "causal" and (r["d"], r["n"]) in pairs
                     and "triton" in r["forward_ms"] and "triton" in pairs[(r["d"], r["n"])]["forward_ms"]]
    if causal_ratios:
        lines.append(f"causal / non-causal wall time: {min(causal_ratios):.2f}..{max(causal_ratios):.2f} (target <= 0.6)")
    longest = max(r["n"] for r in rows)
    for mask in ("window", "bigbird"):
        for r in (r for r in rows if r["mask"] == mask and r["n"] == longest and "triton" in r["forward_ms"]):
            dense = [r["forward_ms"][lab] for lab in ("sdpa/efficient", "sdpa/cudnn", "sdpa/flash") if lab in r["forward_ms"]]
            if dense:
                lines.append(f"{mask} at N = {longest}, d = {r['d']}: {min(dense) / r['forward_ms']['triton']:.1f}x faster "
                             "than the fastest SDPA with the dense mask (target >= 3x)")
    return lines


def print_gpu(report: dict) -> list[str]:
    lines = [f"Flash attention on {report['gpu']}: B={report['batch']} H={report['heads']} bf16, torch {report['torch']}, "
             f"triton {report['triton']} ({report['seconds']:.0f} s)"]
    lines.append(f"{'d':>4} {'N':>6} {'mask':<8} {'triton TF':>10} {'% of 989':>9} {'vs flash':>9} {'vs cudnn':>9} "
                 f"{'vs effic.':>9} {'fwd+bwd TF':>11}")
    for row in report["results"]:
        fwd = row["forward_ms"]
        tri = fwd.get("triton")

        def ratio(label):
            return f"{fwd[label] / tri:.2f}x" if tri and label in fwd else "—"
        tflops = row["forward_tflops"].get("triton", float("nan"))
        lines.append(
            f"{row['d']:>4} {row['n']:>6} {row['mask']:<8} {tflops:>10.1f} {tflops / report['peak_tflops']:>9.1%} "
            f"{ratio('sdpa/flash'):>9} {ratio('sdpa/cudnn'):>9} {ratio('sdpa/efficient'):>9} "
            f"{row['forward_backward_tflops'].get('triton', float('nan')):>11.1f}"
        )
    lines.append("Ratios are contender time / triton time (above 1 = triton faster).")
    lines += targets_gpu(report)
    return lines
