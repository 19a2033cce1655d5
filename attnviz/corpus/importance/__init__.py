"""Does a head matter across a corpus: the importance maps over thousands of documents, in DuckDB.

- ``runner``: the run (its chunks through :mod:`attnviz.corpus.runner`); ``on_ray``: the same on Ray;
  ``store``: the results file
- ``python -m attnviz.corpus.importance``: the command line (``__main__``)
"""
