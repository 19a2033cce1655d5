"""Head detectors from a notebook: how much of each head's attention falls on a pattern of (query, key) cells, every
head ranked, as the Head statistics tab of Explore heads scores them
(:mod:`attnviz.pagelogic.explore_heads.detectors`).
"""

from __future__ import annotations

import pandas as pd
import torch

from attnviz.api.capture import Captured
from attnviz.pagelogic.explore_heads.detectors import PATTERN_KINDS, detector_scores, pattern_targets

# Each named detector: the page's pattern kind and its spec (what the page's text box would hold)
DETECTORS = {
    "induction": ("induction", ""),
    "previous-token": ("offsets", "-1"),
    "duplicate-token": ("duplicate token", ""),
}
# The page's own pattern kinds that take a spec: detect(captured, "offsets", "-3, -2")
SPEC_KINDS = {"offsets": "offsets", "key-tokens": "key tokens", "matrix": "matrix"}


def _detector_name(kind: str) -> str:
    """A detector's name as :data:`DETECTORS` writes it: any case, with "_" or " " for "-", with or without
    "-head" (TransformerLens's ``"previous_token_head"`` is ``"previous-token"``)."""
    name = "-".join(kind.strip().lower().replace("_", " ").replace("-", " ").split())
    return name.removesuffix("-head").removesuffix("-heads")


def _custom_targets(pattern, captured: Captured, attention: str | None) -> torch.Tensor:
    """A pattern given as a tensor, or a callable of the capture that returns one: ``[query, key]``, checked."""
    record = captured.record(attention)
    targets = pattern(captured) if callable(pattern) else pattern
    targets = torch.as_tensor(targets).detach().cpu()
    if tuple(targets.shape) != (record.n_q, record.n_k):
        raise ValueError(f"the pattern is {tuple(targets.shape)}; this capture's attention is {record.n_q} queries x "
                         f"{record.n_k} keys, so the pattern must be [{record.n_q}, {record.n_k}] (query, key)")
    if targets.dtype == torch.bool:
        return targets
    if targets.is_complex() or not bool(torch.isfinite(targets.double()).all()):
        raise ValueError("the pattern must hold finite real numbers (or be boolean)")
    return targets.double()


def page_pattern(kind: str, spec: str = "") -> tuple[str, str]:
    """A detector's name as the page's pattern kind (a key of
    :data:`attnviz.pagelogic.explore_heads.detectors.PATTERN_KINDS`) and its spec."""
    name = _detector_name(kind)
    if name in DETECTORS:
        return DETECTORS[name]
    if name in SPEC_KINDS:
        return SPEC_KINDS[name], spec
    raise ValueError(f"no detector {kind!r}: name one of {', '.join(map(repr, DETECTORS))}, one of the page's "
                     f"patterns with its spec ({', '.join(map(repr, SPEC_KINDS))}), or give a [query, key] pattern "
                     "(a tensor, or a function of the capture that returns one)")


def targets_of(captured: Captured, kind, spec: str = "", *, attention: str | None = None) -> torch.Tensor:
    """The ``[query, key]`` cells a detector looks at on ``captured`` (see :func:`detect`): bool for a named one,
    the pattern itself (bool, or float64) for a custom one."""
    if isinstance(kind, str):
        page_kind, page_spec = page_pattern(kind, spec)
        record = captured.record(attention)
        if record.n_q != record.n_k or record.query_tokens is not record.key_tokens:
            raise ValueError(f"the named detectors read self-attention; {record.kind!r} attention has other queries "
                             "than keys: give a [query, key] pattern instead")
        return pattern_targets(page_kind, page_spec, captured.capture, record.key_tokens)
    return _custom_targets(kind, captured, attention)


def detect(captured_or_run, kind, spec: str = "", *, attention: str | None = None) -> pd.DataFrame:
    """Every head scored on a pattern of (query, key) cells, highest first: a DataFrame of ``layer``, ``head``,
    ``score`` and ``transformerlens_mul`` (TransformerLens's score of the same weights, below), one row per head
    (read the heads as ``frame["head"]``: ``frame.head`` is pandas' method).

    ``captured_or_run``: a :class:`~attnviz.api.capture.Captured` (one text), or anything with a ``detect(kind)``
    method, which is asked instead (a corpus scan's result). ``kind``:

    - ``"induction"``: key j + 1 after each earlier occurrence j of the query's token (same token id; "A B ... A"
      attends to B): what an induction head copies from (Olsson et al., 2022). Measure it on random tokens
      repeated twice, where every second-copy token has exactly one such key;
    - ``"duplicate-token"``: the earlier occurrences of the query's token;
    - ``"previous-token"``: key i - 1 of query i;
    - the page's own patterns with their ``spec``: ``"offsets"`` (``"-3, -2"``: keys at these offsets key -
      query), ``"key-tokens"`` (``"the, [SEP]"``: keys whose token is one of these words), ``"matrix"`` (0/1 rows);
    - a custom pattern: a ``[query, key]`` tensor (bool; or float, each cell's weight in the score), or a callable
      ``pattern(captured) -> tensor`` (e.g. ``lambda c: torch.ones(c.n_tokens, c.n_tokens).tril(-2).bool()``).

    Names are read in any case, with "_" or " " for "-", with or without "-head" (TransformerLens's
    ``"induction_head"``). Special tokens ([CLS], [SEP], a BOS the tokenizer adds) are neither queries nor
    occurrences of the repeat patterns (induction, duplicate-token); the offsets patterns count every token.

    **The score** of a head is its attention weight on the pattern, averaged over the queries the pattern gives at
    least one key: ``score = sum over such queries i of sum_j w[i, j] P[i, j], divided by their number``, where
    ``w`` is the head's weights (each row sums to 1 over the keys the model's mask lets the query see) and ``P``
    the pattern. A head that always attends to its pattern scores 1, whatever share of the text has one. Queries
    without a target are left out; weight on the first token (a BOS or [CLS], where many heads rest) stays in: a
    head that rests there scores low. ``frame.attrs`` holds ``queries_with_target`` and ``queries``.

    **How TransformerLens's** ``detect_head`` (``transformer_lens/head_detector.py``) **differs**, on the same
    pattern:

    - its default error measure ``"mul"`` scores ``sum(w * P) / sum(w)`` over *every* query row. With rows that sum
      to 1 that is the weight on the pattern divided by the number of all queries, including those the pattern
      gives no key, so it is attnviz's score times the share of queries with a target (in the
      ``transformerlens_mul`` column, computed so on the same tokens): the previous-token score of a text of n
      tokens is (n - 1)/n of attnviz's, and an induction score on a text repeated twice about half of it;
    - ``exclude_bos=True`` zeroes the weight on the first key before it divides, so a head's weight on the BOS is
      removed from both sums (its score is renormalised over the rest); ``exclude_current_token=True`` does the same
      for the diagonal. attnviz removes neither;
    - its ``"abs"`` measure scores ``1 - sum |w - P| / n``, which rewards matching the pattern's values, not only
      landing on its cells; attnviz has no counterpart;
    - ``model.to_tokens`` prepends a BOS by default: every position moves by one, the BOS is a token its patterns
      count (attnviz's repeat patterns skip special tokens), and heads get a first key to rest on. The two agree
      only on the same tokens: capture the text as TransformerLens's tokens read it, or compare the column
      ``transformerlens_mul`` (computed on attnviz's tokens);
    - it requires a square, lower-triangular pattern (a decoder's self-attention); attnviz scores any pattern of the
      attention's shape, on encoders too, and ``attention=`` chooses an encoder-decoder's attention ("encoder",
      "decoder", "cross"; cross-attention takes custom patterns only)."""
    if not isinstance(captured_or_run, Captured):
        if callable(getattr(captured_or_run, "detect", None)):
            return captured_or_run.detect(kind)
        raise TypeError(f"detect() reads a Captured (attnviz.capture) or a result with a .detect(kind) method; got "
                        f"{type(captured_or_run).__name__}")
    captured = captured_or_run
    record = captured.record(attention)
    targets = targets_of(captured, kind, spec, attention=attention)
    scores = detector_scores(captured.capture, record.kind, targets)
    layers, heads = scores.mean.shape
    frame = pd.DataFrame({
        "layer": [layer for layer in range(layers) for _ in range(heads)],
        "head": [head for _ in range(layers) for head in range(heads)],
        "score": scores.mean.reshape(-1),
        "transformerlens_mul": scores.transformerlens.reshape(-1),
    })
    frame = frame.sort_values(["score", "layer", "head"], ascending=[False, True, True], na_position="last",
                              ignore_index=True)
    pattern = PATTERN_KINDS[page_pattern(kind, spec)[0]] if isinstance(kind, str) else "a custom pattern"
    frame.attrs.update(kind=kind if isinstance(kind, str) else "custom", pattern=pattern,
                       queries_with_target=scores.queries_with_target, queries=scores.queries)
    return frame
