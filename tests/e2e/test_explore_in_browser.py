"""Explore heads and Checkpoints in a real Chromium: the three main views, and an upload through the file input."""

import pytest

from tests.e2e.conftest import upload_checkpoint, wait_until_idle
from tests.tiny_models import make_tiny_checkpoint, zip_folder

pytestmark = pytest.mark.e2e


def no_exception(page):
    assert page.locator('[data-testid="stException"]').count() == 0


@pytest.mark.parametrize(
    "view,expected",
    [("Head", "Layer 1, head 2: self-attention"), ("Grid", "All 6 x 12 heads"),
     ("Lines", "Layer 1: self-attention, head 2")],
)
def test_explore_views_render(page, app_url, screenshot_dir, view, expected):
    page.goto(f"{app_url}/?layer=1&head=2&view={view}")
    wait_until_idle(page)
    page.get_by_text(expected).first.wait_for(timeout=30_000)
    page.get_by_text("Replay check").wait_for(timeout=30_000)
    no_exception(page)
    page.screenshot(path=str(screenshot_dir / f"explore_{view.lower()}.png"), full_page=True)


def test_upload_through_the_file_input_switches_the_model(page, app_url, screenshot_dir, tmp_path):
    folder = make_tiny_checkpoint("gpt2", tmp_path / "tiny-gpt2")
    archive = zip_folder(folder, tmp_path / "tiny-gpt2.zip")
    upload_checkpoint(page, app_url, archive)
    no_exception(page)
    page.screenshot(path=str(screenshot_dir / "checkpoints_uploaded.png"), full_page=True)
    page.get_by_role("link", name="Explore heads").click()
    wait_until_idle(page)
    page.get_by_text("gpt2 decoder").first.wait_for(timeout=60_000)
    page.get_by_text("Replay check").wait_for(timeout=30_000)
    assert "model=tiny-gpt2" in page.url  # the sidebar's model, kept in the URL
    no_exception(page)
    page.screenshot(path=str(screenshot_dir / "explore_uploaded_gpt2.png"), full_page=True)
    # Remove it again: the sidebar falls back to the bundled BERT.
    page.get_by_role("link", name="Checkpoints").click()
    wait_until_idle(page)
    page.get_by_role("button", name="Remove").click()
    wait_until_idle(page)
    page.get_by_role("link", name="Explore heads").click()
    wait_until_idle(page)
    page.get_by_text("bert encoder").first.wait_for(timeout=60_000)
    no_exception(page)


def test_clicking_a_grid_thumbnail_opens_that_head(page, app_url, screenshot_dir):
    page.goto(f"{app_url}/?view=Grid&sentence=The%20cat%20sat%20on%20the%20mat.")
    wait_until_idle(page)
    page.get_by_text("All 6 x 12 heads").first.wait_for(timeout=30_000)
    area = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
    tokens, gap, layers, heads = 9, 1, 6, 12  # [CLS] the cat sat on the mat . [SEP]: thumbnails of 9 cells
    width, height = heads * (tokens + gap) - gap, layers * (tokens + gap) - gap
    layer, head = 3, 7
    x = area["x"] + area["width"] * (head * (tokens + gap) + tokens / 2) / width
    y = area["y"] + area["height"] * (layer * (tokens + gap) + tokens / 2) / height
    page.mouse.click(x, y)
    wait_until_idle(page)
    page.get_by_text("Layer 3, head 7: self-attention").first.wait_for(timeout=30_000)
    assert "layer=3" in page.url and "head=7" in page.url
    page.screenshot(path=str(screenshot_dir / "explore_clicked_thumbnail.png"), full_page=True)


def test_clicking_a_query_token_in_the_lines_view_follows_it(page, app_url):
    page.goto(f"{app_url}/?view=Lines&layer=2&head=5&sentence=The%20cat%20sat%20on%20the%20mat.")
    wait_until_idle(page)
    page.get_by_text("Layer 2: self-attention, head 5").first.wait_for(timeout=30_000)
    label = page.locator(".js-plotly-plot").first.get_by_text("2 · cat", exact=True).first.bounding_box()
    page.mouse.click(label["x"] + label["width"] + 5, label["y"] + label["height"] / 2)  # the point the label names
    wait_until_idle(page)
    page.locator('[data-testid="stMultiSelect"]').get_by_text("2 · cat").wait_for(timeout=30_000)  # now followed
    assert page.locator('[data-testid="stException"]').count() == 0
