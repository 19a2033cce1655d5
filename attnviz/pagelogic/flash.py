"""What the "Flash vs naive" page computes: every chosen backend on the same inputs, timed and compared."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from attnviz import masks
from attnviz.flash import BackendUnavailable, attention  # noqa: F401 - BackendUnavailable is used by the page
from attnviz.flash.tiled import COMPUTED, MASKED, SKIPPED, tiled_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INTERPRETER_LIMIT = 256  # tokens: above this the Triton interpreter takes minutes
CONTENDERS = {
    "naive": {"backend": "naive"},
    "tiled (PyTorch)": {"backend": "tiled"},
    "SDPA flash": {"backend": "sdpa", "sdpa_kernel": "flash"},
    "SDPA math": {"backend": "sdpa", "sdpa_kernel": "math"},
    "SDPA efficient": {"backend": "sdpa", "sdpa_kernel": "efficient"},
    "SDPA cuDNN": {"backend": "sdpa", "sdpa_kernel": "cudnn"},
    "Triton": {"backend": "triton"},
}


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask_kwargs: dict
    dense_mask: torch.Tensor | None  # for reference and density only; None = full


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(n: int, d: int, heads: int, kv_heads: int, dtype: str, mask: str, *, window: int = 64,
                block_size: int = 64, seed: int = 0, device: str | None = None) -> Inputs:
    """Seeded inputs on the GPU when there is one (so Triton and SDPA's CUDA kernels run), else on the CPU."""
    device = device or default_device()
    generator = torch.Generator().manual_seed(int(seed))
    q = torch.randn(1, heads, n, d, generator=generator).to(device=device, dtype=DTYPES[dtype])
    k = torch.randn(1, kv_heads, n, d, generator=generator).to(device=device, dtype=DTYPES[dtype])
    v = torch.randn(1, kv_heads, n, d, generator=generator).to(device=device, dtype=DTYPES[dtype])
    if mask == "full":
        return Inputs(q, k, v, {}, None)
    if mask == "causal":
        return Inputs(q, k, v, {"causal": True}, masks.causal(n))
    if mask == "sliding window":
        return Inputs(q, k, v, {"window": (window - 1, 0)}, masks.sliding_window(n, window - 1, 0))
    if mask == "BigBird":
        pattern = masks.bigbird(n, block_size, 1, 3, 1, seed=int(seed))
        return Inputs(q, k, v, {"block_layout": pattern.layout, "block_size": block_size}, pattern.mask)
    raise ValueError(f"unknown mask {mask!r}")


@dataclass
class Row:
    name: str
    ran: str | None  # the backend that ran, or None
    reason: str | None  # why it did not run
    max_abs_diff: float | None
    median_ms: float | None
    peak_bytes: int | None = None  # on a GPU: extra peak allocated memory of one call


def run_contenders(inputs: Inputs, names: list[str], *, repeats: int = 3, block_q: int = 256, block_k: int = 512,
                   allow_interpreter: bool = False, progress=None) -> list[Row]:
    """Run each named contender on the same inputs: max |difference| to naive (fp64) and median time."""
    q, k, v = inputs.q, inputs.k, inputs.v
    with torch.no_grad():
        reference = attention(q.double(), k.double(), v.double(), backend="naive", **inputs.mask_kwargs).output
    rows = []
    for index, name in enumerate(names):
        options = dict(CONTENDERS[name])
        if progress:
            progress(index, name)
        if options["backend"] == "triton" and q.device.type == "cpu":
            if not allow_interpreter:
                rows.append(Row(name, None, "no GPU here: tick 'run the Triton interpreter' (correctness only)", None, None))
                continue
            if q.shape[2] > INTERPRETER_LIMIT:
                rows.append(Row(name, None, f"the interpreter would take minutes above N = {INTERPRETER_LIMIT}", None, None))
                continue
        if options["backend"] == "tiled":
            options.update(block_q=block_q, block_k=block_k)
        run = lambda: attention(q, k, v, **inputs.mask_kwargs, **options)  # noqa: E731
        cuda = q.device.type == "cuda"
        peak = None
        try:
            with torch.no_grad():
                result = run()
                if cuda:  # the allocator's own high-water mark, for this one call
                    torch.cuda.synchronize()
                    baseline = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    run()
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - baseline
                times = []
                for _ in range(1 if options["backend"] == "triton" and not cuda else repeats):
                    start = time.perf_counter()
                    run()
                    if cuda:
                        torch.cuda.synchronize()  # kernels run asynchronously: wait before reading the clock
                    times.append(time.perf_counter() - start)
        except (BackendUnavailable, RuntimeError, TypeError, ValueError) as problem:
            rows.append(Row(name, None, str(problem).splitlines()[0][:200], None, None))
            continue
        difference = (result.output.double() - reference).abs().max().item()
        timing = statistics.median(times) * 1000
        if result.backend == "triton (interpreter)":
            timing = None  # the interpreter is for correctness, never timing
        rows.append(Row(name, result.backend, None, difference, timing, peak))
    return rows


def naive_score_bytes(n: int, heads: int, dtype: str, batch: int = 1) -> int:
    """What naive attention materialises: the N x N scores and as many probabilities, per batch x heads."""
    size = torch.finfo(DTYPES[dtype]).bits // 8
    return 2 * batch * heads * n * n * size


def tiling(inputs: Inputs, block_q: int, block_k: int, trace_query_block: int):
    """The tiled algorithm's trace on these inputs: block statuses and one query block's online-softmax steps."""
    q, k, v = (t[:, :1].float().cpu() for t in (inputs.q, inputs.k, inputs.v))  # one head is enough to draw
    kwargs = dict(inputs.mask_kwargs)
    if "block_layout" in kwargs:
        block_q = block_k = kwargs["block_size"]
    output, _, trace = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, trace=True,
                                       trace_query_block=trace_query_block, **kwargs)
    return output, trace


STATUS_CODES = {SKIPPED: 0, COMPUTED: 1, MASKED: 2}


# ---------------------------------------------------------------------------------------------------------------
# Peak memory of one backend, measured in a fresh process (so nothing else in this one counts)


def _peak_memory_child(spec_json: str) -> None:
    import json

    from attnviz.flash_bench import print_peak_of

    spec = json.loads(spec_json)
    inputs = make_inputs(spec["n"], spec["d"], spec["heads"], spec["kv_heads"], spec["dtype"], spec["mask"],
                         window=spec["window"], block_size=spec["block_size"], device=spec.get("device", "cpu"))
    options = dict(CONTENDERS[spec["name"]])
    if options["backend"] == "tiled":
        options.update(block_q=256, block_k=512)
    print_peak_of(lambda: attention(inputs.q, inputs.k, inputs.v, **inputs.mask_kwargs, **options))


def measure_peak_memory(name: str, *, n: int, d: int, heads: int, kv_heads: int, dtype: str, mask: str,
                        window: int = 64, block_size: int = 64, timeout: float = 120) -> int:
    """Extra peak resident memory of one call of backend ``name`` (CPU, Linux), in a fresh Python process."""
    import json
    from pathlib import Path

    from attnviz.flash_bench import run_memory_child

    if CONTENDERS[name]["backend"] == "triton":
        raise BackendUnavailable("peak memory is measured for the CPU backends (the interpreter's is not the kernel's)")
    if not Path("/proc/self/clear_refs").exists():
        raise BackendUnavailable("peak memory is measured through Linux's /proc; not available on this system")
    spec = json.dumps({"name": name, "n": n, "d": d, "heads": heads, "kv_heads": kv_heads, "dtype": dtype,
                       "mask": mask, "window": window, "block_size": block_size, "device": "cpu"})
    try:
        return run_memory_child("attnviz.flash_live", "_peak_memory_child", spec, timeout)
    except RuntimeError as problem:
        raise BackendUnavailable(str(problem)) from None

