"""Heads across a corpus: scan a model over thousands of documents and keep, per head, what it does in general
(statistics with their spread, label frequencies, offset profiles, token pairs, top examples) in a DuckDB file.

* :mod:`attnviz.scan.corpus`: the bundled corpus and the readers of corpus files;
* :mod:`attnviz.scan.heads`: one document's statistics, and the mergeable partial aggregate;
* :mod:`attnviz.scan.store`: the database (written per chunk, read by the page and by SQL);
* :mod:`attnviz.scan.runner`: the scan in this process; :mod:`attnviz.scan.on_ray`: the same on Ray;
* ``python -m attnviz.scan``: the command line.
"""
