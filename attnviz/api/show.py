"""Figures from a notebook, made by the same builders the pages use, that render inline offline.

Each function takes a :class:`~attnviz.api.capture.Captured` (or, for :func:`importance_map`, what the importance
maps returned) and returns a :class:`NotebookFigure`: a Plotly ``go.Figure`` (change it, export it with
``write_image`` / ``write_html``) with ``caption``, one sentence on what to notice, as the page writes under it.

- :func:`head`: one head's weights as a heatmap (Explore heads' Head view)
- :func:`grid`: every head as a thumbnail, of one layer or of all (the Grid view)
- :func:`lines`: bertviz-style lines from queries to keys (the Lines view)
- :func:`qk_map`: a head's queries and keys as points of one picture (the Queries and keys page)
- :func:`importance_map`: layers x heads, how much each head matters (the "Does this head matter?" page)
- :func:`patching`, :func:`paths`, :func:`attribution`, :func:`lens`, :func:`composition`: the results of
  ``attnviz.patch``, ``attnviz.paths``, ``attnviz.attribute``, ``attnviz.logit_lens`` and ``attnviz.composition``

Shown as a cell's last expression (or with IPython's ``display``), a figure gives the frontend Plotly's own
mimetype (``application/vnd.plotly.v1+json``: JupyterLab, VS Code and nteract draw it with the plotly.js they ship)
and an HTML fallback that needs no network: the first figure shown in a process carries plotly.js itself (about
4.8 MB, once), later ones only their data; nothing is ever loaded from a CDN. A frontend that shows each output in
a frame of its own (Colab) needs plotly.js in every figure: :func:`plotlyjs_in_every_figure`. Plotly's own
``figure.show()`` goes through Plotly's renderers instead, some of which load plotly.js from a CDN.
"""

from __future__ import annotations

import html
import json
import re

import plotly.graph_objects as go
import plotly.io as pio
import torch

from attnviz.api.capture import Captured
from attnviz.core.qk_geometry import TRUST_KS
from attnviz.interventions.edits import AttentionModule
from attnviz.interventions.importance import ImportanceMap
from attnviz.pagelogic import queries_keys
from attnviz.pagelogic.explore_heads.grid import THUMBNAIL, filtered_thumbnails, grid_notes
from attnviz.pagelogic.explore_heads.options import GRID_SCALES, KIND_NAMES, SCALES, ViewOptions, automatic_scale
from attnviz.pagelogic.explore_heads.views import view_figure
from attnviz.pagelogic.importance import MEASURES, METHOD_TITLES, map_caption
from attnviz.viz import queries_keys as qk_figures
from attnviz.viz.heads import head_grid
from attnviz.viz.importance import importance_heatmap

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
# The toolbar's camera button saves a PNG at twice the size on screen (paper-ready), as the app's figures do
FIGURE_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}

# Whether this process has sent plotly.js in a figure's HTML already, and whether every figure should carry it
_PLOTLYJS = {"sent": False, "every_figure": False}


def send_plotlyjs_again() -> None:
    """The next figure's HTML carries plotly.js again: after the output that carried it was cleared, or the page
    reloaded without re-running the cell."""
    _PLOTLYJS["sent"] = False


def plotlyjs_in_every_figure(enabled: bool = True) -> None:
    """Every figure's HTML carries plotly.js (about 4.8 MB each), for frontends that show each output in a frame
    of its own (Colab), where a figure cannot use the plotly.js an earlier output loaded."""
    _PLOTLYJS["every_figure"] = bool(enabled)


def _plotlyjs_now() -> bool:
    """Whether the HTML being made now carries plotly.js (and, once per process, that it has been sent)."""
    if _PLOTLYJS["every_figure"] or not _PLOTLYJS["sent"]:
        _PLOTLYJS["sent"] = True
        return True
    return False


class NotebookFigure(go.Figure):
    """A ``go.Figure`` that shows itself inline without a network: Plotly's mimetype, and HTML whose plotly.js is
    inline (see the module's docstring). ``caption``: what to notice in it, in one sentence."""

    caption = ""  # a class attribute: Plotly's figures accept only attributes they know
    # Plotly's Figure displays itself through its default renderer (some use a CDN, some send no HTML at all);
    # without that hook IPython asks for the mimebundle below, plotly.js inline
    _ipython_display_ = None

    def offline_html(self) -> str:
        """The figure as an HTML fragment: plotly.js inline in the first one of the process (or in every one, see
        :func:`plotlyjs_in_every_figure`), never a script from the network."""
        return pio.to_html(self, include_plotlyjs=_plotlyjs_now(), full_html=False, config=FIGURE_CONFIG,
                           validate=False)

    def plain_text(self) -> str:
        """The title and the caption, for a frontend that shows text only."""
        title = re.sub(r"<[^>]+>", " ", str(self.layout.title.text or "")).split()
        return html.unescape(" ".join(title)) + (f"\n{self.caption}" if self.caption else "")

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        def wanted(mimetype: str) -> bool:
            return (include is None or mimetype in include) and not (exclude and mimetype in exclude)

        bundle = {"text/plain": self.plain_text()}
        if wanted(PLOTLY_MIMETYPE):  # Plotly's own renderers send the figure as a JSON object, its config inside
            bundle[PLOTLY_MIMETYPE] = {**json.loads(pio.to_json(self, validate=False)), "config": FIGURE_CONFIG}
        if wanted("text/html"):
            bundle["text/html"] = self.offline_html()
        return bundle

    def _repr_html_(self) -> str:
        return self.offline_html()


def _notebook_figure(figure: go.Figure, caption: str) -> NotebookFigure:
    shown = NotebookFigure(figure)
    shown.caption = caption
    return shown


def _view_options(captured: Captured, view: str, layer: int, head: int, kind: str | None, **fields) -> ViewOptions:
    """The page's options for one view of ``captured``: its layer and head checked (a ValueError naming the
    range)."""
    kind = captured.kind if kind is None else kind
    captured.check_layer(layer, kind)
    captured.check_head(head, kind)
    return ViewOptions(kind=kind, layer=layer, head=head, view=view, **fields)


def head(captured: Captured, layer: int, head: int, *, kind: str | None = None,
         scale: str | None = None) -> NotebookFigure:
    """One head's attention weights as a heatmap, rows = query tokens, columns = key tokens, as Explore heads'
    Head view draws it: the weights on 0–1, each cell's value written where it fits, exact on hover; above 256
    tokens a side pooled by max (the title says so). ``scale``: one of "fixed" (0–1), "head" (to this head's
    maximum), "row" (each row to its maximum) or "log"; default "fixed", "row" for long texts as the page does.
    ``kind``: the attention ("self"; an encoder-decoder's "encoder", "decoder" or "cross")."""
    record = captured.record(kind)
    scale = automatic_scale(record.n_q, record.n_k) if scale is None else scale
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(map(repr, SCALES))}, got {scale!r}")
    options = _view_options(captured, "head", layer, head, kind, scale=scale)
    return _notebook_figure(*view_figure(captured.capture, options))


def grid(captured: Captured, layer: int | None = None, *, kind: str | None = None,
         scale: str = "head") -> NotebookFigure:
    """Every head of ``layer`` (default: of every layer) as a thumbnail, rows = queries, columns = keys, pooled
    by mean to at most 24 cells a side, as Explore heads' Grid view draws them, each labelled (up to 2,048
    tokens) with what the head statistics make of it ("prev", "first", ...). ``scale``: "head" (each thumbnail to
    its own maximum, so faint heads show) or "fixed" (the head view's 0–1, so heads compare)."""
    if scale not in GRID_SCALES:
        raise ValueError(f"scale must be one of {', '.join(map(repr, GRID_SCALES))}, got {scale!r}")
    options = _view_options(captured, "grid", 0 if layer is None else layer, 0, kind, grid_scale=scale)
    record = captured.record(options.kind)
    thumbnails = filtered_thumbnails(captured.capture, record, options)  # [layers, heads, t_q, t_k]
    notes = grid_notes(captured.capture, options.kind)  # (hovers, badges), each [layers][heads], or None
    layers = slice(None) if layer is None else slice(layer, layer + 1)
    what = KIND_NAMES.get(options.kind, options.kind)
    title = (f"All {record.n_layers} x {record.n_heads} heads: {what}" if layer is None
             else f"Layer {layer}: all {record.n_heads} heads, {what}")
    figure = head_grid(thumbnails[layers], title=f"{title}<br><sup>colour: {GRID_SCALES[scale]}</sup>",
                       thumbnail=THUMBNAIL, per_head_max=scale == "head", clickable=False,
                       row_names=None if layer is None else [f"L{layer}"],
                       notes=notes[0][layers] if notes else None, badges=notes[1][layers] if notes else None)
    shown = ("scaled to its own maximum so faint heads show" if scale == "head"
             else "on the head view's 0–1 scale, so heads compare directly")
    return _notebook_figure(figure, f"Each thumbnail is one head (rows = queries, columns = keys), pooled by mean "
                                    f"and {shown}." + (" Badges and hovers name what the head statistics make of "
                                                       "each head." if notes else ""))


def lines(captured: Captured, layer: int, head: int | list[int] = 0, *, kind: str | None = None,
          top_k: int | None = None) -> NotebookFigure:
    """bertviz-style lines, as Explore heads' Lines view draws them: queries on the left, keys on the right, one
    line per weight of at least 0.02, its width and opacity the weight, one colour per head (``head``: one head or
    a list of them). ``top_k``: only each query's ``top_k`` strongest keys. Above 64 tokens a window of the first
    64 queries is drawn, with the 64 keys they use most (the caption says so)."""
    heads = [head] if isinstance(head, int) and not isinstance(head, bool) else list(head)
    if not heads:
        raise ValueError("give at least one head")
    options = _view_options(captured, "lines", layer, heads[0], kind, line_heads=heads, top_k=top_k)
    for one in heads[1:]:
        captured.check_head(one, options.kind)
    return _notebook_figure(*view_figure(captured.capture, options))


def qk_map(captured: Captured, layer: int, head: int, *, kind: str | None = None, method: str = "PCA",
           dims: int = 2, query: int | None = None, colour: str = "query or key",
           values: bool = False) -> NotebookFigure:
    """A head's queries (circles) and keys (diamonds) as points of one picture, as the Queries and keys page
    draws them (AttentionViz, Yeh et al. 2023): the keys shifted so their centroid meets the queries' and both
    scaled to the same mean length, which changes no weight, then projected (``method``: "PCA", "t-SNE" or
    "UMAP"; ``dims``: 2 or 3), so that a query lies near the keys it attends to, as far as the projection can
    show it; the caption says how far (the share of queries whose strongest key is among their k nearest).
    ``query``: draw lines from that query (its position) to the three keys it attends to most. ``colour``: "query
    or key", "position" or "token category". ``values``: the value vectors too (triangles)."""
    options = _view_options(captured, "head", layer, head, kind)
    record = captured.record(options.kind)
    if colour not in qk_figures.COLOURINGS:
        raise ValueError(f"colour must be one of {', '.join(map(repr, qk_figures.COLOURINGS))}, got {colour!r}")
    special = (captured.capture.special_of(record.query_tokens), captured.capture.special_of(record.key_tokens))
    special = (special[0] if len(special[0]) == record.n_q else [False] * record.n_q,
               special[1] if len(special[1]) == record.n_k else [False] * record.n_k)
    points = queries_keys.head_points([record], layer, head, values=values, special=[special])
    coordinates = queries_keys.project(points, method, dims, with_values=values)
    trusted = queries_keys.trust(points, coordinates)
    sets = (f"{len(points.queries)} queries, {len(points.keys)} keys and values" if values
            else f"{len(points.queries)} queries and {len(points.keys)} keys")
    figure = qk_figures.head_scatter(points, coordinates, title=f"{options.kind} layer {layer}, head {head}: "
                                     f"{sets} ({method})", colour=colour, selected_query=query)
    shares = ", ".join(f"k = {k}: {share:.0%}" for k, share in trusted.items() if share == share) or "none"
    caption = (f"A query lies near the keys it attends to, as far as {method} in {dims}D can show it: its strongest "
               f"key is among its k nearest for {shares} of the queries (k = {', '.join(map(str, TRUST_KS))}). "
               + queries_keys.trust_statement(queries_keys.trust_counted(points), len(points.queries))
               + ("" if points.translated else " This head soft-caps its scores or has a sink: its keys are only "
                                               "scaled, not shifted."))
    return _notebook_figure(figure, caption)


def _maps_of_table(result) -> dict[str, ImportanceMap]:
    """The maps of a result that gives them as a table (a corpus importance run's ``map()``: one row per measure
    and head, with ``method``, ``module``, ``kind``, ``layer``, ``head`` and ``mean``) and its ``objective``."""
    table = result.map()
    maps = {}
    for method, rows in table.groupby("method", sort=False):
        firsts = rows.sort_values("module").drop_duplicates("module")
        heads = rows.groupby("module")["head"].max() + 1
        modules = [AttentionModule(str(row.module), int(heads[row.module]), str(row.kind), int(row.layer))
                   for row in firsts.itertuples()]
        values = torch.full((len(modules), max(m.heads for m in modules)), float("nan"))  # NaN: no such head
        place = {int(row.module): number for number, row in enumerate(firsts.itertuples())}
        for row in rows.itertuples():
            values[place[int(row.module)], int(row.head)] = float(row.mean)
        maps[str(method)] = ImportanceMap(str(method), values, modules, str(result.objective), float("nan"))
    return maps


def _maps_of(result) -> dict[str, ImportanceMap]:
    """The importance maps ``result`` holds, by method: one map, a dict of them, anything with ``.maps``, or a
    corpus run's table of them (``.map()`` and ``.objective``)."""
    if isinstance(result, ImportanceMap):
        return {result.method: result}
    if callable(getattr(result, "map", None)) and hasattr(result, "objective"):
        return _maps_of_table(result)
    maps = getattr(result, "maps", result)
    if isinstance(maps, dict) and maps and all(isinstance(one, ImportanceMap) for one in maps.values()):
        return maps
    raise TypeError(f"importance_map() reads an ImportanceMap, a dict of them, a result with .maps (what "
                    f"attnviz.interventions.importance.study returns), a corpus importance run (.map() and "
                    f".objective) or a result with .map_figure(); got {type(result).__name__}")


def importance_map(result, method: str | None = None) -> NotebookFigure:
    """How much each head matters, layers x heads, as the "Does this head matter?" page draws it: for an ablation
    ("zero" or "mean") the change of the loss when the head's output is removed (red: the loss rises without it,
    the head helps), for "gradient" |dL/dg| of the head's gate (Michel et al., 2019).

    ``result``: what :mod:`attnviz.interventions.importance` returns (a ``Study``, one ``ImportanceMap``, or a
    dict of them); a corpus importance run (:func:`attnviz.importance`: its mean over the documents, from its
    ``map()`` table); or any result with a ``map_figure(method)`` method, which then draws it itself.
    ``method``: which map of several (default "zero" ablation, where there is one)."""
    if callable(getattr(result, "map_figure", None)):
        drawn = result.map_figure() if method is None else result.map_figure(method)
        figure, caption = drawn if isinstance(drawn, tuple) else (drawn, getattr(drawn, "caption", "") or "")
        return _notebook_figure(figure, caption)
    maps = _maps_of(result)
    method = method if method is not None else ("zero" if "zero" in maps else next(iter(maps)))
    if method not in maps:
        raise ValueError(f"no {method!r} map here: there are {', '.join(map(repr, maps))}")
    chosen = maps[method]
    signed = method != "gradient" and chosen.objective != "hidden"  # a distance, like a gradient's size, is >= 0
    figure = importance_heatmap(chosen.values, chosen.labels, title=METHOD_TITLES.get(method, method),
                                measure="|dL/dg|" if method == "gradient" else MEASURES[chosen.objective],
                                signed=signed)
    over = "texts" if isinstance(result, (ImportanceMap, dict)) or hasattr(result, "maps") else "documents"
    return _notebook_figure(figure, map_caption(method, chosen.objective, over))


# -- patching, attribution, composition (attnviz.patch, attnviz.paths, attnviz.attribute, ...) ----------------------
def _columns(count: int, tokens: list[str] | None) -> list[str]:
    return [f"{i} {tokens[i]}" for i in range(count)] if tokens is not None and len(tokens) == count else \
        [str(i) for i in range(count)]


def patching(result, tokens: list[str] | None = None) -> NotebookFigure:
    """A :func:`attnviz.patch` map as the page draws it: the mean share over the examples, each cell's 95 % bootstrap
    interval on hover. ``tokens``: labels for the positions (the clean prompt's tokens)."""
    from attnviz.interventions.activation_patching import SITES, spread
    from attnviz.pagelogic.patching import as_grid, head_labels
    from attnviz.viz.patching import spread_heatmap

    shares, rows = as_grid(result)
    by_position = result.by_position or result.site in ("resid", "attn", "mlp")
    columns = _columns(shares.shape[-1], tokens) if by_position else head_labels(result.heads)
    summary = spread(shares)
    measure = "restored share" if result.direction == "denoising" else "share taken away"
    figure = spread_heatmap(summary.mean, summary.low, summary.high, summary.std, rows, columns,
                            examples=summary.examples, measure=measure, x_title="position" if by_position else "head",
                            title=f"{SITES[result.site].capitalize()} patched ({result.direction}): mean share of the "
                                  f"{result.metric} gap")
    return _notebook_figure(figure, "1: the patch alone " + ("brings the clean answer back" if result.direction ==
                                                              "denoising" else "breaks the answer") + "; 0: nothing.")


def paths(result) -> NotebookFigure:
    """A :func:`attnviz.paths` map: each sender's share into the receiver's queries, keys or values."""
    from attnviz.interventions.path_patching import MLPS, VIA
    from attnviz.viz.patching import spread_heatmap

    summary = result.share_spread
    layer, head = result.receiver
    figure = spread_heatmap(summary.mean, summary.low, summary.high, summary.std, result.rows,
                            [f"H{h}" for h in range(summary.mean.shape[-1])], examples=summary.examples,
                            measure="restored share" if result.direction == "denoising" else "share taken away",
                            x_title="sender head",
                            title=f"Into L{layer} H{head}'s {VIA[result.via]}, {MLPS.get(result.mlps, result.mlps)}")
    return _notebook_figure(figure, "Each cell: the sender's change reaching the receiver only through this input.")


def attribution(result, position: int = -1) -> NotebookFigure:
    """An :func:`attnviz.attribute` result's parts at ``position`` as bars; they sum to the model's difference."""
    from attnviz.viz.logit_attribution import attribution_bars

    values = result.values[:, position]
    figure = attribution_bars(values, result.labels, result.layers, total=float(values.sum()),
                              title=f"Direct logit attribution at position {position}")
    return _notebook_figure(figure, f"Red: toward the answer, blue: toward the foil ({result.note}).")


def lens(result, tokens: list[str] | None = None) -> NotebookFigure:
    """An :func:`attnviz.logit_lens` result: the logit difference read at every layer boundary and position."""
    from attnviz.viz.logit_attribution import lens_heatmap

    n = result.difference.shape[1]
    figure = lens_heatmap(result.difference, result.rows, tokens if tokens is not None else [str(i) for i in range(n)],
                          probability=result.probability, rank=result.rank, answer_top=result.top == result.answer,
                          title="Logit lens: logit(answer) - logit(foil) read at each layer")
    return _notebook_figure(figure, f"Each row read through {result.note}.")


def composition(result) -> NotebookFigure:
    """An :func:`attnviz.composition` result: every pair's score against random matrices of the same shapes."""
    from attnviz.viz.composition import composition_heatmap

    figure = composition_heatmap(result.scores, result.labels, kind=result.kind, baseline_mean=result.baseline_mean,
                                 baseline_spread=result.baseline_spread)
    return _notebook_figure(figure, "Senders down, receivers across; red: above what random matrices score.")
