"""attnviz: transformer attention from scratch, explained with real numbers.

The package is pure PyTorch (plus Plotly for figures); the Streamlit app in ``app.py`` and ``pages/`` is a thin
layer over it. Conventions used everywhere in the package:

* tensors are ``[batch, heads, seq, head_dim]``;
* masks are boolean with **True = may attend** (PyTorch SDPA's convention); ``attnviz.masks`` converts from and
  to the other conventions at the edges.
"""

__version__ = "0.1.0"
