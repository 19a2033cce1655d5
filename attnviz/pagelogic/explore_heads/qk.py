"""The Q·K tab (bertviz's neuron view, for every architecture captured): how one score is made from a query and a
key vector, and the softmax over the row."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import torch

from attnviz.core.tokens_display import piece_note
from attnviz.models.record import AttentionRecord
from attnviz.viz import style
from attnviz.viz.charts import bar_chart
from attnviz.viz.matrix import SIGNED, matrix_heatmap


@dataclass
class QueryKey:
    """How one score is made: the query and key vectors as attention saw them (after RoPE, if any), their
    element-wise product, its sum times the model's scaling (plus any position bias or soft-capping: the
    record's own scores), and the softmax over every key of the row."""

    query: torch.Tensor  # [d]
    key: torch.Tensor  # [d]
    product: torch.Tensor  # [d]
    dot: float  # product.sum()
    scale: float
    score: float  # what the softmax sees for this key (the record's scores: scaling, soft-capping, bias)
    scores: torch.Tensor  # [n_k], the whole row
    weights: torch.Tensor  # [n_k], the row's weights (the model's mask applied)
    visible: torch.Tensor  # [n_k] bool, the keys the model's mask lets this query see (True = may attend)


QK_BARS = 64  # keys drawn in the Q·K view's softmax row when there are more


def query_key(record: AttentionRecord, layer: int, head: int, query: int, key: int) -> QueryKey:
    """The anatomy of the score of ``query`` for ``key`` in one head (``record`` of any captured model)."""
    if not (0 <= query < record.n_q and 0 <= key < record.n_k):
        raise ValueError(f"query {query} or key {key} is outside the {record.n_q} x {record.n_k} tokens")
    q = record.queries[layer, head, query].float()  # [d]
    k = record.keys[layer, record.kv_head(head), key].float()  # [d]
    scores = record.scores(layer, query, query + 1, heads=[head])[0, 0]  # [n_k]
    weights = record.head_weights(layer, head, query, query + 1)[0]  # [n_k]
    product = q * k
    visible = record.mask_rows(layer, query, query + 1)[0]  # [n_k]
    return QueryKey(q, k, product, float(product.sum()), float(record.scales[layer]), float(scores[key]), scores,
                    weights, visible)


def query_key_figures(anatomy: QueryKey, record: AttentionRecord, layer: int, head: int, query: int,
                      key: int, key_ids: list[int] | None = None) -> tuple[go.Figure, go.Figure, str]:
    """The vectors (q, k, q∘k as three rows over the head's dimensions) and the row (scores and weights over the
    keys, the chosen key marked), with a caption that does the arithmetic. Tokens read as every page shows them
    (``record.query_display``); each bar's hover adds the key's raw piece (and its id, from ``key_ids``)."""
    query_label = style.token_label(query, record.query_display[query])
    key_label = style.token_label(key, record.key_display[key])
    rows = torch.stack([anatomy.query, anatomy.key, anatomy.product])  # [3, d]
    dims = [f"d{i}" for i in range(rows.shape[1])]
    vectors = matrix_heatmap(rows, [f"q · {query_label}", f"k · {key_label}", "q∘k"], dims, scale=SIGNED,
                             title=style.plotly_text(f"Layer {layer}, head {head}: query {query_label} and key "
                                                     f"{key_label}"),
                             x_title="dimension of the head", y_title="", show_values=False, height=300)
    # The softmax runs over the keys the model's mask lets this query see; the others are no part of its row.
    visible = anatomy.visible.nonzero().flatten().tolist() or list(range(record.n_k))
    n_visible = len(visible)
    shown = visible
    every = "every key" if n_visible == record.n_k else f"the {n_visible:,} keys it may see (of {record.n_k:,})"
    title = f"The softmax over {every} of {style.plotly_text(query_label)}"
    if n_visible > QK_BARS:  # long inputs: the strongest visible keys (and the chosen one), in their order
        strongest = set(torch.tensor(visible)[anatomy.weights[visible].topk(QK_BARS - 1).indices].tolist()) | {key}
        shown = sorted(strongest)
        title = (f"The softmax over the keys of {style.plotly_text(query_label)}: the {len(shown)} largest of the "
                 f"{n_visible:,} it may see")
    labels = [style.token_label(j, record.key_display[j]) for j in shown]
    notes = [piece_note(record.key_tokens[j], None if key_ids is None else key_ids[j]) for j in shown]
    row = bar_chart(labels, anatomy.weights[shown].tolist(), title=title, y_title="weight",
                    text=[f"{float(anatomy.weights[j]):.2f}" if j == key else "" for j in shown], notes=notes)
    row.data[0].marker.color = ["#ff7f0e" if j == key else "#1f77b4" for j in shown]
    adjusted = "" if abs(anatomy.score - anatomy.dot * anatomy.scale) < 1e-6 * max(1.0, abs(anatomy.score)) else (
        f", then the model's own adjustments (position bias or soft-capping) make it {anatomy.score:.4g}")
    rank = int((anatomy.weights[visible] > anatomy.weights[key]).sum()) + 1
    standing = (f"rank {rank} of the {n_visible:,} keys it may see" if bool(anatomy.visible[key]) else
                "the model's mask hides this key from this query")
    sinks = record.sinks[layer] if record.sinks else None
    softmax = "The softmax of the row's scores" if sinks is None else (
        f"The softmax of the row's scores and this head's sink logit {float(sinks[head]):.4g} (a column every row "
        f"has, dropped after the softmax: the row keeps {float(anatomy.weights.sum()):.3g} of its weight)")
    caption = (f"q·k = Σ q∘k = {anatomy.dot:.4g}; times the scaling {anatomy.scale:.4g} gives the score "
               f"{anatomy.dot * anatomy.scale:.4g}{adjusted}. {softmax} gives {key_label} the "
               f"weight {float(anatomy.weights[key]):.3g} ({standing}).")
    return vectors, row, caption
