"""Paper-ready figures: every Plotly toolbar downloads PNG (at 2x, named after the title) and SVG, in the browser."""

import struct
import xml.etree.ElementTree as ElementTree

import pytest

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e


def _toolbar_button(page, figure, label: str):
    figure.hover()  # Plotly shows its toolbar on hover
    button = figure.locator(f'.modebar-btn[data-title="{label}"]')
    button.wait_for(timeout=30_000)
    return button


def test_every_figure_downloads_png_at_2x_and_svg(page, app_url, tmp_path):
    page.goto(app_url + "/step_by_step")
    wait_until_idle(page)
    page.get_by_text("Step 4 · Weights").first.wait_for(timeout=30_000)
    figures = page.locator(".js-plotly-plot")
    assert figures.count() >= 5
    for index in range(figures.count()):  # every toolbar got the SVG button
        assert figures.nth(index).locator('[data-attnviz-svg]').count() == 1
    figure = page.locator(".js-plotly-plot", has_text="Step 4 · Weights").first
    with page.expect_download() as svg_download:
        _toolbar_button(page, figure, "Download as SVG").click()
    svg_path = tmp_path / "figure.svg"
    svg_download.value.save_as(svg_path)
    assert svg_download.value.suggested_filename == "step-4-weights-softmax-of-each-row.svg"
    root = ElementTree.parse(svg_path).getroot()  # a valid XML document...
    assert root.tag.endswith("svg")  # ...whose root is an SVG drawing
    assert "Step 4" in svg_path.read_text()  # with the figure's title in it, as text (vector, not a bitmap)

    with page.expect_download() as png_download:
        _toolbar_button(page, figure, "Download plot as a PNG").click()
    png_path = tmp_path / "figure.png"
    png_download.value.save_as(png_path)
    assert png_download.value.suggested_filename == "step-4-weights-softmax-of-each-row.png"
    header = png_path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    shown = figure.bounding_box()
    assert width >= 1.9 * shown["width"] and height >= 1.9 * shown["height"]  # rendered at 2x
