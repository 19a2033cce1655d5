"""Interventions on attention heads: zero a head's output, replace it (with its mean, or with its output on another
input), or scale it by a gate whose gradient says how much the loss depends on the head.

They act where attnviz records attention (:mod:`attnviz.models.attention_hook`): on the output of each attention
call, ``[batch, n_q, heads, d_v]``, each head's weighted values before the output projection mixes the heads. A
head's output there is exactly what its columns of the output projection read, so zeroing it equals zeroing those
columns (the tests check this against a copy of the model with the columns zeroed). Grouped-query heads are query
heads: each has its own output, whichever K/V head it shares.

Models whose attention runs in their own code (attnviz reads them by hooks or by their eager weights) do not call
the attention function: for them, :func:`install_projection_hooks` puts a forward pre-hook on each attention's
output projection, whose input is the same heads' outputs, merged (``[batch, n, heads * d_v]``); the hook hands
them to the same editor, so every edit below works on both paths. The hooks do nothing outside an edit block, and
an edit block is per thread (a ``contextvars`` variable), so sessions sharing a model never see each other's edits.

Imports only torch and attnviz.models.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.models import architectures
from attnviz.models.attention_hook import ATTENTION_NAME, edit_output, editing, editing_now
from attnviz.models.with_heads import load_causal_lm, load_masked_lm

# what replaces a head's output: None (zeros), or a tensor broadcastable to [batch, n_q, d_v]
Replacement = torch.Tensor | None
# the edits of one forward: module name -> {head: replacement}
Plan = dict[str, dict[int, Replacement]]


@dataclass(frozen=True)
class AttentionModule:
    """One attention module of a model, as the model calls it: its name, how many (query) heads it has, and which
    attention it is ("self"; in an encoder-decoder "encoder", "decoder" or "cross")."""

    name: str
    heads: int
    kind: str
    index: int  # its place among the modules of its kind, in call order: the layer number the pages show

    @property
    def label(self) -> str:
        return f"layer {self.index}" if self.kind == "self" else f"{self.kind} layer {self.index}"


# Attention in the model's own code: its attention class -> the child (a dotted path) whose input is every head's
# output, merged, and which mixes them (the output projection)
OUTPUT_PROJECTIONS = {
    "GPTNeoSelfAttention": "out_proj",
    "MPNetSelfAttention": "o",
    "BloomAttention": "dense",
    "FalconAttention": "dense",  # (before transformers 5.25: its attention interface since)
    "MptAttention": "out_proj",
    "DebertaV2Attention": "output.dense",
}


def _heads_of(module: torch.nn.Module) -> int | None:
    for owner in (module, getattr(module, "self", None)):
        for name in ("num_heads", "num_attention_heads", "n_head", "n_heads"):
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def _projection_hook(attention: torch.nn.Module, heads: int):
    def hook(_, arguments):
        if not editing_now():
            return None
        merged = arguments[0]  # [batch, n, heads * d_v]
        output = merged.view(*merged.shape[:-1], heads, merged.shape[-1] // heads)  # [batch, n, heads, d_v]
        edited = edit_output(attention, output)  # as the attention function does: by the attention module's call
        return None if edited is output else (edited.reshape(merged.shape), *arguments[1:])

    return hook


def install_projection_hooks(model: torch.nn.Module) -> int:
    """Put the editing hook on the output projection of every attention module of ``model`` that runs in its own
    code (:data:`OUTPUT_PROJECTIONS`), once per model; returns how many modules have one."""
    with _INSTALLING:  # two sessions opening the same model at once: one set of hooks
        return _install(model)


_INSTALLING = threading.Lock()


def _install(model: torch.nn.Module) -> int:
    installed = getattr(model, "_attnviz_edit_hooks", None)
    if installed is not None:
        return installed
    count = 0
    for module in model.modules():
        child = OUTPUT_PROJECTIONS.get(type(module).__name__)
        heads = _heads_of(module) if child else None
        if child is None or heads is None:
            continue
        module.get_submodule(child).register_forward_pre_hook(_projection_hook(module, heads))
        count += 1
    model._attnviz_edit_hooks = count
    return count


def editable(model: torch.nn.Module) -> str | None:
    """None when ``model``'s attention can be edited here, else why not, in words for the page."""
    if architectures.uses_attention_interface(model):
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if implementation != ATTENTION_NAME:
            return (f"its attention runs as {implementation!r}, not through attnviz's attention function: load it "
                    "with attnviz (interventions act on the attention function's output)")
        return None
    if install_projection_hooks(model):
        return None
    return ("its attention runs in its own code, and attnviz does not know where this architecture mixes its "
            "heads: they can be shown but not edited")


def editable_lm(folder, masked: bool = False):
    """The folder's causal LM (or encoder-decoder LM; with ``masked``, its encoder with the masked-LM head) and
    tokenizer, checked and loaded as :mod:`attnviz.models.with_heads` does, with its attention switched to attnviz's
    function so its heads can be edited (its own copy: generation's copy keeps eager attention)."""
    model, tokenizer = load_masked_lm(folder) if masked else load_causal_lm(folder)
    if architectures.uses_attention_interface(model):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        install_projection_hooks(model)
    return model, tokenizer


def loss_head_of(folder) -> str | None:
    """Which head gives the folder's checkpoint a loss, from its config alone: "lm" (a decoder's or an
    encoder-decoder's language-model head), "masked" (an encoder saved with its masked-LM head), or None."""
    from attnviz.models.loading import architecture_of_folder
    from attnviz.models.with_heads import declares_masked_lm_head

    if architecture_of_folder(folder) in ("decoder", "encoder-decoder"):
        return "lm"
    return "masked" if declares_masked_lm_head(folder) else None


def editable_checkpoint(folder, dtype: str = "stored", *, load_lm=None, load_encoder=None
                        ) -> tuple[torch.nn.Module, object, str]:
    """``(model, tokenizer, note)``: the folder's checkpoint with the head that gives it a loss where it has one
    (:func:`loss_head_of`; ``load_lm(folder, masked)``, default :func:`editable_lm`), else the encoder alone
    (``load_encoder(folder)``, a :class:`~attnviz.models.loading.ModelBundle`; default loaded as every page
    loads it); ``note`` says why an encoder that declares a masked-LM head is measured without it (else "")."""
    from attnviz.checkpoints.safety import CheckpointRefused
    from attnviz.models.loading import load_model_dir

    head, note = loss_head_of(folder), ""
    if head is not None:
        try:
            return (*(load_lm or editable_lm)(folder, head == "masked"), "")
        except CheckpointRefused as refused:
            if head == "lm":
                raise
            note = f"Its masked-LM head could not be used ({refused}), so its hidden states are measured."
    bundle = load_encoder(folder) if load_encoder else load_model_dir(folder, dtype=dtype)
    return bundle.model, bundle.tokenizer, note


def attention_modules(model: torch.nn.Module, inputs: dict) -> list[AttentionModule]:
    """The attention modules ``model`` calls on ``inputs``, in call order (one forward, watched by an editor that
    changes nothing: the same place every edit acts)."""
    model_type = getattr(model.config, "model_type", "")
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    seen: dict[str, int] = {}

    def watch(name: str, output: torch.Tensor) -> torch.Tensor:  # output [batch, n_q, heads, d_v]
        seen.setdefault(name, int(output.shape[2]))
        return output

    with torch.no_grad(), editing(model, watch):
        model(**inputs)
    modules, counts = [], {}
    for name, heads in seen.items():
        kind = architectures.attention_kind(name.split("@")[0], model_type, encoder_decoder)
        modules.append(AttentionModule(name, heads, kind, counts.get(kind, 0)))
        counts[kind] = counts.get(kind, 0) + 1
    if not modules:
        raise RuntimeError(f"no attention call was observed in {type(model).__name__}: edits act where attnviz's "
                           "attention function runs, so the model must use it (a model attnviz loaded does; for one "
                           "loaded by hand, attnviz.bundle_of(model, tokenizer) switches it, as the API's docs say)")
    return modules


def _apply(plan: Plan) -> Callable[[str, torch.Tensor], torch.Tensor]:
    def editor(name: str, output: torch.Tensor) -> torch.Tensor:  # output [batch, n_q, heads, d_v]
        heads = plan.get(name)
        if not heads:
            return output
        output = output.clone()
        for head, replacement in heads.items():
            if replacement is None:
                output[:, :, head] = 0
            else:
                output[:, :, head] = replacement.to(output.dtype).to(output.device)  # [batch, n_q, d_v]
        return output

    return editor


@contextlib.contextmanager
def edited(model: torch.nn.Module, plan: Plan):
    """Forwards of ``model`` inside the block run with ``plan``'s heads zeroed (None) or replaced."""
    with editing(model, _apply(plan)):
        yield


def zeroed(module: str, heads: int | list[int]) -> Plan:
    """The plan that zeroes ``heads`` (one or several) of ``module``."""
    return {module: {head: None for head in ([heads] if isinstance(heads, int) else heads)}}


@contextlib.contextmanager
def gated(model: torch.nn.Module, gates: dict[str, torch.Tensor]):
    """Forwards inside the block multiply each head's output by its gate: ``gates[module]`` is ``[heads]`` or
    ``[batch, heads]`` (one gate per text, so each text's gradient is its own). With gates of ones the forward is
    the model's; the loss's gradient with respect to a gate is Michel et al.'s (2019) head importance."""

    def editor(name: str, output: torch.Tensor) -> torch.Tensor:  # output [batch, n_q, heads, d_v]
        gate = gates.get(name)
        if gate is None:
            return output
        gate = gate if gate.dim() == 2 else gate[None]  # [batch or 1, heads]
        return output * gate[:, None, :, None].to(output.dtype)

    with editing(model, editor):
        yield


def head_outputs(model: torch.nn.Module, inputs: dict, modules: list[str] | None = None,
                 plan: Plan | None = None) -> tuple[dict[str, torch.Tensor], object]:
    """One forward of ``model`` on ``inputs`` (with ``plan``'s edits, if any): every attention module's output
    ``[batch, n_q, heads, d_v]`` (of ``modules`` only, if given; after the module's edits), and the model's
    outputs."""
    kept: dict[str, torch.Tensor] = {}
    edit = _apply(plan or {})

    def editor(name: str, output: torch.Tensor) -> torch.Tensor:
        output = edit(name, output)
        if modules is None or name in modules:
            kept[name] = output.detach()
        return output

    with torch.no_grad(), editing(model, editor):
        outputs = model(**inputs)
    return kept, outputs


def head_means(model: torch.nn.Module, inputs: dict,
               real: torch.Tensor | None) -> tuple[dict[str, torch.Tensor], object]:
    """One unedited forward: every attention module's head outputs averaged over the real tokens (``real``, as in
    :func:`mean_over_tokens`), ``[heads, d_v]`` each, and the model's outputs. Only the means are kept, not the
    outputs (64 texts of 256 tokens through GPT-2 small would be 600 MB)."""
    means: dict[str, torch.Tensor] = {}

    def editor(name: str, output: torch.Tensor) -> torch.Tensor:  # output [batch, n_q, heads, d_v]
        means[name] = mean_over_tokens(output.detach(), real)
        return output

    with torch.no_grad(), editing(model, editor):
        outputs = model(**inputs)
    return means, outputs


def mean_over_tokens(output: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """A module's head outputs ``[batch, n_q, heads, d_v]`` averaged over every real token of every text (``real``:
    ``[batch, n_q]`` True at a text's tokens, not its padding; None: all are real): ``[heads, d_v]``."""
    if real is None:
        return output.mean(dim=(0, 1))
    weights = real.to(output.dtype)[..., None, None]  # [batch, n_q, 1, 1]
    return (output * weights).sum(dim=(0, 1)) / weights.sum().clamp(min=1)


# -- the residual stream ------------------------------------------------------------------------------------------
# The residual stream between layers: the input of each block (the element of the model's list of layers that holds
# an attention module), and the output of the last one. Hooks are put on the blocks once per model and act only
# inside a :func:`on_residual` block of the calling thread, on that model, as the attention edits do.


@dataclass
class _ResidualBlock:
    model: int  # id() of the model
    editor: Callable[[int, torch.Tensor], torch.Tensor]


_RESIDUAL: contextvars.ContextVar[_ResidualBlock | None] = contextvars.ContextVar("attnviz_residual", default=None)


def residual_blocks(model: torch.nn.Module, modules: list[AttentionModule]) -> list[str] | None:
    """The name of the block around each of ``modules`` (a decoder's self-attention modules, in call order): the
    element of a ``ModuleList`` whose name starts the attention's. None when a module has none, two share one (a
    layer called more than once) or a module is not self-attention: the residual stream is then not patched."""
    lists = {name for name, module in model.named_modules() if isinstance(module, torch.nn.ModuleList)}
    blocks = []
    for module in modules:
        if module.kind != "self" or "@" in module.name:
            return None
        parts = module.name.split(".")
        found = next((".".join(parts[:cut]) for cut in range(len(parts) - 1, 0, -1)
                      if parts[cut - 1].isdigit() and ".".join(parts[: cut - 1]) in lists), None)
        if found is None or found in blocks:
            return None
        blocks.append(found)
    return blocks


def _residual_hooks(model: torch.nn.Module, blocks: list[str]) -> None:
    with _INSTALLING:
        if getattr(model, "_attnviz_residual_hooks", None) == blocks:
            return
        if getattr(model, "_attnviz_residual_hooks", None) is not None:
            raise RuntimeError("the model's residual hooks were put on other blocks")
        for layer, name in enumerate(blocks):
            block = model.get_submodule(name)
            block.register_forward_pre_hook(_before_block(model, layer), with_kwargs=True)
            if layer == len(blocks) - 1:
                block.register_forward_hook(_after_block(model, layer + 1))
        model._attnviz_residual_hooks = list(blocks)


def _before_block(model: torch.nn.Module, layer: int):
    owner = id(model)

    def hook(_, args, kwargs):
        state = _RESIDUAL.get()
        if state is None or state.model != owner:
            return None
        if args:  # the hidden states: the block's first argument, by position or by name
            return (state.editor(layer, args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": state.editor(layer, kwargs["hidden_states"])}
        raise RuntimeError("the block's hidden states were not found among its arguments")

    return hook


def _after_block(model: torch.nn.Module, layer: int):
    owner = id(model)

    def hook(_, __, output):
        state = _RESIDUAL.get()
        if state is None or state.model != owner:
            return None
        if isinstance(output, tuple):
            return (state.editor(layer, output[0]), *output[1:])
        return state.editor(layer, output)

    return hook


@contextlib.contextmanager
def on_residual(model: torch.nn.Module, blocks: list[str], editor: Callable[[int, torch.Tensor], torch.Tensor]):
    """Forwards of ``model`` in this thread inside the block hand the residual stream ``[batch, n, d_model]`` to
    ``editor(layer, hidden)`` and go on with what it returns: ``layer`` l < L is the input of block l (``blocks``,
    :func:`residual_blocks`; 0: the embeddings), l = L the output of the last block (before any final norm)."""
    _residual_hooks(model, blocks)
    token = _RESIDUAL.set(_ResidualBlock(id(model), editor))
    try:
        yield
    finally:
        _RESIDUAL.reset(token)
