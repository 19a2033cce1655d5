"""attnviz: transformer attention from scratch, explained with real numbers.

The package is pure PyTorch (plus Plotly for figures); the Streamlit app in ``app.py`` and ``app_pages/`` is a thin
layer over it. Its folders, from the bottom layer up (docs/architecture.md draws them): ``core``, ``system``,
``checkpoints``, ``flash``, ``viz``, ``models``, ``interventions``, ``tiny_gpt``, ``corpus``, ``pagelogic``, ``ui``,
``bench``. Conventions used everywhere in the package:

* tensors are ``[batch, heads, seq, head_dim]``;
* masks are boolean with **True = may attend** (PyTorch SDPA's convention); ``attnviz.core.masks`` converts from and
  to the other conventions at the edges.
"""

__version__ = "0.1.0"
