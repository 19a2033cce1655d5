"""Activation and path patching over a corpus: each document's own text typed twice, patched site by site and path
by path, in DuckDB.

- ``runner``: the run (its chunks through :mod:`attnviz.corpus.runner`) and the examples it makes; ``on_ray``: the
  same on Ray; ``store``: the results file
- ``python -m attnviz.corpus.patching``: the command line (``__main__``)
"""
