"""A post-norm model's logit difference, read back to the parts of its residual stream with every nonlinearity on
the way frozen at its value on the prompt: what direct logit attribution needs for BERT-shaped models.

In a post-norm block (BERT, RoBERTa, DistilBERT, ELECTRA) the stream is renormalised twice per layer::

    h = norm_1(x + attention(x))          # the attention's norm
    x' = norm_2(h + mlp(h))               # the MLP's norm

and a masked LM's output head is more than an unembedding (BERT's ``cls``: dense, GELU, LayerNorm, decoder). With
each norm's scale fixed at the one the model computed at each position, a norm is affine; with the activation's
gate fixed (each unit's output over its input, ``gelu(t) / t``), so is the activation. Then logit(answer) -
logit(foil) at each position is a linear function of every part that enters the stream (plus constants: the norms'
and the head's biases), and each part's share is its dot product with the *readout* at the point it enters: a
vector per position, carried back from the unembedding step by step. The shares add up to the model's own
difference exactly, by construction; what they leave out is stated: a part's effect through later norms' scales
and gates is held at this prompt's values, not recomputed.

The structure is found on a short forward (the leading tokens of the prompt), never assumed from the family: each
norm is the module of its block whose input is exactly ``x + attention(x)`` (then ``h + mlp(h)``), and the head is
the chain of modules from the last block's output to the unembedding, each given the previous one's output (a
linear layer, a norm, or an activation: a module, or a known elementwise function recognised by its values).

Imports torch and attnviz.interventions.anatomy."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnviz.interventions.anatomy import Anatomy, FrozenNorm, NotReadable, frozen_norm

# Elementwise activations a head may call as a function (RoBERTa's ``gelu(x)``), recognised by their values
KNOWN_ACTIVATIONS = {
    "GELU": F.gelu,
    "GELU (tanh)": lambda t: F.gelu(t, approximate="tanh"),
    "ReLU": F.relu,
    "SiLU": F.silu,
    "tanh": torch.tanh,
}
PROBE_TOKENS = 8  # the leading tokens whose forward shows the structure (it does not depend on the length)


@dataclass(frozen=True)
class Step:
    """One step of the output head, from the last block's output to the unembedding's input: a linear layer, a
    norm, or an activation (``name``: the module, or for a function called inside ``forward`` the module after it;
    ``function``: the activation's name)."""

    kind: str  # "linear", "norm" or "activation"
    name: str
    function: str = ""
    before: bool = False  # an activation called as a function inside ``forward``, before the module ``name``


@dataclass(frozen=True)
class PostNormLayer:
    attention_norm: str  # the module that normalises x + attention(x)
    mlp_norm: str  # the module that normalises h + mlp(h)


@dataclass(frozen=True)
class PostNormShape:
    layers: list[PostNormLayer]
    head: list[Step]  # from the last block's output to the unembedding's input, in order

    @property
    def activation(self) -> str:
        """The head's activation(s), by name ("" when it has none)."""
        return " and ".join(step.function for step in self.head if step.kind == "activation")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-4, atol=1e-5 * (1 + float(b.abs().max()))))


def _watch_leaves(model: torch.nn.Module, inputs: dict) -> list[tuple[str, torch.Tensor | None, torch.Tensor]]:
    """Every leaf module's call in one forward of ``inputs`` in this thread: (name, first input, output), in order."""
    thread, calls, handles = threading.get_ident(), [], []
    for name, module in model.named_modules():
        if name and not list(module.children()):
            def keep(_, arguments, output, name=name):
                if threading.get_ident() == thread and isinstance(output, torch.Tensor):
                    given = arguments[0] if arguments and isinstance(arguments[0], torch.Tensor) else None
                    calls.append((name, None if given is None else given.detach()[0].cpu(), output.detach()[0].cpu()))
            handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _norm_or_none(model: torch.nn.Module, name: str, d_model: int) -> FrozenNorm | None:
    try:
        return frozen_norm(model.get_submodule(name), d_model)
    except (NotReadable, RuntimeError, TypeError):
        return None


def find_post_norm_shape(model: torch.nn.Module, anatomy: Anatomy, inputs: dict,
                         streams: dict[int, torch.Tensor]) -> PostNormShape:
    """The norms of every post-norm block and the output head's steps, found on a forward of the leading tokens of
    ``inputs`` (``streams``: the residual stream at each layer boundary on the whole prompt, for its width), or
    :class:`NotReadable` with what did not fit."""
    short = {key: value[:, :PROBE_TOKENS] for key, value in inputs.items()}
    calls = _watch_leaves(model, short)
    output = {name: out for name, _, out in calls}
    given = {name: arg for name, arg, _ in calls}
    d_model = streams[0].shape[-1]
    found_layers = []
    for index, layer in enumerate(anatomy.layers):
        inside = [name for name, _, _ in calls if name.startswith(layer.block + ".")]
        if layer.mlp is None or layer.mlp not in output and not any(n.startswith(layer.mlp + ".") for n in inside):
            raise NotReadable(f"no MLP was found in layer {index}")
        mlp_output = output.get(layer.mlp)
        if mlp_output is None:  # the MLP is a container: its output is its last leaf's
            mlp_output = output[[n for n in inside if n.startswith(layer.mlp + ".")][-1]]
        x = next(arg for name, arg, _ in calls if name.startswith(layer.block + ".") and arg is not None).double()
        first = _norm_given(model, inside, given, x + output[layer.output_projection], d_model)
        if first is None:
            raise NotReadable(f"in layer {index} no norm is given the stream plus the attention's output")
        second = _norm_given(model, inside, given, output[first].double() + mlp_output.double(), d_model)
        if second is None:
            raise NotReadable(f"in layer {index} no norm is given the attention norm's output plus the MLP's")
        found_layers.append(PostNormLayer(first, second))
    return PostNormShape(found_layers, _head_steps(model, anatomy, calls, d_model))


def _norm_given(model: torch.nn.Module, names: list[str], given: dict, expected: torch.Tensor,
                d_model: int) -> str | None:
    for name in names:
        arg = given.get(name)
        if arg is not None and _close(arg, expected) and _norm_or_none(model, name, d_model) is not None:
            return name
    return None


def _head_steps(model: torch.nn.Module, anatomy: Anatomy, calls: list, d_model: int) -> list[Step]:
    """The chain of leaf calls after the last block, from its output to the unembedding's input."""
    last_block = anatomy.layers[-1].block
    last = max(i for i, (name, _, _) in enumerate(calls) if name.startswith(last_block + "."))
    current = calls[last][2].double()  # the last block's last leaf output: the post-norm stream leaving it
    after = calls[last + 1:]
    steps: list[Step] = []
    position = 0
    while position < len(after):
        name, arg, out = after[position]
        if arg is None or not _close(arg, current):
            function = next((label for label, f in KNOWN_ACTIVATIONS.items()
                             if arg is not None and arg.shape == current.shape and _close(arg, f(current))), None)
            if function is None:
                position += 1
                continue
            steps.append(Step("activation", name, function, before=True))
            current = arg.double()
        if name == anatomy.unembedding:
            return steps
        module = model.get_submodule(name)
        if _close(out, current):  # dropout in eval, an identity: nothing to read
            pass
        elif isinstance(module, torch.nn.Linear):
            steps.append(Step("linear", name))
        elif _norm_or_none(model, name, out.shape[-1]) is not None:
            steps.append(Step("norm", name))
        else:
            function = next((label for label, f in KNOWN_ACTIVATIONS.items() if _close(out, f(current))), None)
            if function is None:
                raise NotReadable(f"its output head's {name} ({type(module).__name__}) is not a linear layer, a "
                                  "norm or a known elementwise activation, so the head is not read step by step")
            steps.append(Step("activation", name, function))
        current = out.double()
        position += 1
    raise NotReadable("the chain of modules from the last layer's output to the unembedding was not found")


# -- reading back -------------------------------------------------------------------------------------------------
def double_call(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module`` on ``x`` with its parameters and buffers in float64 (the module itself is not changed)."""
    state = {name: value.detach().cpu().double() if value.is_floating_point() else value.cpu()
             for name, value in [*module.named_parameters(), *module.named_buffers()]}
    return torch.func.functional_call(module, state, (x.double(),))


def affine_readout(module: torch.nn.Module, width: int, read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For an affine ``module`` (a linear layer, whatever its weight's layout) and a readout of its output, ``read``
    ``[out]`` or one per position ``[n, out]``: the readout of its input ``g`` (``[width]`` or ``[n, width]``) and
    the bias's share ``c`` (``[]`` or ``[n]``), with ``module(x) · read = x · g + c``. Found by one vector-Jacobian
    product at 0, in float64; whether the module is affine is checked by the callers' sums."""
    rows = read.double().reshape(-1, read.shape[-1])  # [rows, out]
    zero = torch.zeros(rows.shape[0], width, dtype=torch.float64)
    with torch.enable_grad():
        output, pull = torch.func.vjp(lambda x: double_call(module, x), zero)  # output [rows, out]
        (gradient,) = pull(rows)
    constant = (output * rows).sum(-1)  # [rows]
    return (gradient[0], constant[0]) if read.dim() == 1 else (gradient, constant)


def norm_back(norm: FrozenNorm, given: torch.Tensor, read: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A norm at the scale it computed on ``given`` ``[n, d]``: the readout of its input ``[n, d]`` for the readout
    of its output ``read`` ``[n, d]``, and its bias's share ``[n]`` (centring is its own transpose)."""
    back = read.double() * norm.gain.double() / norm.scale(given)  # [n, d]
    if norm.centres:
        back = back - back.mean(-1, keepdim=True)
    return back, read.double() @ norm.bias.double()


@dataclass
class Row:
    """One part's share of the logit difference at every position (``values [n]``)."""

    label: str
    kind: str
    layer: int | None
    head: int | None
    values: torch.Tensor


def kept_names(shape: PostNormShape) -> tuple[str, ...]:
    """The modules whose input and output the full forward must keep for :func:`post_norm_rows`."""
    return tuple(dict.fromkeys([name for layer in shape.layers for name in (layer.attention_norm, layer.mlp_norm)]
                               + [step.name for step in shape.head]))


def post_norm_rows(model: torch.nn.Module, anatomy: Anatomy, shape: PostNormShape, streams: dict[int, torch.Tensor],
                   kept_in: dict[str, torch.Tensor], kept_out: dict[str, torch.Tensor],
                   unembedding_read: torch.Tensor) -> list[Row]:
    """Every part's share of the logit difference, in stream order, for a post-norm model: ``unembedding_read``
    ``[n, d]`` is the readout of the unembedding's input (its weight's answer row minus the foil's). Carried back
    through the head's steps, then through each block's MLP norm and attention norm, each at its own frozen scale,
    and each activation at its frozen gate (output over input, unit by unit)."""
    d_model = streams[0].shape[-1]
    read = unembedding_read.double()  # [n, width of the unembedding's input]
    head_rows: list[Row] = []
    stepped = []  # (step, its input t, its output u), first to last
    current = streams[len(anatomy.layers)].double()
    for step in shape.head:
        if step.before:
            given, out = current, kept_in[step.name].double()  # a function called before the module ``name``
        else:
            given, out = kept_in[step.name].double(), kept_out[step.name].double()
        stepped.append((step, given, out))
        current = out
    for step, given, out in reversed(stepped):
        if step.kind == "linear":
            read, constant = affine_readout(model.get_submodule(step.name), given.shape[-1], read)
            head_rows.append(Row(_head_label(step.name), "output head bias", None, None, constant))
        elif step.kind == "norm":
            norm = frozen_norm(model.get_submodule(step.name), given.shape[-1])
            read, constant = norm_back(norm, given, read)
            head_rows.append(Row(_head_label(step.name), "output head bias", None, None, constant))
        else:  # the gate each unit had: output over input (0 where the input is 0: so was the output)
            safe = torch.where(given == 0, torch.ones_like(given), given)
            read = read * torch.where(given == 0, torch.zeros_like(given), out / safe)
    layer_rows: list[list[Row]] = []
    for index in reversed(range(len(anatomy.layers))):
        layer, norms = anatomy.layers[index], shape.layers[index]
        after_mlp, mlp_bias = norm_back(frozen_norm(model.get_submodule(norms.mlp_norm), d_model),
                                        kept_in[norms.mlp_norm], read)
        after_attention, attention_bias = norm_back(frozen_norm(model.get_submodule(norms.attention_norm), d_model),
                                                    kept_in[norms.attention_norm], after_mlp)
        merged = kept_in[layer.output_projection].double()  # [n, heads * d_v]
        n, heads = merged.shape[0], layer.attention.heads
        back, bias = affine_readout(model.get_submodule(layer.output_projection), merged.shape[-1], after_attention)
        per_head = torch.einsum("nhd,nhd->hn", merged.view(n, heads, -1), back.view(n, heads, -1))  # [heads, n]
        rows = [Row(f"L{index} H{head}", "head", index, head, per_head[head]) for head in range(heads)]
        if bool(bias.abs().max() > 0):
            rows.append(Row(f"L{index} attention bias", "attention bias", index, None, bias))
        rows.append(Row(f"L{index} attention norm bias", "norm bias", index, None, attention_bias))
        rows.append(Row(f"L{index} MLP", "mlp", index, None, kept_out[layer.mlp].double().reshape(n, -1)
                        .mul(after_mlp).sum(-1)))
        rows.append(Row(f"L{index} MLP norm bias", "norm bias", index, None, mlp_bias))
        layer_rows.append(rows)
        read = after_attention
    embeddings = Row("embeddings", "embeddings", None, None, (streams[0].double() * read).sum(-1))
    return [embeddings, *[row for rows in reversed(layer_rows) for row in rows], *reversed(head_rows)]



def _head_label(name: str) -> str:
    """``cls.predictions.transform.dense`` -> ``"output head transform.dense bias"``."""
    return f"output head {'.'.join(name.split('.')[-2:])} bias"
