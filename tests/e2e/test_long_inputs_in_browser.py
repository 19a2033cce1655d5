"""Long inputs in a real Chromium: a 512-token sentence on the bundled BERT, and 4,096 tokens on a Llama-shaped
checkpoint (the head view pooled, and a zoomed window). The times are printed (run pytest with -s to see them)."""

import time
from urllib.parse import quote

import pytest

from tests.e2e.conftest import wait_until_idle

pytestmark = pytest.mark.e2e


def no_exception(page):
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_512_token_sentence_renders_its_pooled_head_view(page, app_url, screenshot_dir):
    """Three new 512-token sentences from a link, each to a rendered pooled head view. The time is printed, not
    asserted: the tests share the machine's cores with another worker, and speed is measured by the benchmarks
    (``python -m attnviz.bench explore``, docs/benchmarks.md)."""
    import statistics

    from attnviz.bench.explore import sentence_of
    from tests.tiny_models import bundled_bert

    tokenizer = bundled_bert().tokenizer
    page.goto(app_url)  # the server has started and loaded the bundled model once (a warm server)
    wait_until_idle(page)
    times = []
    for word in ("cat", "dog", "owl"):  # a new sentence each time: nothing is cached
        sentence = word + " " + sentence_of(511, tokenizer)
        start = time.perf_counter()
        page.goto(f"{app_url}/?sentence={quote(sentence)}")
        page.locator(".js-plotly-plot", has_text="pooled to 256 x 256").wait_for(timeout=60_000)
        page.locator(".js-plotly-plot .heatmaplayer").first.wait_for(timeout=30_000)
        times.append(time.perf_counter() - start)
        wait_until_idle(page)
    median = statistics.median(times)
    print(f"\n512-token sentence, navigation to a rendered head view: median {median:.2f} s of "
          + ", ".join(f"{t:.2f}" for t in times))
    no_exception(page)
    page.screenshot(path=str(screenshot_dir / "explore_512_tokens.png"), full_page=True)


def test_4096_tokens_of_a_llama_shaped_checkpoint_render_pooled_and_zoomed(page, app_url, screenshot_dir, tmp_path):
    from attnviz.bench.long import make_checkpoint

    folder = make_checkpoint(tmp_path / "llama-shaped", layers=4, max_positions=4096)
    page.goto(app_url)
    wait_until_idle(page)
    page.get_by_role("link", name="Checkpoints").click()
    wait_until_idle(page)
    page.get_by_role("tab", name="Folder on this server").click()
    page.get_by_label("Folder path").fill(str(folder))
    page.get_by_label("Folder path").press("Enter")
    wait_until_idle(page)
    page.get_by_role("button", name="Load this folder").click()
    wait_until_idle(page)
    page.get_by_text("Loaded llama-shaped").wait_for(timeout=120_000)
    page.get_by_role("link", name="Explore heads").click()
    wait_until_idle(page)
    start = time.perf_counter()
    page.get_by_text("Python's documentation", exact=True).click()
    wait_until_idle(page, timeout_ms=180_000)
    slider = page.get_by_role("slider", name="Tokens")
    for _ in range(3):  # a key pressed while the example's run still ends can be lost on a loaded machine
        slider.focus()
        slider.press("End")  # the checkpoint reads 4,096 tokens: the last length offered
        wait_until_idle(page, timeout_ms=180_000)
        if slider.get_attribute("aria-valuenow") == slider.get_attribute("aria-valuemax"):
            break
    assert slider.get_attribute("aria-valuenow") == slider.get_attribute("aria-valuemax")
    pooled = page.locator(".js-plotly-plot", has_text="4,096 x 4,096 pooled to 256 x 256")
    pooled.wait_for(timeout=180_000)
    seconds = time.perf_counter() - start
    zoom = page.locator(".js-plotly-plot", has_text="zoomed")
    zoom.wait_for(timeout=60_000)
    print(f"\n4,096 tokens (Llama-shaped, 4 layers): to a rendered pooled head view and zoom: {seconds:.2f} s")
    page.get_by_text("Run the replay check").first.wait_for(timeout=30_000)  # long: the replay check waits for a click
    no_exception(page)
    page.screenshot(path=str(screenshot_dir / "explore_4096_tokens.png"), full_page=True)
