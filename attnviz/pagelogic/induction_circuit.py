"""The induction circuit, demonstrated by ablation (the first view of the "Does this head matter?" page): random
tokens typed twice, each head of a decoder removed in turn, the loss on each copy measured; beside it, where each
head looks on the same sequences (previous-token and induction scores)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnviz import circuits
from attnviz.models.capture import record_from_calls, recorded_calls
from attnviz.models.importance import empty_map
from attnviz.models.interventions import AttentionModule, Plan, attention_modules, edited, zeroed


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
                   seed: int = 0, bos: int | None = None) -> dict[str, torch.Tensor]:
    """Where each head looks on the same sequences as :func:`induction_circuit`: its previous-token and induction
    scores (Olsson et al., :mod:`attnviz.circuits`), ``[layers, heads]`` each, averaged over the texts."""
    ids = repeats(tokens, period, texts, seed, bos)
    start = ids.shape[1] - 2 * period
    previous, induction = [], []
    for row in ids:
        calls, _ = recorded_calls(model, {"input_ids": row[None]})
        names = [str(token) for token in row.tolist()]
        weights = record_from_calls("self", calls, names, names).every_layer_weights()  # [layers, heads, n, n]
        previous.append(circuits.previous_token_score(weights[..., start:, start:]))
        induction.append(circuits.induction_score(weights, period, start=start))
    return {"previous": torch.stack(previous).mean(0), "induction": torch.stack(induction).mean(0)}


# What the story calls a head that attends like one (a score, the mean attention weight on the expected token), a
# copy "easy" (its loss under this share of the first copy's) and a removal that "matters" (the second copy's loss
# at least this many times the clean one)
ATTENDS = 0.3
COPIES = 0.5
MATTERS = 1.5


def story(result: Circuit, scores: dict[str, torch.Tensor], period: int) -> str:
    """What the measurements show, in words (markdown), each claim made only where the numbers make it: that the
    model copies, which head is its strongest induction head and what removing it costs, and whether a
    previous-token head in an earlier layer feeds it (removing that one damages induction too: the heads
    compose)."""
    layers = [module.index for module in result.modules for _ in range(module.heads)]
    labels = [f"L{module.index} H{head}" for module in result.modules for head in range(module.heads)]
    first = [float(v) for row in result.first for v in row if v == v]
    second = [float(v) for row in result.second for v in row if v == v]
    induction = scores["induction"].flatten().tolist()
    previous = scores["previous"].flatten().tolist()
    clean_first, clean_second = result.clean_first, result.clean_second
    said = (f"On {period} random tokens typed twice, the model's loss on the second copy is "
            f"**{clean_second:.3g}** nats against **{clean_first:.3g}** on the first")
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
             f"**{(first[strongest] / clean_first - 1):+.1%}**")
    said += "." if cost >= MATTERS else ": the model copies without it (other heads do the work)."
    earlier = [head for head in range(len(previous)) if layers[head] < layers[strongest]]
    feeder = max(earlier, key=previous.__getitem__, default=None)
    if feeder is None or previous[feeder] < ATTENDS:
        said += (" No head in an earlier layer attends to the previous token, so this induction head does not read "
                 "one: there is no composition to show.")
    else:
        feeder_cost = second[feeder] / clean_second
        said += (f" Zeroing the previous-token head **{labels[feeder]}** ({previous[feeder]:.2f} on the previous "
                 f"token, an earlier layer) makes the second copy **{feeder_cost:.1f}x** harder")
        said += (": the induction heads read what it wrote (the heads compose)." if feeder_cost >= MATTERS else
                 ": the induction heads do not need it here.")
    return said + _costliest(labels, induction, second, clean_second, strongest)


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
