"""The Generation page's head finder: which heads of a decoder are previous-token and induction heads (Olsson et
al., 2022), measured on held-out text, and named only at the threshold Explore heads labels by."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from attnviz.core import analysis, circuits
from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.pagelogic.generation.decode import context_length
from attnviz.tiny_gpt.text import HELD_OUT_SHARE, documentation_text, split_text


def held_out_text() -> str:
    """The part of Python's documentation the bundled GPT never trained on."""
    return split_text(documentation_text(), HELD_OUT_SHARE)[1]


def bundled_training_report() -> dict:
    """What ``python -m attnviz.tiny_gpt.train`` wrote about the bundled GPT (recipe, losses, circuits)."""
    return json.loads((BUNDLED_GPT_DIR / "training.json").read_text())


# A head is named a previous-token (or induction) head only at this score or above: the threshold Explore heads
# labels a previous-token head with (attnviz.core.analysis.LABEL_RULES)
CIRCUIT_THRESHOLD = analysis.LABEL_RULES["previous-token head"][1]


@dataclass
class FoundHead:
    name: str
    layer: int  # the top-scoring head, found or not
    head: int
    score: float
    measure: str
    found: bool = True  # its score reaches CIRCUIT_THRESHOLD

    def in_words(self) -> str:
        """"**induction head**: layer 1, head 0: ... = **0.60**." or, below the threshold, that none was found."""
        if self.found:
            return f"**{self.name}**: layer {self.layer}, head {self.head}: {self.measure} = **{self.score:.2f}**."
        return (f"**{self.name}**: none found: no head reaches {CIRCUIT_THRESHOLD:g} ({self.measure}); the highest, "
                f"layer {self.layer}, head {self.head}, has **{self.score:.2f}**.")


def ordinary_ids(model, tokenizer) -> list[int]:
    """Every token id of the model's vocabulary but the tokenizer's special tokens."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(int(model.config.vocab_size)) if i not in special]


def find_circuits(model, tokenizer, text: str, *, pool: list[int] | None = None,
                  pool_words: str | None = None) -> list[FoundHead]:
    """The strongest previous-token head (on ``text``) and induction head (on random tokens of ``pool``, default
    every id of the vocabulary but the special tokens, repeated twice), measured with
    :func:`attnviz.core.circuits.circuit_scores` on the model's own eager weights (as ``python -m
    attnviz.tiny_gpt.train``
    measures them for the model card); each is named only when its score reaches :data:`CIRCUIT_THRESHOLD`.
    ``pool_words``: what the pool is, for the page ("the 384 most frequent tokens of its training text")."""
    if pool is None:
        pool = ordinary_ids(model, tokenizer)
        pool_words = f"all {len(pool):,} ids of its vocabulary but the special tokens"
    pool_words = pool_words or f"a pool of {len(pool):,} token ids"
    config = model.config
    context = context_length(config)
    scores = circuits.circuit_scores(model, tokenizer, text, pool, max_positions=context)
    found = []
    for name, key, measure in (
        ("previous-token head", "previous_token", "mean weight on position i-1 (held-out text)"),
        ("induction head", "induction", f"mean weight on the token after the earlier occurrence ({scores['period']} "
                                        f"random tokens drawn from {pool_words}, repeated twice)"),
    ):
        values = torch.tensor(scores[key])  # [layers, heads]
        layer, head = divmod(int(values.argmax()), values.shape[1])
        score = float(values[layer, head])
        found.append(FoundHead(name, layer, head, score, measure, score >= CIRCUIT_THRESHOLD))
    return found


# ---------------------------------------------------------------------------------------------------------------
# PagedAttention and Ring attention on the model's real tensors
