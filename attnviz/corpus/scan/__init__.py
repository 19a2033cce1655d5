"""Heads across a corpus: scan a model over thousands of documents and keep, per head, what it does in general
(statistics with their spread, label frequencies, offset profiles, token pairs, top examples) in a DuckDB file.

- ``heads``: one document's statistics, and the mergeable partial aggregate
- ``store``: the database (written per chunk, read by the page and by SQL); ``disk``: what its file takes on disk,
  and the compact copy that replaces it when the scan finishes
- ``runner``: the scan (its chunks through :mod:`attnviz.corpus.runner`); ``on_ray``: the same on Ray
- ``qk_sample``: a sample of every head's queries, keys and values, for the Queries and keys page
- ``python -m attnviz.corpus.scan``: the command line (``__main__``)
"""
