"""Clicks on the "Queries and keys" page's figures, read from every shape a selection comes back in.

st.plotly_chart(on_select=...) hands back what the browser's Plotly event held, through JSON.stringify: integer
customdata sent as a typed array (as attnviz.viz.queries_keys sends it) is a typed array per point there, and JSON
writes a
typed array as an object. The JSON strings below are what Chromium sent for a click (Streamlit 1.67, Plotly 7),
read by Streamlit's own deserializer, as the page reads them. The browser test
(tests/e2e/test_queries_keys_in_browser.py) clicks the real figures."""

import math

import pytest
from streamlit.elements.plotly_chart import PlotlyChartSelectionSerde

from attnviz.pagelogic.clicks import clicked_layer_head, customdata_numbers, selected_points
from attnviz.pagelogic.queries_keys import clicked_query

# a click on a point whose customdata is an int32 [n, 3] typed array (the head's picture): point 1 holds [6, 2, 0]
TYPED_2D = ('{"selection": {"points": [{"curve_number": 0, "point_number": 1, "point_index": 1, "x": 10, "y": 10, '
            '"customdata": {"0": 6, "1": 2, "2": 0}}], "point_indices": [1], "box": [], "lasso": []}}')
# the same from an int16 [n, 2] typed array (the grid of heads): layer 2, head 5
TYPED_GRID = ('{"selection": {"points": [{"curve_number": 10, "point_number": 1, "point_index": 1, "x": 10, "y": 10, '
              '"customdata": {"0": 2, "1": 5}}], "point_indices": [1], "box": [], "lasso": []}}')
# one-dimensional customdata (a typed array of numbers): a scalar; a plain list of lists: a list
SCALAR = ('{"selection": {"points": [{"curve_number": 0, "point_number": 1, "point_index": 1, "x": 10, "y": 10, '
          '"customdata": 6}], "point_indices": [1], "box": [], "lasso": []}}')
LIST = ('{"selection": {"points": [{"curve_number": 0, "point_number": 1, "point_index": 1, "x": 10, "y": 10, '
        '"customdata": [6, 2, 0]}], "point_indices": [1], "box": [], "lasso": []}}')


def as_streamlit_gives_it(sent: str | None):
    """The widget state the page reads from st.session_state, for what the browser sent."""
    return PlotlyChartSelectionSerde().deserialize(sent)


@pytest.mark.parametrize("customdata,expected", [
    ([6, 2, 0], (6, 2, 0)),  # a plain list
    ((6, 2, 0), (6, 2, 0)),
    ({"0": 6, "1": 2, "2": 0}, (6, 2, 0)),  # a typed array, as JSON writes it
    ({"2": 0, "0": 6, "1": 2}, (6, 2, 0)),  # its places, not the object's order
    ({"0": 6.0, "1": 2.0}, (6, 2)),  # a float typed array
    (6, (6,)),  # one-dimensional customdata
    (6.0, (6,)),
    ("6", (6,)),  # text of a whole number
    ([6.0, "2", 0], (6, 2, 0)),
    (None, None),  # a trace without customdata (the lines, a search's rings)
    ([], None),
    ({}, None),
    ({"0": 6, "2": 0}, None),  # a gap: not an array
    ({"x": 1}, None),
    ([6.5, 2, 0], None),  # not whole numbers
    ([math.nan], None),
    ([math.inf], None),
    (True, None),  # a boolean is no index
    (["the"], None),
    ([[6, 2, 0]], None),  # nested
])
def test_customdata_of_every_shape_gives_its_whole_numbers_in_order(customdata, expected):
    assert customdata_numbers(customdata) == expected


def test_a_query_click_is_read_from_what_the_browser_sends():
    for sent in (TYPED_2D, LIST):
        assert clicked_query(as_streamlit_gives_it(sent), n_queries=10) == 2  # 6 = 3 x query 2 + 0 (a query)
    assert clicked_query(as_streamlit_gives_it(TYPED_2D), n_queries=2) is None  # query 2 of 2: not in this picture
    assert clicked_query(as_streamlit_gives_it(SCALAR), n_queries=10) is None  # not the picture's (index, pos, doc)
    assert clicked_query(as_streamlit_gives_it(None), n_queries=10) is None  # no click yet
    assert clicked_query(None, n_queries=10) is None
    assert clicked_query({"selection": {"points": []}}, n_queries=10) is None
    key, value = {"customdata": {"0": 7, "1": 2, "2": 0}}, {"customdata": [8, 2, 0]}  # key 2, value 2
    assert clicked_query({"selection": {"points": [key, value]}}, n_queries=10) is None
    line, query = {"curve_number": 3}, {"customdata": {"0": 9, "1": 3, "2": 1}}  # a line has no customdata
    assert clicked_query({"selection": {"points": [line, key, query]}}, n_queries=10) == 3
    assert clicked_query({"selection": {"points": [{"customdata": [-3, 0, 0]}]}}, n_queries=10) is None


def test_a_head_click_is_read_from_what_the_browser_sends():
    assert clicked_layer_head(as_streamlit_gives_it(TYPED_GRID), n_layers=6, n_heads=12) == (2, 5)
    assert clicked_layer_head({"selection": {"points": [{"customdata": [2, 5]}]}}, 6, 12) == (2, 5)
    assert clicked_layer_head(as_streamlit_gives_it(TYPED_GRID), n_layers=2, n_heads=12) is None  # no layer 2 here
    assert clicked_layer_head(as_streamlit_gives_it(TYPED_GRID), n_layers=6, n_heads=5) is None
    assert clicked_layer_head(as_streamlit_gives_it(TYPED_2D), 6, 12) is None  # three numbers: not a head's
    assert clicked_layer_head(as_streamlit_gives_it(None), 6, 12) is None


def test_selected_points_of_any_state():
    assert len(selected_points(as_streamlit_gives_it(TYPED_2D))) == 1
    for state in (None, {}, {"selection": None}, {"selection": {"points": None}}, "points", 3):
        assert selected_points(state) == []
    assert selected_points({"selection": {"points": [1, {"customdata": 3}]}}) == [{"customdata": 3}]
