"""Everything the "Explore heads" page computes, as functions of a :class:`~attnviz.models.record.Capture`; one
module per tab, so each reads in one sitting. The page only reads widgets, calls these, and draws the figures they
return; the benchmarks call the same.

- :mod:`.options`: what the page is set to (``ViewOptions``) and the token filters every tab applies
- :mod:`.matrices`: the weights matrix a heatmap draws: streamed, pooled, zoomed, scaled and titled
- :mod:`.views`, :mod:`.grid`: the View tab (``VIEW_BUILDERS``: one builder per view)
- :mod:`.statistics`: the Head statistics tab; :mod:`.detectors`: detectors of a pattern on one text
- :mod:`.qk`: the Q·K tab; :mod:`.compare`: two texts; :mod:`.whatif`: another mask, scale or temperature
- :mod:`.export`, :mod:`.bertviz_view`: downloads and bertviz; :mod:`.long_texts`: long texts offline
- :mod:`.images`: a vision model's Image tab (overlays on the photo); :mod:`.setup_notes`: what the setup area
  says (the second text box, a cut text, the replay check)
"""
