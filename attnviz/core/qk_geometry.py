"""Queries and keys as points of one space (AttentionViz, Yeh et al. 2023), placed so that a query lies near the
keys it attends to; the projections of that space to 2 or 3 dimensions, and how far to trust them.

Two changes leave every attention weight as it is and make distance mean attention:

* **scaling**: queries times ``c``, keys divided by ``c``; dot products are unchanged;
* **translation**: every key moves by the same vector, so that the keys' centroid meets the queries'. A query's
  scores then all change by the same amount (``q · (k + t) = q · k + q · t``), which its softmax does not see;

with ``c`` chosen so that, after both, queries and keys have the same mean norm. The translation is exact only
where a score is a plain dot product plus terms that do not depend on the key's vector (no soft-cap, no sink): the
caller says whether to translate.

Value vectors, where asked, are a third set: they are never compared with queries, so no placement makes their
distance to a query mean anything. They are centred on the keys' centroid with the keys' mean spread, so that their
own clusters (tokens the head would pass on alike) show in the same picture.

This module is the geometry alone, on tensors (imports torch; scikit-learn and umap-learn lazily): the page builds
its points from a capture (:mod:`attnviz.pagelogic.queries_keys`), a scan from the sample kept in its database
(:mod:`attnviz.corpus.scan.qk_sample`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

PROJECTIONS = ("PCA", "t-SNE", "UMAP")
TRUST_KS = (1, 5, 10)
STRONGEST = 3  # keys a query's lines go to


@dataclass
class Document:
    """Where one document's points are in a :class:`HeadPoints`: its queries and keys (index ranges), which key
    each query may attend to (``allowed`` ``[n_q, n_k]`` bool, True = may attend) and the keys it attends to most,
    strongest first (``strongest_keys`` ``[n_q, s]``, indices among the document's keys, and their weights)."""

    queries: range
    keys: range
    allowed: torch.Tensor
    strongest_keys: torch.Tensor
    strongest_weights: torch.Tensor

    @property
    def top(self) -> torch.Tensor:
        """``[n_q]``: the key each query attends to most."""
        return self.strongest_keys[:, 0]


def strongest(weights: torch.Tensor, allowed: torch.Tensor, count: int = STRONGEST
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` keys each query attends to most among those it may (``weights``, ``allowed`` ``[n_q, n_k]``):
    ``(keys [n_q, count], weights [n_q, count])``, strongest first."""
    count = min(count, weights.shape[-1])
    found = weights.float().masked_fill(~allowed, -1.0).topk(count, dim=-1)
    return found.indices, found.values.clamp_min(0.0)


@dataclass
class DocumentVectors:
    """One document's vectors of one head as the model used them (after RoPE; for a grouped-query head, its K/V
    head's keys and values), and what the pictures say of them."""

    queries: torch.Tensor  # [n_q, d]
    keys: torch.Tensor  # [n_k, d]
    allowed: torch.Tensor  # [n_q, n_k] bool, True = may attend
    strongest_keys: torch.Tensor  # [n_q, s]
    strongest_weights: torch.Tensor  # [n_q, s]
    query_tokens: list[str]
    key_tokens: list[str]
    values: torch.Tensor | None = None  # [n_k, d_v]
    query_categories: list[str] | None = None
    key_categories: list[str] | None = None
    name: int = 0  # what the document is called (its number in the corpus)


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
    values: torch.Tensor | None = None  # [n_k, d_v] placed as the module's docstring says (None: not asked)
    query_categories: list[str] | None = None
    key_categories: list[str] | None = None
    document_names: list[int] | None = None  # each document's number in its corpus (default: its index)

    @property
    def query_documents(self) -> list[int]:
        return [index for index, document in enumerate(self.documents) for _ in document.queries]

    @property
    def key_documents(self) -> list[int]:
        return [index for index, document in enumerate(self.documents) for _ in document.keys]

    def document_name(self, index: int) -> int:
        return self.document_names[index] if self.document_names else index

    def document_of_query(self, query: int) -> tuple[int, Document]:
        """(index, document) of the document that query ``query`` (an index among all queries) belongs to."""
        for index, document in enumerate(self.documents):
            if query in document.queries:
                return index, document
        raise IndexError(f"no query {query}")


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


def translation_is_exact(record, layer: int) -> bool:
    """Whether moving every key of ``layer`` by one vector leaves its weights unchanged: no soft-cap and no sink
    (``record``: an :class:`attnviz.models.record.AttentionRecord`, read by attribute)."""
    softcap = record.softcaps[layer] if record.softcaps else None
    sinks = record.sinks[layer] if record.sinks else None
    return not softcap and sinks is None


def place_values(values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``values [n, d_v]`` centred on the (normalised) ``keys``' centroid with the keys' mean spread around it.
    Only their arrangement among themselves means something (see the module's docstring)."""
    values, keys = values.double(), keys.double()
    centred = values - values.mean(0)
    spread = float(centred.norm(dim=-1).mean())
    key_spread = float((keys - keys.mean(0)).norm(dim=-1).mean())
    scaled = centred * (key_spread / spread) if spread > 0 else centred
    if scaled.shape[1] == keys.shape[1]:
        return scaled + keys.mean(0)
    return scaled  # another width than the keys': around the origin (a projection centres everything anyway)


def pool(documents: list[DocumentVectors], translate: bool = True) -> HeadPoints:
    """One head's points over several documents, pooled and normalised together: one shift and one scale for every
    document, so each query's softmax still sees the same scores. Values are placed only if every document has
    them."""
    documents_out, positions_q, positions_k = [], [], []
    query_tokens, key_tokens, query_categories, key_categories = [], [], [], []
    n_q = n_k = 0
    for vectors in documents:
        size_q, size_k = len(vectors.queries), len(vectors.keys)
        documents_out.append(Document(range(n_q, n_q + size_q), range(n_k, n_k + size_k), vectors.allowed,
                                      vectors.strongest_keys, vectors.strongest_weights))
        query_tokens += list(vectors.query_tokens)
        key_tokens += list(vectors.key_tokens)
        query_categories += list(vectors.query_categories or ["token"] * size_q)
        key_categories += list(vectors.key_categories or ["token"] * size_k)
        positions_q += list(range(size_q))
        positions_k += list(range(size_k))
        n_q, n_k = n_q + size_q, n_k + size_k
    queries, keys, shift, scale = normalise(torch.cat([v.queries for v in documents]),
                                            torch.cat([v.keys for v in documents]), translate)
    values = None
    if documents and all(v.values is not None for v in documents):
        values = place_values(torch.cat([v.values for v in documents]), keys)
    return HeadPoints(queries, keys, query_tokens, key_tokens, positions_q, positions_k, documents_out, shift, scale,
                      translate, values, query_categories, key_categories, [v.name for v in documents])


def project(points: HeadPoints, method: str = "PCA", dims: int = 2, *, seed: int = 0, with_values: bool = False,
            progress: Callable[[str], None] | None = None) -> torch.Tensor:
    """Queries, then keys, then (``with_values``) values as ``[n_q + n_k (+ n_k), dims]`` coordinates: PCA (the
    plane, or space, of largest spread of them together), t-SNE or UMAP (seeded). PCA always works; t-SNE needs
    scikit-learn, UMAP umap-learn."""
    if method not in PROJECTIONS:
        raise ValueError(f"unknown projection {method!r}: one of {', '.join(PROJECTIONS)}")
    if dims not in (2, 3):
        raise ValueError("a picture has 2 or 3 dimensions")
    parts = [points.queries, points.keys]
    if with_values:
        if points.values is None:
            raise ValueError("these points hold no value vectors")
        if points.values.shape[1] != points.keys.shape[1]:
            raise ValueError("this head's values are not as wide as its keys: they cannot share its picture")
        parts.append(points.values)
    both = torch.cat(parts).double()  # [n_q + n_k (+ n_v), d]
    if len(both) <= dims:
        return torch.zeros(len(both), dims, dtype=torch.float64)
    if method == "PCA":
        return torch.from_numpy(principal_components(both.numpy(), dims))
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
            raise ValueError("UMAP needs umap-learn (pip install -r requirements.txt); PCA and t-SNE work "
                             "without") from None
        # a spectral start needs more points than a handful; on fewer, a seeded random one
        embedded = umap.UMAP(n_components=dims, random_state=seed, n_jobs=1,  # seeded: one thread either way
                             init="spectral" if len(array) > 50 else "random",
                             n_neighbors=min(15, max(2, len(array) - 1))).fit_transform(array)
    return torch.from_numpy(embedded).double()


def principal_components(points: np.ndarray, dims: int) -> np.ndarray:
    """``points [n, d]`` on their ``dims`` directions of largest spread: ``[n, dims]``, each direction's sign fixed
    (its largest component positive) so the same points always give the same picture. By the eigenvectors of the
    ``[d, d]`` covariance: a few milliseconds for 20,000 points, where an SVD of the points themselves takes a
    second."""
    centred = points - points.mean(0)
    _, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
    basis = vectors[:, ::-1][:, :dims]  # [d, min(d, dims)]
    basis = basis * np.sign(basis[np.abs(basis).argmax(0), np.arange(basis.shape[1])] + 1e-300)
    projected = centred @ basis
    if projected.shape[1] < dims:  # fewer directions than dimensions asked
        projected = np.concatenate([projected, np.zeros((len(points), dims - projected.shape[1]))], 1)
    return projected


def _allowed_counts(document: Document) -> torch.Tensor:
    """``[n_q_doc]``: how many keys each query of ``document`` may attend to."""
    return document.allowed.sum(-1)


def trust(points: HeadPoints, coordinates: torch.Tensor, ks: tuple[int, ...] = TRUST_KS) -> dict[int, float]:
    """For each ``k``, the share of queries whose strongest key is among their ``k`` nearest keys in the picture (of
    the keys they may attend to in their document), over the queries that may attend to more than ``k`` keys: a
    query with ``k`` or fewer has all of them among its ``k`` nearest whatever the picture (a causal decoder's first
    ``k`` queries), so counting it would say nothing of the projection. NaN for a ``k`` no query has more keys than
    (:func:`trust_counted` says how many were counted)."""
    n_q = len(points.queries)
    found = {k: 0 for k in ks}
    counted = {k: 0 for k in ks}
    for document in points.documents:
        q = coordinates[document.queries.start:document.queries.stop]  # [n_q_doc, dims]
        k = coordinates[n_q + document.keys.start:n_q + document.keys.stop]  # [n_k_doc, dims]
        distance = torch.cdist(q, k).masked_fill(~document.allowed, float("inf"))  # [n_q_doc, n_k_doc]
        rank = (distance < distance.gather(1, document.top[:, None])).sum(-1)  # keys nearer than the top key
        allowed = _allowed_counts(document)
        for size in ks:
            more = allowed > size
            counted[size] += int(more.sum())
            found[size] += int(((rank < size) & more).sum())
    return {size: found[size] / counted[size] if counted[size] else float("nan") for size in ks}


def trust_counted(points: HeadPoints, ks: tuple[int, ...] = TRUST_KS) -> dict[int, int]:
    """For each ``k``, how many queries :func:`trust` counts: those that may attend to more than ``k`` keys."""
    return {size: sum(int((_allowed_counts(document) > size).sum()) for document in points.documents)
            for size in ks}
