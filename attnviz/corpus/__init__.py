"""Work over a corpus of documents, in the background: what a corpus is, the jobs that run over it, and the two
runs that keep their results in DuckDB (a scan, a corpus importance run, a corpus patching run).

- ``documents``: what a corpus is and its bounds; ``document_files``: the readers of corpus files;
  ``document_probe``: a corpus file's facts, read in a process of its own
- ``jobs``: background jobs, server-wide (one process each, bounded); ``background``: starting a scan or an
  importance run as such a job, ``(kind, key, settings)``
- ``options``: a run's settings as dataclass fields, read as JSON and as command-line options; ``command``: the
  command line both runs share (their options, the settings file a job is given, progress, stop, the model chosen)
- ``runner``: the one runner both runs go through (chunks, progress, stop, resume), with the strategy that measures
  the chunks here; ``on_ray``: the strategy that measures them on Ray
- ``database``: a DuckDB results file, written with its memory bounded and opened safely
- ``scan``: heads across a corpus (statistics, labels, examples); ``importance``: does a head matter across a corpus;
  ``patching``: activation and path patching over a corpus, one example made from each document
- ``series``: a series of a user's checkpoints measured over training, one checkpoint at a time through the same
  runner (each checkpoint a "document"), one row per step in DuckDB
"""
