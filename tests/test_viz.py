"""Figure builders: one colour scale for weights, a centred one for signed values, readable labels, -inf shown."""

import dataclasses

import numpy as np
import pytest
import torch

from attnviz.viz import style
from attnviz.viz.charts import line_chart
from attnviz.viz.heads import head_grid
from attnviz.viz.matrix import (
    PLAIN,
    SIGNED,
    WEIGHTS,
    WEIGHTS_LOG,
    WEIGHTS_PER_HEAD,
    WEIGHTS_PER_ROW,
    SignedScale,
    WeightScale,
    heatmap_row,
    mask_heatmap,
    matrix_heatmap,
)


def test_weights_use_the_shared_zero_to_one_scale_and_show_minus_infinity():
    figure = matrix_heatmap(np.array([[0.5, -np.inf], [0.25, 0.75]]), ["0 · a", "1 · b"], ["0 · a", "1 · b"], title="t")
    trace = figure.data[0]
    other = matrix_heatmap(np.eye(2), ["a", "b"], ["a", "b"], title="u").data[0]
    assert (trace.zmin, trace.zmax) == (0.0, 1.0) and trace.colorscale == other.colorscale  # every head: one scale
    assert trace.text[0][1] == "−∞" and np.isnan(trace.z[0][1])  # -inf is a gap: the grey background shows
    assert figure.layout.plot_bgcolor == style.BLOCKED_COLOR
    assert list(trace.x) == ["0 · a", "1 · b"] and list(trace.y) == ["0 · a", "1 · b"]  # hover names both tokens
    assert "%{z:.3g}" in trace.hovertemplate and "query %{y}" in trace.hovertemplate  # 3 significant digits
    assert list(figure.layout.xaxis.tickvals) == ["0 · a", "1 · b"] and figure.layout.yaxis.autorange == "reversed"


def test_repeated_labels_fall_back_to_positions():
    figure = matrix_heatmap(np.eye(2), ["a", "a"], ["k0", "k1"], title="t")
    assert list(figure.data[0].y) == [0, 1]  # Plotly would merge two "a" categories


def test_log_row_and_head_colour_scales():
    log = matrix_heatmap(np.log10(np.array([[1e-3, 1.0]])), ["q"], ["k0", "k1"], title="t", scale=WEIGHTS_LOG)
    assert log.data[0].zmin == -3.0 and log.data[0].zmax == 0.0 and "log10 weight" in log.data[0].hovertemplate
    assert list(log.data[0].colorbar.tickvals) == [-3, -2, -1, 0]  # ticks at powers of ten, read as such
    assert list(log.data[0].colorbar.ticktext) == ["1e-3", "1e-2", "1e-1", "1"]
    tiny = matrix_heatmap(np.array([[-20.0, 0.0]]), ["q"], ["k0", "k1"], title="t", scale=WEIGHTS_LOG)
    assert tiny.data[0].zmin == -12.0  # the scale stops at 1e-12
    for scale, name in ((WEIGHTS_PER_ROW, "weight / row max"), (WEIGHTS_PER_HEAD, "weight / head max")):
        divided = matrix_heatmap(np.array([[0.5, 1.0]]), ["q"], ["k0", "k1"], title="t", scale=scale)
        assert f"{name} %{{z:.3g}}" in divided.data[0].hovertemplate and divided.data[0].zmax == 1.0
        assert "rank" in divided.data[0].hovertemplate  # still weights: ranked in their row


def test_a_scale_takes_only_its_own_options():
    with pytest.raises(TypeError):
        SignedScale(log=True)  # log is for weights
    with pytest.raises(TypeError):
        WeightScale(robust=True)  # robust and bound are for signed values
    with pytest.raises(dataclasses.FrozenInstanceError):
        SIGNED.bound = 2.0  # the shared constants cannot be changed under another figure


def test_signed_values_are_centred_and_robust_bound_ignores_outliers():
    values = np.concatenate([np.linspace(-1, 1, 999), [100.0]]).reshape(20, 50)
    rows, cols = [str(i) for i in range(20)], [str(j) for j in range(50)]
    plain = matrix_heatmap(values, rows, cols, title="t", scale=SIGNED)
    assert plain.data[0].zmin == -100 and plain.data[0].zmax == 100 and plain.data[0].zmid == 0
    robust = matrix_heatmap(values, rows, cols, title="t", scale=SignedScale(robust=True))
    assert robust.data[0].zmax < 2 and robust.data[0].zmin == -robust.data[0].zmax
    shared = matrix_heatmap(values, rows, cols, title="t", scale=SignedScale(bound=3.5))
    assert (shared.data[0].zmin, shared.data[0].zmax, shared.data[0].zmid) == (-3.5, 3.5, 0)
    zeros = matrix_heatmap(np.zeros((2, 2)), ["a", "b"], ["a", "b"], title="t", scale=SIGNED)
    assert (zeros.data[0].zmin, zeros.data[0].zmax) == (-1.0, 1.0)  # nothing to scale by: ±1, not a 0-wide range
    assert "rank" not in plain.data[0].hovertemplate and plain.data[0].customdata is None  # ranks are for weights


def test_plain_values_take_their_own_range():
    figure = matrix_heatmap(np.array([[3.0, 7.0]]), ["q"], ["k0", "k1"], title="t", scale=PLAIN)
    trace = figure.data[0]
    weights = matrix_heatmap(np.array([[0.3, 0.7]]), ["q"], ["k0", "k1"], title="t", scale=WEIGHTS).data[0]
    assert trace.zmin is None and trace.zmax is None and trace.colorscale != weights.colorscale
    assert list(trace.text[0]) == ["3", "7"] and "value %{z:.3g}" in trace.hovertemplate


def test_large_matrices_drop_per_cell_text_and_thin_ticks():
    labels = style.token_labels([f"w{i}" for i in range(512)])
    figure = matrix_heatmap(np.random.rand(512, 512), labels, labels, title="t")
    assert figure.data[0].text is None and figure.data[0].customdata is None  # no ranks past 256 x 256
    assert len(figure.layout.xaxis.tickvals) <= 48
    assert len(figure.to_json()) < 2_000_000  # a 512 x 512 head stays under 2 MB, hover labels included
    assert style.token_labels(["a", "a"]) == ["0 · a", "1 · a"]  # repeated tokens kept apart
    assert style.format_number(0.000123456) == "0.000123" and style.format_number(float("-inf")) == "−∞"


def test_heatmap_row_shares_one_scale():
    figure = heatmap_row([np.array([[1.0, -2.0]]), np.array([[0.5, 4.0]])], ["a", "b"], ["q"], ["k0", "k1"],
                         title="t", scale=SIGNED)
    assert {(trace.zmin, trace.zmax, trace.zmid) for trace in figure.data} == {(-4.0, 4.0, 0.0)}
    assert [trace.showscale for trace in figure.data] == [False, True]


def test_mask_heatmap_uses_discrete_colours():
    figure = mask_heatmap(torch.tensor([[1, 0], [1, 1]]), ["0 · the", "1 · cat"], ["0 · the", "1 · cat"], title="t")
    assert list(figure.data[0].colorbar.ticktext) == ["blocked", "may attend"]
    assert figure.data[0].customdata[0][1] == "query 0 · the → key 1 · cat: blocked"  # the hover names both tokens


def test_head_grid_pools_and_labels():
    weights = torch.softmax(torch.randn(3, 4, 100, 100), dim=-1)
    figure = head_grid(weights, title="t", thumbnail=10)
    canvas = np.asarray(figure.data[0].z)
    assert canvas.shape == (3 * 11 - 1, 4 * 11 - 1)
    assert list(figure.layout.yaxis.ticktext) == ["L0", "L1", "L2"]
    assert len(figure.data[1].customdata) == 12  # one clickable centre per head


def test_line_chart_marker_line_stays_in_data_units_on_log_axes():
    figure = line_chart([1, 10, 100], {"a": [3.0, 2.0, 1.0]}, title="t", x_title="x", y_title="y", log_x=True,
                        vlines={"here": 10})
    marker = figure.data[-1]
    assert list(marker.x) == [10, 10] and list(marker.y) == [1.0, 3.0]
    assert figure.layout.xaxis.type == "log" and not figure.layout.shapes


@pytest.mark.parametrize("scale", [WEIGHTS, SIGNED, PLAIN])
def test_label_count_mismatch_is_an_error(scale):
    with pytest.raises(ValueError, match="labels"):
        matrix_heatmap(np.zeros((2, 2)), ["a"], ["a", "b"], title="t", scale=scale)


def test_a_sweeps_few_sizes_are_each_labelled_on_a_log_axis():
    """A log x axis over a benchmark's few sizes labels each size (not Plotly's 2 ... 9 between decades, which
    collided with "1000" in a half-width chart); a long sweep keeps Plotly's own ticks."""
    from attnviz.viz.charts import MOST_LABELLED_X, line_chart

    sizes = [512, 1024, 2048, 4096, 8192]
    figure = line_chart(sizes, {"naive": [1, 2, 4, 8, 16]}, title="Time vs N", x_title="N", y_title="ms", log_x=True)
    assert figure.layout.xaxis.tickmode == "array"
    assert list(figure.layout.xaxis.tickvals) == sizes
    assert list(figure.layout.xaxis.ticktext) == ["512", "1,024", "2,048", "4,096", "8,192"]
    many = [2 ** i for i in range(MOST_LABELLED_X + 3)]
    figure = line_chart(many, {"d_k": many}, title="Variance", x_title="d_k", y_title="variance", log_x=True)
    assert figure.layout.xaxis.tickmode is None and figure.layout.xaxis.type == "log"
    linear = line_chart(sizes, {"naive": [1, 2, 4, 8, 16]}, title="Time vs N", x_title="N", y_title="ms")
    assert linear.layout.xaxis.tickmode is None
