"""Over training in a real Chromium, on the bundled tiny GPT's own run: the figures, the step slider moved with the
keyboard, the kept checkpoint opened in Explore heads and in Generation, and the pre-norm runs trained."""

import json

import pytest

from attnviz.models.shipped import BUNDLED_GPT_DIR
from attnviz.pagelogic.over_training import REPEATED_SENTENCE
from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e

MEASURES = BUNDLED_GPT_DIR / "over-training" / "measures.json"


def shipped_run() -> dict:
    if not MEASURES.exists():
        pytest.skip("the bundled tiny GPT ships no over-training record")
    return json.loads(MEASURES.read_text())


def plot_titles(page) -> list[str]:
    return page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(el => el.layout.title.text "
                         "|| '')")


def marked_step(page) -> float:
    """Where the loss figure's dashed line (the step picked) stands."""
    return page.evaluate("""() => {
        const plot = [...document.querySelectorAll('.js-plotly-plot')]
            .find(el => (el.layout.title.text || '').toLowerCase().includes('loss'));
        const line = (plot.layout.shapes || []).find(shape => shape.line && shape.line.dash === 'dash');
        return line ? line.x0 : -1; }""")


def model_chosen(page, name: str) -> None:
    """Waits until a model box shows ``name`` (its text, or its input's value)."""
    page.wait_for_function("""(name) => [...document.querySelectorAll('[data-testid="stSelectbox"]')].some(el =>
        el.innerText.includes(name) || [...el.querySelectorAll('input')].some(i => (i.value || '').includes(name)))""",
                           arg=name, timeout=60_000)


def metric(page, label: str) -> str:
    return page.locator('[data-testid="stMetric"]').filter(has_text=label).first.inner_text().split("\n")[-1]


def test_the_shipped_run_opens_on_its_phase_change_the_slider_moves_it_and_pre_norm_trains(page, app_url,
                                                                                            screenshot_dir):
    run = shipped_run()
    steps = [row["step"] for row in run["rows"]]
    change = run["phase_change"]
    page.goto(f"{app_url}/over_training")
    wait_until_idle(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert len(plot_titles(page)) >= 3  # loss and in-context learning, the heads, pre-norm's gradients at init
    assert marked_step(page) == change["end"]  # the page opens at the end of the phase change
    words = page.locator('[data-testid="stMarkdown"]').all_inner_texts()
    assert any(f"{change['start']:,}" in text and f"{change['end']:,}" in text for text in words)
    page.screenshot(path=str(screenshot_dir / "over_training_run.png"), full_page=True)
    by_step = {row["step"]: row for row in run["rows"]}
    assert float(metric(page, "Held-out loss")) == pytest.approx(by_step[change["end"]]["loss"], abs=6e-3)

    slider = page.get_by_role("slider").first
    slider.focus()
    slider.press("ArrowLeft")  # one measured step back: the last step before the end of the rise
    wait_until_idle(page)
    before = steps[steps.index(change["end"]) - 1]
    page.wait_for_function(f"() => [...document.querySelectorAll('.js-plotly-plot')].some(el => (el.layout.shapes "
                           f"|| []).some(s => s.line && s.line.dash === 'dash' && s.x0 === {before}))", timeout=30_000)
    assert float(metric(page, "Held-out loss")) == pytest.approx(by_step[before]["loss"], abs=6e-3)
    assert "ot_step=" + str(before) in page.url  # the step is in the link: a talk can open on it

    # Pre-norm or post-norm, on the same page: four runs of 5 steps trained when asked
    page.get_by_label("Steps per run").fill("5")
    page.get_by_label("Steps per run").press("Enter")
    wait_until_idle(page)
    page.get_by_role("button", name="Train both ways").click()
    wait_until_idle(page)
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')].some(el => "
                           "(el.layout.title.text || '').includes('Loss of the four runs'))", timeout=120_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert page.get_by_role("button", name="Train both ways").count() == 0
    page.screenshot(path=str(screenshot_dir / "over_training_pre_post_norm.png"), full_page=True)


def test_the_kept_checkpoint_opens_in_explore_heads_and_generation(page, app_url, screenshot_dir):
    run = shipped_run()
    after = run["phase_change"]["end"]
    page.goto(f"{app_url}/over_training?ot_step={after}")
    wait_until_idle(page)
    page.get_by_role("button", name="Open in Explore heads").click()
    wait_until_idle(page)
    page.wait_for_url("**/?*layer=*", timeout=30_000)  # Explore heads is the app's first page
    model_chosen(page, f"tiny GPT at step {after:,} (bundled run)")
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(screenshot_dir / "over_training_opened_in_explore.png"), full_page=True)

    page.goto(f"{app_url}/over_training?ot_step={after}")
    wait_until_idle(page)
    page.get_by_role("button", name="Open in Generation").click()
    wait_until_idle(page)
    page.wait_for_url("**/generation*", timeout=30_000)
    model_chosen(page, f"tiny GPT at step {after:,} (bundled run)")
    prompt = page.locator('[data-testid="stTextArea"]').filter(has_text="Prompt").locator("textarea").first
    assert prompt.input_value() == REPEATED_SENTENCE
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(screenshot_dir / "over_training_opened_in_generation.png"), full_page=True)
