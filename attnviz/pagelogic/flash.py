"""What the "Flash vs naive" page computes: every chosen contender on the same inputs, timed and compared, the
tiling of one head, and the memory naive attention would need."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from attnviz.core import mask_patterns
from attnviz.core.units import DTYPE_BYTES, human_bytes
from attnviz.flash.cases import AttentionCase
from attnviz.flash.dispatch import CONTENDERS, BackendUnavailable, run_contender
from attnviz.flash.tiled import COMPUTED, MASKED, SKIPPED, TiledTrace, tiled_attention
from attnviz.system.gpus import gpu_bf16_peak

INTERPRETER_LIMIT = 256  # tokens: above this the Triton interpreter takes minutes
STATUS_CODES = {SKIPPED: 0, COMPUTED: 1, MASKED: 2}
# The page's opening settings: what a first visit measures, and what the server's warm-up measures before one.
# Causal by default: the mask whose skipped tiles show why flash attention is fast.
DEFAULT_N, DEFAULT_D, DEFAULT_HEADS, DEFAULT_MASK = 1024, 64, 4, "causal"
DEFAULT_CONTENDERS = ("naive", "tiled", "sdpa/flash", "sdpa/math", "triton")
DEFAULT_DTYPE = "fp32"
DEFAULT_BLOCK = 64  # the tiling's query and key blocks


def default_trace_block(n_query_blocks: int) -> int:
    """The query block the stepper follows at first: the third, where a causal mask has skipped tiles to show."""
    return min(n_query_blocks - 1, 2)


def interpreter_by_default(n: int) -> bool:
    """Whether the Triton interpreter starts switched on (without a GPU): only where it takes seconds."""
    return n <= 128


def measurement_key(case: AttentionCase, names, interpreter: bool) -> tuple:
    """What names one measurement of the page's backends, shared by every session with these settings."""
    return (case, tuple(names), interpreter)


def default_case() -> AttentionCase:
    """The inputs of the page at its opening settings (the causal mask has no parameters to choose)."""
    return page_case(DEFAULT_N, DEFAULT_D, DEFAULT_HEADS, DEFAULT_HEADS, DEFAULT_DTYPE, DEFAULT_MASK, {})


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def flash_masks() -> tuple[str, ...]:
    """The mask patterns the page offers: those the registry shows on the Flash page (each has a rule the
    kernels follow tile by tile), in its order."""
    return mask_patterns.shown_in(mask_patterns.FLASH)


def page_case(n: int, d: int, heads: int, kv_heads: int, dtype: str, mask: str, mask_params: dict | None = None, *,
              seed: int = 0, device: str | None = None) -> AttentionCase:
    """The page's inputs: on the GPU when there is one (so Triton and SDPA's CUDA kernels run), else the CPU.
    ``mask_params`` are the pattern's parameters the page asked for (the rest keep the registry's defaults, but a
    pattern's seed follows the inputs' ``seed``)."""
    params = dict(mask_params or {})
    if "seed" in mask_patterns.parameters_of(mask):
        params.setdefault("seed", seed)
    return AttentionCase(n, d, heads, kv_heads, dtype=dtype, mask=mask, mask_params=tuple(params.items()), seed=seed,
                         device=device or default_device())


def layout_block_size(case: AttentionCase) -> int | None:
    """The block size of a block-sparse mask (BigBird): the tiles must be its blocks. None for other masks."""
    spec = case.mask_spec()
    return spec.block_size if spec.block_layout is not None else None


@dataclass
class Row:
    name: str  # a key of attnviz.flash.CONTENDERS
    ran: str | None  # the backend that ran, or None
    reason: str | None  # why it did not run
    max_abs_diff: float | None
    median_ms: float | None
    peak_bytes: int | None = None  # on a GPU: extra peak allocated memory of one call
    first_ms: float | None = None  # the first call: FlexAttention compiles its kernel then (not in median_ms)

    @property
    def label(self) -> str:
        return CONTENDERS[self.name].label


def _why_not(name: str, q: torch.Tensor, allow_interpreter: bool) -> str | None:
    """Why the Triton interpreter will not run here (it is opt-in on a CPU and too slow for long inputs)."""
    if CONTENDERS[name].options["backend"] != "triton" or q.device.type != "cpu":
        return None
    if not allow_interpreter:
        return "no GPU: switch on Triton interpreter"
    if q.shape[2] > INTERPRETER_LIMIT:
        return f"the interpreter would take minutes above N = {INTERPRETER_LIMIT}"
    return None


def _cuda_peak(run) -> int:
    """The allocator's own high-water mark for one call, above what was allocated before it."""
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - baseline


def run_contenders(case: AttentionCase, names: list[str], *, repeats: int = 3, allow_interpreter: bool = False,
                   progress=None) -> list[Row]:
    """Run each named contender on the same inputs: max |difference| to naive (fp64) and median time."""
    q, k, v = case.tensors()
    mask = case.mask_spec()
    with torch.no_grad():
        reference = run_contender("naive", q.double(), k.double(), v.double(), mask).output
    rows = []
    for index, name in enumerate(names):
        if progress:
            progress(index, CONTENDERS[name].label)
        reason = _why_not(name, q, allow_interpreter)
        if reason:
            rows.append(Row(name, None, reason, None, None))
            continue
        cuda = q.device.type == "cuda"
        interpreted = CONTENDERS[name].options["backend"] == "triton" and not cuda
        run = lambda name=name: run_contender(name, q, k, v, mask)  # noqa: E731
        try:
            with torch.no_grad():
                start = time.perf_counter()
                result = run()
                if cuda:
                    torch.cuda.synchronize()
                first = (time.perf_counter() - start) * 1000
                peak = _cuda_peak(run) if cuda else None
                times = []
                for _ in range(1 if interpreted else repeats):
                    start = time.perf_counter()
                    run()
                    if cuda:
                        torch.cuda.synchronize()  # kernels run asynchronously: wait before reading the clock
                    times.append(time.perf_counter() - start)
        except (BackendUnavailable, RuntimeError, TypeError, ValueError) as problem:
            rows.append(Row(name, None, str(problem).splitlines()[0][:200], None, None))
            continue
        difference = (result.output.double() - reference).abs().max().item()
        timing = None if interpreted else statistics.median(times) * 1000  # the interpreter is never timed
        rows.append(Row(name, result.backend, None, difference, timing, peak, None if interpreted else first))
    return rows


# attnviz's naive attention (attnviz.core.attention.scaled_dot_product_attention, the "naive" contender) holds this many
# N x N buffers in the inputs' dtype at its peak: the scores and the probabilities; a mask that hides keys adds the
# scores with them at -inf, and its own N x N bool (1 byte a cell). (A row with no allowed key costs two more:
# masked_softmax zeroes it.) A textbook naive attention needs at least 2 (scores and probabilities).
# tests/test_page_flash.py checks the count against measure_peak_memory.
NAIVE_BUFFERS = 2
MASKED_BUFFERS = 1  # more, when a mask hides keys
TEXTBOOK_BUFFERS = 2


def naive_buffers(masked: bool) -> int:
    return NAIVE_BUFFERS + (MASKED_BUFFERS if masked else 0)


def naive_peak_bytes(n: int, heads: int, dtype: str, batch: int = 1, *, masked: bool = False,
                     buffers: int | None = None) -> int:
    """The N x N memory of naive attention at its peak, per batch x heads: ``buffers`` N x N matrices in ``dtype``
    (attnviz's naive code: :func:`naive_buffers`; a textbook one: TEXTBOOK_BUFFERS), and the bool mask when
    ``masked``."""
    buffers = naive_buffers(masked) if buffers is None else buffers
    return int(batch * heads * n * n * (buffers * DTYPE_BYTES[dtype] + (1 if masked else 0)))


def naive_memory_note(case: AttentionCase) -> str:
    """What the naive memory metric counts, in words, for ``case``."""
    masked = not case.mask_spec().is_full
    textbook = naive_peak_bytes(case.n, case.heads, case.dtype, case.batch, buffers=TEXTBOOK_BUFFERS)
    return (f"attnviz's naive attention keeps {naive_buffers(masked)} N x N {case.dtype} buffers alive at once for "
            f"each of the {case.heads} heads (batch {case.batch}): the scores"
            + (", the scores with the hidden keys at -inf, the probabilities and the N x N bool mask" if masked else
               " and the probabilities") + ". A textbook naive attention needs at least the scores and the "
            f"probabilities: {human_bytes(textbook)}.")


def tflops_caption(gpu_name: str | None, best_tflops: float | None) -> str:
    """The caption under a GPU report's TFLOPS: the peak of the GPU it names, or that the peak is unknown."""
    peak = gpu_bf16_peak(gpu_name)
    name = gpu_name or "this GPU"
    if peak is None:
        return (f"Higher is better. attnviz does not know the dense bf16 peak of {name}, so these are achieved "
                "TFLOPS only" + (f" (best {best_tflops:.0f})." if best_tflops else "."))
    best = f"; the best here reaches {best_tflops:.0f}, {best_tflops / peak:.0%} of it" if best_tflops else ""
    return f"Higher is better. The dense bf16 peak of {name} is {peak:.0f} TFLOPS (NVIDIA's data sheet){best}."


def flash_tile_bytes(block_q: int, block_k: int) -> int:
    """What one flash tile holds of the N x N matrix, per head: fp32 scores and their exponentials (in place
    in our tiled code, apart in a kernel's registers; counted twice to be safe)."""
    return 2 * block_q * block_k * 4


def tiling(case: AttentionCase, block_q: int, block_k: int, trace_query_block: int) -> tuple[torch.Tensor, TiledTrace]:
    """The tiled algorithm's trace on these inputs: tile statuses and one query block's online-softmax steps."""
    q, k, v = (t[:, :1].float().cpu() for t in case.tensors())  # one head is enough to draw
    output, _, trace = tiled_attention(q, k, v, case.mask_spec(), block_q=block_q, block_k=block_k, trace=True,
                                       trace_query_block=trace_query_block)
    return output, trace


def mask_label(key: str) -> str:
    return mask_patterns.label(key)
