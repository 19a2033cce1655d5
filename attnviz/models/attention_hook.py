"""The attention function attnviz registers with transformers, and the recorder it writes to.

Every loaded model is switched to ``attn_implementation="attnviz"`` (transformers' ``AttentionInterface``, set per
model instance: no module globals are patched). The function computes each attention call with the model's fast
path (PyTorch SDPA; transformers' eager function for the few modifiers SDPA cannot do) and, while a
:func:`recording` block is active in the calling thread (a ``contextvars`` variable, so sessions on a server
never see each other's calls and never wait for each other), keeps what attention received and returned.

Nothing the kernel returns is kept: the replay check runs the same kernel again on the recorded tensors.

The mask comes through transformers' SDPA mask builder (``AttentionMaskInterface``), which passes None when the
mask is plain causal or full (SDPA's ``is_causal`` then does the work): the recorder stores the module's causality
with it, and :mod:`attnviz.models.capture` rebuilds the mask from both.

Imports only torch and transformers.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import weakref
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "attnviz"
# Keyword arguments SDPA cannot apply; a call that has one runs through the model's own eager function.
EAGER_ONLY = ("softcap", "s_aux")


@dataclass
class AttentionCall:
    """One attention call as the model made it (batch of one): tensors in the model's dtype, not copied."""

    module_name: str
    query: torch.Tensor  # [heads, n_q, d] (after RoPE, if any)
    key: torch.Tensor  # [kv_heads, n_k, d]
    value: torch.Tensor  # [kv_heads, n_k, d_v]
    kernel: "KernelCall"  # how to run the model's own kernel again on these tensors (for the replay check)
    mask: torch.Tensor | None  # the model's mask for this call: bool [n_q, n_k] (True = may attend), or None
    is_causal: bool  # with mask None: the mask is causal (True) or full (False)
    scaling: float
    position_bias: torch.Tensor | None = None  # T5: [heads, n_q, n_k], added to the scaled scores
    # The bias came inside a float mask (Falcon's ALiBi since transformers 5.25): the mask is kept as given, never
    # replaced by a rule, so that running the kernel again adds the bias too
    bias_in_mask: bool = False
    softcap: float | None = None  # Gemma 2: scores = softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None  # gpt-oss: [heads] logits of a sink column in every row's softmax
    sliding_window: int | None = None


@dataclass
class KernelCall:
    """Everything but Q, K, V that the model passed to its attention kernel, to run it again exactly: the module
    (weakly: a capture must not keep a removed model alive), the mask as given, the scaling and the keywords."""

    module: weakref.ref
    module_name: str  # to find the same module in a reloaded copy of the model
    attention_mask: torch.Tensor | None
    scaling: float | None
    kwargs: dict
    device: torch.device  # where the model ran this call: the kernel runs there again
    rebuild_mask: object = None  # a callable giving the mask again when it was a rule (not kept: it is N x N)

    def output(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               model: torch.nn.Module | None = None) -> torch.Tensor:
        """The model's kernel on ``query [heads, n_q, d]``, ``key``, ``value`` (batch of one), on the device the
        model ran it on: ``[n_q, heads, d_v]`` on the CPU. ``model``: the loaded model to find the module in, if
        the copy the capture came from has been unloaded since."""
        module = self.module()
        if module is None and model is not None:
            module = dict(model.named_modules()).get(self.module_name)
        if module is None:
            raise RuntimeError("the model this capture came from is no longer loaded")
        mask = self.attention_mask if self.rebuild_mask is None else self.rebuild_mask().to(self.device)
        output, _ = _fast_path(module, query[None].to(self.device), key[None].to(self.device),
                               value[None].to(self.device), mask, self.scaling, 0.0, **self.kwargs)
        return output[0].cpu()


@dataclass
class Recorder:
    calls: list[AttentionCall] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # id(module) -> its name in the model


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("attnviz_recorder", default=None)


@contextlib.contextmanager
def recording(model: torch.nn.Module):
    """Record every attention call ``model`` makes in this thread until the block ends; yields the recorder."""
    recorder = Recorder(names={id(module): name for name, module in model.named_modules()})
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


# The edit block active in this thread (see :func:`editing` and attnviz.interventions.edits).
_EDITOR: contextvars.ContextVar["EditBlock | None"] = contextvars.ContextVar("attnviz_editor", default=None)


@dataclass
class EditBlock:
    """One :func:`editing` block: the model it edits (its modules' names by id), the editor, and how often each
    module has been called in the current forward."""

    model: int  # id() of the edited model
    names: dict[int, str]
    editor: object
    calls: dict[str, int] = field(default_factory=dict)
    # inputs(name, query, key, value) -> (query, key, value): edits what the attention call receives, ``[batch,
    # heads or kv_heads, n, d]`` each (after RoPE); None: not edited
    inputs: object = None
    # pattern(name, weights) -> weights, ``[batch, heads, n_q, n_k]``, for the calls named in ``pattern_calls`` (all
    # when None): those run by the written-out softmax so that their weights exist to be read or replaced
    pattern: object = None
    pattern_calls: frozenset[str] | None = None

    def wants_pattern(self, name: str) -> bool:
        return self.pattern is not None and (self.pattern_calls is None or name in self.pattern_calls)

    def call_name(self, module: torch.nn.Module) -> str | None:
        """The name of this call of ``module`` (None: not a module of the edited model): its module name, and for
        a module called again in the same forward (ALBERT's one layer serving every layer), ``name@k`` for its
        k-th call, so that each layer can be edited alone."""
        name = self.names.get(id(module))
        if name is None:
            return None
        count = self.calls.get(name, 0) + 1
        self.calls[name] = count
        return name if count == 1 else f"{name}@{count}"


_RESETTING = threading.Lock()


def _forward_starts(model: torch.nn.Module, _arguments) -> None:
    block = _EDITOR.get()
    if block is not None and block.model == id(model):
        block.calls.clear()  # a new forward: the call counts start again


def _count_forwards(model: torch.nn.Module) -> None:
    """A forward pre-hook on the model, once: it restarts the call counts of this thread's edit block at each
    forward (installed once and never removed: adding hooks per block would race with other threads' forwards)."""
    with _RESETTING:
        if not getattr(model, "_attnviz_counts_forwards", False):
            model.register_forward_pre_hook(_forward_starts)
            model._attnviz_counts_forwards = True


@contextlib.contextmanager
def editing(model: torch.nn.Module, editor, *, inputs=None, pattern=None, pattern_calls=None):
    """Until the block ends, every attention call of ``model`` in this thread hands its output (``[batch, n_q,
    heads, d_v]``, each head's weighted values before the output projection mixes the heads) to
    ``editor(call_name, output)`` and goes on with what it returns. ``call_name`` is the module's name (see
    :meth:`EditBlock.call_name` for a module called more than once in a forward). Other models' calls, and
    other threads', are not edited.

    Through attnviz's attention function only (not the projection hooks of models whose attention runs in their own
    code): ``inputs(call_name, query, key, value)`` returns the query, key and value the call goes on with (``[batch,
    heads, n, d]``; key and value have the K/V heads, after RoPE), and ``pattern(call_name, weights)`` the attention
    weights (``[batch, heads, n_q, n_k]``, rows summing to 1) the values are mixed with, for the calls in
    ``pattern_calls`` (None: all), which then run by the written-out softmax instead of the fast kernel."""
    _count_forwards(model)
    token = _EDITOR.set(EditBlock(id(model), {id(module): name for name, module in model.named_modules()}, editor,
                                  inputs=inputs, pattern=pattern,
                                  pattern_calls=None if pattern_calls is None else frozenset(pattern_calls)))
    try:
        yield
    finally:
        _EDITOR.reset(token)


def editing_now() -> bool:
    """Whether an :func:`editing` block is active in this thread."""
    return _EDITOR.get() is not None


def edit_output(module: torch.nn.Module, output: torch.Tensor) -> torch.Tensor:
    """``output`` ``[batch, n_q, heads, d_v]`` of one call of ``module``, as this thread's edit block makes it (the
    same tensor where no block is active, or ``module`` is not the edited model's)."""
    block = _EDITOR.get()
    if block is None:
        return output
    name = block.call_name(module)
    return output if name is None else block.editor(name, output)


def batch_zero_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """The mask of batch item 0 as ``[n_q, n_k]`` bool (True = may attend); transformers' additive float masks
    (0 / large negative) are converted."""
    if attention_mask is None:
        return None
    mask = attention_mask.reshape(-1, *attention_mask.shape[-2:])[0]
    return mask if mask.dtype == torch.bool else mask > -1e4


def bias_in_mask(attention_mask: torch.Tensor | None, heads: int, n_q: int, n_k: int) -> torch.Tensor | None:
    """The finite, non-zero part of batch item 0's additive float mask, ``[heads, n_q, n_k]``: a position bias
    that a model adds to the scores through the mask (Falcon's ALiBi), or None for a bool mask or a plain 0 /
    large-negative one."""
    if attention_mask is None or attention_mask.dtype == torch.bool or attention_mask.dim() < 3:
        return None
    first = attention_mask.reshape(-1, *attention_mask.shape[-3:])[0][..., -n_q:, :n_k]  # [heads or 1, n_q, n_k]
    values = first.masked_fill(first <= -1e4, 0.0)
    if not bool(values.any()):
        return None
    return values.detach().expand(heads, n_q, n_k)


def _additive_mask(attention_mask: torch.Tensor | None, is_causal: bool, query: torch.Tensor,
                   key: torch.Tensor) -> torch.Tensor | None:
    """What transformers' eager functions expect: an additive float mask (0 / the dtype's minimum). SDPA's mask
    builder gives a bool mask, or None for plain causal (SDPA's is_causal), which eager would not apply."""
    n_q, n_k = query.shape[-2], key.shape[-2]
    if attention_mask is None:
        if not (is_causal and n_q > 1):
            return None
        key_pos = torch.arange(n_k, device=query.device)
        attention_mask = (key_pos[None, :] <= torch.arange(n_q, device=query.device)[:, None] + (n_k - n_q))[None, None]
    if attention_mask.dtype != torch.bool:
        return attention_mask
    additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
    return additive.masked_fill(~attention_mask, torch.finfo(query.dtype).min)


def _fast_path(module, query, key, value, attention_mask, scaling, dropout, **kwargs):
    """The model's own computation: SDPA, or the model's eager function for what SDPA cannot do."""
    if any(kwargs.get(name) is not None for name in EAGER_ONLY):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        is_causal = kwargs.get("is_causal")
        is_causal = bool(getattr(module, "is_causal", False) if is_causal is None else is_causal)
        additive = _additive_mask(attention_mask, is_causal, query, key)
        return eager(module, query, key, value, additive, scaling=scaling, dropout=dropout, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def _by_pattern(module, query, key, value, attention_mask, scaling, edit) -> torch.Tensor:
    """Attention written out (scores, mask, softmax, weighted values) with the weights handed to ``edit`` before
    they mix the values: ``[batch, n_q, heads, d_v]``. For calls with no modifier SDPA cannot apply."""
    heads, kv_heads = query.shape[1], key.shape[1]
    key = key.repeat_interleave(heads // kv_heads, dim=1)  # [batch, heads, n_k, d]: each query head's K/V head
    value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    wide = torch.float64 if query.dtype == torch.float64 else torch.float32  # the softmax in float32 at least
    scores = (query.to(wide) @ key.to(wide).transpose(-1, -2)) * scale  # [batch, heads, n_q, n_k]
    additive = _additive_mask(attention_mask, bool(getattr(module, "is_causal", False)), query, key)
    if additive is not None:
        scores = scores + additive.to(wide)[..., -query.shape[-2]:, : key.shape[-2]]
    weights = edit(torch.softmax(scores, dim=-1))  # [batch, heads, n_q, n_k]
    return (weights.to(value.dtype) @ value).transpose(1, 2).contiguous()  # [batch, n_q, heads, d_v]


def attnviz_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers calls this for every attention of a model loaded with ``attn_implementation="attnviz"``."""
    block = _EDITOR.get()
    name = block.call_name(module) if block is not None else None
    if name is not None and block.inputs is not None:
        query, key, value = block.inputs(name, query, key, value)
    if name is not None and block.wants_pattern(name):
        if any(kwargs.get(option) is not None for option in (*EAGER_ONLY, "position_bias")) or \
                bias_in_mask(attention_mask, query.shape[1], query.shape[-2], key.shape[-2]) is not None:
            raise ValueError("this attention adds to its scores (a soft cap, sinks or a position bias), so its "
                             "pattern is not replaced here")
        output = _by_pattern(module, query, key, value, attention_mask, scaling,
                             lambda weights, name=name: block.pattern(name, weights))
    else:
        output, _ = _fast_path(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    # [batch, n_q, heads, d_v]
    output = output if name is None else block.editor(name, output)
    recorder = _RECORDER.get()
    if recorder is not None:
        bias = kwargs.get("position_bias")
        bias = None if bias is None else bias.reshape(-1, *bias.shape[-3:])[0].detach()
        folded = bias_in_mask(attention_mask, query.shape[1], query.shape[-2], key.shape[-2])
        if folded is not None:
            bias = folded if bias is None else bias + folded
        sinks = kwargs.get("s_aux")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        is_causal = kwargs.get("is_causal")
        recorder.calls.append(AttentionCall(
            module_name=recorder.names.get(id(module), ""),
            query=query[0].detach(), key=key[0].detach(), value=value[0].detach(),
            kernel=KernelCall(weakref.ref(module), recorder.names.get(id(module), ""), attention_mask, scaling,
                              dict(kwargs), query.device),
            mask=batch_zero_mask(attention_mask),
            is_causal=bool(getattr(module, "is_causal", False) if is_causal is None else is_causal),
            scaling=float(scale),
            position_bias=bias,
            bias_in_mask=folded is not None,
            softcap=kwargs.get("softcap"),
            sinks=None if sinks is None else sinks.detach(),
            sliding_window=kwargs.get("sliding_window"),
        ))
    return output, None  # no weights: attnviz materialises them on demand, by replay


AttentionInterface.register(ATTENTION_NAME, attnviz_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # bool masks, None for plain causal or full
