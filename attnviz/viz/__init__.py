"""Plotly figure builders: data in, ``go.Figure`` out, no Streamlit.

- ``style``: one colour scale and token labels for every figure; ``framing``: titles and text sized for a projector
- ``matrix``: heatmaps with their numbers; ``charts``: lines, histograms, bars; ``heads``: a model's heads
- ``vision``: attention on the image; ``inference``: paged caches and ring attention; ``generation``: the
  Generation page's own figures
- ``corpus``: a scan's figures; ``queries_keys``: queries and keys as points; ``importance``: importance maps;
  ``patching``: patching maps with their intervals and examples; ``logit_attribution``: attribution bars and the
  logit lens; ``composition``: composition scores between heads
- ``over_training``: a run's measures against the training step, with the phase change shaded; ``series_scans``:
  a series' corpus-scan map of one statistic at one step; ``norm_placement``: pre-norm against post-norm (gradients
  per block, loss curves)
"""
