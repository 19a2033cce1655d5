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


def counted(n: int, one: str, many: str) -> str:
    """``n`` things in words with the right number: "1 head", "2 heads", "1,024 queries"."""
    return f"{n:,} {one if n == 1 else many}"


def ordinal(n: int) -> str:
    """``n`` as an English ordinal: "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "101st", "111th"
    (11, 12 and 13 take "th" in every hundred; every other number its last digit's suffix)."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"
