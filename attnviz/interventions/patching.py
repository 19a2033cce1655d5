"""Activation patching on the "Does this head matter?" page: each head's output (then each layer's, every head at
once) on a clean input put into the run of a corrupted one, and the residual stream at each layer and position
likewise; how much of the answer's logit difference over a foil each patch brings back; what makes those shares
meaningless (said before them); and the preset for the bundled tiny GPT (induction on random tokens, the token to
copy changed in the corrupted prompt)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnviz.core.tokens_display import readable_token, tokenizer_style
from attnviz.interventions.edits import (
    AttentionModule,
    Plan,
    attention_modules,
    edited,
    head_outputs,
    on_residual,
    residual_blocks,
)
from attnviz.interventions.importance import empty_map


@dataclass
class Patching:
    """Activation patching: the answer's logit difference restored by putting each head's clean output into the
    corrupted run, as a share of the clean-corrupted gap (1: all of it)."""

    heads: torch.Tensor  # [modules, heads]
    layers: torch.Tensor  # [modules]: every head of the module patched at once
    modules: list[AttentionModule]
    clean: float  # logit(answer) - logit(foil) at the last position, on the clean input
    corrupted: float
    answer: str
    foil: str


@dataclass
class PositionPatching:
    """The residual stream patched one layer and one position at a time: ``shares [layers + 1, n]``, row l < L the
    input of layer l (row 0: the embeddings), row L the last layer's output."""

    shares: torch.Tensor
    rows: list[str]
    clean: float
    corrupted: float
    answer: str
    foil: str


def _names(tokenizer):
    if tokenizer is None:
        return str
    style = tokenizer_style(tokenizer)
    return lambda token: readable_token(tokenizer.convert_ids_to_tokens(token), style)


def _check(clean_ids: list[int], corrupted_ids: list[int]) -> None:
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(f"the clean and corrupted inputs must have the same length in tokens "
                         f"({len(clean_ids)} and {len(corrupted_ids)})")
    if not clean_ids:
        raise ValueError("the inputs are empty")


def top_other(logits: torch.Tensor, answer: int) -> int:
    """The most likely token other than ``answer`` (``logits [vocab]``): the foil when none is given."""
    return next(token for token in logits.argsort(descending=True).tolist() if token != answer)


def patching_map(model: torch.nn.Module, clean_ids: list[int], corrupted_ids: list[int], answer: int,
                 foil: int | None = None, *, tokenizer=None,
                 progress: Callable[[float, str], None] | None = None) -> Patching:
    """Patch each head's output (then each module's, all heads) from the clean run into the corrupted one, at every
    position, and measure, at the last position, logit(answer) - logit(foil); ``foil`` defaults to the corrupted
    run's most likely token other than the answer. A causal LM only; both inputs the same length."""
    _check(clean_ids, corrupted_ids)
    clean_inputs = {"input_ids": torch.tensor([clean_ids])}
    corrupted_inputs = {"input_ids": torch.tensor([corrupted_ids])}
    modules = attention_modules(model, clean_inputs)
    clean_outputs, clean_run = head_outputs(model, clean_inputs)
    _, corrupted_run = head_outputs(model, corrupted_inputs)
    if foil is None:
        foil = top_other(corrupted_run.logits[0, -1].float(), answer)

    def difference(logits: torch.Tensor) -> float:
        logits = logits[0, -1].double()
        return float(logits[answer] - logits[foil])

    clean, corrupted = difference(clean_run.logits), difference(corrupted_run.logits)
    gap = clean - corrupted
    heads, layers = empty_map(modules), torch.full((len(modules),), float("nan"))
    total, done = sum(module.heads for module in modules) + len(modules), 0
    with torch.no_grad():
        for row, module in enumerate(modules):
            source = clean_outputs[module.name]  # [1, n, heads, d_v]
            for head in [*range(module.heads), None]:
                chosen = range(module.heads) if head is None else [head]
                plan: Plan = {module.name: {h: source[:, :, h] for h in chosen}}
                with edited(model, plan):
                    patched = difference(model(**corrupted_inputs).logits)
                share = (patched - corrupted) / gap if gap else float("nan")
                if head is None:
                    layers[row] = share
                else:
                    heads[row, head] = share
                done += 1
                if progress is not None:
                    progress(done / total, module.label)
    name = _names(tokenizer)
    return Patching(heads, layers, modules, clean, corrupted, name(answer), name(foil))


def residual_rows(layers: int) -> list[str]:
    """The rows of a :class:`PositionPatching`: where in the residual stream each is."""
    return ["embeddings (into layer 0)", *(f"into layer {layer}" for layer in range(1, layers)),
            f"out of layer {layers - 1}"]


def position_patching(model: torch.nn.Module, clean_ids: list[int], corrupted_ids: list[int], answer: int,
                      foil: int | None = None, *, tokenizer=None, rows_per_forward: int = 16,
                      progress: Callable[[float, str], None] | None = None) -> PositionPatching:
    """Put the clean run's residual stream at one layer and one position into the corrupted run (every other
    position and layer left as the corrupted run computes it), for every layer and position, and measure the share
    of the clean-corrupted gap of logit(answer) - logit(foil) at the last position it restores. One forward per
    layer and ``rows_per_forward`` positions (each row of the batch patches one position; one more row, unpatched,
    is what each share is measured from, in the same forward). Refused (ValueError) for
    a model whose layers are not a list of blocks around its self-attention (an encoder-decoder, a shared layer)."""
    _check(clean_ids, corrupted_ids)
    clean_inputs = {"input_ids": torch.tensor([clean_ids])}
    modules = attention_modules(model, clean_inputs)
    blocks = residual_blocks(model, modules)
    if blocks is None:
        raise ValueError("this model's layers are not a list of blocks around its self-attention, so its residual "
                         "stream is not patched here (its heads are)")
    n, last_layer = len(clean_ids), len(blocks)
    kept: dict[int, torch.Tensor] = {}

    def keep(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        kept[layer] = hidden.detach()  # [1, n, d_model]
        return hidden

    only_last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        with on_residual(model, blocks, keep):
            clean_logits = model(**clean_inputs, **only_last).logits[0, -1].double()
        corrupted_logits = model(input_ids=torch.tensor([corrupted_ids]), **only_last).logits[0, -1].double()
    if foil is None:
        foil = top_other(corrupted_logits, answer)
    clean = float(clean_logits[answer] - clean_logits[foil])
    corrupted = float(corrupted_logits[answer] - corrupted_logits[foil])
    gap = clean - corrupted
    shares = torch.full((last_layer + 1, n), float("nan"), dtype=torch.float64)
    steps = [(layer, start) for layer in range(last_layer + 1) for start in range(0, n, rows_per_forward)]
    with torch.no_grad():
        for done, (layer, start) in enumerate(steps, 1):
            positions = torch.arange(start, min(start + rows_per_forward, n))
            rows = torch.arange(1, len(positions) + 1)  # row 0: the corrupted run unpatched, in the same batch

            def patch(at: int, hidden: torch.Tensor, layer=layer, positions=positions, rows=rows) -> torch.Tensor:
                if at != layer:
                    return hidden
                hidden = hidden.clone()
                hidden[rows, positions] = kept[layer][0, positions].to(hidden.dtype)
                return hidden

            batch = torch.tensor([corrupted_ids]).repeat(len(positions) + 1, 1)
            with on_residual(model, blocks, patch):
                logits = model(input_ids=batch, **only_last).logits[:, -1].double()
            differences = logits[:, answer] - logits[:, foil]
            # against the unpatched row of the same forward: a patch that changes nothing restores 0 to the
            # rounding of one row against another (a batch of another size rounds the whole run otherwise)
            moved = differences[1:] - differences[0]
            shares[layer, positions] = moved / gap if gap else float("nan")
            if progress is not None:
                progress(done / len(steps), residual_rows(last_layer)[layer])
    name = _names(tokenizer)
    return PositionPatching(shares, residual_rows(last_layer), clean, corrupted, name(answer), name(foil))


@dataclass(frozen=True)
class Prompts:
    """A clean and a corrupted prompt of the same length, the answer the clean one leads to and the foil (the
    corrupted one's answer; None: the corrupted run's most likely token other than the answer), the positions where
    they differ, and whether they start with a BOS token."""

    clean: list[int]
    corrupted: list[int]
    answer: int
    foil: int | None
    changed: tuple[int, ...]
    bos: bool


def induction_prompts(tokens: list[int], period: int, *, seed: int, bos: int | None = None,
                      change: str = "copied") -> Prompts:
    """The induction preset: ``period`` different random tokens (from ``tokens``) typed, then their first half
    typed again (after ``bos`` when the model has one). The clean prompt's answer is the token that followed the
    last typed token in the first copy (an induction head copies it); the corrupted prompt is the same with that
    token of the first copy replaced by another random token, the foil, which a model that copies predicts instead.
    One position differs: the working path (an induction head reading the first copy) gives the answer, the broken
    one the foil.

    ``change="previous"`` changes the token before it instead (the first occurrence of the last typed token): the
    token to copy is still there, but nothing marks it as following the last typed token, so an induction head no
    longer finds it through its keys, while what it would copy (its values) is unchanged. That corruption tells the
    previous-token head -> induction head path through the keys from a broken one; the default one tells the values'
    path. Its foil is None (the corrupted run's most likely other token): no token is the corrupted prompt's answer.
    """
    if change not in ("copied", "previous"):
        raise ValueError("change: 'copied' or 'previous'")
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor(tokens)
    first = pool[torch.randperm(len(pool), generator=generator)[:period]].tolist()
    stop = period // 2
    others = [token for token in tokens if token not in set(first)]
    foil = others[int(torch.randint(len(others), (1,), generator=generator))]
    prefix = [] if bos is None else [bos]
    clean = prefix + first + first[:stop]
    corrupted = list(clean)
    at = len(prefix) + stop - (change == "previous")
    corrupted[at] = foil
    return Prompts(clean, corrupted, first[stop], foil if change == "copied" else None, (at,), bos is not None)


PREFERS = 1.0  # logits: the clean prompt must prefer the answer to the foil by this much for its shares to mean much
SMALL_GAP = 1.0  # logits: below this, a share of the gap is a share of noise


def problems(clean: float, corrupted: float, answer: str, foil: str) -> list[tuple[str, str]]:
    """What makes the shares of the clean-corrupted gap mean little, as ``(level, words)``, most serious first:
    "error" when there is no gap (nothing to recover: no map), "warning" when the clean prompt does not prefer the
    answer to the foil by ``PREFERS`` logits (the shares measure a move toward a difference the model does not
    make), when the corrupted prompt prefers the answer as much or more, or when the gap is small."""
    found = []
    gap = clean - corrupted
    if abs(gap) < 1e-6:
        return [("error", f"The clean and corrupted prompts give the same logit difference ({clean:.2f}): there is "
                          "nothing to recover. Choose prompts whose answers differ.")]
    if clean < PREFERS:
        found.append(("warning", f"On the clean prompt the model does not prefer the answer `{answer}` to the foil "
                                 f"`{foil}` by {PREFERS:g} logit or more (logit difference {clean:.2f}): it does not "
                                 "do this task, so the shares below say how far each patch moves the corrupted run "
                                 "toward a difference the model does not make. Choose prompts it gets right (the "
                                 "preset: induction)."))
    if gap < 0:
        found.append(("warning", f"The corrupted prompt prefers the answer more than the clean one ({corrupted:.2f} "
                                 f"against {clean:.2f}): a positive share moves the run away from the answer."))
    elif gap < SMALL_GAP:
        found.append(("warning", f"The clean and corrupted prompts' logit differences are about equal ({clean:.2f} and "
                                 f"{corrupted:.2f}, {gap:.2f} apart): each share divides by that gap, so small "
                                 "changes look large and the shares mean little. Prompts that separate the answers "
                                 "more give a clearer map."))
    return found


def start_words(tokenizer, ids: list[int], *, several: bool = False) -> str:
    """Whether ``ids`` (as read) start with a BOS or another special token, in words: the verb and what follows, for
    one text (``several``: for several)."""
    style = tokenizer_style(tokenizer)
    start, have = ("start", "have") if several else ("starts", "has")
    if ids and tokenizer.bos_token_id is not None and ids[0] == tokenizer.bos_token_id:
        return f"{start} with the BOS token `{readable_token(tokenizer.convert_ids_to_tokens(ids[0]), style)}`"
    if ids and ids[0] in set(tokenizer.all_special_ids):
        return f"{start} with the special token `{readable_token(tokenizer.convert_ids_to_tokens(ids[0]), style)}`"
    return f"{have} no BOS token before {'them' if several else 'it'}"


def prompt_ids(tokenizer, text: str, bos: bool) -> list[int]:
    """``text`` as the tokenizer reads it, after the tokenizer's BOS token when ``bos`` and it did not put one."""
    ids = tokenizer(text)["input_ids"]
    first = tokenizer.bos_token_id
    if bos and first is not None and (not ids or ids[0] != first):
        ids = [first, *ids]
    return ids


def own_prompts(tokenizer, clean_text: str, corrupted_text: str, answer_text: str, foil_text: str,
                bos: bool) -> Prompts | str:
    """Typed prompts as :class:`Prompts` (the answer and the foil: the first token of each; an empty foil: the
    corrupted run's most likely other token), or what is wrong with them, in words."""
    clean, corrupted = prompt_ids(tokenizer, clean_text, bos), prompt_ids(tokenizer, corrupted_text, bos)
    answer_ids = tokenizer(answer_text, add_special_tokens=False)["input_ids"]
    foil_ids = tokenizer(foil_text, add_special_tokens=False)["input_ids"] if foil_text.strip() else []
    if not clean_text.strip() or not answer_ids:
        return "Type a clean prompt and an answer."
    if len(clean) != len(corrupted):
        return (f"The prompts must have the same number of tokens: the clean one has {len(clean)}, the corrupted one "
                f"{len(corrupted)}.")
    foil = foil_ids[0] if foil_ids else None
    if foil == answer_ids[0]:
        return "The answer and the foil are the same token: choose a foil the corrupted prompt leads to instead."
    changed = tuple(position for position, (a, b) in enumerate(zip(clean, corrupted, strict=True)) if a != b)
    first = tokenizer.bos_token_id
    return Prompts(clean, corrupted, answer_ids[0], foil, changed, bool(clean) and first is not None and
                   clean[0] == first)


def prompt_lines(tokenizer, prompts: Prompts, *, around: int = 3, tail: int = 4) -> str:
    """The prompts as readable tokens, one line each: the tokens around each position where they differ (the
    difference in brackets), then their last tokens, then the answer or foil they lead to."""
    style = tokenizer_style(tokenizer)
    n = len(prompts.clean)
    shown: set[int] = set(range(max(0, n - tail), n))
    for position in prompts.changed:
        shown |= set(range(max(0, position - around), min(n, position + around + 1)))

    def line(ids: list[int], next_token: int | None) -> str:
        parts, previous = [], -1
        for position in sorted(shown):
            if position != previous + 1:
                parts.append("…")
            token = readable_token(tokenizer.convert_ids_to_tokens(ids[position]), style)
            parts.append(f"[{token}]" if position in prompts.changed else token)
            previous = position
        ending = "" if next_token is None else \
            f"   → {readable_token(tokenizer.convert_ids_to_tokens(next_token), style)}"
        return " ".join(parts) + ending

    return (f"clean      {line(prompts.clean, prompts.answer)}\n"
            f"corrupted  {line(prompts.corrupted, prompts.foil)}")
