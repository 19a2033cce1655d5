"""Everything works offline: no page asks the network for anything but the app's own server."""

from urllib.parse import urlparse

import pytest

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e


def test_no_page_requests_anything_outside_the_app(browser, app_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    outside = []

    def guard(route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    page.goto(app_url)
    wait_until_idle(page)
    links = page.locator('[data-testid="stSidebarNav"] a')
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    assert len(hrefs) >= 8
    for href in hrefs:
        page.goto(href if href.startswith("http") else app_url + href)
        wait_until_idle(page)
        assert page.locator('[data-testid="stException"]').count() == 0
    context.close()
    assert outside == [], f"pages asked the network for: {outside[:5]}"
