"""Direct logit attribution and the logit lens: where in the residual stream the model's preference for an answer
over a foil comes from.

Direct logit attribution (Elhage et al. 2021) reads the stream leaving the last layer as a sum: the embeddings, what
each head adds (its output pushed through the output projection alone), each output projection's bias, each MLP's
output. With the final norm's scale frozen at the value the model computed on this prompt, the norm and the
unembedding are affine, so logit(answer) - logit(foil) splits into one number per part, and the numbers add up to
the model's own difference. That holds when the stream really is that sum and nothing but the final norm and
the unembedding sits after it. Where it is not (a post-norm model such as BERT, whose every block renormalises the
stream, and whose masked-LM head is a dense layer, GELU and LayerNorm before the unembedding), every norm's scale and
the head's activation gate are frozen in turn (:mod:`attnviz.interventions.frozen_readout`), and the parts still add
up. Each is measured on the prompt (never assumed from the family); a model where neither reading adds up (a norm
after each attention or MLP in a pre-norm block, logits softcapped or scaled after the unembedding) is refused with
the reason in words.

The logit lens (nostalgebraist 2020) reads the stream at each layer boundary as if it were the last: through the
final norm (at its own scale on that stream, not frozen) and the unembedding, or, for a masked LM whose head is more
than an unembedding (BERT's ``cls``: dense, GELU, LayerNorm, decoder), through that whole head.

Imports only torch and attnviz.interventions (and, through them, attnviz.models)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.interventions.activation_patching import residual_rows
from attnviz.interventions.anatomy import Anatomy, FrozenNorm, NotReadable, frozen_norm
from attnviz.interventions.anatomy import anatomy as find_anatomy
from attnviz.interventions.edits import on_residual
from attnviz.interventions.frozen_readout import Row, affine_readout, find_post_norm_shape, kept_names, post_norm_rows

FROZEN_NOTE = "the final norm's scale frozen at its value on this prompt"
# Part kinds, in the order they appear in an attribution
KINDS = ("embeddings", "head", "attention bias", "mlp", "norm bias", "final norm bias", "output head bias",
         "unembedding bias")


@dataclass
class Attribution:
    """logit(answer) - logit(foil) at every position split into parts: ``values [parts, n]`` (float64) sum over
    parts to ``logit_difference [n]``, the model's own. Parts in stream order: the embeddings, then for each layer
    its heads, its output projection's bias (where it has one) and its MLP, then the final norm's bias and the
    unembedding's (where they have one). ``layers``/``heads``: each part's layer and head (None where it has none)."""

    values: torch.Tensor  # [parts, n]
    labels: list[str]  # "embeddings", "L0 H1", "L0 attention bias", "L0 MLP", "final norm bias", ...
    kinds: list[str]  # one of KINDS
    layers: list[int | None]
    heads: list[int | None]
    logit_difference: torch.Tensor  # [n], the model's own logits, float64
    heads_per_layer: list[int]
    answer: int
    foil: int
    note: str  # how the final norm was treated (FROZEN_NOTE, or that the model has none)

    def head_map(self, position: int = -1) -> torch.Tensor:
        """The heads' parts at ``position`` as ``[layers, max heads]`` (NaN where a layer has fewer heads)."""
        found = torch.full((len(self.heads_per_layer), max(self.heads_per_layer)), float("nan"), dtype=torch.float64)
        for row, (kind, layer, head) in enumerate(zip(self.kinds, self.layers, self.heads, strict=True)):
            if kind == "head":
                found[layer, head] = self.values[row, position]
        return found

    def by_kind(self, position: int = -1) -> dict[str, float]:
        """The parts at ``position`` summed by kind (every head together, every MLP together, ...)."""
        totals: dict[str, float] = {}
        for row, kind in enumerate(self.kinds):
            totals[kind] = totals.get(kind, 0.0) + float(self.values[row, position])
        return totals


@dataclass
class Lens:
    """The logit lens: row l < L reads the stream entering layer l (row 0: the embeddings), row L the stream leaving
    the last layer (equal to the model's own logits). At every position (``[L + 1, n]`` each): logit(answer) -
    logit(foil), the answer's probability, its rank (1: the top token) and the top token's id."""

    difference: torch.Tensor  # [L + 1, n] float64
    probability: torch.Tensor  # [L + 1, n] float64
    rank: torch.Tensor  # [L + 1, n] long, 1 = the most likely token
    top: torch.Tensor  # [L + 1, n] long
    rows: list[str]  # "embeddings (into layer 0)", "into layer 1", ..., "out of layer L-1"
    answer: int
    foil: int
    note: str  # what each row was read through


# -- watching one forward -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _watching(model: torch.nn.Module, anatomy: Anatomy, *, pre: tuple[str, ...] = (), post: tuple[str, ...] = ()):
    """Keep, on the CPU, the residual stream at every layer boundary (``streams[l]``, ``[n, d_model]``), the input
    of the modules named in ``pre`` and the output of those in ``post`` (``inputs[name]``, ``outputs[name]``), for
    forwards run in this thread inside the block (the model may be shared with other threads: their forwards are
    not kept)."""
    thread = threading.get_ident()
    streams: dict[int, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}

    def keep_stream(layer: int, hidden: torch.Tensor) -> torch.Tensor:  # [1, n, d_model]
        streams[layer] = hidden.detach()[0].cpu()
        return hidden

    def keep_input(name):
        def hook(_, arguments):
            if threading.get_ident() == thread and arguments and isinstance(arguments[0], torch.Tensor):
                inputs[name] = arguments[0].detach()[0].cpu()
        return hook

    def keep_output(name):
        def hook(_, __, output):
            if threading.get_ident() == thread:
                output = output[0] if isinstance(output, tuple) else output
                outputs[name] = output.detach()[0].cpu()
        return hook

    handles = [model.get_submodule(name).register_forward_pre_hook(keep_input(name)) for name in pre]
    handles += [model.get_submodule(name).register_forward_hook(keep_output(name)) for name in post]
    try:
        with torch.no_grad(), on_residual(model, [layer.block for layer in anatomy.layers], keep_stream):
            yield streams, inputs, outputs
    finally:
        for handle in handles:
            handle.remove()


def _checked(model: torch.nn.Module, ids: list[int], answer: int, foil: int) -> dict:
    if not ids:
        raise ValueError("the prompt is empty")
    if answer == foil:
        raise ValueError("the answer and the foil are the same token: their logit difference is 0 everywhere")
    if model.training:
        raise ValueError("the model is in training mode (dropout changes every forward): call model.eval() first")
    parameter = next(model.parameters(), None)
    return {"input_ids": torch.tensor([ids], device=parameter.device if parameter is not None else None)}


def _in_vocabulary(logits: torch.Tensor, answer: int, foil: int) -> None:
    for what, token in (("answer", answer), ("foil", foil)):
        if not 0 <= token < logits.shape[-1]:
            raise ValueError(f"the {what} {token} is not a token of the model's vocabulary (0 to "
                             f"{logits.shape[-1] - 1})")


def _tolerance(dtype: torch.dtype) -> float:
    """How far two computations of the same number may differ in ``dtype``'s rounding (relative); never less than
    float32's, which norms compute in whatever the model's dtype (Llama's RMSNorm upcasts to float32, not to
    float64). A stream that is not the sum of its parts misses by far more (a post-norm's norm: order 1)."""
    eps = max(torch.finfo(dtype).eps if dtype.is_floating_point else 0.0, torch.finfo(torch.float32).eps)
    return min(5e-2, 1000 * eps)


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The relative gap between ``a`` and ``b`` (same shape): ``|a - b| / |b|`` in the Frobenius norm."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _identity_norm(d_model: int) -> FrozenNorm:
    return FrozenNorm(torch.ones(d_model, dtype=torch.float64), torch.zeros(d_model, dtype=torch.float64), False, 0.0)


# -- direct logit attribution -------------------------------------------------------------------------------------
def direct_logit_attribution(model: torch.nn.Module, ids: list[int], answer: int, foil: int, *,
                             anatomy: Anatomy | None = None) -> Attribution:
    """logit(answer) - logit(foil) of ``model`` on ``ids`` at every position, split into the parts of the residual
    stream (see :class:`Attribution`), with the final norm's scale frozen at its value on this prompt (the scale the
    model computed on the final residual at each position): at that scale the norm is affine, so each part's share
    is its own. A head's part is its output pushed through the output projection alone, ``proj(z with only head h)
    - proj(0)``; ``proj(0)``, the projection's bias, is a part of its own.

    A post-norm model (BERT, RoBERTa, DistilBERT, ELECTRA: every block renormalises the stream, and the masked-LM
    head is dense, activation, LayerNorm, decoder) is read with every norm's scale and the head's activation gate
    frozen, each norm's bias a part of its own (:mod:`attnviz.interventions.frozen_readout`; said in ``note``).

    Refused (:class:`NotReadable`, the reason in words) when the parts do not add up to the model's logits, as
    measured on this prompt: the stream is neither the sum of the embeddings and what each attention and MLP adds nor
    a post-norm stream (a norm after the attention or the MLP inside a pre-norm block), something nonlinear sits
    between the stream and the unembedding, or the logits are changed after the unembedding (a softcap, a scale).
    ``anatomy``: the model's parts, if already found."""
    inputs = _checked(model, ids, answer, foil)
    anatomy = anatomy or find_anatomy(model, inputs)
    if anatomy.unembedding is None:
        raise NotReadable("it has no unembedding (output embeddings), so it gives no logits to attribute")
    layers = anatomy.layers
    pre = tuple(dict.fromkeys([layer.output_projection for layer in layers] + [anatomy.unembedding]
                              + ([anatomy.final_norm] if anatomy.final_norm else [])))
    post = tuple([layer.output_projection for layer in layers] + [layer.mlp for layer in layers if layer.mlp])
    with _watching(model, anatomy, pre=pre, post=post) as (streams, kept_in, kept_out):
        logits = model(**inputs).logits[0].cpu()  # [n, vocab]
    _in_vocabulary(logits, answer, foil)
    tolerance = _tolerance(logits.dtype)
    model_difference = logits[:, answer].double() - logits[:, foil].double()  # [n]
    n, d_model = streams[0].shape

    problems = _stream_problems(anatomy, streams, kept_in, kept_out, tolerance)
    if problems:  # perhaps a post-norm model: every norm on the way is frozen in turn
        return _post_norm_attribution(model, anatomy, inputs, streams, answer, foil, problems)
    final = streams[len(layers)].double()  # [n, d_model], the stream leaving the last layer
    if anatomy.final_norm is not None:
        norm = frozen_norm(model.get_submodule(anatomy.final_norm), d_model)
        scale = norm.scale(final)  # [n, 1]: the norm's own scale on the final residual, then frozen
        note = FROZEN_NOTE
    else:
        norm, scale = _identity_norm(d_model), torch.ones(n, 1, dtype=torch.float64)
        note = "the model has no final norm: the stream leaving the last layer goes straight to the unembedding"
    unembedding = model.get_submodule(anatomy.unembedding)
    fed = kept_in[anatomy.unembedding].double()  # [n, d_model]: what the unembedding was given
    normed = norm.linear_part(final, scale) + norm.bias  # [n, d_model]
    if _gap(normed, fed) > tolerance:
        problems.append("something sits between the last layer and the unembedding"
                        + (" besides the final norm" if anatomy.final_norm else "")
                        + f" (relative gap {_gap(normed, fed):.2g}): a nonlinear transform, such as BERT's masked-LM "
                        "head (dense layer, GELU, LayerNorm), does not split into the parts' shares")
    direction = torch.zeros(logits.shape[-1], dtype=torch.float64)
    direction[answer], direction[foil] = 1.0, -1.0
    readout, unembedding_bias = affine_readout(unembedding, d_model, direction)
    unembedding_bias = float(unembedding_bias)  # [d_model]: W_U[a] - W_U[f]
    from_fed = fed @ readout + unembedding_bias  # [n]
    scale_of_logits = 1.0 + logits.double().abs().amax(-1)  # [n]
    if bool(((from_fed - model_difference).abs() > tolerance * scale_of_logits).any()):
        problems.append("its logits are not its unembedding's output (they differ by up to "
                        f"{float((from_fed - model_difference).abs().max()):.3g}): a softcap or a scale applied after "
                        "the unembedding is not linear in the stream, or not the unembedding the parts are read by")
    if problems:
        raise NotReadable("its logits do not split into the parts of its residual stream: " + "; ".join(problems))

    # the linear functional x -> linear_part(x, 1) · readout, as a vector: the stream direction each part is read in
    probe = torch.zeros(d_model, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        (stream_readout,) = torch.autograd.grad(norm.linear_part(probe, torch.ones(1, dtype=torch.float64))
                                                @ readout, probe)  # [d_model]

    def read(part: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n]
        return part.double() @ stream_readout / scale[:, 0]

    rows = [Row("embeddings", "embeddings", None, None, read(streams[0]))]
    for index, layer in enumerate(layers):
        projection = model.get_submodule(layer.output_projection)
        merged = kept_in[layer.output_projection].double()  # [n, heads * d_v]
        heads = layer.attention.heads
        z = merged.view(n, heads, -1)  # [n, heads, d_v]
        back, bias = affine_readout(projection, merged.shape[-1], stream_readout)  # [heads * d_v]
        bias = float(bias)
        per_head = torch.einsum("nhd,hd->hn", z, back.view(heads, -1)) / scale[:, 0]  # [heads, n]
        rows += [Row(f"L{index} H{head}", "head", index, head, per_head[head]) for head in range(heads)]
        if bias != 0.0:
            rows.append(Row(f"L{index} attention bias", "attention bias", index, None,
                            torch.full((n,), bias, dtype=torch.float64) / scale[:, 0]))
        # the heads and the bias together against the projection's own output: the projection is affine
        whole = read(kept_out[layer.output_projection])
        if bool(((per_head.sum(0) + bias / scale[:, 0] - whole).abs() > tolerance * scale_of_logits).any()):
            raise NotReadable(f"the output projection of layer {index} does not act as a linear layer on the heads' "
                              "outputs, so its heads' shares cannot be told apart")
        rows.append(Row(f"L{index} MLP", "mlp", index, None, read(kept_out[layer.mlp])))
    for label, value in (("final norm bias", float(norm.bias @ readout)), ("unembedding bias", unembedding_bias)):
        if value != 0.0:
            rows.append(Row(label, label, None, None, torch.full((n,), value, dtype=torch.float64)))
    return _assembled(rows, model_difference, logits, anatomy, answer, foil, note)


def _post_norm_attribution(model: torch.nn.Module, anatomy: Anatomy, inputs: dict, streams: dict[int, torch.Tensor],
                           answer: int, foil: int, problems: list[str]) -> Attribution:
    """:func:`direct_logit_attribution` for a model whose stream is not a plain sum (``problems`` say why): read as a
    post-norm model (:mod:`attnviz.interventions.frozen_readout`), or refused with both reasons."""
    try:
        shape = find_post_norm_shape(model, anatomy, inputs, streams)
    except NotReadable as reason:
        raise NotReadable("its logits do not split into the parts of its residual stream: " + "; ".join(problems)
                          + f"; nor does it read as a post-norm model ({reason})") from None
    names = kept_names(shape)
    projections = [layer.output_projection for layer in anatomy.layers]
    pre = tuple(dict.fromkeys([*projections, *names, anatomy.unembedding]))
    post = tuple(dict.fromkeys([*projections, *[layer.mlp for layer in anatomy.layers], *names]))
    with _watching(model, anatomy, pre=pre, post=post) as (streams, kept_in, kept_out):
        logits = model(**inputs).logits[0].cpu()  # [n, vocab]
    _in_vocabulary(logits, answer, foil)
    model_difference = logits[:, answer].double() - logits[:, foil].double()  # [n]
    direction = torch.zeros(logits.shape[-1], dtype=torch.float64)
    direction[answer], direction[foil] = 1.0, -1.0
    fed = kept_in[anatomy.unembedding].double()  # [n, width]
    readout, unembedding_bias = affine_readout(model.get_submodule(anatomy.unembedding), fed.shape[-1], direction)
    rows = post_norm_rows(model, anatomy, shape, streams, kept_in, kept_out, readout.expand_as(fed))
    if float(unembedding_bias) != 0.0:
        rows.append(Row("unembedding bias", "unembedding bias", None, None,
                        torch.full_like(model_difference, float(unembedding_bias))))
    activation = shape.activation
    note = ("every norm's scale (each block's two" + (", the output head's" if any(
        step.kind == "norm" for step in shape.head) else "") + ")" + (
        f" and the output head's {activation} (each unit's output over its input)" if activation else "")
        + " frozen at their values on this prompt")
    return _assembled(rows, model_difference, logits, anatomy, answer, foil, note)


def _assembled(rows: list[Row], model_difference: torch.Tensor, logits: torch.Tensor, anatomy: Anatomy, answer: int,
               foil: int, note: str) -> Attribution:
    """The rows as an :class:`Attribution`, once their sum is checked against the model's own difference."""
    values = torch.stack([row.values.double() for row in rows])  # [parts, n]
    gap = (values.sum(0) - model_difference).abs()
    if not bool((gap <= _tolerance(logits.dtype) * (1.0 + logits.double().abs().amax(-1))).all()):
        raise NotReadable(f"its parts do not sum to its logit difference (off by up to {float(gap.max()):.3g}), "
                          "although each step was checked: the attribution would not add up, so none is given")
    return Attribution(values, [row.label for row in rows], [row.kind for row in rows], [row.layer for row in rows],
                       [row.head for row in rows], model_difference, anatomy.heads, answer, foil, note)


def _stream_problems(anatomy: Anatomy, streams: dict[int, torch.Tensor], kept_in: dict[str, torch.Tensor],
                     kept_out: dict[str, torch.Tensor], tolerance: float) -> list[str]:
    """What keeps the stream from being the sum of its parts, in words (empty: it is the sum, layer by layer)."""
    missing = [index for index, layer in enumerate(anatomy.layers) if layer.mlp is None]
    if missing:
        return [f"no MLP was found in layer {missing[0]} (its name is none of those attnviz knows), so what it adds "
                "to the stream is not accounted for"]
    for index, layer in enumerate(anatomy.layers):
        added = streams[index].double() + kept_out[layer.output_projection].double() + kept_out[layer.mlp].double()
        gap = _gap(added, streams[index + 1])
        if gap > tolerance:
            return [f"its residual stream is not the sum of its parts: leaving layer {index} it is not what entered "
                    f"plus what the attention and the MLP added (relative gap {gap:.2g}), as in a post-norm model "
                    "such as BERT, whose every block normalises (rescales) the stream, or a model with a norm after "
                    "its attention or MLP"]
    last = streams[len(anatomy.layers)]
    given = kept_in[anatomy.final_norm] if anatomy.final_norm else None
    if given is not None and _gap(given, last) > tolerance:
        return ["the final norm is not given the stream leaving the last layer (something sits between them)"]
    return []


# -- the logit lens -----------------------------------------------------------------------------------------------
def _lens_head(model: torch.nn.Module, anatomy: Anatomy) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """How each row of the lens is read: the final norm (if any) and then the unembedding; or, when the unembedding
    sits inside a larger head of the model (BERT's ``cls``: dense, GELU, LayerNorm, decoder), that whole head."""
    if anatomy.unembedding is None:
        raise NotReadable("it has no unembedding (output embeddings), so its stream cannot be read as logits")
    owner = anatomy.unembedding.split(".")[0]  # the model's child that holds the unembedding
    head = model.get_submodule(owner)
    norm = model.get_submodule(anatomy.final_norm) if anatomy.final_norm else None
    device = next(head.parameters()).device

    def apply(stream: torch.Tensor) -> torch.Tensor:  # [n, d_model] -> [n, vocab]
        stream = stream[None].to(device)  # [1, n, d_model]
        return head(stream if norm is None else norm(stream))[0].cpu()

    if owner != anatomy.unembedding:
        words = f"each layer's output through the model's whole output head ({owner}: every step before the logits)"
    elif norm is not None:
        words = "each layer's stream through the final norm (at its own scale on that stream) and the unembedding"
    else:
        words = "each layer's stream through the unembedding (the model has no final norm)"
    return apply, words


def logit_lens(model: torch.nn.Module, ids: list[int], answer: int, foil: int, *,
               anatomy: Anatomy | None = None) -> Lens:
    """The logit lens on ``ids``: the residual stream at each layer boundary read as the model reads the last one
    (see :class:`Lens`). The row leaving the last layer is checked against the model's own logits
    (:class:`NotReadable` where it differs: logits changed after the unembedding, or a step the lens leaves out)."""
    inputs = _checked(model, ids, answer, foil)
    anatomy = anatomy or find_anatomy(model, inputs)
    apply, words = _lens_head(model, anatomy)
    with _watching(model, anatomy) as (streams, _, _):
        logits = model(**inputs).logits[0].cpu()  # [n, vocab]
    _in_vocabulary(logits, answer, foil)
    difference, probability, rank, top = [], [], [], []
    with torch.no_grad():
        for layer in range(len(anatomy.layers) + 1):  # one row of logits at a time: [n, vocab] each
            row = apply(streams[layer])
            if layer == len(anatomy.layers):
                gap = (row.double() - logits.double()).abs().amax()
                if float(gap) > _tolerance(logits.dtype) * (1.0 + float(logits.double().abs().max())):
                    raise NotReadable(
                        f"read this way ({words}), the last layer's output does not give the model's own logits "
                        f"(off by up to {float(gap):.3g}): something after the unembedding (a softcap or a scale) "
                        "or before it is left out, so the earlier rows would not mean what they say")
            row = row.double()
            difference.append(row[:, answer] - row[:, foil])
            probability.append(torch.softmax(row, -1)[:, answer])
            rank.append(1 + (row > row[:, answer : answer + 1]).sum(-1))
            top.append(row.argmax(-1))
    return Lens(torch.stack(difference), torch.stack(probability), torch.stack(rank), torch.stack(top),
                residual_rows(len(anatomy.layers)), answer, foil, words)


# -- words --------------------------------------------------------------------------------------------------------
def _number(value: float) -> str:
    return f"{value:+.3g}"


def _share(value: float, total: float) -> str:
    return f"{100 * value / total:.0f}%"


def attribution_words(attribution: Attribution, *, position: int = -1, answer_text: str | None = None,
                      foil_text: str | None = None, top: int = 3) -> list[str]:
    """Sentences about the parts at ``position`` (default the last), every one computed from the values: the
    difference they add up to, the parts pushing most toward the answer and toward the foil (with their share of
    the difference, where the difference is not so small that shares of it mean nothing), and the share of the
    heads, the MLPs and the embeddings."""
    answer = repr(answer_text) if answer_text is not None else f"token {attribution.answer}"
    foil = repr(foil_text) if foil_text is not None else f"token {attribution.foil}"
    values = attribution.values[:, position]  # [parts]
    total = float(values.sum())
    where = position if position >= 0 else attribution.values.shape[1] + position
    magnitude = float(values.abs().sum())
    meaningful = abs(total) >= max(0.05, 0.05 * magnitude)
    prefers = "prefers" if total > 0 else "does not prefer"
    sentences = [f"At position {where} the model {prefers} {answer} to {foil}: logit difference {total:.3g}, the "
                 f"sum of {len(values)} parts ({attribution.note})."]
    order = values.argsort(descending=True).tolist()

    def listed(rows: list[int]) -> str:
        return ", ".join(f"{attribution.labels[row]} ({_number(float(values[row]))}"
                         + (f", {_share(float(values[row]), total)} of the difference)" if meaningful else ")")
                         for row in rows)

    toward_answer = [row for row in order if values[row] > 0][:top]
    toward_foil = [row for row in reversed(order) if values[row] < 0][:top]
    sentences.append(f"Pushing most toward {answer}: {listed(toward_answer)}." if toward_answer
                     else f"No part pushes toward {answer}.")
    sentences.append(f"Pushing most toward {foil}: {listed(toward_foil)}." if toward_foil
                     else f"No part pushes toward {foil}.")
    if meaningful:
        kinds = attribution.by_kind(position)
        named = {"head": "the heads together", "mlp": "the MLPs", "embeddings": "the embeddings"}
        parts = [f"{words} {_number(kinds[kind])} ({_share(kinds[kind], total)})" for kind, words in named.items()
                 if kind in kinds]
        biases = sum(value for kind, value in kinds.items() if kind not in named)
        if any(kind not in named for kind in kinds):
            parts.append(f"the biases {_number(biases)} ({_share(biases, total)})")
        sentences.append("Of the difference: " + ", ".join(parts) + ".")
    else:
        sentences.append(f"The difference is small beside its parts (they add up to {magnitude:.3g} in size), so "
                         "they mostly cancel and shares of it are not given.")
    return sentences


def lens_words(lens: Lens, *, position: int = -1, answer_text: str | None = None, foil_text: str | None = None,
               token_text: Callable[[int], str] | None = None) -> list[str]:
    """Sentences about the lens at ``position`` (default the last), computed from it: the first row at which the
    answer is the top token (or that it never is, and what is instead), whether it stays top, and where the logit
    difference over the foil moves most."""
    answer = repr(answer_text) if answer_text is not None else f"token {lens.answer}"
    foil = repr(foil_text) if foil_text is not None else f"token {lens.foil}"
    name = (lambda token: repr(token_text(token))) if token_text is not None else (lambda token: f"token {token}")
    where = position if position >= 0 else lens.difference.shape[1] + position
    tops = lens.top[:, position].tolist()
    first = next((row for row, token in enumerate(tops) if token == lens.answer), None)
    if first is None:
        sentences = [f"At position {where} {answer} is never the top token: {lens.rows[-1]} the top token is "
                     f"{name(tops[-1])} and {answer} ranks {int(lens.rank[-1, position])} "
                     f"(probability {float(lens.probability[-1, position]):.3g})."]
    else:
        stays = all(token == lens.answer for token in tops[first:])
        top_rows = sum(token == lens.answer for token in tops)
        sentences = [f"At position {where} {answer} is first the top token {lens.rows[first]} "
                     f"(probability {float(lens.probability[first, position]):.3g})"
                     + (", and stays the top token from there on." if stays else
                        f", but does not stay on top (top in {top_rows} of {len(tops)} rows; {lens.rows[-1]} the top "
                        f"token is {name(tops[-1])}).")]
    difference = lens.difference[:, position]  # [L + 1]
    sentences.append(f"The logit difference over {foil} goes from {float(difference[0]):.3g} "
                     f"({lens.rows[0]}) to {float(difference[-1]):.3g} ({lens.rows[-1]}).")
    if len(difference) > 1:
        steps = difference[1:] - difference[:-1]  # [L]: what each layer changed
        layer = int(steps.abs().argmax())
        sentences.append(f"Layer {layer} moves it most ({_number(float(steps[layer]))}"
                         + (f", toward {answer})." if steps[layer] > 0 else f", toward {foil})."))
    return sentences
