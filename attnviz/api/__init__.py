"""attnviz from Python: the notebook API, on the same code the pages use. ``import attnviz`` gives its names
(``attnviz.capture``, ``attnviz.show``, ``attnviz.detect``, ``attnviz.scan``, ``attnviz.importance``).

- ``capture``: ``capture(model, tokenizer, text)`` on a model in memory, a checkpoint folder or a bundled model's
  name: a ``Captured`` (its tokens, every head's weights, the replay check); ``bundle_of`` gives the ``ModelBundle``
- ``show``: the pages' figures (``head``, ``grid``, ``lines``, ``qk_map``, ``importance_map``, ``patching``,
  ``paths``, ``attribution``, ``lens``, ``composition``), shown inline offline
- ``detect``: every head scored on a pattern (induction, previous-token, duplicate-token, or one's own), as a
  DataFrame
- ``runs``: corpus scans and importance runs from a notebook (``scan``, ``importance``); ``run_control``: their
  progress bar and resumable stop; ``run_files``: their DuckDB files read as DataFrames (``ScanRun``,
  ``ImportanceRun``, ``open_scan``, ``open_importance``)
- ``patching``: patching from a notebook (``patch``, ``paths``, ``induction_examples``, ``example``) and what a
  clean run says directly (``attribute``, ``logit_lens``, ``composition``); ``patching_runs``: patching over a
  corpus (``patch_corpus``, ``open_patching``, ``PatchingRun``)
- ``series``: a series of checkpoints measured over training (``measure_series``) and read back as the Over training
  page draws it (``open_series``)
- ``reference``: docs/api.md, written from these modules' docstrings
"""
