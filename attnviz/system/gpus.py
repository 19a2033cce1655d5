"""What attnviz knows about GPUs it may be measured on: their dense bf16 tensor-core peak, to put measured TFLOPS
against (the Flash page, on a saved report; ``python -m attnviz.bench flash --gpu``)."""

from __future__ import annotations

import re

# Dense bf16 tensor-core peaks (no sparsity), TFLOPS, from NVIDIA's data sheets, which print the sparse figure (2x):
# H100 SXM 989 and H100 PCIe 756 (H100 Tensor Core GPU datasheet); H100 NVL 835 (H100 NVL product brief); H200 SXM
# 989 and H200 NVL 835 (H200 datasheet); A100 312 (A100 datasheet, SXM and PCIe alike); A10 125 (A10 datasheet);
# L4 121 (L4 datasheet); L40S 362 (L40S datasheet); L40 181 (L40 datasheet). Matched against torch's device name
# ("NVIDIA H100 80GB HBM3" is the SXM part), first match wins.
GPU_BF16_PEAKS = (
    (r"H200.*NVL", 835.0),
    (r"H200", 989.0),
    (r"H100.*NVL", 835.0),
    (r"H100.*PCIe", 756.0),
    (r"H100.*(SXM|HBM3)", 989.0),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
)


def gpu_bf16_peak(gpu_name: str | None) -> float | None:
    """The dense bf16 peak of the GPU a report names (TFLOPS), or None when attnviz does not know it."""
    for pattern, peak in GPU_BF16_PEAKS:
        if gpu_name and re.search(pattern, gpu_name):
            return peak
    return None
