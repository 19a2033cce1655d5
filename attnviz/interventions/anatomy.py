"""Where a model's parts are, found by watching one forward rather than by a table of names per family: each block's
attention module and the module that mixes its heads (the output projection), its MLP, the final norm, and the
unembedding. Patching of an attention or MLP output, path patching and direct logit attribution all act on these.

The output projection is the module inside the block whose input, in the watched forward, is exactly the attention
function's output with its heads merged (``[batch, n, heads * d_v]``): that holds for every model whose attention
runs through attnviz's function, whatever the family calls it (``c_proj``, ``o_proj``, ``dense``,
``attention.output.dense``). The MLP is found by name (a table of the names families use), because nothing in its
computation marks it.

Imports only torch and attnviz.interventions.edits (and, through it, attnviz.models)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from attnviz.interventions.edits import AttentionModule, attention_modules, editing, residual_blocks

# The child of a block whose output is what the MLP adds to the residual stream (before a post-norm's norm): the
# first name that a block has, in this order. BERT-like encoders: "output.dense" (the block's "output" holds the
# dense layer, then the residual add and the norm); OPT: "fc2".
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "output.dense", "fc2")
# The norm after the last block, as a child of the model's base (the module that holds the list of blocks).
FINAL_NORM_NAMES = ("ln_f", "norm", "final_layer_norm", "final_layernorm", "norm_f", "ln_final")


@dataclass(frozen=True)
class Layer:
    """One block of a decoder or encoder: its name (the element of the model's list of layers), its attention module
    (as :func:`attnviz.interventions.edits.attention_modules` names it), the module that mixes the heads (its input
    ``[batch, n, heads * d_v]``, its output ``[batch, n, d_model]``: the attention's contribution to the stream
    before a post-norm's residual add), and the MLP's module (None: not found)."""

    block: str
    attention: AttentionModule
    output_projection: str
    mlp: str | None


@dataclass(frozen=True)
class Anatomy:
    """A model's layers in order, the norm after the last one (None: none found, e.g. a post-norm encoder whose
    blocks end in their own norm) and the unembedding (the output embeddings' module; None: the model has none)."""

    layers: list[Layer]
    final_norm: str | None
    unembedding: str | None
    base: str  # the module holding the list of blocks ("transformer", "model", "bert.encoder"...)

    @property
    def heads(self) -> list[int]:
        return [layer.attention.heads for layer in self.layers]


class NotReadable(ValueError):
    """The model's parts could not be found: the message says which and why, in words for a page."""


def _projections(model: torch.nn.Module, blocks: list[str], modules: list[AttentionModule],
                 inputs: dict) -> list[str | None]:
    """For each block, the name of its module whose input equals the attention output with heads merged."""
    merged: dict[str, torch.Tensor] = {}

    def watch(name: str, output: torch.Tensor) -> torch.Tensor:  # [batch, n, heads, d_v]
        merged.setdefault(name, output.detach().reshape(*output.shape[:2], -1))  # [batch, n, heads * d_v]
        return output

    seen: dict[str, list[tuple[str, torch.Tensor]]] = {block: [] for block in blocks}
    handles = []
    for block in blocks:
        for child_name, child in model.get_submodule(block).named_modules():
            if child_name and not list(child.children()):  # leaves only: a linear layer, not its container

                def keep(_, arguments, block=block, child_name=child_name):
                    if arguments and isinstance(arguments[0], torch.Tensor):
                        seen[block].append((child_name, arguments[0].detach()))

                handles.append(child.register_forward_pre_hook(keep))
    try:
        with torch.no_grad(), editing(model, watch):
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    found = []
    for block, module in zip(blocks, modules, strict=True):
        target = merged.get(module.name)
        name = next((child for child, given in seen[block]
                     if target is not None and given.shape == target.shape and torch.equal(given, target)), None)
        found.append(None if name is None else f"{block}.{name}")
    return found


def _child(model: torch.nn.Module, owner: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        full = f"{owner}.{name}" if owner else name
        with contextlib.suppress(AttributeError):
            model.get_submodule(full)
            return full
    return None


def anatomy(model: torch.nn.Module, inputs: dict) -> Anatomy:
    """The parts of ``model`` (found on one forward of ``inputs``, e.g. a few tokens), or :class:`NotReadable`.
    The model's attention must run through attnviz's function (a model attnviz loaded for editing)."""
    modules = attention_modules(model, inputs)
    blocks = residual_blocks(model, modules)
    if blocks is None:
        raise NotReadable("its layers are not a list of blocks around its self-attention (an encoder-decoder, or "
                          "one layer called for every layer), so its residual stream is not read here")
    projections = _projections(model, blocks, modules, inputs)
    missing = [module.label for module, name in zip(modules, projections, strict=True) if name is None]
    if missing:
        raise NotReadable(f"the module that mixes the heads of {missing[0]} was not found (no module of its block "
                          "reads the attention's output as it is)")
    layers = [Layer(block, module, projection, _child(model, block, MLP_NAMES))
              for block, module, projection in zip(blocks, modules, projections, strict=True)]
    base = blocks[0].rsplit(".", 2)[0] if blocks[0].count(".") >= 2 else ""
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    unembedding = next((name for name, module in model.named_modules() if module is embeddings), None) \
        if embeddings is not None else None
    return Anatomy(layers, _child(model, base, FINAL_NORM_NAMES), unembedding, base)


# -- a norm, frozen -------------------------------------------------------------------------------------------------
@dataclass
class FrozenNorm:
    """A norm as an affine map once its scale is fixed: ``norm(x) = gain * (x - mean(x) if centres else x) / scale
    + bias``, with ``scale`` the one the model computed on its own input (``[..., 1]``). A sum of parts of ``x``
    then goes through it part by part, the bias once."""

    gain: torch.Tensor  # [d_model]
    bias: torch.Tensor  # [d_model]
    centres: bool
    eps: float

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """The scale the norm divides ``x`` ``[..., d_model]`` by: ``[..., 1]``."""
        x = x.double()
        if self.centres:
            x = x - x.mean(-1, keepdim=True)
        return (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def linear_part(self, part: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """What one part of the norm's input contributes to its output at the frozen ``scale``, bias left out."""
        part = part.double()
        if self.centres:
            part = part - part.mean(-1, keepdim=True)
        return part * self.gain.double() / scale


def _epsilon(norm: torch.nn.Module) -> float:
    for name in ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"):
        value = getattr(norm, name, None)
        if isinstance(value, float | int):
            return float(value)
    raise NotReadable(f"the epsilon of {type(norm).__name__} was not found")


def frozen_norm(norm: torch.nn.Module, d_model: int) -> FrozenNorm:
    """The norm's gain, bias, whether it subtracts the mean, and its epsilon, read by calling it (LayerNorm, RMSNorm,
    Gemma's ``1 + weight`` alike): on u = (1, -1, 1, -1, ...), whose mean is 0 and mean square 1, norm(±u) =
    ±gain * u / sqrt(1 + eps) + bias; a shift of u changes the output only if the norm does not subtract the mean.
    Checked on a random input against the module itself (NotReadable if it is not this kind of norm)."""
    if d_model % 2:
        raise NotReadable("the model's width is odd, so its norm is not read here")
    eps = _epsilon(norm)
    parameter = next(norm.parameters(), None)
    dtype = parameter.dtype if parameter is not None else torch.float32
    device = parameter.device if parameter is not None else torch.device("cpu")
    u = torch.tensor([1.0, -1.0] * (d_model // 2), dtype=torch.float64)  # [d_model]
    with torch.no_grad():
        up, down = (norm((sign * u).to(dtype=dtype, device=device)[None]).double().cpu()[0] for sign in (1, -1))
        shifted = norm((u + 3.0).to(dtype=dtype, device=device)[None]).double().cpu()[0]
    gain = (up - down) / 2 / u * (1 + eps) ** 0.5
    bias = (up + down) / 2
    # the parameters themselves where the calls show them to be the gain (or Gemma's 1 + gain) and the bias: exact,
    # where a norm computing in float32 (as RMSNorms do) gives them to float32's precision only
    weight, offset = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if isinstance(weight, torch.Tensor) and weight.shape == gain.shape:
        for exact in (weight.detach().double().cpu(), 1 + weight.detach().double().cpu()):
            if torch.allclose(exact, gain, rtol=1e-3, atol=1e-5):
                gain = exact
                break
    if isinstance(offset, torch.Tensor) and offset.shape == bias.shape and \
            torch.allclose(offset.detach().double().cpu(), bias, rtol=1e-3, atol=1e-5):
        bias = offset.detach().double().cpu()
    centres = bool(torch.allclose(shifted, up, atol=1e-4, rtol=1e-4))
    found = FrozenNorm(gain, bias, centres, eps)
    probe = torch.randn(3, d_model, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        expected = norm(probe.to(dtype=dtype, device=device)).double().cpu()
    rebuilt = found.linear_part(probe, found.scale(probe)) + bias
    if not torch.allclose(rebuilt, expected, atol=1e-3 * max(1.0, float(expected.abs().max())), rtol=1e-3):
        raise NotReadable(f"{type(norm).__name__} is not a LayerNorm or an RMSNorm (it does not act as one)")
    return found
