"""The bundled tiny GPT: its words, its training text, its model card and the script that trained it.

- ``words``: a byte-level BPE that keeps everyday English whole; ``text``: English that ships with every Python
- ``card``: the model card, the recipe in words with what training measured
- ``train``: ``python -m attnviz.tiny_gpt.train``, seeded, on the CPU, in minutes; ``batches``: what it trains on;
  ``loss``: the LM head and its cross-entropy fused a block of rows at a time (``--fused-loss``);
  ``evaluation``: what the trained model is measured on when the run ends (held-out loss, both circuits)
- ``recording``: the run kept: its measures at log-spaced steps and snapshots around the phase change
"""
