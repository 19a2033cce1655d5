"""A real ``streamlit run app.py`` and Debian's Chromium driven by Playwright: what the browser benchmarks and
the end-to-end tests share. Needs the ``playwright`` package and ``/usr/bin/chromium`` (``ATTNVIZ_CHROMIUM``)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

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
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'


class ServerFailed(RuntimeError):
    """The Streamlit server did not start; the message holds the end of its log."""


@dataclass
class Server:
    url: str
    pid: int

    def rss_bytes(self) -> int:
        """The server process's resident memory now (Linux)."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CHECKOUT_COMMAND = (sys.executable, "-m", "streamlit", "run", "app.py")  # as the README says, in the checkout


@contextlib.contextmanager
def streamlit_server(extra_env: dict | None = None, timeout: float = 90, command: tuple[str, ...] = CHECKOUT_COMMAND,
                     cwd: Path = ROOT):
    """A fresh ``streamlit run app.py`` (or ``command``, e.g. an installed ``attnviz serve``, run in ``cwd``) on a
    free port; yields a :class:`Server` once /_stcore/health answers."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))  # the app sets the offline variables
    process = subprocess.Popen(
        [*command, "--server.headless", "true", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise ServerFailed("streamlit exited:\n" + Path(log.name).read_text()[-3000:])
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise ServerFailed(f"streamlit did not become healthy in {timeout:.0f} s:\n"
                                       + Path(log.name).read_text()[-3000:]) from None
                time.sleep(0.3)
        yield Server(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        os.unlink(log.name)


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def wait_until_idle(page, timeout_ms: int = 90_000) -> None:
    """Wait until Streamlit has finished running the script (and the page shows its result)."""
    page.wait_for_selector(IDLE, timeout=timeout_ms)
    page.wait_for_timeout(500)  # let Plotly draw
    page.wait_for_selector(IDLE, timeout=timeout_ms)
