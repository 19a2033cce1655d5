"""A real `streamlit run app.py` and a real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright."""

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ATTNVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    port = _free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
    server = subprocess.Popen(
        [
            sys.executable, "-m", "streamlit", "run", "app.py",
            "--server.headless", "true",
            "--server.port", str(port),
            "--server.address", "127.0.0.1",
            "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none",
        ],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    else:
        server.kill()
        pytest.fail("streamlit did not become healthy in 90 s:\n" + Path(log.name).read_text()[-3000:])
    if server.poll() is not None:
        pytest.fail("streamlit exited:\n" + Path(log.name).read_text()[-3000:])
    try:
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        os.unlink(log.name)


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
    """Screenshots go to $ATTNVIZ_SCREENSHOTS if set (to look at them), else to a temp dir."""
    path = Path(os.environ.get("ATTNVIZ_SCREENSHOTS") or tempfile.mkdtemp(prefix="attnviz-shots-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1500, "height": 3200})
    tab = context.new_page()
    yield tab
    context.close()


def wait_until_idle(page, timeout_ms: int = 90_000) -> None:
    """Wait until Streamlit has finished running the script (and the page shows its result)."""
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms)
    page.wait_for_timeout(500)  # let Plotly draw
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]', timeout=timeout_ms)
