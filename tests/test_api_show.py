"""attnviz.api.show: the pages' own figure builders from a notebook, holding the captured numbers, and shown inline
with no network: Plotly's mimetype and HTML whose plotly.js is inline once per process, never from a CDN."""

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from attnviz.api import show
from attnviz.api.capture import capture
from attnviz.interventions import importance as imp
from attnviz.interventions.edits import editable_lm
from attnviz.models.shipped import BUNDLED_GPT_DIR

TEXT = "The cat sat on the mat. The cat sat on the mat."


@pytest.fixture(scope="module")
def captured():
    return capture("tiny GPT", TEXT)


@pytest.fixture(scope="module")
def study():
    """Every importance map of the page, on the bundled tiny GPT (3 x 4 heads) and two short texts."""
    model, tokenizer = editable_lm(BUNDLED_GPT_DIR)
    return imp.study(model, tokenizer, ["The cat sat on the mat.", "A list is a sequence of items."])


def test_the_head_view_draws_the_captured_weights(captured):
    figure = show.head(captured, 2, 1)
    assert isinstance(figure, show.NotebookFigure) and isinstance(figure, go.Figure)
    heatmap = figure.data[0]
    np.testing.assert_allclose(np.asarray(heatmap.z, dtype=float), captured.weights(2)[1].numpy(), atol=1e-7)
    assert len(heatmap.x) == len(heatmap.y) == captured.n_tokens
    assert "Layer 2, head 1" in figure.layout.title.text and figure.caption.startswith("Each row")
    log = show.head(captured, 0, 0, scale="log")
    weights = captured.weights(0)[0].numpy()
    expected = np.where(weights > 0, np.log10(np.maximum(weights, 1e-30)), np.nan)  # masked keys: no logarithm
    np.testing.assert_allclose(np.asarray(log.data[0].z, dtype=float), expected, atol=1e-5)


def test_the_grid_draws_every_head(captured):
    n = captured.n_tokens  # under 24: the thumbnails are the weights themselves
    one_layer = show.grid(captured, 1, scale="fixed")
    canvas = np.asarray(one_layer.data[0].z, dtype=float)
    assert canvas.shape == (n, 4 * n + 3)  # four heads a gap apart
    for head in range(4):
        np.testing.assert_allclose(canvas[:, head * (n + 1): head * (n + 1) + n], captured.weights(1)[head].numpy(),
                                   atol=1e-6)
    assert "Layer 1: all 4 heads" in one_layer.layout.title.text
    every = show.grid(captured)
    assert np.asarray(every.data[0].z).shape == (3 * n + 2, 4 * n + 3)
    top = np.asarray(every.data[0].z, dtype=float)[:n, :n]  # layer 0, head 0, scaled to its own maximum
    weights = captured.weights(0)[0].numpy()
    np.testing.assert_allclose(top, weights / weights.max(), atol=1e-6)


def test_the_lines_view_draws_each_weight_of_the_head(captured):
    figure = show.lines(captured, 0, [1, 2])
    weights = captured.weights(0)
    drawn = figure.layout.meta["lines"]  # [query, key, weight] of every line drawn
    expected = sum(int((weights[head] >= 0.02).sum()) for head in (1, 2))
    assert len(drawn) == expected
    strongest = max(drawn, key=lambda line: line[2])
    assert strongest[2] == pytest.approx(float(weights[1:3, strongest[0], strongest[1]].max()), abs=1e-3)
    assert "heads 1, 2" in figure.layout.title.text
    only = show.lines(captured, 0, 1, top_k=1)
    assert len(only.layout.meta["lines"]) == int((weights[1].max(-1).values >= 0.02).sum())


def test_the_queries_and_keys_map(captured):
    figure = show.qk_map(captured, 2, 1, query=8)
    queries, keys = figure.data[0], figure.data[1]
    assert len(queries.x) == len(keys.x) == captured.n_tokens
    assert "layer 2, head 1" in figure.layout.title.text and "(PCA)" in figure.layout.title.text
    assert "k = 1" in figure.caption
    assert any(trace.mode == "lines" for trace in figure.data)  # the chosen query's lines to its strongest keys
    three = show.qk_map(captured, 0, 0, dims=3, colour="position")
    assert three.data[0].type == "scatter3d"


def test_the_importance_map_draws_what_the_study_measured(study):
    figure = show.importance_map(study)  # zero ablation, the page's first map
    np.testing.assert_allclose(np.asarray(figure.data[0].z, dtype=float), study.maps["zero"].values.numpy(),
                               atol=1e-7)
    assert figure.layout.title.text == "Zero ablation" and "loss rises" in figure.caption
    gradient = show.importance_map(study.maps, "gradient")
    np.testing.assert_allclose(np.asarray(gradient.data[0].z, dtype=float), study.maps["gradient"].values.numpy(),
                               atol=1e-7)
    assert gradient.data[0].zmin == 0  # a size, not signed
    one = show.importance_map(study.maps["mean"])
    assert one.layout.title.text == "Mean ablation"

    class ImportanceRun:  # a corpus run gives its mean maps as a table, one row per measure and head
        objective = study.objective

        def map(self, method=None):
            return pd.DataFrame([(name, row, module.kind, module.index, head, float(one.values[row, head]))
                                 for name, one in study.maps.items() for row, module in enumerate(one.modules)
                                 for head in range(module.heads)],
                                columns=["method", "module", "kind", "layer", "head", "mean"])

    from_table = show.importance_map(ImportanceRun(), "gradient")
    np.testing.assert_allclose(np.asarray(from_table.data[0].z, dtype=float),
                               study.maps["gradient"].values.numpy(), atol=1e-6)
    assert list(from_table.layout.yaxis.ticktext) == study.maps["gradient"].labels == ["layer 0", "layer 1", "layer 2"]
    assert "documents" in from_table.caption

    class CorpusRun:  # a result that draws its own map
        def map_figure(self, method="zero"):
            return go.Figure(go.Heatmap(z=[[1.0, 2.0]], name=method)), f"{method} over a corpus"

    delegated = show.importance_map(CorpusRun(), "mean")
    assert isinstance(delegated, show.NotebookFigure) and delegated.data[0].name == "mean"
    assert delegated.caption == "mean over a corpus"
    with pytest.raises(ValueError, match="no 'nothing' map here"):
        show.importance_map(study, "nothing")
    with pytest.raises(TypeError, match="ImportanceMap"):
        show.importance_map(torch.zeros(3, 4))


def scripts_from_network(html: str) -> list[str]:
    return re.findall(r"<script[^>]*\bsrc\s*=", html, flags=re.IGNORECASE)


def test_figures_show_inline_without_a_network(captured):
    show.send_plotlyjs_again()  # as in a fresh process
    first = show.head(captured, 0, 0)._repr_mimebundle_()
    second = show.grid(captured, 0)._repr_mimebundle_()
    assert set(first) == set(second) == {"text/plain", show.PLOTLY_MIMETYPE, "text/html"}
    assert first["text/plain"].startswith("Layer 0, head 0")
    for bundle in (first, second):
        assert not scripts_from_network(bundle["text/html"])
        plotly_json = str(bundle[show.PLOTLY_MIMETYPE])
        assert "cdn" not in plotly_json.lower() and "https://" not in plotly_json
        assert bundle[show.PLOTLY_MIMETYPE]["data"] and "layout" in bundle[show.PLOTLY_MIMETYPE]
    assert first["text/html"].count("window.Plotly = Plotly") == 1  # plotly.js inline, in the first figure only
    assert len(first["text/html"]) > 3_000_000
    assert "window.Plotly = Plotly" not in second["text/html"] and len(second["text/html"]) < 200_000
    # once plotly.js is out of the way, nothing in a figure's HTML points at the network
    assert "cdn" not in second["text/html"].lower() and "https://" not in second["text/html"]
    assert "Plotly.newPlot" in second["text/html"]
    # a frontend that asks for some mimetypes gets those only, and plotly.js waits for HTML that is sent
    show.send_plotlyjs_again()
    only_json = show.head(captured, 0, 1)._repr_mimebundle_(include=[show.PLOTLY_MIMETYPE])
    assert show.PLOTLY_MIMETYPE in only_json and "text/html" not in only_json
    assert "window.Plotly = Plotly" in show.head(captured, 0, 1)._repr_html_()
    show.plotlyjs_in_every_figure()  # frontends that frame every output alone (Colab)
    try:
        for _ in range(2):
            assert show.head(captured, 0, 2).offline_html().count("window.Plotly = Plotly") == 1
    finally:
        show.plotlyjs_in_every_figure(False)


def test_invalid_layers_and_heads_name_the_range(captured):
    for call, message in ((lambda: show.head(captured, 3, 0), "layers 0 to 2"),
                          (lambda: show.head(captured, 0, 4), "heads 0 to 3"),
                          (lambda: show.head(captured, -1, 0), "layers 0 to 2"),
                          (lambda: show.grid(captured, 7), "layers 0 to 2"),
                          (lambda: show.lines(captured, 0, [0, 9]), "heads 0 to 3"),
                          (lambda: show.qk_map(captured, 0, 5), "heads 0 to 3"),
                          (lambda: show.head(captured, 0, 0, scale="loud"), "scale must be one of"),
                          (lambda: show.qk_map(captured, 0, 0, colour="pink"), "colour must be one of")):
        with pytest.raises(ValueError, match=message):
            call()
