"""What each page computes and draws, one module (or folder) per page of the app (``app_pages/masks.py`` reads
widgets and calls ``attnviz.pagelogic.masks``). Built on the core, the models, the interventions and the figure
builders; no Streamlit, so tests and notebooks can call everything a page shows.

- ``explore_heads``: Explore heads, one module per tab; ``generation``: Generation and KV cache
- ``masks``, ``positional``, ``scaling``, ``heads_kv_cache``, ``flash``, ``queries_keys``: one page each
- ``importance_words``: what "Does this head matter?" says beside its numbers
- ``clicks``: what a click on a chart selected, read in every shape the browser sends
"""
