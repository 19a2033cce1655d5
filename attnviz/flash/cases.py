"""Attention inputs by description: the seeded Q, K, V and mask that the Flash page and the benchmarks run every
contender on, and the peak memory of one contender on them, measured in a fresh process."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from attnviz.core import mask_patterns
from attnviz.core.masks import MaskSpec
from attnviz.core.units import TORCH_DTYPES
from attnviz.flash.dispatch import CONTENDERS, run_contender
from attnviz.system import measure


@dataclass(frozen=True)
class AttentionCase:
    """``batch`` x ``heads`` query heads (``kv_heads`` K/V heads) of dimension ``d`` over ``n`` tokens, under
    the mask pattern ``mask`` of :mod:`attnviz.core.mask_patterns` with ``mask_params`` (name, value) pairs."""

    n: int
    d: int = 64
    heads: int = 8
    kv_heads: int | None = None
    batch: int = 1
    dtype: str = "fp32"
    mask: str = "full"
    mask_params: tuple[tuple[str, int], ...] = ()
    seed: int = 0
    device: str = "cpu"

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Seeded ``q [batch, heads, n, d]``, ``k, v [batch, kv_heads, n, d]``, drawn on the CPU (the same numbers
        on every device), then moved to ``device`` in ``dtype``."""
        generator = torch.Generator().manual_seed(int(self.seed))
        kv_heads = self.kv_heads or self.heads
        shapes = ((self.batch, self.heads, self.n, self.d), (self.batch, kv_heads, self.n, self.d),
                  (self.batch, kv_heads, self.n, self.d))
        dtype = TORCH_DTYPES[self.dtype]
        return tuple(torch.randn(*shape, generator=generator).to(device=self.device, dtype=dtype) for shape in shapes)

    def mask_spec(self) -> MaskSpec:
        return mask_patterns.rule(self.mask, self.n, **dict(self.mask_params))

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "AttentionCase":
        fields = json.loads(text)
        fields["mask_params"] = tuple(tuple(pair) for pair in fields["mask_params"])
        return cls(**fields)


def peak_memory_child(spec: str) -> None:
    """The fresh process of :func:`measure_peak_memory`: build the case, run the contender, print its peak."""
    arguments = json.loads(spec)
    if arguments.get("threads"):
        torch.set_num_threads(arguments["threads"])
    case = AttentionCase.from_json(arguments["case"])
    q, k, v = case.tensors()
    mask = case.mask_spec()
    with torch.no_grad():
        measure.print_peak_of(lambda: run_contender(arguments["contender"], q, k, v, mask))


def measure_peak_memory(case: AttentionCase, contender: str, *, threads: int | None = None,
                        timeout: float = 600) -> int:
    """Extra peak resident memory of one call of ``contender`` on ``case`` (CPU, Linux), in a fresh process."""
    if CONTENDERS[contender].options["backend"] == "triton":
        raise measure.MeasurementUnavailable(
            "peak memory is measured for the CPU backends (the interpreter's is not the kernel's)"
        )
    spec = json.dumps({"case": case.to_json(), "contender": contender, "threads": threads})
    return measure.peak_in_fresh_process("attnviz.flash.cases", "peak_memory_child", spec, timeout)
