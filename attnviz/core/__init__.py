"""The from-scratch maths of attention: plain PyTorch (with numpy, and scikit-learn/UMAP/PIL where a picture needs
them), no models, no Streamlit, no Plotly.

- ``attention``: softmax(Q K^T / sqrt(d_k) + bias) V, the multi-head layer and its variants
- ``masks``: boolean masks (True = may attend) and the converters at the edges; ``mask_patterns``: every pattern by
  name, in the registry the pages, the flash dispatch and the benchmarks share
- ``positional``: sinusoidal, learned, RoPE and ALiBi; ``scaling``: why attention divides by sqrt(d_k)
- ``stepwise``: attention taken apart into its five steps; ``circuits``: previous-token and induction circuits
- ``kvcache``: MHA, GQA and MQA and their caches; ``paged_kv``: PagedAttention's cache, simulated exactly
- ``analysis``: what heads do (statistics, labels, rollout); ``qk_geometry``: queries and keys as points of one space
- ``vision``: images to patch tokens and attention back onto the image
- ``tokens_display``: tokens as people read them; ``units``: sizes, dtypes and ratios in words
- ``schedule``: the learning-rate schedule attnviz trains with (warm-up, then a cosine decay), and log-spaced steps
"""
