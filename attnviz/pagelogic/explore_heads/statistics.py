"""The Head statistics tab: one row per head (entropy, distance, shares, a label), and a layers x heads map of one
statistic. The grid view labels its thumbnails from the same table."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnviz.core import analysis
from attnviz.models.record import AttentionRecord, Capture
from attnviz.viz import style
from attnviz.viz.heads import statistic_heatmap

MEMO_KEY = "statistics"  # where the table is kept with its record: the grid and the tab share one computation
# HeadStats field -> the table's column name
STATISTICS_COLUMNS = {
    "entropy": "entropy (nats)", "normalised_entropy": "normalised entropy", "mean_distance": "mean distance",
    "self": "self", "previous": "previous token", "next": "next token", "first": "first token",
    "separator": "separators", "punctuation": "punctuation", "duplicate": "duplicate token",
    "induction": "induction", "top_key": "top key", "top_key_share": "top key share",
}


def statistics_table(capture: Capture, kind: str, progress=None) -> pd.DataFrame:
    """One row per head: entropy, distance, shares and label (self-attention only). Computed block by block of
    query rows, so a long input never holds a head's whole N x N matrix; ``progress(layer, n_layers)``."""
    record = capture.records[kind]
    if record.n_q != record.n_k:
        raise ValueError("head statistics are computed for self-attention; choose encoder or decoder attention")
    if has_statistics(record):
        return record.memo[MEMO_KEY].copy()  # a copy: the record is shared by every session
    tokens = record.key_tokens
    special = capture.special_of(tokens)
    separators, ids = capture.separators_of(tokens), capture.ids_of(tokens)
    rows = []
    for layer in range(record.n_layers):
        if progress:
            progress(layer, record.n_layers)
        accumulator = analysis.StatisticsAccumulator(record.n_heads, tokens, special, separators, ids)
        block = record.block_rows()
        for start in range(0, record.n_q, block):
            end = min(record.n_q, start + block)
            accumulator.add(start, record.layer_weights(layer, start, end),
                            allowed=record.mask_rows(layer, start, end).sum(-1))
        rows += accumulator.result(layer)
    frame = pd.DataFrame([dataclasses.asdict(row) for row in rows])
    frame["top_key"] = [style.token_label(j, record.key_display[j]) for j in frame["top_key"]]  # as pages show it
    frame = frame.rename(columns=STATISTICS_COLUMNS)
    frame = frame[["layer", "head", "label", *STATISTICS_COLUMNS.values()]]
    record.memo[MEMO_KEY] = frame
    return frame.copy()


def has_statistics(record: AttentionRecord) -> bool:
    """Whether :func:`statistics_table` is computed already for this record (else the page shows progress)."""
    return MEMO_KEY in record.memo


MAPPABLE_STATISTICS = ("previous token", "next token", "self", "first token", "separators", "punctuation",
                       "duplicate token", "induction", "entropy (nats)", "normalised entropy", "mean distance",
                       "top key share")


def statistics_that_apply(table: pd.DataFrame, causal: bool) -> tuple[str, ...]:
    """The statistics of :data:`MAPPABLE_STATISTICS` that mean something for this text and model: no "next token"
    under a causal mask (weight 0 in every head), no statistic no head has (separators in a text without one,
    duplicate and induction in a text that repeats no token)."""
    return tuple(name for name in MAPPABLE_STATISTICS
                 if not (causal and name == "next token") and name in table and table[name].notna().any()
                 and not (name == "separators" and not table[name].any()))


def statistic_range(statistic: str, n_keys: int) -> tuple[float, float, str]:
    """The colour range that means something for ``statistic`` (not the spread of the values, which turns noise
    between 0.0063 and 0.0064 into full contrast): shares and normalised entropy on 0–1, entropy from 0 to that of
    a uniform row over ``n_keys`` keys (ln n), the mean distance from 0 to ``n_keys`` − 1. With the range in
    words."""
    if statistic == "entropy (nats)":
        top = math.log(max(n_keys, 2))
        return 0.0, top, f"0 (one key) to ln {n_keys} = {top:.3g} (uniform over every key)"
    if statistic == "mean distance":
        return 0.0, float(max(n_keys - 1, 1)), f"0 to {max(n_keys - 1, 1)} tokens"
    if statistic == "normalised entropy":
        return 0.0, 1.0, "0 (one key) to 1 (uniform)"
    return 0.0, 1.0, "0 to 1 (a share of each row's weight)"


def statistic_figure(table: pd.DataFrame, statistic: str, labels: list[str],
                     selected: tuple[int, int], n_keys: int | None = None) -> tuple[go.Figure, str]:
    """A layers x heads heatmap of one column of :func:`statistics_table`, coloured on the statistic's meaningful
    range (:func:`statistic_range`, for a text of ``n_keys`` tokens; default: the largest value seen as the
    distance, e^max as the entropy's key count); heads whose label is not in ``labels`` are left blank. Click a
    cell to open that head."""
    if statistic not in MAPPABLE_STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {MAPPABLE_STATISTICS}")
    layers, heads = int(table["layer"].max()) + 1, int(table["head"].max()) + 1
    values = np.full((layers, heads), np.nan)
    names = [[""] * heads for _ in range(layers)]
    for _, row in table.iterrows():
        layer, head = int(row["layer"]), int(row["head"])
        names[layer][head] = row["label"]
        if row["label"] in labels:
            values[layer, head] = row[statistic]
    if n_keys is None:  # no text length given: enough keys for the largest value seen
        seen = float(np.nanmax(table[statistic])) if len(table) else 1.0
        n_keys = (int(math.ceil(math.exp(seen))) if statistic == "entropy (nats)" else int(math.ceil(seen)) + 1)
    low, high, in_words = statistic_range(statistic, n_keys)
    figure = statistic_heatmap(values, title=f"{statistic} of every head", statistic=statistic, labels=names,
                               highlight=selected, value_range=(low, high))
    hidden = int(np.isnan(values).sum())
    note = f" Blank: {hidden} heads with other labels." if hidden else ""
    return figure, (f"One cell per head, coloured from {in_words}; the orange box is the page's Layer and Head. "
                    f"Click a cell to open it.{note}")


STATISTICS_SHORT = {  # the table's narrow column headers (the full name is the header's tooltip)
    "entropy (nats)": "entropy", "normalised entropy": "norm. H", "mean distance": "distance", "self": "self",
    "previous token": "prev.", "next token": "next", "first token": "first", "separators": "sep.",
    "punctuation": "punct.", "duplicate token": "dup.", "induction": "induct.", "top key share": "top share",
}


def statistics_column_config(column_config) -> dict:
    """Narrow columns (short headers, 3 significant digits), so the whole table fits about 1,000 px."""
    config = {name: column_config.NumberColumn(short, help=name, format="%.3g", width=60)
              for name, short in STATISTICS_SHORT.items()}
    config.update(layer=column_config.NumberColumn("layer", width=45),
                  head=column_config.NumberColumn("head", width=45),
                  label=column_config.TextColumn("label", width=140),
                  **{"top key": column_config.TextColumn("top key", width=110)})
    return config


def label_rules_text() -> str:
    """How a head gets its label, in words, with the thresholds of :data:`attnviz.core.analysis.LABEL_RULES`."""
    rules = [f"**{label}**: share on {stat} ≥ {threshold}" for label, (stat, threshold) in analysis.LABEL_RULES.items()]
    rules.append(f"**broad head**: normalised entropy ≥ {analysis.BROAD_ENTROPY}")
    return ("; ".join(rules) + ". The strongest rule that holds wins; otherwise **mixed**. Induction is the weight "
            "on the token right after an earlier occurrence of the query's token, duplicate token the weight on those "
            "earlier occurrences, each averaged over the queries that have one (TransformerLens's detect_head divides "
            "by every query, so its scores are smaller by the share of queries that repeat a token). A text with "
            f"fewer than {analysis.MIN_LABELLED_QUERIES} queries that see more than one key is "
            f"**{analysis.UNLABELLED}**.")
