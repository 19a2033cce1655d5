"""What each page computes and draws, one module per page of the app (``pages/masks.py`` reads widgets and calls
``attnviz.pagelogic.masks``). Built on the core, the models and the figure builders; no Streamlit here, so tests
and notebooks can call everything a page shows."""
