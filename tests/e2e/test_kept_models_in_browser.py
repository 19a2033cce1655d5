"""Talk-ready: a reload keeps the models a browser added, links reopen them, and nobody else gets them."""

import os
import time

import pytest

from tests.e2e.conftest import streamlit_server, upload_checkpoint, wait_until_idle
from tests.tiny_models import make_tiny_checkpoint, zip_folder

pytestmark = pytest.mark.e2e



def _model_shown(page) -> str:
    return page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Model").input_value()


def _number(page, label: str) -> str:
    return page.get_by_label(label, exact=True).input_value()


def test_reload_link_other_browser_and_expiry(browser, tmp_path):
    kept = tmp_path / "kept"
    root = tmp_path / "models"
    make_tiny_checkpoint("bert", root / "local-bert")
    archive = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "tiny-gpt2"), tmp_path / "tiny-gpt2.zip")
    env = {"ATTNVIZ_KEEP_DIR": str(kept), "ATTNVIZ_MODEL_ROOT": str(root), "ATTNVIZ_JANITOR_SECONDS": "1",
           "TMPDIR": str(tmp_path / "server-tmp")}
    (tmp_path / "server-tmp").mkdir()
    with streamlit_server(env) as url:
        speaker = browser.new_context(viewport={"width": 1400, "height": 1800})
        page = speaker.new_page()
        upload_checkpoint(page, url, archive)
        link = f"{url}/?model=tiny-gpt2&layer=1&head=3"
        page.goto(link)
        wait_until_idle(page)
        assert _model_shown(page) == "tiny-gpt2" and page.get_by_text("gpt2 decoder").count() > 0

        page.reload()  # a stray F5: a new Streamlit session in the same browser
        wait_until_idle(page)
        assert _model_shown(page) == "tiny-gpt2" and page.get_by_text("gpt2 decoder").count() > 0
        assert (_number(page, "Layer"), _number(page, "Head")) == ("1", "3")  # the view is back too
        assert "model=tiny-gpt2" in page.url

        tab = speaker.new_page()  # the prepared link in another tab of the same browser
        tab.goto(link)
        wait_until_idle(tab)
        assert _model_shown(tab) == "tiny-gpt2"
        tab.close()

        audience = browser.new_context(viewport={"width": 1400, "height": 1800})  # someone else's browser
        other = audience.new_page()
        other.goto(link)
        wait_until_idle(other)
        assert _model_shown(other).startswith("all-MiniLM-L6-v2")
        assert other.get_by_text("This link asks for the model").count() == 1
        assert other.get_by_text("gpt2 decoder").count() == 0
        other.goto(f"{url}/?model=local-bert")  # a folder inside the server's model root opens for anyone
        wait_until_idle(other)
        assert _model_shown(other) == "local-bert" and other.get_by_text("bert encoder").count() > 0
        audience.close()

        speaker.close()
        folders = [p for p in kept.iterdir() if p.is_dir()]
        assert len(folders) == 2  # one per browser: the speaker's upload, the audience's folder link
        (browser_folder,) = [p for p in folders if any(p.rglob("model.safetensors"))]  # kept after the session
        day_and_a_bit = time.time() - 25 * 3600
        os.utime(browser_folder, (day_and_a_bit, day_and_a_bit))  # as if the browser had not come back for 25 h
        deadline = time.monotonic() + 30
        while browser_folder.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not browser_folder.exists(), "an expired browser's files are still on disk"
