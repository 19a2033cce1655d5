"""Uploads belong to their session: invisible to another browser, and deleted once the session has ended."""

import time

import pytest

from tests.e2e.conftest import streamlit_server, upload_checkpoint, wait_until_idle
from tests.tiny_models import make_tiny_checkpoint, zip_folder

pytestmark = pytest.mark.e2e


def workspaces(temporary):
    """The uploads' workspaces in a server's temporary folder (not the views of models still cached)."""
    return [p for p in temporary.glob("attnviz-uploads-*/attnviz-upload-*")
            if not p.name.startswith("attnviz-upload-view-")]


def test_an_upload_is_invisible_to_others_and_gone_after_its_session(browser, tmp_path):
    uploads = tmp_path / "server-tmp"
    uploads.mkdir()
    archive = zip_folder(make_tiny_checkpoint("gpt2", tmp_path / "tiny-gpt2"), tmp_path / "tiny-gpt2.zip")
    env = {"TMPDIR": str(uploads), "STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": "1", "ATTNVIZ_JANITOR_SECONDS": "1",
           "ATTNVIZ_KEEP_HOURS": "0"}  # keeping off: an upload belongs to its session alone
    with streamlit_server(env) as url:
        first = browser.new_context(viewport={"width": 1400, "height": 1800})
        upload_checkpoint(first.new_page(), url, archive)
        assert len(workspaces(uploads)) == 1

        second = browser.new_context(viewport={"width": 1400, "height": 1800})
        other = second.new_page()
        other.goto(url + "/checkpoints")
        wait_until_idle(other)
        assert other.get_by_text("tiny-gpt2").count() == 0  # another session's upload is not listed
        other.goto(url + "/?model=tiny-gpt2")  # nor reachable by name
        wait_until_idle(other)
        assert other.get_by_text("gpt2 decoder").count() == 0
        second.close()

        first.close()  # the session ends...
        time.sleep(2)  # ...past server.disconnectedSessionTTL
        third = browser.new_context()  # another session comes and goes: Streamlit drops expired sessions then
        page = third.new_page()
        page.goto(url)
        wait_until_idle(page)
        third.close()
        deadline = time.monotonic() + 60
        while workspaces(uploads) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert workspaces(uploads) == [], "the ended session's upload is still on disk"
