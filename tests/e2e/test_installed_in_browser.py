"""`attnviz serve` from the installed package, run in a folder outside the checkout, seen in Chromium: healthy, the
first page renders with its figures, a second page opens from the navigation, and nothing is asked of the network."""


import pytest

from attnviz.bench import browser as shared
from tests.e2e.conftest import offline_context, wait_until_idle

pytestmark = pytest.mark.e2e


def test_attnviz_serve_from_the_installed_package(installed_attnviz, browser, screenshot_dir):
    command = (str(installed_attnviz.command), "serve")
    try:
        server = shared.streamlit_server(command=command, cwd=installed_attnviz.home,
                                         extra_env={"PYTHONPATH": ""}, timeout=120)
        with server as served:
            context, outside = offline_context(browser, viewport={"width": 1400, "height": 1800})
            page = context.new_page()
            page.goto(served.url)
            wait_until_idle(page)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.get_by_role("heading", name="Explore heads").first.wait_for(timeout=60_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            page.screenshot(path=str(screenshot_dir / "installed_serve.png"))
            page.get_by_role("link", name="Masks").click()
            wait_until_idle(page)
            page.get_by_role("heading", name="Masks").first.wait_for(timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            context.close()
            assert outside == []
    except shared.ServerFailed as problem:
        pytest.fail(str(problem))
