"""The app layer: everything the pages share, one module per concern. Only this package, ``attnviz.bench`` and the
pages import Streamlit.

- ``frame``: a page's start, presentation mode, the story's Previous/Next links, progress boxes, the run log
- ``sidebar``: the sentence every page reads, and the sidebar's choices kept across page changes
- ``figures``: ``show_figure`` (caption, presentation scale, downloads named after the title)
- ``messages``: errors in words, the last line of defence, not-finite warnings
- ``session_models``: this session's models (registry, uploads added, this browser's kept models, a link's model)
- ``session_uploads``: upload folders that die with their session, and the clean-up thread
- ``loaded_models``: models loaded once per process (bounded cache)
- ``captures``: a text's capture by the sidebar model, cached by its key (``capture_current``)
- ``explore_controls``, ``explore_tabs``: Explore heads' controls above its tabs, and its tabs beyond View
- ``generation_setup``: the Generation page's decoder and request form
- ``caches``: the pages' own caches; ``scans``: this browser's scans and what the pages read from them (one cached
  function per reading of a scan's database)
- ``scan_start``: the corpus page's "Scan a corpus" (the corpus, the limits, the scan started, its progress)
- ``importance_maps``: "Does this head matter?"'s maps and whether its measures agree; ``importance_runs``: its map
  over a corpus, measured in the background; ``patching_views``: its patching experiment (the examples, and the
  looks: layer x position, heads, head inputs, paths, logit attribution, logit lens, composition);
  ``patching_runs``: the same experiment over a corpus, measured in the background; ``patching_run_results``: its
  maps read back and drawn
- ``over_training_series``: the Over training page's series of the user's checkpoints (a folder on the server,
  measured in the background)
- ``over_training_view``: the Over training page's view (a run's figures, its words, one step's numbers);
  ``norm_placement_view``: its pre-norm or post-norm section
- ``open_in_explore``: "Open in Explore heads" from any page; ``links``: what a link's parameters may hold
- ``open_in_generation``: "Open in Generation" from any page
- ``downloads``: large files streamed from disk; ``pattern_widgets``: a mask pattern's widgets, from the registry
- ``page_scripts``: the browser-side scripts (``assets/*.js``)
- ``lifespan`` and ``warm_up``: the server's start, and what it computes before the first visit
"""
