"""The prompts of the "Does this head matter?" page's patching experiment: the induction presets for the bundled tiny
GPT (random tokens typed twice, the token to copy or the token before it changed in the corrupted prompt), typed
prompts read as a tokenizer reads them, the lines that show them, and what makes the shares of a clean-corrupted
gap meaningless (said before them). The patching itself is :mod:`attnviz.interventions.activation_patching` and
:mod:`attnviz.interventions.path_patching`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.core.tokens_display import readable_token, tokenizer_style


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
