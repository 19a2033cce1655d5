"""The induction circuit, demonstrated by ablation (the first view of the "Does this head matter?" page): random
tokens typed twice, each head of a decoder removed in turn, the loss on each copy measured; beside it, where each
head looks on the same sequences (previous-token and induction scores), and where the induction heads look when
the previous-token head that may feed them is removed (the test of composition)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz.core import circuits
from attnviz.interventions.edits import AttentionModule, Plan, attention_modules, edited, zeroed
from attnviz.interventions.importance import empty_map
from attnviz.models.capture import record_from_calls, recorded_calls


@dataclass
class Circuit:
    """The bundled tiny GPT's induction circuit on random tokens typed twice: each head's loss on the first and
    the second copy with the head ablated, against the clean run's."""

    first: torch.Tensor  # [modules, heads]: mean loss on the first copy with the head ablated
    second: torch.Tensor
    clean_first: float
    clean_second: float
    modules: list[AttentionModule]


def copy_losses(model: torch.nn.Module, ids: torch.Tensor, period: int, plan: Plan | None = None,
                start: int = 0) -> tuple[float, float]:
    """Mean next-token loss on the first copy (its tokens after the first) and on the second copy (the same
    positions of the pattern, one copy later) of ``ids`` ``[texts, start + 2 * period]`` (``start``: a BOS)."""
    with torch.no_grad(), edited(model, plan or {}):
        logits = model(input_ids=ids).logits[:, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    # losses[:, i] is the loss of token i + 1; nothing can predict either copy's first token
    first = losses[:, start : start + period - 1]
    second = losses[:, start + period : start + 2 * period - 1]
    return float(first.mean()), float(second.mean())


def repeats(tokens: list[int], period: int, texts: int, seed: int, bos: int | None = None) -> torch.Tensor:
    """``texts`` sequences of ``period`` different random tokens (from ``tokens``; with repeats only if there are
    fewer) typed twice, after ``bos`` when the model has one: ``[texts, start + 2 * period]``. No token repeats
    inside a copy, so each token of the second copy has one earlier occurrence to copy from."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor(tokens)
    if len(pool) >= period:
        picks = torch.stack([torch.randperm(len(pool), generator=generator)[:period] for _ in range(texts)])
    else:
        picks = torch.randint(len(pool), (texts, period), generator=generator)
    first = pool[picks]  # [texts, period]
    prefix = torch.full((texts, 0 if bos is None else 1), -1 if bos is None else bos, dtype=torch.long)
    return torch.cat([prefix, first, first], dim=1)


def induction_circuit(model: torch.nn.Module, tokens: list[int], *, period: int = 50, texts: int = 8,
                      seed: int = 0, bos: int | None = None) -> Circuit:
    """Ablate each head (zero) of a decoder on ``texts`` random sequences (from ``tokens``) typed twice."""
    ids = repeats(tokens, period, texts, seed, bos)
    start = ids.shape[1] - 2 * period
    modules = attention_modules(model, {"input_ids": ids[:1]})
    clean_first, clean_second = copy_losses(model, ids, period, start=start)
    first_losses, second_losses = empty_map(modules), empty_map(modules)
    for row, module in enumerate(modules):
        for head in range(module.heads):
            first_losses[row, head], second_losses[row, head] = copy_losses(
                model, ids, period, zeroed(module.name, head), start=start)
    return Circuit(first_losses, second_losses, clean_first, clean_second, modules)


def circuit_scores(model: torch.nn.Module, tokens: list[int], *, period: int = 50, texts: int = 8,
                   seed: int = 0, bos: int | None = None, plan: Plan | None = None) -> dict[str, torch.Tensor]:
    """Where each head looks on the same sequences as :func:`induction_circuit`: its previous-token and induction
    scores (Olsson et al., :mod:`attnviz.core.circuits`), ``[layers, heads]`` each, averaged over the texts; with
    ``plan``'s heads edited (e.g. one zeroed) while they are measured."""
    ids = repeats(tokens, period, texts, seed, bos)
    start = ids.shape[1] - 2 * period
    previous, induction = [], []
    for row in ids:
        with edited(model, plan or {}):
            calls, _ = recorded_calls(model, {"input_ids": row[None]})
        names = [str(token) for token in row.tolist()]
        weights = record_from_calls("self", calls, names, names).every_layer_weights()  # [layers, heads, n, n]
        previous.append(circuits.previous_token_score(weights[..., start:, start:]))
        induction.append(circuits.induction_score(weights, period, start=start))
    return {"previous": torch.stack(previous).mean(0), "induction": torch.stack(induction).mean(0)}


# What the story calls a head that attends like one (a score, the mean attention weight on the expected token), a
# copy "easy" (its loss under this share of the first copy's), a removal that "matters" (the second copy's loss
# at least this many times the clean one), a first copy left "alone" (its loss moved by less than this share) and
# an induction head that "reads" a previous-token head (its score, with that head removed, at most this share of
# its own)
ATTENDS = 0.3
COPIES = 0.5
MATTERS = 1.5
ALONE = 0.1
READS = 0.5


def feeder(result: Circuit, scores: dict[str, torch.Tensor]) -> int | None:
    """The head (flat index) that may feed the strongest induction head: the strongest previous-token head in an
    earlier layer, if it attends like one (score at least ``ATTENDS``); else None."""
    layers = [module.index for module in result.modules for _ in range(module.heads)]
    induction = scores["induction"].flatten().tolist()
    previous = scores["previous"].flatten().tolist()
    strongest = max(range(len(induction)), key=induction.__getitem__)
    earlier = [head for head in range(len(previous)) if layers[head] < layers[strongest]]
    found = max(earlier, key=previous.__getitem__, default=None)
    return None if found is None or previous[found] < ATTENDS else found


def without_feeder(model: torch.nn.Module, tokens: list[int], result: Circuit, scores: dict[str, torch.Tensor], *,
                   period: int = 50, texts: int = 8, seed: int = 0, bos: int | None = None) -> torch.Tensor | None:
    """Every head's induction score on the same sequences with the :func:`feeder` zeroed (None without one): an
    induction head that finds the token to copy through what the previous-token head wrote loses its score."""
    found = feeder(result, scores)
    if found is None:
        return None
    row, head = _place(result, found)
    return circuit_scores(model, tokens, period=period, texts=texts, seed=seed, bos=bos,
                          plan=zeroed(result.modules[row].name, head))["induction"]


def _place(result: Circuit, index: int) -> tuple[int, int]:
    for row, module in enumerate(result.modules):
        if index < module.heads:
            return row, index
        index -= module.heads
    raise IndexError(index)


def story(result: Circuit, scores: dict[str, torch.Tensor], period: int, *, texts: int = 8,
          composed: torch.Tensor | None = None, bos: str | None = None) -> str:
    """What the measurements show, in words (markdown), each claim made only where the numbers make it: that the
    model copies, which head is its strongest induction head and what removing it costs, and whether a
    previous-token head in an earlier layer feeds it. The heads are said to compose only when removing that head
    makes the second copy harder, leaves the first copy alone, and takes the induction heads' attention away
    (``composed``: the induction scores with it zeroed, :func:`without_feeder`); each induction head it feeds is
    named. ``bos``: the BOS token the sequences start with (None: none)."""
    layers = [module.index for module in result.modules for _ in range(module.heads)]
    labels = [f"L{module.index} H{head}" for module in result.modules for head in range(module.heads)]
    first = [float(v) for row in result.first for v in row if v == v]
    second = [float(v) for row in result.second for v in row if v == v]
    induction = scores["induction"].flatten().tolist()
    previous = scores["previous"].flatten().tolist()
    clean_first, clean_second = result.clean_first, result.clean_second
    start = f"after the BOS token `{bos}`" if bos else "with no BOS token before them"
    said = (f"On {period} random tokens typed twice ({texts} sequences, {start}), the model's loss on the second "
            f"copy is **{clean_second:.3g}** nats per token against **{clean_first:.3g}** on the first (each the "
            "mean over every predicted token of that copy in every sequence)")
    if clean_second >= COPIES * clean_first:
        return (said + ": it does not copy (an induction circuit makes the second copy far easier), so there is no "
                "circuit here for removing a head to break. The bundled tiny GPT has one.")
    said += ": it copies."
    strongest = max(range(len(induction)), key=induction.__getitem__)
    if induction[strongest] < ATTENDS:
        return (said + f" Yet no head attends like an induction head (the highest score is "
                f"{induction[strongest]:.2f}): the copying is spread over heads, or done another way.")
    cost = second[strongest] / clean_second
    said += (f" Zeroing **{labels[strongest]}** (the strongest induction head by attention, "
             f"{induction[strongest]:.2f}) makes the second copy **{cost:.1f}x** harder while the first copy moves "
             f"**{(first[strongest] / clean_first - 1):+.2%}**")
    said += "." if cost >= MATTERS else ": the model copies without it (other heads do the work)."
    found = feeder(result, scores)
    if found is None:
        said += (" No head in an earlier layer attends to the previous token, so this induction head does not read "
                 "one: there is no composition to show.")
    else:
        said += _composition(found, strongest, labels, layers, first, second, clean_first, clean_second,
                             induction, previous[found], composed)
    return said + _costliest(labels, induction, second, clean_second, strongest)


def _composition(found: int, strongest: int, labels: list[str], layers: list[int], first: list[float],
                 second: list[float], clean_first: float, clean_second: float, induction: list[float],
                 previous: float, composed: torch.Tensor | None) -> str:
    """What removing the previous-token head ``found`` shows, in words: the heads compose only when the second copy
    gets harder, the first copy stays as it was, and the induction heads lose their attention without it."""
    cost, moved = second[found] / clean_second, first[found] / clean_first - 1
    said = (f" Zeroing the previous-token head **{labels[found]}** ({previous:.2f} on the previous token, an "
            f"earlier layer) makes the second copy **{cost:.1f}x** harder while the first copy moves "
            f"**{moved:+.2%}**")
    if cost < MATTERS:
        return said + ": the induction heads do not need it here."
    if abs(moved) >= ALONE:
        return said + (": it does other work too (the first copy has nothing to copy), so this does not show that "
                       "the induction heads read it.")
    if composed is None:
        return said + "; whether the induction heads read it is not measured here."
    after = composed.flatten().tolist()
    inducting = [head for head in range(len(induction)) if layers[head] > layers[found] and induction[head] >= ATTENDS]
    reading = [head for head in inducting if after[head] <= READS * induction[head]]
    changes = ", ".join(f"**{labels[head]}** {induction[head]:.2f} → {after[head]:.2f}" for head in inducting)
    if strongest not in reading:
        return said + (f". Without it the induction heads still attend to the token to copy ({changes}): its "
                       "effect does not come through their attention.")
    bold = [f"**{labels[head]}**" for head in reading]
    names = bold[0] if len(bold) == 1 else f"{', '.join(bold[:-1])} and {bold[-1]}"
    return said + (f". Without it the induction heads' attention to the token to copy falls ({changes}): {names} "
                   "need what it wrote to find the token to copy (the heads compose).")


def _costliest(labels: list[str], induction: list[float], second: list[float], clean: float,
               strongest: int) -> str:
    """When the induction head whose removal costs most is not the one that attends most like one: say so."""
    inducting = [index for index, score in enumerate(induction) if score > 0.5]
    if not inducting:
        return ""
    costliest = max(inducting, key=second.__getitem__)
    if costliest == strongest:
        return ""
    return (f" Among the induction heads, removing **{labels[costliest]}** (attention {induction[costliest]:.2f}) "
            f"costs most, **{second[costliest] / clean:.1f}x**: where a head looks does not rank how much it "
            "matters.")
