"""``python -m attnviz.bench flash --gpu``: our Triton kernel vs SDPA's flash, cuDNN and memory-efficient kernels
on a CUDA GPU, bf16, forward and forward + backward, for full, causal, sliding-window and BigBird masks.

Imports only torch, triton and attnviz's flash and core, so it runs on a bare GPU machine. ``device`` and
``timer`` let the same code run on a CPU in Triton's interpreter (the tests do), so what runs on the GPU machine
has run before.
"""

from __future__ import annotations

import time

import torch

from attnviz.core import mask_patterns, masks
from attnviz.flash.cpu_sweep import attention_flops
from attnviz.system.gpus import gpu_bf16_peak

CASE_MASKS = ("full", "causal", "window", "bigbird")
SDPA_KERNELS = ("sdpa/flash", "sdpa/cudnn", "sdpa/efficient")
# What the recorded figures are checked against (docs/benchmarks.md).
TARGETS = {"forward vs SDPA flash, full, N >= 4k, d = 128": 1.0, "causal / full time": 0.6,
           "sparse speed-up over the fastest dense SDPA": 3.0}


def gpu_cases(quick: bool = False, lengths: list[int] | None = None,
              head_dims: tuple[int, ...] = (64, 128)) -> list[dict]:
    lengths = lengths or ([1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384])
    return [{"d": d, "n": n, "mask": mask} for d in head_dims for n in lengths for mask in CASE_MASKS]


def case_mask(mask: str, n: int, *, window: int, bigbird_block: int) -> masks.MaskSpec:
    """The mask of a case, from the shared pattern registry."""
    if mask == "window":
        return mask_patterns.rule("sliding_causal", n, window=window)
    if mask == "bigbird":
        return mask_patterns.rule("bigbird", n, block_size=bigbird_block, global_blocks=2, window_blocks=3,
                                  random_blocks=2)
    return mask_patterns.rule(mask, n)


def _contenders(q, k, v, spec: masks.MaskSpec) -> dict:
    """Our kernel and SDPA's, each a function of no arguments; SDPA gets the same mask as a dense tensor."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnviz.flash.triton_kernel import triton_attention

    dense = None if spec.is_full or (spec.causal and spec.window is None) else spec.dense().to(q.device)
    from attnviz.flash.flex import flex_attention

    scale = q.shape[-1] ** -0.5
    # FlexAttention has no backward on a CPU and refuses inputs that require grad there: the CPU smoke test runs
    # its forward on detached inputs (its forward + backward is then reported as an error, not fatal).
    flex_inputs = (q, k, v) if q.is_cuda else (q.detach(), k.detach(), v.detach())
    contenders = {"triton": lambda: triton_attention(q, k, v, spec)[0],
                  "flex": lambda: flex_attention(*flex_inputs, spec, scale)}
    kernels = {"sdpa/flash": SDPBackend.FLASH_ATTENTION, "sdpa/cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa/efficient": SDPBackend.EFFICIENT_ATTENTION}
    for label in SDPA_KERNELS:
        def run(backend=kernels[label]):
            with sdpa_kernel([backend]):
                if dense is not None:
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=spec.causal)
        contenders[label] = run
    return contenders


def _time_case(contenders: dict, q, k, v, timer) -> dict:
    """Forward and forward + backward times of every contender; one that cannot run is reported, not fatal."""
    grad = torch.randn_like(q)
    row = {"forward_ms": {}, "forward_backward_ms": {}, "errors": {}, "first_call_ms": {}}
    reference = None
    for label, function in contenders.items():
        try:
            started = time.perf_counter()
            with torch.no_grad():
                output = function()  # FlexAttention compiles its kernel in this first call: timed apart
            if q.is_cuda:
                torch.cuda.synchronize()
            row["first_call_ms"][label] = (time.perf_counter() - started) * 1000
            if reference is None and label not in ("triton", "flex"):
                reference = output
            row["forward_ms"][label] = timer(function)

            def forward_backward(function=function):
                q.grad = k.grad = v.grad = None
                function().backward(grad)
            row["forward_backward_ms"][label] = timer(forward_backward)
        except Exception as problem:  # noqa: BLE001 - any kernel failure is a result to report
            row["errors"][label] = str(problem).splitlines()[0][:160]
    with torch.no_grad():
        ours = contenders["triton"]()
        flex = contenders["flex"]() if "flex" in row["forward_ms"] else None
    if reference is not None:
        row["max_abs_diff_vs_sdpa"] = (ours.float() - reference.float()).abs().max().item()
        if flex is not None:
            row["flex_max_abs_diff_vs_sdpa"] = (flex.float() - reference.float()).abs().max().item()
    return row


def bench_gpu(*, batch: int = 4, heads: int = 32, quick: bool = False, device: str = "cuda", timer=None,
              lengths: list[int] | None = None, head_dims: tuple[int, ...] = (64, 128), window: int = 1024,
              bigbird_block: int = 128, progress=print) -> dict:
    """Triton vs SDPA's kernels; ``timer(function) -> ms`` defaults to ``triton.testing.do_bench``."""
    import triton

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu needs a CUDA GPU")
    if timer is None:
        timer = lambda function: triton.testing.do_bench(function, warmup=5, rep=20)  # noqa: E731
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke test, Triton interpreter)"
    rows = []
    started = time.perf_counter()
    for case in gpu_cases(quick, lengths, head_dims):
        d, n, mask = case["d"], case["n"], case["mask"]
        q, k, v = (torch.randn(batch, heads, n, d, generator=generator, device=device, dtype=dtype).requires_grad_()
                   for _ in range(3))
        spec = case_mask(mask, n, window=window, bigbird_block=bigbird_block)
        density = None if mask in ("full", "causal") else masks.density(spec.dense())
        row = {**case, "density": density, **_time_case(_contenders(q, k, v, spec), q, k, v, timer)}
        for key in ("forward_ms", "forward_backward_ms"):
            flops = attention_flops(batch, heads, n, d, causal=mask == "causal", backward=key == "forward_backward_ms",
                                    density=density)
            row[key.replace("_ms", "_tflops")] = {lab: flops / (ms * 1e-3) / 1e12 for lab, ms in row[key].items()}
        rows.append(row)
        progress(f"  d={d:<3} N={n:>5} {mask:<7} triton fwd {row['forward_ms'].get('triton', float('nan')):7.2f} ms "
                 f"({row['forward_tflops'].get('triton', float('nan')):6.1f} TFLOPS) | "
                 + ", ".join(f"{lab} {ms:.2f}" for lab, ms in row["forward_ms"].items() if lab != "triton")
                 + (f" | errors: {row['errors']}" if row["errors"] else ""))
        del q, k, v  # let the GPU memory of this case go before the next
        if device == "cuda":
            torch.cuda.empty_cache()
    return {
        "benchmark": "flash-gpu", "gpu": device_name, "batch": batch, "heads": heads,
        "dtype": str(dtype).split(".")[-1], "window": window,
        "bigbird": f"block {bigbird_block}, 2 global, 3 window, 2 random blocks",
        "peak_tflops": gpu_bf16_peak(device_name),  # None: a GPU attnviz has no data sheet figure for
        "torch": torch.__version__, "triton": triton.__version__, "seconds": time.perf_counter() - started,
        "results": rows,
    }


def targets_gpu(report: dict) -> list[str]:
    """The recorded targets, checked on a report's numbers."""
    rows = report["results"]
    lines = []
    big_d128 = [r for r in rows if r["d"] == 128 and r["n"] >= 4096 and r["mask"] == "full"]
    ok = [r["forward_ms"]["sdpa/flash"] / r["forward_ms"]["triton"] >= TARGETS[
        "forward vs SDPA flash, full, N >= 4k, d = 128"] for r in big_d128
          if "triton" in r["forward_ms"] and "sdpa/flash" in r["forward_ms"]]
    lines.append(f"forward >= 1.0x SDPA flash at N >= 4k, d = 128: {sum(ok)} of {len(ok)} sizes")
    pairs = {(r["d"], r["n"]): r for r in rows if r["mask"] == "full"}
    causal_ratios = [r["forward_ms"]["triton"] / pairs[(r["d"], r["n"])]["forward_ms"]["triton"]
                     for r in rows if r["mask"] == "causal" and (r["d"], r["n"]) in pairs
                     and "triton" in r["forward_ms"] and "triton" in pairs[(r["d"], r["n"])]["forward_ms"]]
    if causal_ratios:
        lines.append(f"causal / non-causal wall time: {min(causal_ratios):.2f}..{max(causal_ratios):.2f} "
                     f"(target <= {TARGETS['causal / full time']})")
    longest = max(r["n"] for r in rows)
    for mask in ("window", "bigbird"):
        for r in (r for r in rows if r["mask"] == mask and r["n"] == longest and "triton" in r["forward_ms"]):
            dense = [r["forward_ms"][lab] for lab in SDPA_KERNELS if lab in r["forward_ms"]]
            if dense:
                lines.append(f"{mask} at N = {longest}, d = {r['d']}: {min(dense) / r['forward_ms']['triton']:.1f}x "
                             "faster than the fastest SDPA with the dense mask "
                             f"(target >= {TARGETS['sparse speed-up over the fastest dense SDPA']:.0f}x)")
    return lines


def print_gpu(report: dict) -> list[str]:
    lines = [f"Flash attention on {report['gpu']}: B={report['batch']} H={report['heads']} {report['dtype']}, "
             f"torch {report['torch']}, triton {report['triton']} ({report['seconds']:.0f} s)"]
    lines.append(f"{'d':>4} {'N':>6} {'mask':<8} {'triton TF':>10} {'% of peak':>9} {'vs flash':>9} {'vs cudnn':>9} "
                 f"{'vs effic.':>9} {'vs flex':>9} {'fwd+bwd TF':>11} {'flex compile':>12}")
    peak = report.get("peak_tflops")
    for row in report["results"]:
        forward = row["forward_ms"]
        ours = forward.get("triton")

        def ratio(label, forward=forward, ours=ours):
            return f"{forward[label] / ours:.2f}x" if ours and label in forward else "—"
        tflops = row["forward_tflops"].get("triton", float("nan"))
        lines.append(
            f"{row['d']:>4} {row['n']:>6} {row['mask']:<8} {tflops:>10.1f} {share_of_peak(tflops, peak):>9} "
            f"{ratio('sdpa/flash'):>9} {ratio('sdpa/cudnn'):>9} {ratio('sdpa/efficient'):>9} {ratio('flex'):>9} "
            f"{row['forward_backward_tflops'].get('triton', float('nan')):>11.1f} "
            f"{row.get('first_call_ms', {}).get('flex', float('nan')) / 1000:>11.1f}s"
        )
    peak_text = f"{peak:.0f} TFLOPS (dense bf16, data sheet)" if peak else f"unknown for {report['gpu']}"
    lines.append("Ratios are contender time / triton time (above 1 = triton faster); "
                 f"peak = {peak_text}; flex compile = FlexAttention's first call (compiling), "
                 "not in its times.")
    lines += targets_gpu(report)
    return lines


def share_of_peak(tflops: float, peak: float | None) -> str:
    """``tflops`` as a share of the GPU's peak ("41.2%"), or "—" when the peak is unknown."""
    return f"{tflops / peak:.1%}" if peak else "—"
