"""Generation and KV cache in a real Chromium: the bundled tiny GPT writes, and the timeline grows."""

import pytest

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e


def timeline_rows(page) -> int:
    return page.evaluate("""() => {
        const plot = [...document.querySelectorAll('.js-plotly-plot')]
            .find(el => (el.layout.title.text || '').includes('Timeline'));
        return plot ? plot.data[0].z.length || plot.data[0].y.length : -1; }""")


def test_the_bundled_gpt_generates_five_tokens_and_the_timeline_grows(page, app_url, screenshot_dir):
    page.goto(f"{app_url}/generation")
    wait_until_idle(page)
    page.get_by_label("New tokens").fill("5")
    page.get_by_role("button", name="Generate").click()
    wait_until_idle(page)
    page.get_by_text("Timeline: each step's attention").first.wait_for(timeout=60_000)
    assert timeline_rows(page) == 5
    page.get_by_role("button", name="One more token").click()
    wait_until_idle(page)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(el => "
                           "(el.layout.title.text || '').includes('Step 6'))", timeout=30_000)
    assert timeline_rows(page) == 6
    # The page's own check of the cache: the same tokens, logits within rounding (a model loaded beside the
    # server's warm-up once broke this: models/loading.LOADING).
    same = page.locator('[data-testid="stMetric"]').filter(has_text="Same tokens uncached").first
    assert same.inner_text().split()[-1] == "yes"
    difference = page.locator('[data-testid="stMetric"]').filter(has_text="Largest logit difference").first
    assert float(difference.inner_text().split()[-1]) < 1e-4
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(screenshot_dir / "generation.png"), full_page=True)
