"""Models: load a checkpoint (after :mod:`attnviz.checkpoints` has checked it), run it and capture its attention.

- ``shipped``: the bundled models' names and folders (found without torch); ``loading``: the bundled models,
  folders and uploads, loaded under one lock (``LOADING``); ``with_heads``: the same
  with the head that gives a loss (a causal LM's, a masked LM's); ``text_tokenizers``: its tokenizer or the
  stand-in; ``trials``: the test sentence every model is tried on at load
- ``architectures``: one record per model type; ``position_tables``: a checkpoint's absolute position table, from
  its record; ``layer_facts``: each layer's attention as its config sets it
- ``capture``: a text or image in, every attention call recorded; ``record``: what a capture holds
- ``attention_hook``: the attention function attnviz registers; ``adapters`` and ``eager``: models whose attention
  is in their own code
- ``scoring``: the one score formula; ``replay_check``: the replayed weights' outputs against the model's own
"""
