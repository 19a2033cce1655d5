"""What each page computes and draws, one module (or folder) per page of the app (``app_pages/masks.py`` reads
widgets and calls ``attnviz.pagelogic.masks``). Built on the core, the models, the interventions and the figure
builders; no Streamlit, so tests and notebooks can call everything a page shows.

- ``explore_heads``: Explore heads, one module per tab; ``generation``: Generation and KV cache
- ``masks``, ``positional``, ``scaling``, ``heads_kv_cache``, ``flash``, ``queries_keys``: one page each
- ``step_by_step``: what Attention step by step says beside its figures
- ``corpus``: Heads across a corpus, beside the scan's own readings (progress, offsets, notes, comparisons)
- ``importance``: Does this head matter?, beside the interventions (captions, tables, a corpus run's maps and rows);
  ``importance_words``: what it says beside its numbers; ``patching``: its patching experiment's grids and words
- ``clicks``: what a click on a chart selected, read in every shape the browser sends
- ``over_training``: Over training, its rows per measure and the sentences read off them; ``series_scans``: what it
  says beside a series' corpus scans (statistic names, the step drawn, the caption); ``norm_placement``: its
  pre-norm against post-norm section (the training text, the figures, the words)
"""
