"""Presentation mode on a 1280 x 720 projector: from a link, the sidebar out of the way, the full width for the
content, no label cut short; and the story's Next / Previous links."""

import pytest

from attnviz.ui.frame import story_neighbours
from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e

PAGES = ["step_by_step", "scaling", "masks", "positional", "", "heads_kv_cache", "flash", "generation"]

# Labels and tabs whose text does not fit their box (the browser cuts them with an ellipsis or a scroll).
TRUNCATED = """
() => [...document.querySelectorAll(
    '[data-testid="stMain"] label p, [data-testid="stMain"] [role="tab"] p, [data-testid="stMain"] [role="tablist"]')]
  .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
  .map(el => el.innerText.slice(0, 40))
"""


@pytest.fixture
def projector(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    yield context.new_page()
    context.close()


def test_a_link_opens_presentation_mode_with_the_whole_width(projector, app_url, screenshot_dir):
    for path in PAGES:
        projector.goto(f"{app_url}/{path}?presentation_mode=true")
        wait_until_idle(projector)
        sidebar = projector.locator('[data-testid="stSidebar"]')
        assert sidebar.get_attribute("data-collapsed") == "true", path  # collapsed: out of the way
        sidebar_box = sidebar.bounding_box()
        assert sidebar_box is None or sidebar_box["x"] + sidebar_box["width"] <= 1, path  # and no strip left
        content = projector.locator('[data-testid="stMainBlockContainer"]').bounding_box()
        assert content["width"] >= 1100, (path, content)
        assert projector.evaluate(TRUNCATED) == [], path
        assert projector.get_by_role("switch", name="Presentation mode").is_checked()  # kept from the link
        previous, following = story_neighbours(projector.locator("h1").first.inner_text())
        links = [text.splitlines()[-1] for text in  # the last line: the first is the page's icon
                 projector.locator('[data-testid="stMain"] [data-testid="stPageLink-NavLink"]').all_inner_texts()]
        assert links == ([f"← Previous: {previous}"] if previous else []) + (
            [f"Next: {following} →"] if following else []), (path, links)
        projector.screenshot(path=str(screenshot_dir / f"presentation_{path or 'explore'}.png"))


def test_next_and_previous_follow_the_story(page, app_url):
    page.goto(f"{app_url}/step_by_step")
    wait_until_idle(page)
    assert page.get_by_role("link", name="← Previous").count() == 0  # the story starts here
    page.get_by_role("link", name="Next: Scaling and softmax →").click()
    wait_until_idle(page)
    assert page.locator("h1").first.inner_text() == "Scaling and softmax"
    page.get_by_role("link", name="← Previous: Attention step by step").click()
    wait_until_idle(page)
    assert page.locator("h1").first.inner_text() == "Attention step by step"
