"""``python -m attnviz.bench NAME``: one module per benchmark (``explore``, ``flash_cpu``, ``flash_gpu``), each
printing medians of repeats measured in one run, with ratios, and writing JSON under ``bench-results/``.

The timing helper and the memory probe they share are in :mod:`attnviz.measure`. The flash benchmarks import
only torch, triton, numpy and the standard library (plus attnviz's flash and core), so they run on a bare GPU
machine.
"""
