"""Composition between attention heads, read from the weights alone (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits"): how much of what an earlier head writes into the residual stream a later head reads into its
queries (Q-composition), its keys (K-composition) or its values (V-composition).

A head's two circuits, in the row-vector convention (a token's residual vector x is a row, heads compute x @ W):

- OV circuit ``W_OV = W_V W_O`` ``[d_model, d_model]``: what the head writes, given what it attends to;
- QK circuit ``W_QK = W_Q W_K^T`` ``[d_model, d_model]``: the bilinear form of its attention scores,
  ``score(x_q, x_k) = x_q W_QK x_k^T`` (before scaling, positions and softmax).

The score of a sender head s in layer i and a receiver head r in layer j > i is TransformerLens's
``all_composition_scores``: ``||W_OV_s @ B_r||_F / (||W_OV_s||_F ||B_r||_F)`` with ``B_r = W_QK_r`` (Q),
``W_QK_r^T`` (K: the sender writes into the receiver's keys), ``W_OV_r`` (V). It lies in [0, 1] and does not change
when either matrix is scaled. Random matrices already score well above 0 (about 1/sqrt(d_model) for Gaussian ones),
so every score here comes with a random baseline measured on Gaussian matrices of the same shapes.

What is read: each self-attention's projections, per query head (a grouped-query head gets the K/V head it shares);
of an encoder-decoder, one stack's self-attention (the encoder's unless the decoder's is asked for), cross-attention
never. Biases are ignored: they shift queries, keys and values by a constant, which the bilinear forms above do not
hold; so are position terms added to the scores outside W_Q W_K^T (ALiBi, T5's relative bias, DeBERTa's
disentangled terms), which :func:`composition_words` says. Nothing is run through the model; the weights are read as
transformers' own attention code splits them (checked for each family against transformers 5.25, and in the tests
against the model's own attention code run on an identity matrix).

The weights are read by :mod:`attnviz.interventions.head_weights`. Imports torch and numpy (and that module).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import torch

from attnviz.interventions.head_weights import HeadWeights, head_weights

KINDS = ("Q", "K", "V")
# how many baseline spreads above the baseline's mean the strongest pair must at least score for the map not to be
# "flat" (more where there are many pairs: see CompositionScores.flat_threshold)
FLAT_SPREADS = 2.0
FLAT_CHANCE = 0.05  # how often the strongest of a model's pairs may pass the threshold with no structure at all


@dataclass
class CompositionScores:
    """One kind of composition for every pair of heads, with the random baseline the scores must be read against
    and the model's facts that say which scores can be compared (see :func:`composition_words`)."""

    kind: str  # "Q", "K" or "V"
    scores: torch.Tensor  # [layers, heads, layers, heads] float64: sender layer, head, receiver layer, head; NaN
    #                       where the receiver's layer is not after the sender's
    labels: list[str]  # "L0 H1" per head, layer by layer
    baseline_mean: float  # the score of Gaussian matrices of the same shapes, mean over the draws
    baseline_spread: float  # and their standard deviation
    baseline_draws: int
    seed: int
    weights: HeadWeights = field(repr=False)  # what the scores were computed from (the model's facts with them)

    @property
    def layers(self) -> int:
        return self.scores.shape[0]

    @property
    def heads(self) -> int:
        return self.scores.shape[1]

    def spreads_above(self) -> torch.Tensor:
        """``[layers, heads, layers, heads]``: how many baseline spreads each score lies above the baseline's mean
        (negative: below it; NaN where there is no pair)."""
        return (self.scores - self.baseline_mean) / self.baseline_spread

    def matrix(self) -> torch.Tensor:
        """The scores as ``[senders, receivers]``, both heads flattened layer by layer (rows and columns follow
        :attr:`labels`)."""
        count = self.layers * self.heads
        return self.scores.reshape(count, count)

    def strongest(self, count: int = 5) -> list[tuple[str, str, float, float]]:
        """The ``count`` highest-scoring pairs as ``(sender, receiver, score, spreads above the baseline)``."""
        flat = self.matrix()
        values = torch.nan_to_num(flat, nan=-math.inf).flatten()
        order = torch.argsort(values, descending=True)[:count]
        pairs = []
        for index in order.tolist():
            if not math.isfinite(values[index]):
                break
            sender, receiver = divmod(index, flat.shape[1])
            score = float(flat[sender, receiver])
            pairs.append((self.labels[sender], self.labels[receiver], score,
                          (score - self.baseline_mean) / self.baseline_spread))
        return pairs

    @property
    def pairs(self) -> int:
        """How many pairs were scored (a receiver in a later layer than its sender)."""
        return int(torch.isfinite(self.scores).sum())

    @property
    def flat_threshold(self) -> float:
        """Baseline spreads above the baseline's mean that the strongest pair must exceed to stand out: at least
        :data:`FLAT_SPREADS`, and at least where the largest of ``pairs`` independent baseline draws stays 95% of
        the time (Gaussian, Bonferroni: 3.1 spreads for 48 pairs, 5.2 for 500,000); random-init models' strongest
        pairs reach 2 to 3 spreads."""
        chance = NormalDist().inv_cdf(1 - FLAT_CHANCE / max(self.pairs, 1))
        return max(FLAT_SPREADS, chance)

    @property
    def flat(self) -> bool:
        """Whether no pair stands out: the strongest lies within :attr:`flat_threshold` baseline spreads of the
        random baseline (or there is no pair at all: a model of one layer)."""
        finite = self.scores[torch.isfinite(self.scores)]
        return finite.numel() == 0 or float(finite.max()) <= (self.baseline_mean
                                                              + self.flat_threshold * self.baseline_spread)


# ---------------------------------------------------------------------------------------------------- the scores


def _r_factor(matrix: torch.Tensor) -> torch.Tensor:
    """A square factor F with ``F^T F = matrix^T matrix``: then ``||matrix @ X||_F = ||F @ X||_F`` for every X, so a
    tall factor can be replaced by its small F in every Frobenius norm (F is R of ``matrix = Q R``, up to signs).
    ``[..., d_model, d_head] -> [..., d_head, d_head]``. Cholesky of the Gram matrix, not a QR: batched QR is
    orders of magnitude slower on a busy CPU; eigh where Cholesky fails (a rank-deficient head, d_head > d_model)."""
    gram = matrix.transpose(-1, -2) @ matrix  # [..., d_head, d_head]
    factor, info = torch.linalg.cholesky_ex(gram, upper=True)  # gram = factor^T factor
    failed = info != 0  # [...]
    if bool(failed.any()):
        values, vectors = torch.linalg.eigh(gram)  # gram = vectors diag(values) vectors^T
        root = values.clamp_min(0).sqrt()[..., :, None] * vectors.transpose(-1, -2)  # [..., d_head, d_head]
        factor = torch.where(failed[..., None, None], root, factor)
    return factor


def _factors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, kind: str):
    """``(S, norm of sender OV, T, norm of receiver B)`` with ``||W_OV_s B_r||_F = ||S_s T_r||_F``:
    ``W_OV_s B_r = V_s O_s L_r Rt_r`` with ``V_s = Qv Rv`` and ``Rt_r^T = Qr Rr``, so the product's norm is that of
    ``(Rv O_s) (L_r Rr^T)``, ``[d_head, d_model] @ [d_model, d_head]``: no d_model x d_model matrix is formed."""
    sender = _r_factor(v) @ o  # [..., d_head, d_model]
    sender_norm = torch.linalg.matrix_norm(sender)  # [...]: ||W_V W_O||_F
    left, right = {"Q": (q, k), "K": (k, q), "V": (v, o.transpose(-1, -2))}[kind]  # B = left @ right^T
    right_r = _r_factor(right)  # [..., d_head, d_head]
    receiver = left @ right_r.transpose(-1, -2)  # [..., d_model, d_head]
    receiver_norm = torch.linalg.matrix_norm(_r_factor(left) @ right_r.transpose(-1, -2))  # [...]: ||B||_F
    return sender, sender_norm, receiver, receiver_norm


def _pair_scores(sender: torch.Tensor, sender_norm: torch.Tensor, receiver: torch.Tensor,
                 receiver_norm: torch.Tensor) -> torch.Tensor:
    """``[senders, d_head, d_model]`` x ``[receivers, d_model, d_head]`` -> ``[senders, receivers]`` scores."""
    senders, d_head, d_model = sender.shape
    receivers = receiver.shape[0]
    product = sender.reshape(senders * d_head, d_model) @ receiver.permute(1, 0, 2).reshape(d_model, -1)
    product = product.reshape(senders, d_head, receivers, -1)  # [senders, d_head, receivers, d_head]
    norms = product.square().sum(dim=(1, 3)).sqrt()  # [senders, receivers]
    return norms / (sender_norm[:, None] * receiver_norm[None, :])


@functools.lru_cache(maxsize=64)
def random_baseline(d_model: int, d_head: int, kind: str, draws: int = 50, seed: int = 0) -> tuple[float, float]:
    """``(mean, standard deviation)`` of the score of independent standard Gaussian W_Q, W_K, W_V, W_O of the
    model's shapes over ``draws`` seeded draws: what a pair scores with no structure at all (for these, about
    1/sqrt(d_model); the scale of the draws does not matter, the score being scale-free). Cached: a 4096-wide
    model's takes seconds."""
    _check_kind(kind)
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(draws, *shape, generator=generator, dtype=torch.float64)

    sender = _factors(draw(d_model, d_head), draw(d_model, d_head), draw(d_model, d_head), draw(d_head, d_model),
                      kind)
    receiver = _factors(draw(d_model, d_head), draw(d_model, d_head), draw(d_model, d_head), draw(d_head, d_model),
                        kind)
    product = sender[0] @ receiver[2]  # [draws, d_head, d_head]: draw i's sender with draw i's receiver
    scores = torch.linalg.matrix_norm(product) / (sender[1] * receiver[3])  # [draws]
    return float(scores.mean()), float(scores.std())


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"the kind of composition is one of {', '.join(KINDS)} (queries, keys, values), not {kind!r}")


def composition_scores(model: torch.nn.Module | HeadWeights, kind: str, *, fold_norm: bool | None = None,
                       baseline_draws: int = 50, seed: int = 0, dtype: torch.dtype = torch.float64,
                       progress: Callable[[float, str], None] | None = None) -> CompositionScores:
    """Every (sender, receiver) pair's ``kind`` composition score, TransformerLens's ``all_composition_scores``
    (its zeros for pairs that cannot compose are NaN here, so a real 0 stays apart).

    ``model``: a transformers model, or the :class:`HeadWeights` already read from one (to score the three kinds
    from one read). ``fold_norm``: see :func:`head_weights`. The work is one ``[heads * d_head, d_model] @
    [d_model, heads * d_head]`` product per pair of layers (in ``dtype``, float64 by default so that the scores
    are exact to far below what is shown): for a 7B Llama about 3e13 multiply-adds, a minute or more on a CPU;
    ``progress(share done, words)`` hears after each sender layer."""
    _check_kind(kind)
    weights = model if isinstance(model, HeadWeights) else head_weights(model, fold_norm)
    layers, heads = weights.layers, weights.heads
    q, k, v, o = (w.to(dtype) for w in (weights.W_Q, weights.W_K, weights.W_V, weights.W_O))
    sender, sender_norm, receiver, receiver_norm = _factors(q, k, v, o, kind)
    # sender: [layers, heads, d_head, d_model]; receiver: [layers, heads, d_model, d_head]; norms: [layers, heads]
    scores = torch.full((layers, heads, layers, heads), math.nan, dtype=torch.float64)
    for first in range(layers - 1):
        for later in range(first + 1, layers):
            scores[first, :, later, :] = _pair_scores(sender[first], sender_norm[first], receiver[later],
                                                      receiver_norm[later]).to(torch.float64).cpu()
        if progress is not None:
            progress((first + 1) / (layers - 1), f"{kind}-composition: senders of layer {first} scored")
    mean, spread = random_baseline(weights.d_model, weights.d_head, kind, baseline_draws, seed)
    return CompositionScores(kind=kind, scores=scores, labels=weights.labels, baseline_mean=mean,
                             baseline_spread=spread, baseline_draws=baseline_draws, seed=seed, weights=weights)


def all_composition_scores(model: torch.nn.Module | HeadWeights, *, fold_norm: bool | None = None,
                           **options) -> dict[str, CompositionScores]:
    """The three kinds, "Q", "K" and "V", from one read of the weights (``options``: see
    :func:`composition_scores`)."""
    weights = model if isinstance(model, HeadWeights) else head_weights(model, fold_norm)
    return {kind: composition_scores(weights, kind, **options) for kind in KINDS}


# ---------------------------------------------------------------------------------------------------- the words

_KIND_WORDS = {"Q": "queries", "K": "keys", "V": "values"}


def composition_words(result: CompositionScores) -> list[str]:
    """What the scores say and what they cannot: how far the strongest pairs lie above the random baseline (or
    that the map is flat), and what the model's positions, grouped K/V heads and norms make incomparable."""
    weights = result.weights
    said = []
    mean, spread = result.baseline_mean, result.baseline_spread
    baseline = (f"Gaussian matrices of the same shapes score {mean:.3g} ± {spread:.3g} "
                f"(mean ± standard deviation over {result.baseline_draws} draws, seed {result.seed})")
    pairs = result.strongest(3)
    if not pairs:
        said.append(f"{result.kind}-composition needs a head in a later layer: this model has one layer, so there "
                    "is no pair to score.")
    elif result.flat:
        top = pairs[0]
        said.append(f"Nearly flat: no pair stands out from random matrices. The strongest {result.kind}-composition "
                    f"({top[0]} → {top[1]}) scores {top[2]:.3g}, {top[3]:.1f} spreads above the baseline; "
                    f"{baseline}. The largest of {result.pairs} random pairs stays below "
                    f"{result.flat_threshold:.1f} spreads 95% of the time: the weights show no composition beyond "
                    "chance.")
    else:
        threshold = result.flat_threshold
        above = int((result.spreads_above() > threshold).sum())
        named = "; ".join(f"{s} → {r}: {score:.3g} ({z:.1f} spreads above)" for s, r, score, z in pairs)
        said.append(f"How much each later head reads the earlier head's output into its {_KIND_WORDS[result.kind]}: "
                    f"the strongest pairs are {named}. {baseline}; {above} of {result.pairs} pairs lie more than "
                    f"{threshold:.1f} spreads above it (where the largest of {result.pairs} random pairs stays 95% "
                    "of the time). The baseline has no structure at all: trained heads whose matrices have a few "
                    "large singular values score above it without composing, so compare pairs with each other too.")
    if weights.positions == "rotary" and result.kind in ("Q", "K"):
        share = ("every dimension" if weights.rotary_fraction >= 1
                 else f"{weights.rotary_fraction:.0%} of each head's dimensions")
        said.append(f"RoPE rotates queries and keys ({share}) by their positions, so a head's real bilinear form "
                    "depends on how far the key is from the query: W_Q W_K^T (before rotation) is only its form at "
                    "offset 0 (a token attending to itself). Q- and K-scores compare that form, not what the head "
                    "does at other distances.")
    if weights.per_head_norms:
        said.append("Each head's queries and keys are normalised (q_norm, k_norm) before their scores: the norms' "
                    "gains are folded into W_Q and W_K, but their per-token scale, a positive factor on each score, "
                    "is not in the weights, so Q- and K-scores say which directions a head reads, not how strongly.")
    if weights.positions == "alibi":
        said.append("ALiBi adds a bias to each head's scores that grows with distance; the weights do not hold it, "
                    "so Q- and K-scores leave out how strongly each head prefers near tokens.")
    if weights.positions == "relative bias":
        owner = "MPNet's" if weights.model_type == "mpnet" else "T5's"
        said.append(f"{owner} relative position bias, learned per head for each (bucketed) distance from query to "
                    "key, is added to each head's scores; the weights do not hold it, so Q- and K-scores leave out "
                    "where each head prefers to look by distance.")
    if weights.positions == "disentangled relative":
        said.append("DeBERTa's disentangled attention adds content-to-position and position-to-content terms to each "
                    "head's scores (its queries and keys against embeddings of the relative distance). W_Q W_K^T here "
                    "is the content-to-content term alone: Q- and K-scores leave the relative-position terms out, so "
                    "they say neither what a head reads by distance nor how a sender's output changes those terms.")
    if weights.shared_weights:
        sets = len(set(weights.shared_weights))
        if sets == 1:
            said.append(f"ALBERT's layers share their weights: its {weights.layers} layers all apply the same "
                        "matrices (one layer repeated), so every score between two layers is a score of that layer's "
                        "heads with themselves, and the map repeats one block: what the shared heads could compose "
                        "with when applied again, not a difference between layers.")
        else:
            said.append(f"ALBERT's layers share their weights: its {weights.layers} layers apply {sets} sets of "
                        "matrices, so a score between two layers that apply the same set is a score of those heads "
                        "with themselves (what they could compose with when applied again, not a difference between "
                        "layers).")
    if weights.stack == "encoder":
        said.append("The encoder's self-attention heads only: the decoder's self-attention heads write into another "
                    "residual stream (not scored with these), and cross-attention, whose keys and values are the "
                    "encoder's output, is left out: it is no composition between heads of one stream.")
    if weights.stack == "decoder":
        said.append("The decoder's self-attention heads only: the encoder's heads write into another residual stream "
                    "(not scored with these). Cross-attention is left out, though its queries read this stream and its "
                    "output is added to it: what decoder heads compose with through it is not in these scores.")
    if weights.kv_heads < weights.heads:
        group = weights.heads // weights.kv_heads
        said.append(f"Grouped-query attention: every {group} query heads share one K/V head, so their W_K and W_V "
                    "are the same matrix. Their K- and V-scores differ only through each query head's own W_Q (K) "
                    "or W_O (V): a difference between heads of a group is not a difference in what they read into "
                    "keys or values.")
    if weights.folded:
        how = ("its gain folded in, and centred because the LayerNorm subtracts each token's mean"
               if weights.norm == "LayerNorm" else "its gain folded in")
        said.append(f"W_Q, W_K and W_V include the {weights.norm} that feeds each attention ({how}); biases are "
                    "left out.")
    else:
        said.append("The norms' gains are not folded into the heads' weights: a dimension the norm amplifies counts "
                    "no more here than in the raw weights. Biases are left out.")
    if not weights.pre_norm:
        said.append("Post-norm model: between two heads the residual stream passes through LayerNorms and MLPs, "
                    "which these weight products leave out.")
    return said


def scores_table(result: CompositionScores) -> list[dict[str, object]]:
    """Every scored pair as a row (sender, receiver, score, spreads above the baseline), strongest first: the
    figure's numbers, exact, for a CSV."""
    spreads = result.spreads_above()
    rows = []
    for first, head, later, other in np.argwhere(np.isfinite(result.scores.numpy())).tolist():
        rows.append({"sender": f"L{first} H{head}", "receiver": f"L{later} H{other}", "kind": result.kind,
                     "score": float(result.scores[first, head, later, other]),
                     "spreads_above_baseline": float(spreads[first, head, later, other])})
    return sorted(rows, key=lambda row: -row["score"])
