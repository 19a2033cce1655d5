"""Two attention circuits a small decoder learns, measured as Olsson et al. (2022) measure them.

- A **previous-token head** puts its weight on position i-1: score = the mean over queries i >= 1 of w[i, i-1].
- An **induction head** completes a repeat: on random tokens repeated twice (``A B C ... A B C ...``), a token
  in the second half attends to the token that followed its first occurrence: score = the mean over second-half
  queries i of w[i, i - period + 1].

Both take one layer's weights ``[heads, n, n]`` (or one head's ``[n, n]``) and return one score per head.
"""

from __future__ import annotations

import torch


def previous_token_score(weights: torch.Tensor) -> torch.Tensor:
    """Mean weight on the previous position, per head: ``[..., n, n]`` -> ``[...]``."""
    n = weights.shape[-1]
    rows = torch.arange(1, n)
    return weights[..., rows, rows - 1].mean(-1)


def induction_score(weights: torch.Tensor, period: int, start: int = 0) -> torch.Tensor:
    """Mean weight from each second-half token to the token after its first occurrence, per head.

    The sequence is ``start`` tokens (e.g. a BOS), then ``period`` random tokens, then the same ``period`` again:
    query ``i`` in the second copy sees its earlier occurrence at ``i - period`` and should attend to
    ``i - period + 1``. The last query of the second copy is included (its target is the first copy's last token
    + 1, i.e. the first token of the second copy)."""
    first_of_second = start + period
    queries = torch.arange(first_of_second, start + 2 * period)
    return weights[..., queries, queries - period + 1].mean(-1)


def repeated_random_tokens(period: int, *, seed: int, pool: list[int], prefix: list[int] | None = None) -> list[int]:
    """``prefix`` then ``period`` token ids drawn uniformly from ``pool`` (seeded), repeated twice."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, len(pool), (period,), generator=generator).tolist()
    tokens = [pool[i] for i in drawn]
    return list(prefix or []) + tokens + tokens


@torch.no_grad()
def circuit_scores(model, tokenizer, text: str, pool: list[int], *, windows: int = 4, length: int = 256,
                   period: int = 40, seeds: int = 4, max_positions: int | None = None) -> dict:
    """Both scores for every layer and head of a causal LM with eager attention (``output_attentions``):
    ``previous_token`` on ``windows`` evenly spaced windows of ``text`` and ``induction`` on ``seeds`` sequences
    of ``period`` random tokens of ``pool`` repeated twice (after a BOS when the tokenizer has one), each
    ``[layers][heads]`` (means over the windows and seeds). ``max_positions``: the model's context, which the
    windows and the repeated sequences are shortened to fit."""
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    length = min(length, len(ids) - 1, max_positions or length)
    previous = []
    for start in torch.linspace(0, len(ids) - length - 1, windows).long().tolist():
        attentions = model(input_ids=ids[start : start + length][None], output_attentions=True).attentions
        previous.append(torch.stack([previous_token_score(a[0]) for a in attentions]))  # [layers, heads]
    prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    if max_positions:
        period = min(period, (max_positions - len(prefix)) // 2)
    induction = []
    for seed in range(seeds):
        tokens = repeated_random_tokens(period, seed=1000 + seed, pool=pool, prefix=prefix)
        attentions = model(input_ids=torch.tensor([tokens]), output_attentions=True).attentions
        induction.append(torch.stack([induction_score(a[0], period, start=len(prefix)) for a in attentions]))
    return {"previous_token": torch.stack(previous).mean(0).tolist(),
            "induction": torch.stack(induction).mean(0).tolist(), "period": period}


def ordinary_token_ids(tokenizer) -> list[int]:
    """Every token id of the vocabulary except the special ones (BOS, EOS, padding...): Olsson et al. draw their
    repeated random tokens from the whole vocabulary."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def _per_token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Loss of predicting ``tokens[1:]`` from ``logits[:-1]``: ``[n, vocab], [n] -> [n - 1]``."""
    return torch.nn.functional.cross_entropy(logits[:-1].float(), tokens[1:], reduction="none")


@torch.no_grad()
def random_repeats(model, tokenizer, *, lengths=(10, 25, 50, 100), seeds: int = 4, seed: int = 2000) -> dict:
    """Olsson et al.'s test on the whole vocabulary: ``length`` token ids drawn uniformly from every ordinary
    token, repeated twice, after a BOS where the tokenizer has one, for each length and seed.

    Returns ``induction`` ``[layers][heads]`` (the mean induction score over every sequence), ``first_loss`` and
    ``second_loss`` (mean next-token loss over the first copy's tokens after its first, and over the second copy's
    tokens after its first: the same positions of the pattern, so the only difference is the repeat), and
    ``ratio`` = second / first."""
    vocabulary = ordinary_token_ids(tokenizer)
    prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    scores, first, second = [], [], []
    for length in lengths:
        for index in range(seeds):
            tokens = repeated_random_tokens(length, seed=seed + 97 * length + index, pool=vocabulary, prefix=prefix)
            ids = torch.tensor([tokens])
            out = model(input_ids=ids, output_attentions=True)
            scores.append(torch.stack([induction_score(a[0], length, start=len(prefix)) for a in out.attentions]))
            losses = _per_token_losses(out.logits[0], ids[0])  # losses[i]: predicting token i + 1
            start = len(prefix)
            first.append(losses[start : start + length - 1].mean())  # tokens start+1 .. start+length-1
            second.append(losses[start + length : start + 2 * length - 1].mean())  # the same, one copy later
    first_loss, second_loss = float(torch.stack(first).mean()), float(torch.stack(second).mean())
    return {"induction": torch.stack(scores).mean(0).tolist(), "first_loss": first_loss,
            "second_loss": second_loss, "ratio": second_loss / first_loss, "lengths": list(lengths),
            "seeds": seeds}


@torch.no_grad()
def sentences_typed_twice(model, tokenizer, sentences) -> dict:
    """Each sentence typed twice (``s + " " + s``, after a BOS where there is one): the next-token loss over the
    first copy's tokens and over the second copy's (each after its first token, which nothing can predict), and
    whether greedy decoding continues the repeat: for every prefix of the second copy of two or more tokens, the
    most likely next token is the one the first copy had there.

    Returns ``first_loss``, ``second_loss``, ``ratio``, ``continued`` (the share of those greedy predictions that
    continue the repeat) and ``sentences_continued`` (the share of sentences where every one does)."""
    prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    first, second, hits, whole = [], [], [], []
    for sentence in sentences:
        copy = tokenizer(sentence, add_special_tokens=False)["input_ids"]
        again = tokenizer(" " + sentence, add_special_tokens=False)["input_ids"]
        tokens = tokenizer(sentence + " " + sentence, add_special_tokens=False)["input_ids"]
        if tokens != copy + again:
            raise ValueError(f"the tokenizer does not split {sentence!r} typed twice at the join")
        ids = torch.tensor(prefix + tokens)
        logits = model(input_ids=ids[None]).logits[0]  # [n, vocab]
        losses = _per_token_losses(logits, ids)
        start, middle = len(prefix), len(prefix) + len(copy)
        first.append(losses[start : middle - 1])  # predicting the first copy's tokens 2..
        second.append(losses[middle : len(ids) - 1])  # predicting the second copy's tokens 2..
        # Greedy continuation: after the second copy's first two tokens on, the argmax is the next token.
        predicted = logits[middle + 1 : len(ids) - 1].argmax(-1)
        correct = (predicted == ids[middle + 2 :]).tolist()
        hits.extend(correct)
        whole.append(all(correct))
    first_loss, second_loss = float(torch.cat(first).mean()), float(torch.cat(second).mean())
    return {"first_loss": first_loss, "second_loss": second_loss, "ratio": second_loss / first_loss,
            "continued": sum(hits) / len(hits), "sentences_continued": sum(whole) / len(whole),
            "sentences": len(sentences)}
