"""Every page in the navigation, in a real browser: renders, no exception element, nothing asked of the network
but the app's own server, screenshot saved."""

import re

import pytest

from attnviz.app.streamlit_app import PAGES
from tests.e2e.conftest import offline_context, streamlit_server, wait_until_idle

pytestmark = pytest.mark.e2e


def navigation_links(page, app_url):
    page.goto(app_url)
    wait_until_idle(page)
    links = page.locator('[data-testid="stSidebarNav"] a')
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    return hrefs or [app_url + "/"]  # a single-page app shows no nav list: the root is the page


def test_every_page_renders_offline_without_exception(browser, app_url, screenshot_dir):
    """Every page renders, draws its figures and asks the network for nothing but the app's own server (everything
    works offline: no CDN script, no hub download)."""
    context, outside = offline_context(browser, viewport={"width": 1500, "height": 3200})
    page = context.new_page()
    hrefs = navigation_links(page, app_url)
    assert len(hrefs) >= 8, "the navigation lists too few pages"
    for href in hrefs:
        url = href if href.startswith("http") else app_url + href
        page.goto(url)
        wait_until_idle(page)
        assert page.locator('[data-testid="stException"]').count() == 0, f"exception on {url}"
        page.locator("h1").first.wait_for(timeout=30_000)
        if "checkpoints" not in url and "corpus" not in url:  # every page but the forms draws figures
            page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
        name = re.sub(r"[^a-z0-9]+", "_", url.rsplit("/", 1)[-1].lower()) or "home"
        page.screenshot(path=str(screenshot_dir / f"{name}.png"), full_page=True)
    context.close()
    assert outside == [], f"pages asked the network for: {outside[:5]}"


def test_step_by_step_reacts_to_the_mask_in_the_browser(page, app_url, screenshot_dir):
    page.goto(app_url + "/step_by_step")
    wait_until_idle(page)
    page.get_by_text("Step 4 · Weights").first.wait_for(timeout=30_000)  # Plotly draws after the script ends
    assert page.get_by_text("−∞").count() == 0
    page.get_by_label("Mask").click()  # the selectbox
    page.get_by_role("option", name="Causal (GPT)").click()
    wait_until_idle(page)
    page.get_by_text("Each query sees between 1 and 8").wait_for(timeout=30_000)
    page.locator("text=−∞").first.wait_for(timeout=30_000)  # masked scores drawn in the figure
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(screenshot_dir / "step_by_step_causal.png"), full_page=True)


def test_a_link_reopens_a_page_in_its_state(page, app_url):
    """Speakers share links: the URL carries the page's main choices."""
    page.goto(app_url + "/step_by_step?sbs_mask=Causal%20(GPT)&sbs_d_k=3")  # a selectbox keeps its shown label
    wait_until_idle(page)
    page.get_by_text("Each query sees between 1 and 8").wait_for(timeout=30_000)
    page.get_by_text("Step 2 · Scaled scores (÷ √3").first.wait_for(timeout=30_000)
    from urllib.parse import quote

    page.goto(app_url + "/masks?masks_pattern=" + quote("BigBird (global + window + random)"))  # the shown label
    wait_until_idle(page)
    page.get_by_text("BigBird (global + window + random) over your").first.wait_for(timeout=30_000)
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_first_visit_to_a_deep_link_on_a_fresh_server_gets_the_navigation(browser):
    """The very first request of a new server is for /masks: the page must come with app.py's sidebar."""
    with streamlit_server() as url:
        context = browser.new_context(viewport={"width": 1400, "height": 1800})
        page = context.new_page()
        page.goto(url + "/masks")
        wait_until_idle(page)
        page.locator("h1", has_text="Masks").wait_for(timeout=60_000)
        assert page.locator('[data-testid="stSidebarNav"] a').count() == len(PAGES)  # app.py's whole navigation
        assert page.get_by_label("Model", exact=True).count() == 1  # the global sidebar of app.py
        assert page.locator('[data-testid="stException"]').count() == 0
        context.close()
