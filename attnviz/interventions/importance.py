"""Does a head matter? The importance maps of the "Does this head matter?" page: the loss change when each head is
ablated (zeroed, or replaced by its mean), gradient importance (Michel et al., 2019), and the tokens a head's
ablation hurts most. How far the maps agree, rank by rank, is :mod:`attnviz.interventions.importance_ranks`;
activation patching :mod:`attnviz.interventions.patching`; the induction circuit
:mod:`attnviz.interventions.induction_circuit`.

Every intervention goes through :mod:`attnviz.interventions.edits`. The objective is the model's own loss where
it has a language-model head (next-token loss of a decoder; the sequence-to-sequence loss of an encoder-decoder,
the text as its own target); an encoder without a head has no loss, so its effect is the change of its final
hidden states (relative distance), and it is said so.

Texts are batched: one forward per head over all of them, in pieces of at most ``MAX_ROWS`` rows (a masked-LM
text is read in ``MASK_EVERY`` copies, so 64 texts are 448 rows). Every number a text gets depends on that text
alone, never on the texts batched with it: a map over chunks of texts gives each text what one batch gives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnviz.core.tokens_display import readable_tokens, tokenizer_style
from attnviz.interventions.edits import AttentionModule, Plan, attention_modules, edited, gated, head_means, zeroed

OBJECTIVES = {
    "next-token": "next-token loss (nats: each text's mean over its predicted tokens, then the mean over the texts)",
    "seq2seq": "sequence-to-sequence loss, the text as its own target (nats: each text's mean over its tokens, then "
               "the mean over the texts)",
    "masked": "masked-LM loss: each ordinary token masked once, in one of 7 copies of its text, and predicted by the "
              "model's masked-LM head (nats: each text's mean over its tokens, then the mean over the texts)",
    "hidden": "change of the final hidden states (each token's distance from its unedited state over the mean size of "
              "its text's unedited states, averaged over the text, then over the texts); the model has no loss",
}
ABLATIONS = {"zero": "zero its output", "mean": "replace its output by its mean over the texts"}
MAX_TEXTS = 64
MAX_TOKENS = 256  # per text: a map is (layers x heads + 1) forwards of every text
MASK_EVERY = 7  # the masked-LM objective masks one token in 7 (15%, as BERT was trained) in each copy of a text
MAX_ROWS = MAX_TEXTS  # rows (texts, or copies of texts) in one forward: a batch of more is run in pieces


def objective_of(model: torch.nn.Module) -> str:
    """Which objective ``model`` has: "seq2seq" (an encoder-decoder with its LM head), "next-token" (a decoder with
    its LM head), "masked" (an encoder with its masked-LM head), or "hidden" (no head that gives a loss)."""
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = None
    if head is None:
        return "hidden"
    if getattr(model.config, "is_encoder_decoder", False):
        return "seq2seq"
    name = type(model).__name__
    if name.endswith("ForMaskedLM"):
        return "masked"
    return "hidden" if name.endswith("ForPreTraining") else "next-token"


@dataclass
class Batch:
    """Texts tokenized and padded on the right: ``inputs`` for the model, ``real`` ``[rows, n]`` True at each
    row's tokens, ``tokens`` the token strings of each text (without padding). A row is a text, or, under the
    masked-LM objective, one of ``copies`` copies of it, each with other tokens masked: row ``c * texts + t`` is
    copy ``c`` of text ``t``."""

    inputs: dict
    real: torch.Tensor
    tokens: list[list[str]]
    texts: list[str]
    cut: list[bool]  # whether each text was longer than it reads
    copies: int = 1


def batch_of(tokenizer, texts: list[str], objective: str, max_tokens: int = MAX_TOKENS) -> Batch:
    """``texts`` (each non-empty) as one right-padded batch, each cut at ``max_tokens`` tokens."""
    texts = [text for text in texts if text and text.strip()]
    if not texts:
        raise ValueError("no text to read: type a sentence (one per line for several)")
    if len(texts) > MAX_TEXTS:
        raise ValueError(f"{len(texts)} texts: at most {MAX_TEXTS} at once (a map runs every head on every text)")
    encoded = [tokenizer(text, truncation=True, max_length=max_tokens + 1) for text in texts]
    cut = [len(one["input_ids"]) > max_tokens for one in encoded]
    n = min(max_tokens, max(len(one["input_ids"]) for one in encoded))
    # input ids only: one segment's token types are zeros, a BERT's default, and a decoder given a BERT tokenizer
    # would embed them (GPT-2 adds token-type embeddings when they are passed)
    names = ["input_ids"]
    inputs = {name: torch.zeros(len(texts), n, dtype=torch.long) for name in names}
    real = torch.zeros(len(texts), n, dtype=torch.bool)
    tokens, style = [], tokenizer_style(tokenizer)
    for row, one in enumerate(encoded):
        ids = one["input_ids"][:n]
        for name in names:
            inputs[name][row, : len(ids)] = torch.tensor(one[name][:n])
        real[row, : len(ids)] = True
        tokens.append(readable_tokens(tokenizer.convert_ids_to_tokens(ids), style))
    inputs["attention_mask"] = real.long()
    if objective == "seq2seq":  # the text is its own target: the decoder reads it shifted, the loss predicts it
        labels = inputs["input_ids"].masked_fill(~real, -100)
        inputs["labels"] = labels
    if objective == "masked":
        return _masked(tokenizer, Batch(inputs, real, tokens, texts, cut))
    return Batch(inputs, real, tokens, texts, cut)


def _masked(tokenizer, batch: Batch) -> Batch:
    """The batch for the masked-LM objective: each text in ``MASK_EVERY`` copies, copy ``c`` with the ``c``-th of
    every ``MASK_EVERY`` ordinary tokens (not CLS, SEP or padding) replaced by the mask token, and labels there:
    every ordinary token is predicted once. The copies are as many whatever the batch holds (a text's loss never
    depends on the texts read with it); the forwards take them ``MAX_ROWS`` rows at a time. Deterministic: the
    same texts give the same masks."""
    ids = batch.inputs["input_ids"]
    copies = MASK_EVERY
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    ordinary = batch.real & ~torch.isin(ids, special)  # [texts, n]
    place = ordinary.long().cumsum(-1) - 1  # each ordinary token's place among its text's ordinary tokens
    rows_ids, rows_labels = [], []
    for copy in range(copies):
        masked = ordinary & (place % MASK_EVERY == copy)
        rows_ids.append(ids.masked_fill(masked, tokenizer.mask_token_id))
        rows_labels.append(ids.masked_fill(~masked, -100))
    inputs = {"input_ids": torch.cat(rows_ids), "attention_mask": batch.real.long().repeat(copies, 1),
              "labels": torch.cat(rows_labels)}
    return Batch(inputs, batch.real.repeat(copies, 1), batch.tokens, batch.texts, batch.cut, copies)


def token_losses(model: torch.nn.Module, batch: Batch, outputs, objective: str,
                 clean_hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses ``[texts, targets]`` and which of them count ``[texts, targets]`` (bool).

    next-token: the loss of token t+1 read at t; seq2seq: the loss of each label; hidden: the distance of each
    token's final hidden state from ``clean_hidden``'s, over the mean norm of the clean states of its own text (its
    row's real tokens: a text's numbers never depend on the texts batched with it; 0 for the clean run)."""
    if objective == "next-token":
        logits = _wide(outputs.logits[:, :-1])  # [texts, n - 1, vocab]
        targets = batch.inputs["input_ids"][:, 1:]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return losses, batch.real[:, 1:]
    if objective in ("seq2seq", "masked"):
        logits = _wide(outputs.logits)
        labels = batch.inputs["labels"]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
        return losses, labels >= 0
    hidden = _wide(_final_hidden(outputs))  # [texts, n, d_model]
    if clean_hidden is None:
        clean_hidden = hidden
    norms = clean_hidden.norm(dim=-1)  # [texts, n]
    weights = batch.real.to(norms.dtype)
    size = ((norms * weights).sum(-1) / weights.sum(-1).clamp(min=1)).clamp(min=1e-12)  # [texts]: each text's own
    return (hidden - clean_hidden).norm(dim=-1) / size[:, None], batch.real


def _by_text(rows: torch.Tensor, copies: int) -> torch.Tensor:
    """``[copies * texts, n]`` (row ``c * texts + t``) -> ``[texts, copies * n]``: each text's copies side by side."""
    if copies == 1:
        return rows
    texts = rows.shape[0] // copies
    return rows.view(copies, texts, -1).transpose(0, 1).reshape(texts, -1)


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """Losses in float32 at least (a half-precision model's logits are widened; float64 stays)."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def _final_hidden(outputs) -> torch.Tensor:
    hidden = getattr(outputs, "last_hidden_state", None)
    return outputs[0] if hidden is None else hidden


def pieces(batch: Batch) -> list[slice]:
    """The batch's rows, at most ``MAX_ROWS`` at a time: what one forward reads."""
    rows = batch.real.shape[0]
    return [slice(start, min(start + MAX_ROWS, rows)) for start in range(0, rows, MAX_ROWS)]


def _part(batch: Batch, rows: slice) -> Batch:
    """The batch's ``rows`` for one forward: its row tensors cut (texts and tokens kept, for naming)."""
    total = batch.real.shape[0]
    inputs = {name: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == total
              else value for name, value in batch.inputs.items()}
    return Batch(inputs, batch.real[rows], batch.tokens, batch.texts, batch.cut, batch.copies)


def counted_targets(batch: Batch, objective: str) -> torch.Tensor:
    """Which per-token losses count, ``[rows, targets]`` (as :func:`token_losses` returns them), without a forward."""
    if objective == "next-token":
        return batch.real[:, 1:]
    if objective in ("seq2seq", "masked"):
        return batch.inputs["labels"] >= 0
    return batch.real


def run_losses(model: torch.nn.Module, batch: Batch, objective: str, clean_hidden: torch.Tensor | None = None,
               plan: Plan | None = None) -> torch.Tensor:
    """The per-token losses ``[rows, targets]`` of the batch run with ``plan``'s edits (:func:`token_losses`), a
    piece of at most ``MAX_ROWS`` rows at a time."""
    found = []
    with torch.no_grad():
        for rows in pieces(batch):
            part = _part(batch, rows)
            with edited(model, plan or {}):
                outputs = model(**part.inputs)
            losses, _ = token_losses(model, part, outputs, objective,
                                     None if clean_hidden is None else clean_hidden[rows])
            found.append(losses)
    return torch.cat(found)


def _combined(sums: dict[str, torch.Tensor], tokens: int, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: (total / max(tokens, 1)).to(like[name].dtype) for name, total in sums.items()}


def _add_weighted(sums: dict[str, torch.Tensor], means: dict[str, torch.Tensor], count: int) -> None:
    """A piece's means, each weighted by its ``count`` tokens, added into ``sums`` (float64)."""
    for name, mean in means.items():
        sums[name] = sums.get(name, 0) + mean.double() * count


def head_means_of(model: torch.nn.Module, batch: Batch) -> tuple[dict[str, torch.Tensor], int]:
    """Every module's head outputs averaged over every real token of the batch's rows (a masked-LM text's copies
    included), ``[heads, d_v]`` by module name, a piece at a time, and how many tokens that is."""
    sums: dict[str, torch.Tensor] = {}
    tokens, last = 0, {}
    for rows in pieces(batch):
        part = _part(batch, rows)
        means, _ = head_means(model, part.inputs, part.real)
        count = int(part.real.sum())
        _add_weighted(sums, means, count)
        tokens, last = tokens + count, means
    return (last if len(pieces(batch)) == 1 else _combined(sums, tokens, last)), tokens


def text_losses(losses: torch.Tensor, counted: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """The mean counted loss of each text over its ``copies`` rows (:class:`Batch`): ``[texts]`` (NaN for a text with
    nothing counted, e.g. one token under next-token loss: it has no target, and is left out of the means over
    texts)."""
    losses, counted = _by_text(losses, copies), _by_text(counted, copies)
    weights = counted.to(losses.dtype)
    total = weights.sum(-1)
    return torch.where(total > 0, (losses * weights).sum(-1) / total.clamp(min=1), float("nan"))


@dataclass
class ImportanceMap:
    """The effect of each head, ``values [modules, heads]`` (NaN where a module has fewer heads), by ``method``
    ("zero", "mean": ablations; "gradient")."""

    method: str
    values: torch.Tensor
    modules: list[AttentionModule]
    objective: str
    clean: float  # the clean run's objective (0 for "hidden")
    per_text: torch.Tensor | None = None  # [modules, heads, texts]
    clean_per_text: torch.Tensor | None = None  # [texts]: each text's objective without edits (NaN: no target)

    @property
    def labels(self) -> list[str]:
        return [module.label for module in self.modules]


@dataclass
class Study:
    """What the page computed for one set of texts: the maps by method and what they were computed on."""

    batch: Batch
    objective: str
    modules: list[AttentionModule]
    maps: dict[str, ImportanceMap] = field(default_factory=dict)


def clean_run(model, batch: Batch, objective: str):
    """The unedited forwards (a piece of the batch at a time): every module's head outputs averaged over the texts'
    real tokens (what mean ablation puts in; over every real query position: a seq2seq decoder reads the text
    shifted, the same mask), the final hidden states ("hidden" only), the per-token losses and which count."""
    sums: dict[str, torch.Tensor] = {}
    tokens, found = 0, {"means": [], "hidden": [], "losses": [], "counted": []}
    for rows in pieces(batch):
        part = _part(batch, rows)
        means, outputs = head_means(model, part.inputs, part.real)
        count = int(part.real.sum())
        _add_weighted(sums, means, count)
        tokens += count
        hidden = _wide(_final_hidden(outputs)) if objective == "hidden" else None
        losses, counted = token_losses(model, part, outputs, objective, hidden)
        for what, value in (("means", means), ("hidden", hidden), ("losses", losses), ("counted", counted)):
            found[what].append(value)
    means = found["means"][0] if len(found["means"]) == 1 else _combined(sums, tokens, found["means"][0])
    hidden = torch.cat(found["hidden"]) if objective == "hidden" else None
    return means, hidden, torch.cat(found["losses"]), torch.cat(found["counted"])


def empty_map(modules: list[AttentionModule], *rest: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((len(modules), max(module.heads for module in modules), *rest), float("nan"), dtype=dtype)


def ablation_map(model: torch.nn.Module, batch: Batch, how: str = "zero", *, objective: str | None = None,
                 modules: list[AttentionModule] | None = None,
                 progress: Callable[[float, str], None] | None = None,
                 finished: dict[tuple[int, int], torch.Tensor] | None = None,
                 means: dict[str, torch.Tensor] | None = None) -> ImportanceMap:
    """The mean over texts of the objective's change when each head alone is ablated (``how``: "zero" or "mean",
    its mean output over every real token of the texts). One forward of the batch per head, plus one clean.

    ``finished``: each head's per-text changes as they are measured, by (module row, head), written as it goes
    and read first: a map stopped part way (its progress callback raising, e.g. the page being rerun) goes on
    where it stopped when called again with the same dict, and gives the same map. ``means``: what mean ablation
    puts in, by module (``[heads, d_v]``; default: the means over these texts), e.g. over a whole corpus."""
    if how not in ABLATIONS:
        raise ValueError(f"unknown ablation {how!r}: one of {', '.join(ABLATIONS)}")
    objective = objective or objective_of(model)
    modules = modules or attention_modules(model, batch.inputs)
    finished = {} if finished is None else finished
    means_by_module, clean_hidden, clean_losses, counted = clean_run(model, batch, objective)
    means_by_module = means if means is not None else means_by_module
    clean = text_losses(clean_losses, counted, batch.copies)
    per_text = empty_map(modules, len(batch.texts), dtype=clean.dtype)
    total = sum(module.heads for module in modules)
    with torch.no_grad():
        for row, module in enumerate(modules):
            means = means_by_module[module.name] if how == "mean" else None  # [heads, d_v]
            for head in range(module.heads):
                if (row, head) not in finished:
                    plan: Plan = zeroed(module.name, head) if means is None else {module.name: {head: means[head]}}
                    losses = run_losses(model, batch, objective, clean_hidden, plan)
                    finished[(row, head)] = text_losses(losses, counted, batch.copies) - clean
                    if progress is not None:
                        progress(len(finished) / total, f"{module.label}, head {head}")
                per_text[row, head] = finished[(row, head)]
    if clean.isnan().all():
        raise ValueError("no text has a token to predict: type texts of at least two tokens")
    return ImportanceMap(how, per_text.nanmean(-1), modules, objective,
                         0.0 if objective == "hidden" else float(clean.nanmean()), per_text,
                         torch.zeros_like(clean) if objective == "hidden" else clean)


def gradient_importance(model: torch.nn.Module, batch: Batch, *, objective: str | None = None,
                        modules: list[AttentionModule] | None = None) -> ImportanceMap:
    """Michel et al.'s (2019) importance: |dL/dg| of a gate g (= 1) on each head's output, per text, averaged over
    the texts. One forward and one backward. Needs a loss: refused for the "hidden" objective."""
    objective = objective or objective_of(model)
    if objective == "hidden":
        raise ValueError("gradient importance needs a loss, and this model has no head that gives one (its hidden "
                         "states' change has a zero gradient at the clean run)")
    modules = modules or attention_modules(model, batch.inputs)
    texts, rows = len(batch.texts), batch.real.shape[0]
    counted = counted_targets(batch, objective)
    total = _by_text(counted, batch.copies).sum(-1)  # [texts]: each text's counted tokens, over its copies
    measured = total > 0  # a text with no target has no loss and no gradient
    if not measured.any():
        raise ValueError("no text has a token to predict: type texts of at least two tokens")
    wide = torch.float64 if any(p.dtype == torch.float64 for p in model.parameters()) else torch.float32
    slopes = {module.name: torch.zeros(rows, module.heads, dtype=wide) for module in modules}
    for piece in pieces(batch):
        part = _part(batch, piece)
        # one gate per row; a text's gate is the same gate in each of its copies, so its slope is the sum of theirs
        gates = {module.name: torch.ones(part.real.shape[0], module.heads, dtype=wide, requires_grad=True)
                 for module in modules}
        with torch.enable_grad(), gated(model, gates):
            outputs = model(**part.inputs)
            losses, kept = token_losses(model, part, outputs, objective)
            # each row's share of its text's loss (the text's mean over every counted token of its copies): the sum
            # over rows is the sum of the texts' losses, and each row's gates get their own text's gradient
            text = torch.arange(piece.start, piece.stop) % texts
            weight = kept.to(losses.dtype) / total[text].clamp(min=1).to(losses.dtype)[:, None]
            weight = weight * measured[text].to(losses.dtype)[:, None]
            summed = (torch.where(kept, losses, torch.zeros_like(losses)) * weight).sum()
            # autograd.grad leaves the parameters' .grad alone (the model is shared by every session)
            found = torch.autograd.grad(summed, [gates[m.name] for m in modules])
        for module, slope in zip(modules, found, strict=True):
            slopes[module.name][piece] = slope.to(wide)
    per_text = empty_map(modules, texts, dtype=wide)
    for row, module in enumerate(modules):
        slope = slopes[module.name].view(batch.copies, texts, module.heads).sum(0)  # [texts, heads]: copies share
        per_text[row, : module.heads] = slope.abs().T  # [heads, texts]
    per_text[..., ~measured] = float("nan")
    return ImportanceMap("gradient", per_text.nanmean(-1), modules, objective, float("nan"), per_text)


def study(model: torch.nn.Module, tokenizer, texts: list[str], *, max_tokens: int = MAX_TOKENS,
          progress: Callable[[float, str], None] | None = None,
          finished: dict[str, dict] | None = None) -> Study:
    """Every map of the page for ``texts``: zero ablation, mean ablation, and gradient importance where the model
    has a loss. ``finished``: what a stopped run measured, by ablation (see :func:`ablation_map`), to go on from."""
    finished = {} if finished is None else finished
    objective = objective_of(model)
    batch = batch_of(tokenizer, texts, objective, max_tokens)
    modules = attention_modules(model, batch.inputs)
    result = Study(batch, objective, modules)
    for part, how in enumerate(ABLATIONS):
        def step(share: float, what: str, part=part, how=how) -> None:
            if progress is not None:
                progress((part + share) / len(ABLATIONS), f"{ABLATIONS[how]}: {what}")

        result.maps[how] = ablation_map(model, batch, how, objective=objective, modules=modules, progress=step,
                                        finished=finished.setdefault(how, {}))
    if objective != "hidden":
        result.maps["gradient"] = gradient_importance(model, batch, objective=objective, modules=modules)
    return result


def token_effect(model: torch.nn.Module, batch: Batch, module: AttentionModule, head: int, how: str = "zero",
                 text: int = 0, *, objective: str | None = None, clean: tuple | None = None
                 ) -> tuple[list[str], torch.Tensor]:
    """For one head: how each target token's loss of text ``text`` moves when the head is ablated (positive:
    the head helped predict it). Returns the target tokens and ``[targets]`` changes (next-token: the token
    predicted at each position, so the text's tokens from the second on; masked: each token masked in one of the
    text's copies, in text order). ``clean``: :func:`clean_run` of the batch, when the caller keeps it (a page
    showing one head after another); only the text's own rows are run with the head ablated."""
    objective = objective or objective_of(model)
    means_by_module, clean_hidden, clean_losses, counted = clean if clean is not None else clean_run(model, batch,
                                                                                                      objective)
    rows = list(range(text, len(batch.texts) * batch.copies, len(batch.texts)))  # this text's rows (its copies)
    one = _rows_of(batch, rows)  # only this text is run again: the means of mean ablation are the whole batch's
    with torch.no_grad():
        plan = zeroed(module.name, head)
        if how == "mean":
            plan = {module.name: {head: means_by_module[module.name][head]}}
        with edited(model, plan):
            losses, _ = token_losses(model, one, model(**one.inputs), objective,
                                     None if clean_hidden is None else clean_hidden[rows])
    tokens = batch.tokens[text]
    if batch.copies > 1 or objective == "masked":
        # [copies, n] rows of this text; each token is masked (counted) in at most one of them
        kept = counted[rows]
        change = ((losses - clean_losses[rows]) * kept).sum(0)
        where = kept.any(0).nonzero().flatten().tolist()
        return [tokens[position] for position in where], change[where]
    keep = counted[text]
    change = (losses[0] - clean_losses[text])[keep]
    targets = tokens[1:] if objective == "next-token" else tokens
    return targets[: len(change)], change


def _rows_of(batch: Batch, rows: list[int]) -> Batch:
    """The batch's ``rows`` alone (one text's), padded as they were."""
    inputs = {name: value[rows] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] ==
              batch.real.shape[0] else value for name, value in batch.inputs.items()}
    text = rows[0] % len(batch.texts)
    return Batch(inputs, batch.real[rows], [batch.tokens[text]], [batch.texts[text]], [batch.cut[text]],
                 batch.copies)
