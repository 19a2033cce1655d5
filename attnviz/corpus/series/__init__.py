"""A user's series of checkpoints measured over training (the Over training page's other source): each checkpoint of
a folder (``step1000/``, ``checkpoint-500/``, ...) measured on one fixed probe as the bundled tiny GPT's own run is
(:mod:`attnviz.interventions.training_measures`), one row per step in DuckDB, read back as a
:class:`~attnviz.interventions.training_runs.Run`.

- ``folder``: finding and checking the series (its checkpoints, their shape and tokenizer); ``probe``: what every
  checkpoint is measured on; ``steps``: one checkpoint loaded, measured (and scanned) and let go; ``runner``: the
  settings and the run (one checkpoint at a time, resumable) through :mod:`attnviz.corpus.runner`; ``on_ray``: the
  same on Ray; ``store``: the results file, ``open_series`` and the scans' maps (``scan_maps``); ``scans``: a corpus
  scan per checkpoint (the scan of :mod:`attnviz.corpus.scan`), when a corpus is chosen
- ``python -m attnviz.corpus.series FOLDER --db FILE.duckdb``: the command line (``__main__``)
"""
