"""A real `streamlit run app.py` and a real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright
(the helpers live in attnviz.bench.browser, shared with the browser benchmarks)."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from attnviz.bench import browser as shared
from attnviz.bench.browser import CHROMIUM, CHROMIUM_ARGS, ROOT, wait_until_idle  # noqa: F401 - used by the tests


def _require_browser() -> None:
    problems = []
    if not Path(CHROMIUM).exists():
        problems.append(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        problems.append("the playwright package is not installed (pip install -r requirements-dev.txt)")
    if problems:
        reason = "browser tests need " + " and ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(reason + " - CI must run them")
        pytest.skip(reason)


@contextlib.contextmanager
def streamlit_server(extra_env: dict | None = None):
    """A fresh `streamlit run app.py` on a free port; yields its URL once /_stcore/health answers."""
    _require_browser()
    queue = tempfile.mkdtemp(prefix="attnviz-e2e-jobs-")  # each server its own queue of background jobs
    try:
        with shared.streamlit_server({"ATTNVIZ_JOBS_DIR": queue, **(extra_env or {})}) as server:
            yield server.url
    except shared.ServerFailed as problem:
        pytest.fail(str(problem))
    finally:
        shutil.rmtree(queue, ignore_errors=True)


def offline_context(browser, **options):
    """A browser context that lets requests reach only the app's own server (and data:/blob: URLs): every other
    request is refused and its URL kept in the list returned beside the context, so a test can say none was made."""
    from urllib.parse import urlparse

    context = browser.new_context(**options)
    outside = []

    def guard(route):
        host = urlparse(route.request.url).hostname
        if host in ("127.0.0.1", "localhost") or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    return context, outside


def upload_checkpoint(page, url: str, archive) -> None:
    """As a user does: open the app, go to Checkpoints, choose the zip, load it; waits for "Loaded <name>"."""
    page.goto(url)
    wait_until_idle(page)
    page.get_by_role("link", name="Checkpoints").click()
    wait_until_idle(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(archive))
    wait_until_idle(page)
    page.get_by_role("button", name="Load this zip").click()
    wait_until_idle(page)
    page.get_by_text(f"Loaded {Path(archive).stem}").wait_for(timeout=60_000)
    wait_until_idle(page)  # the run that registers the model ends before the test navigates away


@pytest.fixture(scope="session")
def app_url():
    with streamlit_server() as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    _require_browser()
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="attnviz-chromium-")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield instance
        instance.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="session")
def screenshot_dir():
    """Screenshots are kept as the run's artefacts: in $ATTNVIZ_SCREENSHOTS if set, else in test-artefacts/screenshots
    (ignored by git), each page at 900 px, at 1280 x 720 in presentation mode and at 1440 x 900 among them."""
    path = Path(os.environ.get("ATTNVIZ_SCREENSHOTS") or ROOT / "test-artefacts" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test, so the ``page`` fixture knows whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def page(browser, request, screenshot_dir):
    """A fresh browser tab; if the test fails, what the tab showed is kept as ``FAILED-<test>.png`` beside the
    screenshots (a timeout says what was missing, the screenshot says what was there instead)."""
    context = browser.new_context(viewport={"width": 1500, "height": 3200})
    tab = context.new_page()
    yield tab
    failed = getattr(request.node, "report_call", None)
    if failed is not None and failed.failed:
        with contextlib.suppress(Exception):  # a closed tab: nothing to keep
            tab.screenshot(path=str(screenshot_dir / f"FAILED-{request.node.name}.png"), full_page=True)
    context.close()
