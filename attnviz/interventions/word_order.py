"""Word order: the same model with its position embeddings silenced, for this thread only. Without positions,
self-attention is permutation equivariant; the experiment shows it on a real checkpoint."""

from __future__ import annotations

import contextlib
import contextvars

import torch

from attnviz.core.positional import permutation_of_words
from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.models import position_tables
from attnviz.models.capture import device_of, record_from_calls, recorded_calls, tokenize
from attnviz.models.loading import ModelBundle

_SILENCED: contextvars.ContextVar[frozenset] = contextvars.ContextVar("attnviz_silenced", default=frozenset())


def _silence_hook(module, inputs, output):
    return torch.zeros_like(output) if id(module) in _SILENCED.get() else output


@contextlib.contextmanager
def _positions_silenced(module: torch.nn.Module):
    """Inside the block (this thread only), ``module`` (a position-embedding table) outputs zeros. The model's
    weights are never changed, so other sessions running the same model at the same time are unaffected."""
    if not getattr(module, "_attnviz_silence_hook", False):
        module.register_forward_hook(_silence_hook)
        module._attnviz_silence_hook = True
    token = _SILENCED.set(_SILENCED.get() | {id(module)})
    try:
        yield
    finally:
        _SILENCED.reset(token)


def word_order_experiment(bundle: ModelBundle, text: str, seed: int = 0, *, remove_positions: bool = True) -> dict:
    """Shuffle the words of ``text`` and compare first-layer self-attention before and after.

    With the model's absolute position embeddings silenced (``remove_positions``: they output zeros in this
    thread, the weights untouched), self-attention is permutation equivariant: the shuffled sentence's weights
    are exactly the original's with rows and columns permuted. Returns the original and un-permuted weights
    ``[heads, n, n]``, the permutation and the max difference.
    """
    found = position_tables.position_table(bundle.model)
    if bundle.modality == "image":
        table = "" if found is None else (
            f" Its position table (`{found.name}`: {found.rows_text()}) is on the Learned tab.")
        raise ValueError(f"{bundle.name} is a vision transformer: it reads an image, not words, so there are no "
                         f"words to shuffle.{table} Choose a text encoder (BERT-like) in the sidebar for this "
                         "experiment.")
    if found is None:
        raise ValueError(f"{bundle.name} has no absolute position table to remove: "
                         f"{position_tables.position_scheme_text(bundle.model)}.")
    if bundle.architecture != "encoder":
        raise ValueError("the word-order experiment runs on encoders (BERT-like), whose attention is not causal: "
                         "under a causal mask each token sees only the tokens before it, so shuffled words give "
                         "other weights even without position embeddings")
    if bundle.capture_path != "interface":
        raise ValueError(f"the word-order experiment records the attention calls of transformers' attention "
                         f"interface, which {bundle.model_type} does not use")
    inputs, tokens, _, special, _ = tokenize(bundle, text, None, bundle.max_positions)
    n = len(tokens)
    keep_ends = special[0] and special[-1]
    order = permutation_of_words(n, seed, keep_ends=keep_ends)
    shuffled = {name: value[:, order] if value.dim() == 2 and value.shape[1] == n else value
                for name, value in inputs.items()}
    module_name = found.name.rsplit(".", 1)[0]  # "embeddings.position_embeddings.weight" -> its module
    table = dict(bundle.model.named_modules())[module_name]

    device = device_of(bundle.model)

    def first_layer(model_inputs) -> torch.Tensor:
        model_inputs = {name: value.to(device) for name, value in model_inputs.items()}
        record = record_from_calls("self", recorded_calls(bundle.model, model_inputs)[0][:1], tokens, tokens)
        return record.layer_weights(0)  # [heads, n, n]

    silenced = _positions_silenced(table) if remove_positions else contextlib.nullcontext()
    with silenced:
        original = first_layer(inputs)
        permuted = first_layer(shuffled)
    # Row i of the shuffled run is token order[i]: undo that on rows and columns.
    inverse = torch.argsort(torch.tensor(order))
    unpermuted = permuted[:, inverse][:, :, inverse]
    return {
        "tokens": tokens,
        "display_tokens": readable_tokens(tokens, tokenizer_style(bundle.tokenizer)),  # as the pages show them
        "order": order,
        "original": original,
        "permuted": permuted,
        "unpermuted": unpermuted,
        "max_difference": (unpermuted - original).abs().max().item(),
        "parameter": found.name,
    }
