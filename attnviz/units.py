"""Sizes and their names: bytes per element of each dtype, readable byte counts, and speed ratios said the
way a person says them ("3.3x slower", never "0.3x faster")."""

from __future__ import annotations

import torch

# Bytes per element. fp8 and int4 have no torch dtype of their own here: they exist for the memory tables.
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int4": 0.5}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB' (binary units, 3 significant digits)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024:
            return f"{count:.3g} {unit}"
        count /= 1024
    return f"{count:.3g} PiB"


def speed_ratio(reference_seconds: float, other_seconds: float) -> str:
    """How ``other`` compares with ``reference``: '2.5x faster', '3.3x slower' or 'as fast' (within 5%)."""
    if reference_seconds <= 0 or other_seconds <= 0:
        raise ValueError("times must be positive")
    ratio = reference_seconds / other_seconds
    if 1 / 1.05 <= ratio <= 1.05:
        return "as fast"
    if ratio > 1:
        return f"{ratio:.2g}x faster" if ratio < 10 else f"{ratio:.0f}x faster"
    slower = 1 / ratio
    return f"{slower:.2g}x slower" if slower < 10 else f"{slower:.0f}x slower"
