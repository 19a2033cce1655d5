"""Models that compute attention in their own code instead of transformers' attention interface.

Most text models call transformers' attention interface, which :mod:`attnviz.models.attention_hook` records. A
few compute attention inline (DeBERTa-v2/v3, MPNet, GPT-Neo, BLOOM, MPT; Falcon before transformers 5.25).
attnviz still shows them, on one of two paths, and the pages say which:

* **hooks** (GPT-Neo, MPNet, BLOOM): the model runs on transformers' eager attention; forward hooks read Q, K and
  V where the model makes them (its projections) and the score terms it passes its attention module (MPNet's
  relative position bias, BLOOM's ALiBi), so replay, the Q.K view and the what-if work as for any other model.
  The type's record (:mod:`attnviz.models.architectures`) names its adapter (:mod:`attnviz.models.adapters`).
  The replay check compares attnviz's weights with the eager weights the model returned (``output_attentions``).
* **weights** (DeBERTa-v2, MPT, and any other type attnviz does not know): transformers' eager weights
  (``output_attentions=True``, what bertviz shows) and nothing else; the pages that need Q and K say why they
  are not available.

Both keep every layer's weights of the forward at once, so inputs are capped at
:func:`attnviz.models.record.dense_token_limit` (:func:`attnviz.models.capture.tokens_read`).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect

import torch

from attnviz.models.adapters import Adapter
from attnviz.models.attention_hook import AttentionCall


class EagerKernel:
    """The replay check's reference on the hooks path: the model's own eager weights of one layer, times V."""

    rebuild_mask = None

    def __init__(self, weights: torch.Tensor, module_name: str, mask: torch.Tensor | None):
        self.weights = weights  # [heads, n_q, n_k], as the model returned them
        self.module_name = module_name
        self.attention_mask = mask  # held, so that the capture tells each layer's mask apart (GPT-Neo alternates)

    def output(self, query, key, value, model=None) -> torch.Tensor:
        """``[n_q, heads, d_v]``: like the kernel call of the interface path. (The hooked types have one K/V head
        per query head, so ``value [heads, n_k, d_v]`` pairs with the weights as it is.)"""
        return (self.weights @ value.float().cpu()).transpose(0, 1)


# What this thread's capture has seen so far; the hooks stay on the (shared, cached) model, and write only into
# the list of the thread that is capturing: sessions running the same model at once never see each other's calls.
_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("attnviz_eager_seen", default=None)


def _install_hooks(model: torch.nn.Module, adapter: Adapter) -> None:
    """Once per model: a pre-hook on every attention module (its arguments) and forward hooks on its projections
    (Q, K, V), recording into :data:`_SEEN` while a capture runs in this thread, and doing nothing otherwise."""
    if getattr(model, "_attnviz_eager_hooks", False):
        return
    names = {id(m): name for name, m in model.named_modules()}
    for module in model.modules():
        if type(module).__name__ != adapter.attention_class:
            continue
        signature = inspect.signature(module.forward)

        def before(mod, args, kwargs, signature=signature):
            seen = _SEEN.get()
            if seen is None:
                return
            bound = signature.bind_partial(*args, **kwargs).arguments
            extra = bound.pop("kwargs", {}) if "kwargs" in bound else {}
            seen.append({"module": mod, "name": names.get(id(mod), ""), "arguments": {**bound, **extra},
                         "outputs": []})

        def projected(mod, inputs, output):
            seen = _SEEN.get()
            if seen:
                seen[-1]["outputs"].append(output.detach())

        module.register_forward_pre_hook(before, with_kwargs=True)
        for child in adapter.projections:
            getattr(module, child).register_forward_hook(projected)
    model._attnviz_eager_hooks = True


@contextlib.contextmanager
def _hooks(model: torch.nn.Module, adapter: Adapter):
    """While the block runs, this thread's calls of ``model``'s attention modules are appended, in forward order,
    to the list yielded: (module, name, arguments, outputs of its projections)."""
    _install_hooks(model, adapter)
    seen: list[dict] = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def _outputs_by_kind(outputs, encoder_decoder: bool) -> dict[str, tuple]:
    if encoder_decoder:
        return {"encoder": outputs.encoder_attentions, "decoder": outputs.decoder_attentions,
                "cross": outputs.cross_attentions}
    return {"self": outputs.attentions}


@torch.no_grad()
def check_weights_come_back(model: torch.nn.Module, model_type: str, encoder_decoder: bool, vocab_size: int) -> None:
    """A dry run on four tokens at load time: the eager paths need ``output_attentions`` to return square
    ``[batch, heads, n, n]`` weights per layer. Raises ValueError naming the type and what came back instead
    (Longformer's windows, Mamba's no attention at all), so a model that cannot be shown is refused when it is
    added, not when a page runs it."""
    ids = torch.arange(4)[None] % max(1, vocab_size)
    inputs = {"input_ids": ids}
    if encoder_decoder:
        inputs["decoder_input_ids"] = ids
    try:
        device = next(model.parameters()).device
        outputs = model(**{k: v.to(device) for k, v in inputs.items()}, output_attentions=True)
    except Exception as problem:  # noqa: BLE001 - any failure means it cannot be shown this way
        reason = str(problem).splitlines()[0][:120] if str(problem) else type(problem).__name__
        raise ValueError(f"{model_type} did not run on four tokens with output_attentions ({reason})") from None
    try:
        found = [w for weights in _outputs_by_kind(outputs, encoder_decoder).values() for w in (weights or ())]
    except AttributeError:  # an output without attention fields (Mamba, ...)
        found = []
    if not found:
        raise ValueError(f"{model_type} returns no attention weights (it may not use attention at all)")
    shapes = {tuple(w.shape) for w in found}
    if any(len(shape) != 4 or shape[-1] != 4 or shape[-2] != 4 for shape in shapes):
        raise ValueError(f"{model_type} returns attention weights shaped {sorted(shapes)[0]}, not [batch, heads, "
                         "n, n] (a local or bucketed attention), which attnviz cannot draw as token-to-token weights")


@torch.no_grad()
def run(model: torch.nn.Module, adapter: Adapter | None, inputs: dict, encoder_decoder: bool):
    """Run the model on eager attention with ``output_attentions``: ``(weights, calls)`` where ``weights`` maps
    each attention kind to its per-layer ``[heads, n_q, n_k]`` weights (batch item 0) and ``calls`` is the list of
    recorded :class:`AttentionCall` (self-attention read through ``adapter`` on the hooks path; empty on the
    weights path, ``adapter`` None), and whether the model's outputs are finite: ``(weights, calls,
    outputs_finite)``."""
    hooks = _hooks(model, adapter) if adapter else contextlib.nullcontext([])
    with hooks as seen:
        outputs = model(**inputs, output_attentions=True)
    by_kind = _outputs_by_kind(outputs, encoder_decoder)
    # [heads, n_q, n_k] per layer, on the CPU (where replay runs; a GPU's memory is not held by a cached capture)
    weights = {kind: [w[0].detach().float().cpu() for w in found] for kind, found in by_kind.items() if found}
    if not weights:
        raise RuntimeError(f"{type(model).__name__} returned no attention weights")
    calls = []
    for layer, entry in enumerate(seen):
        module = entry["module"]
        query, key, value = adapter.split(module, entry["outputs"])
        mask, causal, bias = adapter.score_terms(module, entry["arguments"], query.shape[1], key.shape[1])
        mask = None if mask is None else mask.cpu()
        calls.append(AttentionCall(
            module_name=entry["name"], query=query, key=key, value=value,
            kernel=EagerKernel(weights["self"][layer], entry["name"], mask),
            mask=mask, is_causal=causal, scaling=adapter.scaling(module), position_bias=bias,
        ))
    outputs_finite = all(bool(torch.isfinite(value).all()) for value in outputs.values()
                         if isinstance(value, torch.Tensor) and value.is_floating_point())
    return weights, calls, outputs_finite
