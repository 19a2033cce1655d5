"""Edits of a model's heads and what they show: the "Does this head matter?" page's experiments.

- ``edits``: zero, mean-replace or patch a head's output, restoring the model afterwards
- ``importance``: the importance maps (the loss change when each head is ablated, and the gradient estimate)
- ``patching``: activation patching, clean into corrupted, by head and by layer x position
- ``induction_circuit``: the induction circuit, demonstrated by ablation
- ``word_order``: the same model with its position embeddings silenced
"""
