"""How the importance maps of :mod:`attnviz.interventions.importance` compare: each head's rank by the size of its
effect, Spearman's rho between two maps, the heads ranked furthest apart, and the page's table of heads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from attnviz.interventions.importance import ImportanceMap, Study


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks of ``values`` (1-D, finite), ties given their mean rank."""
    order = values.argsort()
    ranked = torch.empty_like(values, dtype=torch.float64)
    ranked[order] = torch.arange(1, len(values) + 1, dtype=torch.float64)
    for value in values.unique():
        tied = values == value
        if tied.sum() > 1:
            ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(first: torch.Tensor, second: torch.Tensor) -> float:
    """Spearman's rank correlation of two maps over the heads both have (NaN cells left out)."""
    keep = ~(first.isnan() | second.isnan())
    a, b = ranks(first[keep].double()), ranks(second[keep].double())
    a, b = a - a.mean(), b - b.mean()
    denominator = (a.norm() * b.norm()).item()
    return float("nan") if denominator == 0 else float((a @ b).item() / denominator)


def how_much(values: torch.Tensor) -> torch.Tensor:
    """How much each head matters by a map: the size of its effect, either way. Removing a head can lower the loss
    (it mattered, against the objective), and Michel et al.'s measure is already |dL/dg|: ranks compare sizes."""
    return values.abs()


def agreement(maps: dict[str, ImportanceMap]) -> list[tuple[str, str, float]]:
    """Spearman's rho of every pair of maps, over the size of each head's effect (:func:`how_much`)."""
    names = list(maps)
    return [(names[i], names[j], spearman(how_much(maps[names[i]].values), how_much(maps[names[j]].values)))
            for i in range(len(names)) for j in range(i + 1, len(names))]


def disagreements(first: ImportanceMap, second: ImportanceMap, count: int = 5) -> list[dict]:
    """The heads whose ranks differ most between two maps (rank 1 = the largest effect, :func:`how_much`), largest
    difference first."""
    keep = ~(first.values.isnan() | second.values.isnan())
    cells = keep.nonzero().tolist()
    size = len(cells)
    rank_first = size + 1 - ranks(how_much(first.values[keep]).double())
    rank_second = size + 1 - ranks(how_much(second.values[keep]).double())
    gaps = (rank_first - rank_second).abs()
    rows = []
    for index in gaps.argsort(descending=True)[:count].tolist():
        row, head = cells[index]
        rows.append({"head": f"{first.modules[row].label}, head {head}", first.method: int(rank_first[index]),
                     second.method: int(rank_second[index]), "rank gap": int(gaps[index])})
    return rows


def head_rows(result: Study, labels: dict[tuple[str, int, int], str] | None = None,
              statistics: dict[tuple[str, int, int], dict[str, float]] | None = None) -> list[dict]:
    """One row per head: its label (``labels`` by (kind, layer, head), e.g. Explore heads' on the first text), its
    ``statistics`` (columns by name, the same keys: where it looks), each map's value and rank (1: the largest
    effect by that measure, either way: :func:`how_much`), most important by zero ablation first."""
    labels, statistics = labels or {}, statistics or {}
    ranked = {}
    for method, one in result.maps.items():
        keep = ~one.values.isnan()
        # tied heads share their mean rank
        order = len(keep.nonzero()) + 1 - ranks(how_much(one.values[keep]).double())
        ranked[method] = dict(zip(map(tuple, keep.nonzero().tolist()), order.tolist(), strict=True))
    rows = []
    for row, module in enumerate(result.modules):
        for head in range(module.heads):
            entry = {"head": f"{module.label}, head {head}",
                     "label": labels.get((module.kind, module.index, head), ""),
                     **statistics.get((module.kind, module.index, head), {})}
            for method, one in result.maps.items():
                entry[method] = float(one.values[row, head])
                rank = ranked[method].get((row, head), float("nan"))  # NaN: not measured (a non-finite loss)
                entry[f"rank ({method})"] = rank if rank != int(rank) else int(rank)
            rows.append(entry)
    first = next(iter(result.maps), None)
    if not first:
        return rows
    return sorted(rows, key=lambda entry: (entry[f"rank ({first})"] != entry[f"rank ({first})"],
                                           entry[f"rank ({first})"]))
