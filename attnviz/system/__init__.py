"""The process around the maths: its environment, how attnviz measures, and what it logs.

- ``runtime``: the environment attnviz needs, set in one place, and what this installation can do
- ``measure``: one timing helper and one memory probe, shared by the benchmarks and the pages
- ``gpus``: the GPUs attnviz may be measured on and their peaks
- ``run_log``: ``ATTNVIZ_RUN_LOG``, one JSON line per script run
"""
