"""Edits of a model's heads and what they show: the "Does this head matter?" page's experiments.

- ``edits``: zero, mean-replace or patch a head's output, restoring the model afterwards
- ``importance``: the importance maps (the loss change when each head is ablated, and the gradient estimate);
  ``importance_ranks``: how two maps agree, rank by rank, and the table of heads; ``mlp_ablation``: each layer's
  MLP ablated the same ways
- ``patching``: the page's prompts (the induction presets, typed prompts)
- ``anatomy``: where a model's parts are (blocks, output projections, MLPs, final norm), found by watching a forward
- ``activation_patching``: patching at every site (residual stream, attention and MLP outputs, heads, a head's Q, K,
  V or pattern), both directions, three metrics, per-example shares with bootstrap intervals
- ``path_patching``: from one head into another's queries, keys or values, directly or through the MLPs
- ``logit_attribution``: direct logit attribution and the logit lens, a post-norm model read back through its frozen
  norms by ``frozen_readout``; ``composition``: Q/K/V composition scores
  between heads from the weights, read by ``head_weights`` (every head's W_Q, W_K, W_V, W_O)
- ``head_weight_layouts``: each family's layout of its attention weights, read per layer for ``head_weights``
- ``induction_circuit``: the induction circuit, demonstrated by ablation
- ``word_order``: the same model with its position embeddings silenced
- ``training_measures``: what a decoder has learned at one step (loss, in-context learning, every head's detector
  scores and ablation cost) and the phase change; ``training_runs``: a run's measures by step, as the Over training
  page draws them
- ``norm_placement``: pre-norm against post-norm, measured: gradients per layer at initialisation and over the
  first steps, and four short training runs
"""
