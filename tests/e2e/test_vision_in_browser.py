"""A vision transformer in a real Chromium: upload the checkpoint, upload an image through the file input, see
the overlay, click a patch to make it the query."""

import io

import pytest
from PIL import Image

from attnviz.bench.tiny import make_tiny_vision_checkpoint
from tests.e2e.conftest import upload_checkpoint, wait_until_idle
from tests.tiny_models import zip_folder

pytestmark = pytest.mark.e2e


def overlay_title(page) -> str:
    return page.locator(".js-plotly-plot .gtitle").first.text_content()


def test_an_image_upload_is_overlaid_and_a_click_on_a_patch_follows_it(page, app_url, screenshot_dir, tmp_path):
    folder = make_tiny_vision_checkpoint("vit", tmp_path / "tiny-vit", image_size=64)  # 8 x 8 patches of 8 px
    upload_checkpoint(page, app_url, zip_folder(folder, tmp_path / "tiny-vit.zip"))
    page.get_by_role("link", name="Explore heads").click()
    wait_until_idle(page)
    page.get_by_role("radio", name="Upload an image").click(timeout=90_000)  # slow to appear on a busy machine
    wait_until_idle(page)
    picture = tmp_path / "stripes.png"
    stripes = Image.new("RGB", (120, 90), (20, 20, 200))
    stripes.paste((230, 200, 0), (0, 0, 60, 90))
    buffer = io.BytesIO()
    stripes.save(buffer, format="PNG")
    picture.write_bytes(buffer.getvalue())
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(picture))
    wait_until_idle(page)
    page.get_by_text("Attention of [CLS]").first.wait_for(timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    # no sentence box while a model that reads images is current: it would change nothing
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_text("This model reads images").count() == 1
    assert sidebar.get_by_role("textbox", name="Sentence").count() == 0
    page.get_by_text("Replay check").wait_for(timeout=30_000)
    page.screenshot(path=str(screenshot_dir / "explore_vision_upload.png"), full_page=True)
    # click the centre of patch (2, 5): the heatmap covers the 64 x 64 image the model saw
    area = page.locator(".js-plotly-plot .nsewdrag").first.bounding_box()
    x = area["x"] + area["width"] * (5 + 0.5) / 8
    y = area["y"] + area["height"] * (2 + 0.5) / 8
    page.mouse.click(x, y)
    wait_until_idle(page)
    page.get_by_text("Attention of (2,5)").first.wait_for(timeout=30_000)
    assert overlay_title(page).startswith("Attention of (2,5)")
    page.screenshot(path=str(screenshot_dir / "explore_vision_clicked.png"), full_page=True)
    # a file that is not an image is refused in the page
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(
        files=[{"name": "fake.png", "mimeType": "image/png", "buffer": b"not an image at all"}])
    wait_until_idle(page)
    page.get_by_text("This image cannot be read").wait_for(timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0
