"""What every head does on one document, and the mergeable aggregate of many: the statistics of a scan.

:func:`document_partial` reads one document's weights (``[layers, heads, n, n]``, rows summing to 1) and returns a
:class:`Partial`: sums, squared sums and counts per head and statistic (row level and document level), label
counts, the weight at each relative offset, a histogram of each query's largest weight, each head's top examples per
criterion (a bounded heap), and the rows that go to the database as they are (per-document head statistics, each
query's top key, token pairs, key tokens). ``a.merge(b)`` adds two partials; merging is exact for the counts and
the heaps, and for the sums up to the order of floating-point additions (float64), so a scan can be split,
resumed and run in parallel, its memory bounded by the heaps and one chunk of rows, not by the corpus.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from attnviz.core.analysis import (
    BROAD_ENTROPY,
    LABEL_RULES,
    MIN_LABELLED_QUERIES,
    STATISTICS,
    UNLABELLED,
    is_punctuation,
    label_indices,
    repeat_targets,
    row_statistics,
    separator_keys,
)

SCAN_STATISTICS = (*STATISTICS, "special", "max_weight")  # row statistics a scan keeps per head
LABELS = (*LABEL_RULES, "broad head", "mixed", UNLABELLED)  # the order of analysis.label_indices, then a document
# too short to label (fewer than MIN_LABELLED_QUERIES queries with a choice of key)
_LABEL_NAMES = np.array(LABELS, dtype=object)
MAX_OFFSET = 32  # the offset profile: mean weight at key - query = -32 .. +32
OFFSETS = tuple(range(-MAX_OFFSET, MAX_OFFSET + 1))
HISTOGRAM_BINS = 20  # of each query's largest weight, over 0..1
PAIR_KEYS = 3  # each query's strongest keys count for the (query token, key token) pairs
EXAMPLES = 12  # top examples kept per head and criterion
WINDOW_BEFORE, WINDOW_AFTER = 12, 6  # an example's context: keys this far before and after its query
KEY_CONTEXT = 3  # and, where its key lies outside that, this many tokens on either side of the key
# What an example shows the head doing most strongly: the value ranked, per query row.
CRITERIA = {
    "strongest": "largest weight on another ordinary token (not itself, not a special token)",
    "previous": "weight on the previous token",
    "next": "weight on the next token",
    "self": "weight on itself",
    "first": "weight on the first token",
    "separator": "weight on separator tokens ([SEP], </s>, <|endoftext|>)",
    "punctuation": "weight on punctuation",
    "duplicate": "weight on earlier occurrences of the query's token",
    "induction": "weight on the token after an earlier occurrence of the query's token",
    "focused": "1 - normalised entropy: all weight on few keys, the strongest an ordinary other token",
    "far": "mean distance of the weight, in tokens",
}
# Reported beside the statistics: BROAD_ENTROPY is the threshold of the "broad head" label.
LABEL_NOTE = (f"a document's label is its head's, by the rules of Explore heads (broad: entropy >= {BROAD_ENTROPY}); "
              f"a document with fewer than {MIN_LABELLED_QUERIES} queries that see more than one key is not labelled")


def token_id_of(piece: str) -> int:
    """A stable id for a token without a tokenizer id (a stand-in tokenizer): the first 62 bits of its SHA-256,
    negated so it never meets a real id."""
    return -int.from_bytes(hashlib.sha256(piece.encode("utf-8", "surrogatepass")).digest()[:8], "big") // 4 - 1


@dataclass
class Example:
    score: float
    doc: int
    query: int
    key: int  # the key the criterion points at (the row's strongest, among ordinary keys for "strongest")
    weight: float  # that key's weight
    window_start: int
    tokens: list[str]  # the readable tokens of ``positions``
    weights: list[float]  # the query's weights on them
    positions: list[int] | None = None  # the window's positions (None: window_start onwards, one run): the query's
    # context and, where the key lies outside it, a few tokens around the key (two runs)

    def order(self) -> tuple:
        """Best first; ties go to the earlier document and query, so every split of a scan keeps the same ones."""
        return (-self.score, self.doc, self.query)


@dataclass
class Partial:
    n_layers: int
    n_heads: int
    sums: np.ndarray = None  # [layers, heads, stats]: over query rows
    squares: np.ndarray = None
    counts: np.ndarray = None  # rows where the statistic is defined
    doc_sums: np.ndarray = None  # [layers, heads, stats]: over documents (each document's mean)
    doc_squares: np.ndarray = None
    doc_counts: np.ndarray = None
    labels: np.ndarray = None  # [layers, heads, labels]: documents where the head got each label
    offsets: np.ndarray = None  # [layers, heads, offsets]: weight at key - query = offset, summed over rows
    offset_rows: np.ndarray = None  # [offsets]: rows that have a key at that offset
    histogram: np.ndarray = None  # [layers, heads, bins]: rows by their largest weight
    examples: dict = field(default_factory=dict)  # (layer, head, criterion) -> [Example], best first
    changed: set = field(default_factory=set)  # the slots of ``examples`` changed since the last take_rows
    # Rows for the database, as column arrays per table (one chunk's; the runner writes and drops them)
    rows: dict = field(default_factory=dict)  # table -> list of {column: array}
    tokens: dict = field(default_factory=dict)  # token id -> (piece, readable)
    documents: list = field(default_factory=list)  # {doc, n_tokens, truncated}

    def __post_init__(self):
        shape = (self.n_layers, self.n_heads)
        stats = len(SCAN_STATISTICS)
        for name, size, dtype in (("sums", stats, np.float64), ("squares", stats, np.float64),
                                  ("counts", stats, np.int64), ("doc_sums", stats, np.float64),
                                  ("doc_squares", stats, np.float64), ("doc_counts", stats, np.int64),
                                  ("labels", len(LABELS), np.int64), ("offsets", len(OFFSETS), np.float64),
                                  ("histogram", HISTOGRAM_BINS, np.int64)):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros((*shape, size), dtype=dtype))
        if self.offset_rows is None:
            self.offset_rows = np.zeros(len(OFFSETS), dtype=np.int64)

    ARRAYS = ("sums", "squares", "counts", "doc_sums", "doc_squares", "doc_counts", "labels", "offsets",
              "offset_rows", "histogram")

    def merge(self, other: Partial) -> Partial:
        """Add ``other`` into this partial (in place) and return it."""
        if (other.n_layers, other.n_heads) != (self.n_layers, self.n_heads):
            raise ValueError("partials of different models cannot be merged")
        for name in self.ARRAYS:
            getattr(self, name).__iadd__(getattr(other, name))
        for key, found in other.examples.items():
            merged = best_examples([*self.examples.get(key, []), *found])
            if merged != self.examples.get(key):
                self.examples[key] = merged
                self.changed.add(key)
        for table, chunks in other.rows.items():
            self.rows.setdefault(table, []).extend(chunks)
        self.tokens.update(other.tokens)
        self.documents.extend(other.documents)
        return self

    def take_rows(self) -> tuple[dict, dict, list, set]:
        """The rows, tokens, documents and changed example slots gathered since the last call (for the database),
        forgotten here."""
        taken = self.rows, self.tokens, self.documents, self.changed
        self.rows, self.tokens, self.documents, self.changed = {}, {}, [], set()
        return taken

    def floors(self) -> np.ndarray:
        """``[layers, heads, criteria]``: the score an example must beat to enter its heap (-inf while not full)."""
        floor = np.full((self.n_layers, self.n_heads, len(CRITERIA)), -np.inf)
        for (layer, head, criterion), kept in self.examples.items():
            if len(kept) >= EXAMPLES:
                floor[layer, head, list(CRITERIA).index(criterion)] = kept[-1].score
        return floor


def best_examples(examples: list[Example]) -> list[Example]:
    return sorted(examples, key=Example.order)[:EXAMPLES]


def document_partial(doc: int, weights: torch.Tensor, pieces: list[str], readable: list[str],
                     special: list[bool], token_ids: list[int] | None, truncated: bool,
                     floors: np.ndarray | None = None, into: Partial | None = None, *,
                     separators: list[bool] | None = None, allowed: torch.Tensor | None = None) -> Partial:
    """The partial of one document. ``weights``: every layer's ``[layers, heads, n, n]`` (rows sum to 1);
    ``pieces`` are the tokenizer's tokens, ``readable`` how pages show them, ``token_ids`` the tokenizer's ids
    (None: :func:`token_id_of` each piece). ``floors`` (``[layers, heads, criteria]``, from
    :meth:`Partial.floors`) lets it skip examples that could not enter the heaps anyway; it is raised in place as
    the heaps of ``into`` fill, so a chunk's documents skip more and more. ``into``: a partial to add the document
    to (a chunk's), returned; by default a new one. ``separators``: which tokens are separators by the tokenizer
    (:meth:`attnviz.models.record.Capture.separators_of`; None: every special token but the first). ``allowed``:
    ``[layers, n]``, how many keys each query may see in each layer (the model's mask; default: every key).

    Every layer's heads are read at once, as ``layers x heads`` flat heads (one pass of each operation per
    document); row values are computed in float32 (the weights' own precision) and summed in float64."""
    n_layers, n_heads, n = weights.shape[:3]
    if n != len(pieces):
        raise ValueError(f"{n} queries of weights for {len(pieces)} tokens")
    ids = np.asarray(token_ids if token_ids is not None else [token_id_of(p) for p in pieces], dtype=np.int64)
    keys = _KeyKinds(special, pieces, separators, ids)
    partial = Partial(n_layers, n_heads) if into is None else into
    partial.tokens.update({int(i): (p, r) for i, p, r in zip(ids.tolist(), pieces, readable, strict=True)})
    partial.documents.append({"doc": doc, "n_tokens": n, "truncated": truncated})
    partial.offset_rows += np.clip(n - np.abs(np.asarray(OFFSETS)), 0, None)
    shape = (n_layers, n_heads)
    weights = weights.float().reshape(n_layers * n_heads, n, n)  # [layers * heads, n, n]
    allowed = (torch.full((n_layers, n), n) if allowed is None else allowed).repeat_interleave(n_heads, 0)
    values = row_statistics(weights, 0, keys.separators, keys.punctuation, dtype=torch.float32,
                            extra_keys={"special": keys.special}, targets=keys.targets,
                            allowed=allowed)  # {name: [layers * heads, n]}
    top_weight, top_key = weights.max(-1)  # [layers * heads, n]
    values["max_weight"] = top_weight
    _add_statistics(partial, doc, values)
    # the weight at each offset key - query, in one scatter: cells past +-MAX_OFFSET land in two spare columns
    by_offset = torch.zeros(n_layers * n_heads, len(OFFSETS) + 2)  # a document's sums in float32, added in float64
    by_offset.index_add_(1, keys.offset_column, weights.reshape(n_layers * n_heads, -1))
    partial.offsets += by_offset[:, 1:-1].reshape(*shape, -1).double().numpy()
    bins = (top_weight * HISTOGRAM_BINS).long().clamp(0, HISTOGRAM_BINS - 1)  # [layers * heads, n]
    histogram = torch.zeros(n_layers * n_heads, HISTOGRAM_BINS, dtype=torch.int64)
    partial.histogram += histogram.scatter_add_(1, bins, torch.ones_like(bins)).reshape(*shape, -1).numpy()
    _add_rows(partial, doc, weights, top_weight, top_key, ids)
    _add_examples(partial, doc, weights, values, top_key, keys, readable, allowed,
                  None if floors is None else floors.reshape(n_layers * n_heads, -1))
    return partial


class _KeyKinds:
    """What a document's positions are: special tokens, separators, punctuation; the targets of the repeat
    detectors; which keys "strongest" and "focused" look past (the query itself, the first token and the special
    tokens, where heads park their weight); each cell's offset column."""

    def __init__(self, special: list[bool], pieces: list[str], separators: list[bool] | None, ids: np.ndarray):
        n = len(pieces)
        self.special = torch.tensor(special, dtype=torch.bool)  # [n]
        self.separators = separator_keys(special, separators)
        self.punctuation = torch.tensor([is_punctuation(p) for p in pieces], dtype=torch.bool)
        self.targets = repeat_targets(ids.tolist(), special)  # {name: [n, n]}
        parked = self.special.clone()
        parked[:1] = True  # the first token: where a decoder parks its weight, special or not
        self.ordinary = (~(parked.unsqueeze(0) | torch.eye(n, dtype=torch.bool))).float()  # [query, key]
        relative = torch.arange(n).unsqueeze(0) - torch.arange(n).unsqueeze(1)  # [n, n]: key - query
        self.offset_column = (relative.clamp(-MAX_OFFSET - 1, MAX_OFFSET + 1) + MAX_OFFSET + 1).reshape(-1)


def _flat_heads(partial: Partial, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(layer, head) of each of ``size`` rows per flat head, for the database's rows."""
    flat = np.arange(partial.n_layers * partial.n_heads)
    return (np.repeat(flat // partial.n_heads, size).astype(np.int16),
            np.repeat(flat % partial.n_heads, size).astype(np.int16))


def _add_statistics(partial: Partial, doc: int, values: dict[str, torch.Tensor]) -> None:
    shape = (partial.n_layers, partial.n_heads, len(SCAN_STATISTICS))
    stacked = torch.stack([values[name] for name in SCAN_STATISTICS]).double()  # [stats, flat heads, n]; NaN: none
    present = ~stacked.isnan()  # [stats, flat heads, n]
    rows = torch.where(present, stacked, torch.zeros_like(stacked))
    counts = present.sum(-1).T  # [flat heads, stats]
    totals = rows.sum(-1).T  # [flat heads, stats]
    partial.sums += totals.reshape(shape).numpy()
    partial.squares += (rows * rows).sum(-1).T.reshape(shape).numpy()
    partial.counts += counts.reshape(shape).numpy()
    doc_means = (totals / counts.clamp_min(1)).numpy()  # [flat heads, stats]
    defined = (counts > 0).numpy()
    partial.doc_sums += np.where(defined, doc_means, 0.0).reshape(shape)
    partial.doc_squares += np.where(defined, doc_means**2, 0.0).reshape(shape)
    partial.doc_counts += defined.reshape(shape)
    label_index = label_indices({name: np.where(defined[:, i], doc_means[:, i], 0.0)
                                 for i, name in enumerate(SCAN_STATISTICS)})  # [flat heads] into LABELS
    choices = counts[:, SCAN_STATISTICS.index("normalised_entropy")].numpy()  # queries with more than one key
    label_index = np.where(choices >= MIN_LABELLED_QUERIES, label_index, LABELS.index(UNLABELLED))
    partial.labels += np.eye(len(LABELS), dtype=np.int64)[label_index].reshape(*shape[:2], -1)
    layer_of, head_of = _flat_heads(partial, 1)
    columns = {"doc": np.full(len(label_index), doc, dtype=np.int32), "layer": layer_of, "head": head_of}
    columns.update({name: np.where(defined[:, i], doc_means[:, i], np.nan) for i, name in enumerate(SCAN_STATISTICS)})
    columns["label"] = _LABEL_NAMES[label_index]
    partial.rows.setdefault("head_documents", []).append(columns)


def _add_rows(partial: Partial, doc: int, weights: torch.Tensor, top_weight: torch.Tensor, top_key: torch.Tensor,
              ids: np.ndarray) -> None:
    """Each query's strongest key (one row per head and query), the (query token, key token) pairs of each query's
    PAIR_KEYS strongest keys, and the weight each key token received."""
    flat, n, _ = weights.shape
    layer_of, head_of = _flat_heads(partial, n)
    query_of = np.tile(np.arange(n, dtype=np.int32), flat)
    keys = top_key.numpy().reshape(-1)
    partial.rows.setdefault("query_top_keys", []).append({
        "doc": np.full(flat * n, doc, dtype=np.int32), "layer": layer_of, "head": head_of, "query": query_of,
        "query_id": ids[query_of], "key": keys.astype(np.int32), "key_id": ids[keys],
        "weight": top_weight.numpy().reshape(-1).astype(np.float32)})
    top_weights, top_keys = strongest_keys(weights, top_weight, top_key, min(PAIR_KEYS, n))  # [flat heads, n, k]
    pair_weights = top_weights.numpy().reshape(-1)
    pair_keys = top_keys.numpy().reshape(-1)
    k = top_weights.shape[-1]
    kept = pair_weights > 0
    partial.rows.setdefault("pair_parts", []).append({
        "layer": np.repeat(layer_of, k)[kept], "head": np.repeat(head_of, k)[kept],
        "query_id": ids[np.repeat(query_of, k)][kept], "key_id": ids[pair_keys][kept],
        "weight": pair_weights[kept].astype(np.float64)})
    received = weights.sum(1).double()  # [flat heads, n]: the weight each key position received
    unique, where = np.unique(ids, return_inverse=True)
    totals = torch.zeros(flat, len(unique), dtype=torch.float64).index_add_(1, torch.from_numpy(where), received)
    occurrences = np.bincount(where, minlength=len(unique))
    layer_of, head_of = _flat_heads(partial, len(unique))
    partial.rows.setdefault("key_parts", []).append({
        "layer": layer_of, "head": head_of, "key_id": np.tile(unique, flat), "weight": totals.numpy().reshape(-1),
        "occurrences": np.tile(occurrences, flat).astype(np.int64)})


def strongest_keys(weights: torch.Tensor, top_weight: torch.Tensor, top_key: torch.Tensor,
                   k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` largest weights and their keys, largest first (``[heads, n, k]`` each), from its largest
    (``top_weight``, ``top_key``, ``[heads, n]``): one more max per key on a copy with the keys found taken out,
    which costs half of a ``topk`` at a few hundred keys. Ties go to the earlier key, as in ``max``."""
    values, indices = [top_weight], [top_key]
    if k > 1:
        rest = weights.clone()  # [heads, n, n_k]
        for _ in range(k - 1):
            rest.scatter_(-1, indices[-1].unsqueeze(-1), -1.0)
            value, index = rest.max(-1)
            values.append(value)
            indices.append(index)
    return torch.stack(values, dim=-1), torch.stack(indices, dim=-1)


def _add_examples(partial: Partial, doc: int, weights: torch.Tensor, values: dict[str, torch.Tensor],
                  top_key: torch.Tensor, keys: _KeyKinds, readable: list[str], allowed: torch.Tensor,
                  floors: np.ndarray | None) -> None:
    """Each head's best query of this document by every criterion, kept if it can enter the head's heap.
    ``weights`` and ``values`` are over flat heads (layer * heads + head); ``allowed`` ``[flat heads, n]``: keys
    each query may see; ``floors`` ``[flat heads, criteria]``. A query with one allowed key (under a causal mask,
    the first) is an example of nothing: it has no choice."""
    n = weights.shape[-1]
    strongest, strongest_key = (weights * keys.ordinary).max(-1)  # [flat heads, n]: past itself, first, special
    on_ordinary = keys.ordinary.gather(1, top_key.T).T > 0  # [flat heads, n]: the row's strongest key is ordinary
    focused = torch.where(on_ordinary, 1 - values["normalised_entropy"], torch.full_like(strongest, float("nan")))
    scores = {"strongest": strongest, "focused": focused, "far": values["mean_distance"]}
    stacked = torch.stack([scores[c] if c in scores else values[c] for c in CRITERIA])  # [criteria, flat heads, n]
    stacked = torch.where((allowed > 1).unsqueeze(0), stacked, torch.full_like(stacked, float("nan")))
    best_score, best_query = torch.nan_to_num(stacked, nan=-np.inf).max(-1)  # [criteria, flat heads]
    best_score, best_query = best_score.T.numpy(), best_query.T.numpy()  # [flat heads, criteria]
    wanted = np.isfinite(best_score) & (best_score > 0)
    if floors is not None:
        wanted &= best_score >= floors
    if not wanted.any():
        return
    criteria = list(CRITERIA)
    flats, columns = np.nonzero(wanted)
    queries = best_query[flats, columns]
    picked = weights[torch.from_numpy(flats), torch.from_numpy(queries)]  # [candidates, n]
    rows, shown = picked.numpy(), torch.round(picked.double(), decimals=5).numpy()  # shown: what an example keeps
    key_of = _pointed_keys(criteria, columns, queries, picked, strongest_key.numpy()[flats, queries],
                           top_key.numpy()[flats, queries], keys)  # [candidates]
    scores = best_score[flats, columns]
    for i, (flat, c, query, key) in enumerate(zip(flats.tolist(), columns.tolist(), queries.tolist(),
                                                  key_of.tolist(), strict=True)):
        if floors is not None and scores[i] < floors[flat, c]:  # a heap this document filled since
            continue
        criterion = criteria[c]
        positions = window_positions(query, key, n)
        example = Example(float(scores[i]), doc, query, key, float(rows[i, key]), positions[0],
                          [readable[p] for p in positions], shown[i, positions].tolist(), positions)
        slot = (flat // partial.n_heads, flat % partial.n_heads, criterion)
        kept = partial.examples.setdefault(slot, [])
        bisect.insort(kept, example, key=Example.order)
        del kept[EXAMPLES:]
        partial.changed.add(slot)
        if floors is not None and len(kept) == EXAMPLES:
            floors[flat, c] = max(floors[flat, c], kept[-1].score)


def window_positions(query: int, key: int, n: int) -> list[int]:
    """The positions an example shows: WINDOW_BEFORE tokens before the query and WINDOW_AFTER after it, and, where
    the key lies outside that, KEY_CONTEXT tokens on either side of the key (two runs, shown with a gap)."""
    start, end = max(0, query - WINDOW_BEFORE), min(n, query + WINDOW_AFTER + 1)
    shown = set(range(start, end))
    if not start <= key < end:
        shown.update(range(max(0, key - KEY_CONTEXT), min(n, key + KEY_CONTEXT + 1)))
    return sorted(shown)


def _pointed_keys(criteria: list[str], columns: np.ndarray, queries: np.ndarray, picked: torch.Tensor,
                  strongest_key: np.ndarray, top_key: np.ndarray, keys: _KeyKinds) -> np.ndarray:
    """The key each example's criterion points at (``[candidates]``): the previous, next or same position, the
    first token, the strongest separator, punctuation, earlier-occurrence or induction key, the strongest ordinary
    key for "strongest", and the row's strongest key for "focused" and "far" (criteria of the whole row)."""
    pointed = top_key.copy()
    by_criterion = {"strongest": strongest_key, "previous": queries - 1, "next": queries + 1, "self": queries,
                    "first": np.zeros_like(queries)}
    for name, kind in (("separator", keys.separators), ("punctuation", keys.punctuation)):
        by_criterion[name] = (picked * kind.to(picked.dtype)).argmax(-1).numpy()  # [candidates]
    for name, targets in keys.targets.items():  # each candidate query's own targets
        by_criterion[name] = (picked * targets[torch.from_numpy(queries)].to(picked.dtype)).argmax(-1).numpy()
    for name, chosen in by_criterion.items():
        where = columns == criteria.index(name)
        pointed[where] = chosen[where]
    return pointed
