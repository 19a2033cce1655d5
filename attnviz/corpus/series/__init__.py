"""A user's series of checkpoints measured over training (the Over training page's other source): each checkpoint of
a folder (``step1000/``, ``checkpoint-500/``, ...) measured on one fixed probe as the bundled tiny GPT's own run is
(:mod:`attnviz.interventions.training_measures`), one row per step in DuckDB, read back as a
:class:`~attnviz.interventions.training_runs.Run`.

- ``runner``: finding and checking the series, the probe, the run (one checkpoint at a time, resumable) through
  :mod:`attnviz.corpus.runner`; ``on_ray``: the same on Ray; ``store``: the results file and ``open_series``
- ``python -m attnviz.corpus.series FOLDER --db FILE.duckdb``: the command line (``__main__``)
"""
