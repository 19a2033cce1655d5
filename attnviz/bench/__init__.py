"""``python -m attnviz.bench NAME``: one module per benchmark, each printing medians of repeats measured in one
run, with ratios, and writing JSON under ``bench-results/``.

- ``explore``, ``pages``, ``startup``, ``load``, ``long``: the app as its users meet it
- ``flash_gpu`` (and ``attnviz.flash.cpu_sweep`` on the CPU): the flash contenders
- ``scan``, ``ablation``, ``queries_keys``: what a scan, an importance map and a picture of queries and keys cost;
  ``patching``: a patching map against the forwards it needs; ``series``: a series' checkpoint measured against
  the forwards its measures need; ``train_step``: the tiny GPT's training step, plain and with the fused loss
- ``browser``: a real ``streamlit run`` and Chromium; ``tiny``: tiny checkpoints made locally
- ``__main__``: the command line

The timing helper and the memory probe they share are in :mod:`attnviz.system.measure`. The flash benchmarks import
only torch, triton, numpy and the standard library (plus attnviz's flash, core and system), so they run on a bare GPU
machine.
"""
