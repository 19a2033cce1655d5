"""Figures of inference-time systems: a paged KV cache's block tables and memory map, and who holds which K/V
block at each step of Ring attention."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attnviz.core.paged_kv import PagedKVCache
from attnviz.viz import style

SHARED, OWN, FREE = "#ff7f0e", "#1f77b4", "#d9d9d9"


def block_table_figure(cache: PagedKVCache, names: list[str], *, title: str) -> go.Figure:
    """One row per sequence, one cell per logical block: the physical block it lives in (orange = shared with
    another sequence, blue = its own)."""
    sequences = [name for name in ["prompt", *names] if name in cache.tables]
    width = max(len(cache.tables[name]) for name in sequences)
    shared = np.full((len(sequences), width), np.nan)
    text = [[""] * width for _ in sequences]
    hover = [[""] * width for _ in sequences]
    for row, name in enumerate(sequences):
        length = cache.lengths[name]
        for logical, block in enumerate(cache.tables[name]):
            shared[row, logical] = 1.0 if cache.references[block] > 1 else 0.0
            text[row][logical] = str(block)
            tokens = min(cache.block_size, length - logical * cache.block_size)
            hover[row][logical] = (f"{name}, logical block {logical} → physical block {block}<br>{tokens} of "
                                   f"{cache.block_size} slots filled; held by {cache.references[block]} "
                                   f"sequence{'s' if cache.references[block] > 1 else ''}")
    figure = go.Figure(go.Heatmap(
        z=shared, x=list(range(width)), y=sequences, text=text, texttemplate="%{text}", textfont=dict(size=13),
        customdata=hover, hovertemplate="%{customdata}<extra></extra>", showscale=False, xgap=3, ygap=3,
        colorscale=[[0, OWN], [0.5, OWN], [0.5, SHARED], [1, SHARED]], zmin=0, zmax=1,
    ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title="logical block (16 tokens each)" if cache.block_size == 16 else "logical block",
                   tickmode="array", tickvals=list(range(width))),
        yaxis=dict(autorange="reversed"), plot_bgcolor="white", height=120 + 48 * len(sequences),
        margin=dict(l=10, r=10, t=60, b=10),
    )
    return figure


def memory_map_figure(cache: PagedKVCache, *, title: str) -> go.Figure:
    """The pool of physical blocks in order: shared, owned by one sequence, or free; hover lists the owners."""
    owners: dict[int, list[str]] = {}
    for name, table in cache.tables.items():
        for block in table:
            owners.setdefault(block, []).append(name)
    count = len(cache.key_blocks)
    state = [2.0 if len(owners.get(b, [])) > 1 else (1.0 if owners.get(b) else 0.0) for b in range(count)]
    hover = [f"physical block {b}: " + (", ".join(owners[b]) if b in owners else "free") for b in range(count)]
    figure = go.Figure(go.Heatmap(
        z=[state], x=list(range(count)), y=["pool"], text=[[str(b) for b in range(count)]], texttemplate="%{text}",
        customdata=[hover], hovertemplate="%{customdata}<extra></extra>", showscale=False, xgap=3,
        colorscale=[[0, FREE], [1 / 3, FREE], [1 / 3, OWN], [2 / 3, OWN], [2 / 3, SHARED], [1, SHARED]],
        zmin=-0.5, zmax=2.5,
    ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        xaxis=dict(title="physical block", tickmode="array", tickvals=list(range(count))),
        yaxis=dict(visible=False), plot_bgcolor="white", height=190, margin=dict(l=10, r=10, t=60, b=10),
    )
    return figure


def ring_figure(held: list[list[int]], status: list[list[str]], *, title: str) -> go.Figure:
    """Rows = steps, columns = devices; each cell names the K/V block that device holds at that step, grey when
    the causal mask lets it skip the block."""
    steps, devices = len(held), len(held[0])
    z = np.array([[float(held[s][d]) if status[s][d] == "computed" else np.nan for d in range(devices)]
                  for s in range(steps)])
    text = [[f"K/V {held[s][d]}" + ("" if status[s][d] == "computed" else " (skip)") for d in range(devices)]
            for s in range(steps)]
    figure = go.Figure(go.Heatmap(
        z=z, x=[f"device {d}" for d in range(devices)], y=[f"step {s + 1}" for s in range(steps)], text=text,
        texttemplate="%{text}", textfont=dict(size=12), colorscale="Viridis", zmin=0, zmax=max(1, devices - 1),
        hovertemplate="%{y}, %{x}: %{text}<extra></extra>", xgap=3, ygap=3,
        colorbar=dict(title=dict(text="K/V block", side="right")),
    ))
    figure.update_layout(
        title=dict(text=title, x=0, xanchor="left"), font=dict(family=style.FONT_FAMILY),
        yaxis=dict(autorange="reversed"), plot_bgcolor=style.BLOCKED_COLOR, height=120 + 44 * steps,
        margin=dict(l=10, r=10, t=60, b=10),
    )
    return figure
