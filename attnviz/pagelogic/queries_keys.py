"""Queries and keys in one picture (AttentionViz, Yeh et al. 2023) from a capture: a head's query and key vectors
(and values, where asked) as the model used them, normalised so that distance means attention
(:mod:`attnviz.core.qk_geometry`: the normalisation, projections and the trust measure), and the weights computed again
from them as a check.

The translation is exact only where a score is a plain dot product plus terms that do not depend on the key's
vector: a soft-cap (Gemma 2) bends scores, and a sink (gpt-oss) is a score that does not move with them, so for
those heads only the scaling is applied (and said). Grouped-query heads: each query head with its own K/V head.

Imports torch and attnviz.models.
"""

from __future__ import annotations

import torch

from attnviz.core.analysis import token_categories
from attnviz.core.qk_geometry import (
    PROJECTIONS,
    STRONGEST,
    TRUST_KS,
    Document,
    DocumentVectors,
    HeadPoints,
    normalise,
    pool,
    project,
    strongest,
    translation_is_exact,
    trust,
    trust_counted,
)
from attnviz.models import scoring
from attnviz.models.record import AttentionRecord
from attnviz.pagelogic.clicks import customdata_numbers, selected_points

__all__ = ["PROJECTIONS", "TRUST_KS", "Document", "DocumentVectors", "HeadPoints", "normalise", "project", "trust",
           "trust_counted", "translation_is_exact", "raw_head", "head_points", "weights_from_points",
           "trust_statement", "clicked_query"]


def raw_head(record: AttentionRecord, layer: int, head: int, *, values: bool = False,
             tokens: tuple[list[str], list[str]] | None = None,
             special: tuple[list[bool], list[bool]] | None = None, name: int = 0) -> DocumentVectors:
    """One capture's vectors of a head as the model used them (queries ``[n_q, d]``; keys, and ``values``, of the
    K/V head a grouped query head reads), with its mask, strongest keys and tokens (default: the record's display
    tokens; ``special`` flags give each token's category)."""
    record.require_replay("Queries and keys")
    queries = record.queries[layer, head].float()  # [n_q, d]
    keys = record.keys[layer, record.kv_head(head)].float()  # [n_k, d]
    weights = record.head_weights(layer, head)  # [n_q, n_k]
    allowed = record.mask_rows(layer)  # [n_q, n_k]
    top_keys, top_weights = strongest(weights, allowed, STRONGEST)
    shown = tokens if tokens is not None else (record.query_display, record.key_display)
    categories = (None, None) if special is None else (token_categories(list(shown[0]), special[0]),
                                                       token_categories(list(shown[1]), special[1]))
    kept_values = record.values[layer, record.kv_head(head)].float() if values and record.values is not None else None
    return DocumentVectors(queries, keys, allowed, top_keys, top_weights, list(shown[0]), list(shown[1]),
                           kept_values, categories[0], categories[1], name)


def head_points(records: list[AttentionRecord], layer: int, head: int, *, tokens: list[tuple[list[str], list[str]]]
                | None = None, special: list[tuple[list[bool], list[bool]]] | None = None,
                translate: bool | None = None, values: bool = False,
                names: list[int] | None = None) -> HeadPoints:
    """A head's points over several captures (one per document) of the same model: pooled, then normalised
    together (one shift and one scale for every document: the softmax of each query still sees the same
    scores). ``tokens``: each capture's (query, key) tokens as shown (default: the records' display tokens);
    ``special``: each capture's (query, key) special-token flags, for the token categories; ``values``: keep the
    value vectors too; ``names``: each document's number in its corpus."""
    translate = translation_is_exact(records[0], layer) if translate is None else translate
    vectors = [raw_head(record, layer, head, values=values, tokens=None if tokens is None else tokens[index],
                        special=None if special is None else special[index],
                        name=index if names is None else names[index])
               for index, record in enumerate(records)]
    return pool(vectors, translate)


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


def trust_statement(counted: dict[int, int], n_queries: int) -> str:
    """What the trust shares counted, in words: at each k, the queries that may attend to more than k keys
    (``counted``, from :func:`trust_counted`) of the ``n_queries`` in the picture, and why the others are left out."""
    if all(number == n_queries for number in counted.values()):
        return (f"Each share is of all {n_queries:,} queries: every one may attend to more than "
                f"{max(counted)} keys.")
    parts = [f"{number:,} at k = {k}" if number else f"none at k = {k} (no share)" for k, number in counted.items()]
    return (f"Each share counts only the queries that may attend to more than k keys, of {n_queries:,}: "
            f"{', '.join(parts)}. A query with k keys or fewer has its strongest among its k nearest whatever the "
            "picture (a causal decoder's first queries), so it is left out.")


def clicked_query(selection, n_queries: int) -> int | None:
    """The query clicked in a head's picture (:func:`attnviz.viz.queries_keys.head_scatter`: customdata ``(3 x index +
    0 for a query, 1 a key, 2 a value; position; document)``), among ``n_queries``; None when no query is
    selected (a key, a value, a line, or one out of range)."""
    for point in selected_points(selection):
        numbers = customdata_numbers(point.get("customdata"))
        if numbers is not None and len(numbers) == 3 and numbers[0] >= 0 and numbers[0] % 3 == 0 \
                and numbers[0] // 3 < n_queries:
            return numbers[0] // 3
    return None
