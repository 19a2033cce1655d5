"""Queries and keys in one picture (AttentionViz, Yeh et al. 2023): a head's query and key vectors as points of one
space, placed so that a query lies near the keys it attends to.

Two changes leave every attention weight as it is and make distance mean attention:

* **scaling**: queries times ``c``, keys divided by ``c``; dot products are unchanged;
* **translation**: every key moves by the same vector, so that the keys' centroid meets the queries'. A query's
  scores then all change by the same amount (``q · (k + t) = q · k + q · t``), which its softmax does not see;

with ``c`` chosen so that, after both, queries and keys have the same mean norm.

The translation is exact only where a score is a plain dot product plus terms that do not depend on the key's
vector: a soft-cap (Gemma 2) bends scores, and a sink (gpt-oss) is a score that does not move with them, so for
those heads only the scaling is applied (and said). Grouped-query heads: each query head with its own K/V head.

Then a projection to 2 or 3 dimensions (PCA always; t-SNE, and UMAP where installed) and a measure of how far to
trust it: for each query, whether the key it attends to most is among its nearest keys in the picture.

Imports torch and attnviz.models (scikit-learn and umap-learn lazily).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnviz.models import scoring
from attnviz.models.record import AttentionRecord

PROJECTIONS = ("PCA", "t-SNE", "UMAP")
TRUST_KS = (1, 5, 10)


@dataclass
class Document:
    """Where one document's points are in a :class:`HeadPoints`: its queries ``queries`` and keys ``keys`` (index
    ranges), which key each query may attend to (``allowed`` ``[n_q, n_k]`` bool, True = may attend) and the one it
    attends to most (``top`` ``[n_q]``, an index among the document's keys)."""

    queries: range
    keys: range
    allowed: torch.Tensor
    top: torch.Tensor
    weights: torch.Tensor  # [n_q, n_k] the head's weights (to draw a query's strongest keys)


@dataclass
class HeadPoints:
    """One head's queries and keys over one or more documents, normalised (see the module's docstring)."""

    queries: torch.Tensor  # [n_q, d]
    keys: torch.Tensor  # [n_k, d]
    query_tokens: list[str]
    key_tokens: list[str]
    query_positions: list[int]
    key_positions: list[int]
    documents: list[Document] = field(default_factory=list)
    shift: torch.Tensor | None = None  # [d] added to every key after the scaling (None: not translated)
    scale: float = 1.0  # queries times it, keys divided by it
    translated: bool = True

    @property
    def query_documents(self) -> list[int]:
        return [index for index, document in enumerate(self.documents) for _ in document.queries]

    @property
    def key_documents(self) -> list[int]:
        return [index for index, document in enumerate(self.documents) for _ in document.keys]


def normalise(queries: torch.Tensor, keys: torch.Tensor, translate: bool = True
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]:
    """``queries [n_q, d]`` times ``c`` and ``keys [n_k, d]`` divided by ``c`` then moved by one vector so that
    their centroid meets the queries' (``translate``), with ``c`` chosen so that their mean norms then match:
    returns both, the shift (added to the divided keys) and ``c``.

    Moved keys are ``(k - mean k) / c + c mean q``; their mean norm over ``c`` is ``h(c) = mean |(k - mean k) / c^2
    + mean q|``, which falls from infinity towards ``|mean q|`` (under the queries' mean norm ``A``) as ``c`` grows:
    ``h(c) = A`` is found by bisection on log c."""
    queries, keys = queries.double(), keys.double()
    query_norm = float(queries.norm(dim=-1).mean())
    if not translate or query_norm == 0:
        key_norm = float(keys.norm(dim=-1).mean())
        scale = (key_norm / query_norm) ** 0.5 if query_norm > 0 and key_norm > 0 else 1.0
        return queries * scale, keys / scale, None, scale
    query_mean, key_mean = queries.mean(0), keys.mean(0)
    centred = keys - key_mean  # [n_k, d]

    def moved_norm(c: float) -> float:  # h(c): the moved keys' mean norm over c
        return float((centred / c**2 + query_mean).norm(dim=-1).mean())

    low, high = -30.0, 30.0  # log c
    if moved_norm(math.exp(high)) >= query_norm:  # every query alike: no c matches the norms
        scale = 1.0
    else:
        for _ in range(100):
            middle = (low + high) / 2
            if moved_norm(math.exp(middle)) > query_norm:
                low = middle
            else:
                high = middle
        scale = math.exp((low + high) / 2)
    shift = scale * query_mean - key_mean / scale  # added to keys / c
    return queries * scale, keys / scale + shift, shift, scale


def translation_is_exact(record: AttentionRecord, layer: int) -> bool:
    """Whether moving every key by one vector leaves this layer's weights unchanged (no soft-cap, no sink)."""
    softcap = record.softcaps[layer] if record.softcaps else None
    sinks = record.sinks[layer] if record.sinks else None
    return not softcap and sinks is None


def raw_head(record: AttentionRecord, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor, Document]:
    """One capture's queries ``[n_q, d]`` and keys ``[n_k, d]`` of a head as the model used them (after RoPE; the
    K/V head a grouped query head reads), and its :class:`Document` (local index ranges)."""
    record.require_replay("Queries and keys")
    queries = record.queries[layer, head].float()  # [n_q, d]
    keys = record.keys[layer, record.kv_head(head)].float()  # [n_k, d]
    weights = record.head_weights(layer, head)  # [n_q, n_k]
    allowed = record.mask_rows(layer)  # [n_q, n_k]
    top = weights.masked_fill(~allowed, -1.0).argmax(-1)
    return queries, keys, Document(range(record.n_q), range(record.n_k), allowed, top, weights)


def head_points(records: list[AttentionRecord], layer: int, head: int, *, tokens: list[tuple[list[str], list[str]]]
                | None = None, translate: bool | None = None) -> HeadPoints:
    """A head's points over several captures (one per document) of the same model: pooled, then normalised
    together (one shift and one scale for every document: the softmax of each query still sees the same
    scores). ``tokens``: each capture's (query, key) tokens as shown (default: the records' display tokens)."""
    translate = translation_is_exact(records[0], layer) if translate is None else translate
    all_queries, all_keys, documents = [], [], []
    query_tokens, key_tokens, query_positions, key_positions = [], [], [], []
    n_q = n_k = 0
    for index, record in enumerate(records):
        queries, keys, document = raw_head(record, layer, head)
        documents.append(Document(range(n_q, n_q + len(queries)), range(n_k, n_k + len(keys)), document.allowed,
                                  document.top, document.weights))
        shown = tokens[index] if tokens is not None else (record.query_display, record.key_display)
        query_tokens += list(shown[0])
        key_tokens += list(shown[1])
        query_positions += list(range(len(queries)))
        key_positions += list(range(len(keys)))
        all_queries.append(queries)
        all_keys.append(keys)
        n_q, n_k = n_q + len(queries), n_k + len(keys)
    queries, keys, shift, scale = normalise(torch.cat(all_queries), torch.cat(all_keys), translate)
    return HeadPoints(queries, keys, query_tokens, key_tokens, query_positions, key_positions, documents, shift,
                      scale, translate)


def weights_from_points(points: HeadPoints, record: AttentionRecord, layer: int, head: int,
                        document: int = 0) -> torch.Tensor:
    """The head's weights computed again from the normalised points of one document, with the record's own scale,
    soft-cap, bias, mask and sink: ``[n_q, n_k]`` (equal to the model's where the normalisation is exact)."""
    span = points.documents[document]
    q = points.queries[span.queries.start:span.queries.stop][None]  # [1, n_q, d]
    k = points.keys[span.keys.start:span.keys.stop][None]  # [1, n_k, d]
    bias = record.bias_rows(layer)
    logits = scoring.logits(q, k, record.scales[layer], softcap=record.softcaps[layer] if record.softcaps else None,
                            biases=(None if bias is None else bias[head: head + 1].double(),))
    sinks = record.sinks[layer] if record.sinks else None
    return scoring.weights(logits, span.allowed[None], None if sinks is None else sinks[head: head + 1])[0]


def project(points: HeadPoints, method: str = "PCA", dims: int = 2, *, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> torch.Tensor:
    """Queries then keys as ``[n_q + n_k, dims]`` coordinates: PCA (the plane, or space, of largest spread of both
    together), t-SNE or UMAP (seeded). PCA always works; t-SNE needs scikit-learn, UMAP umap-learn."""
    if method not in PROJECTIONS:
        raise ValueError(f"unknown projection {method!r}: one of {', '.join(PROJECTIONS)}")
    if dims not in (2, 3):
        raise ValueError("a picture has 2 or 3 dimensions")
    both = torch.cat([points.queries, points.keys]).double()  # [n_q + n_k, d]
    if len(both) <= dims:
        return torch.zeros(len(both), dims, dtype=torch.float64)
    if method == "PCA":
        centred = both - both.mean(0)
        _, _, basis = torch.linalg.svd(centred, full_matrices=False)  # [min(n, d), d]
        projected = centred @ basis[:dims].T
        if projected.shape[1] < dims:  # fewer directions than dimensions asked
            projected = torch.cat([projected, projected.new_zeros(len(both), dims - projected.shape[1])], 1)
        return projected
    if progress is not None:
        progress(f"{method} of {len(both):,} points…")
    array = both.float().numpy()
    if method == "t-SNE":
        from sklearn.manifold import TSNE

        embedded = TSNE(n_components=dims, random_state=seed, init="pca",
                        perplexity=min(30.0, max(2.0, (len(array) - 1) / 3))).fit_transform(array)
    else:
        try:
            import umap
        except ImportError:
            raise ValueError("UMAP needs umap-learn (pip install umap-learn); PCA and t-SNE work without") from None
        embedded = umap.UMAP(n_components=dims, random_state=seed,
                             n_neighbors=min(15, max(2, len(array) - 1))).fit_transform(array)
    return torch.from_numpy(embedded).double()


def trust(points: HeadPoints, coordinates: torch.Tensor, ks: tuple[int, ...] = TRUST_KS) -> dict[int, float]:
    """For each query, whether the key it attends to most is among its ``k`` nearest keys in the picture (of the
    keys it may attend to in its document): the share of queries where it is, for each ``k``."""
    n_q = len(points.queries)
    found = {k: 0 for k in ks}
    counted = 0
    for document in points.documents:
        q = coordinates[document.queries.start:document.queries.stop]  # [n_q_doc, dims]
        k = coordinates[n_q + document.keys.start:n_q + document.keys.stop]  # [n_k_doc, dims]
        distance = torch.cdist(q, k).masked_fill(~document.allowed, float("inf"))  # [n_q_doc, n_k_doc]
        rank = (distance < distance.gather(1, document.top[:, None])).sum(-1)  # keys nearer than the top key
        has_key = document.allowed.any(-1)
        counted += int(has_key.sum())
        for size in ks:
            found[size] += int(((rank < size) & has_key).sum())
    return {size: found[size] / counted if counted else float("nan") for size in ks}
