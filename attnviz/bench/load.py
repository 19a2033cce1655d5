"""``python -m attnviz.bench load --sessions 8``: one ``streamlit run app.py`` shared by N browser sessions at once,
as a class of students would use it.

Each session is its own Chromium context (its own cookies and websocket, so its own Streamlit session) with its own
sentence from the URL; every other one first uploads a tiny GPT-2 under its own name. Each then visits Explore heads
(the head view, then the grid), Masks, Scaling and softmax, and Flash vs naive, through the sidebar as a user does.
On every page the benchmark checks: no exception shown; the session's own words and model on the page and no other
session's. Before the crowd, one session alone sets the baseline. The server's resident memory is sampled
throughout and read again after each round, once the round's sessions have ended; uploads must be gone from disk.

Two clocks: the browser's (click to the script's end, as Streamlit's own websocket messages reach the browser:
that includes the websocket and the browser's own work, here Chromium sharing the server's CPUs), and the server's (each
script run as app.py logs it with ``ATTNVIZ_RUN_LOG``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from attnviz.bench import browser

NOUNS = ("zebra", "penguin", "dolphin", "camel", "rabbit", "turtle", "parrot", "eagle", "monkey", "elephant",
         "kangaroo", "panda", "whale", "squirrel", "donkey", "dinosaur")
PAGES = ("Explore heads", "Explore grid", "Masks", "Scaling and softmax", "Flash vs naive")
SHOWS_TOKENS = ("Explore heads", "Masks", "Scaling and softmax")  # pages that label their axes with the tokens
# What bounds the server's memory, however many sessions come (enforced by Streamlit's caches and by attnviz.ui).
MEMORY_BOUND = (
    "models: the bundled one plus at most 4 uploaded ones in memory (st.cache_resource LRU, attnviz.ui."
    "MAX_LOADED_UPLOADS); captures: the 4 most recent (cached_capture), replay checks and statistics tables: 8 each; "
    "Scaling experiments: 32 per experiment (st.cache_data); Flash timings: 32 settings shared by all sessions; per "
    "session: at most 4 added models (attnviz.ui.MAX_UPLOADED_MODELS) and 16 Flash settings, all released when "
    "Streamlit drops the session (server.disconnectedSessionTTL)"
)


class ScriptRuns:
    """Every script run of one page, read from Streamlit's own websocket messages as the browser receives them
    (a run starts with ``new_session`` and ends with ``script_finished``). Watching the page's script-state
    attribute instead misses runs under load: React commits a run that started and ended within one batch of
    messages as no change at all."""

    def __init__(self, page):
        self.events: list[tuple[str, float]] = []  # ("started" | "finished" | "interrupted", perf_counter)
        page.on("websocket", lambda socket: socket.on("framereceived", self._frame))

    def _frame(self, payload) -> None:
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        if not isinstance(payload, (bytes, bytearray)):
            return
        try:
            message = ForwardMsg.FromString(bytes(payload))
        except Exception:  # noqa: BLE001 - not a message this benchmark needs
            return
        kind = message.WhichOneof("type")
        if kind == "new_session":
            self.events.append(("started", time.perf_counter()))
        elif kind == "script_finished":
            early = message.script_finished == ForwardMsg.ScriptFinishedStatus.FINISHED_EARLY_FOR_RERUN
            self.events.append(("interrupted" if early else "finished", time.perf_counter()))

    def describe(self, since: float) -> str:
        return ", ".join(f"{kind} +{at - since:.1f}s" for kind, at in self.events if at >= since)[-200:] or "none"

    async def finished_after(self, since: float, timeout_ms: int, quiet_s: float = 0.4) -> float:
        """Wait for a run that started after ``since`` (perf_counter) to finish, and for ``quiet_s`` without
        another (a page may rerun itself); returns the seconds from ``since`` to that last finish."""
        deadline = since + timeout_ms / 1000
        while time.perf_counter() < deadline:
            recent = [(kind, at) for kind, at in self.events if at >= since]
            if (recent and recent[-1][0] == "finished" and any(kind == "started" for kind, _ in recent)
                    and time.perf_counter() - recent[-1][1] >= quiet_s):
                return recent[-1][1] - since
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no script run finished within {timeout_ms / 1000:.0f} s (runs seen: "
                           f"{self.describe(since)})")


@dataclass
class SessionPlan:
    index: int
    upload: Path | None = None

    @property
    def noun(self) -> str:
        return NOUNS[self.index % len(NOUNS)]

    @property
    def sentence(self) -> str:
        return f"The {self.noun} watched the river while the old {self.noun} slept in the sun."

    @property
    def model(self) -> str:
        return self.upload.stem if self.upload else "all-MiniLM-L6-v2"


@dataclass
class SessionResult:
    plan: SessionPlan
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


async def _timed_click(runs: ScriptRuns, locator, timeout_ms: int) -> float:
    since = time.perf_counter()
    await locator.click()
    return await runs.finished_after(since, timeout_ms)


def check_page(html: str, plan: SessionPlan, others: list[SessionPlan], where: str) -> list[str]:
    """What a session must (and must never) see on a page."""
    problems = []
    if 'data-testid="stException"' in html:
        shown = html.split('data-testid="stException"', 1)[1]
        text = " ".join(re.sub(r"<[^>]+>", " ", shown).split())[:300]
        problems.append(f"{where}: an exception is shown: {text}")
    if where in SHOWS_TOKENS and not re.search(rf"\d · {plan.noun}\b", html):
        problems.append(f"{where}: its own sentence's tokens are missing")
    for other in others:
        if re.search(rf"\b{other.noun}\b", html):
            problems.append(f"{where}: shows session {other.index}'s words ({other.noun})")
        if other.upload and other.model != plan.model and other.model in html:
            problems.append(f"{where}: shows session {other.index}'s model ({other.model})")
    return problems


class StepClock:
    """Which step a session is at and since when, for the message when a step fails."""

    def __init__(self, name: str):
        self.start(name)

    def start(self, name: str) -> None:
        self.name, self.began = name, time.perf_counter()


async def _screenshot(page, name: str) -> None:
    shots = os.environ.get("ATTNVIZ_LOAD_SHOTS")  # a folder for screenshots of what went wrong
    if shots:
        await page.screenshot(path=f"{shots}/{name}.png", full_page=True)


async def _sidebar_sentence(page) -> str:
    return await page.locator('[data-testid="stSidebar"]').get_by_role("textbox", name="Sentence").input_value()


async def _first_load(page, url: str, plan: SessionPlan, timeout_ms: int) -> float:
    """Open the app with the session's sentence in the address; the seconds until Explore heads has run once."""
    start = time.perf_counter()
    await page.goto(f"{url}/?sentence={urllib.parse.quote(plan.sentence)}", timeout=timeout_ms)
    await page.get_by_text("Replay check").wait_for(timeout=timeout_ms)  # Explore heads has run once
    await page.wait_for_selector(browser.IDLE, timeout=timeout_ms)
    return time.perf_counter() - start


async def _upload_checkpoint(page, runs: ScriptRuns, plan: SessionPlan, step: StepClock, result: SessionResult,
                             timeout_ms: int) -> None:
    """On the Checkpoints page, upload the session's zip, as a user does; the sidebar must keep its sentence."""
    step.start("open Checkpoints")
    await _timed_click(runs, page.get_by_role("link", name="Checkpoints"), timeout_ms)
    step.start("choose the file")
    dropzone = page.locator('[data-testid="stFileUploaderDropzoneInput"]').first
    await dropzone.set_input_files(str(plan.upload), timeout=timeout_ms)
    await runs.finished_after(step.began, timeout_ms)
    step.start("load the zip")
    result.seconds["upload"] = await _timed_click(runs, page.get_by_role("button", name="Load this zip"), timeout_ms)
    await page.get_by_text(f"Loaded {plan.model}").wait_for(timeout=timeout_ms)
    sentence = await _sidebar_sentence(page)
    if sentence != plan.sentence:
        result.problems.append(f"after the upload the sidebar's sentence is {sentence[:50]!r}, the address "
                               f"{page.url[-80:]!r}")


def _page_link(page, name: str):
    """What a user clicks to reach one of :data:`PAGES`."""
    if name == "Explore grid":
        return page.get_by_text("Grid", exact=True).first  # the View segmented control
    return page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=name)


async def _model_problems(page, html: str, name: str, plan: SessionPlan) -> list[str]:
    """The sidebar and, on Explore heads, the page must show the session's own model."""
    problems = []
    model_box = await page.locator('[data-testid="stSidebar"]').get_by_role("combobox", name="Model").input_value()
    if plan.model not in model_box:
        problems.append(f"{name}: the sidebar's model is not {plan.model}: {model_box!r}")
    if name.startswith("Explore") and plan.upload and "gpt2 decoder" not in html:
        problems.append(f"{name}: its uploaded GPT-2 is not the model shown")
    return problems


async def _visit_page(page, runs: ScriptRuns, name: str, plan: SessionPlan, others: list[SessionPlan],
                      result: SessionResult, timeout_ms: int) -> None:
    """Go to one of :data:`PAGES` (timed) and check what it shows: :func:`check_page`, then the model."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    result.seconds[name] = await _timed_click(runs, _page_link(page, name), timeout_ms)
    if name in SHOWS_TOKENS:  # Plotly draws the axes after the script has finished: give it time
        with contextlib.suppress(PlaywrightTimeout):
            await page.wait_for_function("(pattern) => new RegExp(pattern).test(document.body.innerHTML)",
                                         arg=rf"\d · {plan.noun}\b", timeout=30_000)
    html = await page.content()
    found = check_page(html, plan, others, name)
    if any("own sentence" in problem for problem in found):  # say what the page had instead
        sentence = await _sidebar_sentence(page)
        found.append(f"{name}: the sidebar's sentence is {sentence[:50]!r}, the address {page.url[-80:]!r}")
    result.problems += found
    if found:
        await _screenshot(page, f"s{plan.index}-{name}")
    result.problems += await _model_problems(page, html, name, plan)


async def run_session(context, url: str, plan: SessionPlan, others: list[SessionPlan],
                      timeout_ms: int = 120_000) -> SessionResult:
    """One user: the first load, an upload if the plan has one, then every page of :data:`PAGES`, checked."""
    result = SessionResult(plan)
    page = await context.new_page()
    runs = ScriptRuns(page)  # before the first load, so that its websocket is watched from the start
    step = StepClock("first load")
    try:
        result.seconds["first load"] = await _first_load(page, url, plan, timeout_ms)
        if plan.upload:
            await _upload_checkpoint(page, runs, plan, step, result, timeout_ms)
        for name in PAGES:
            step.start(name)
            await _visit_page(page, runs, name, plan, others, result, timeout_ms)
    except Exception as problem:  # a timeout or a missing element: the session failed, say where
        result.problems.append(f"failed at {step.name!r}: {type(problem).__name__}: {str(problem).splitlines()[0]} "
                               f"(script runs since this step and the one before: {runs.describe(step.began - 60)})")
        with contextlib.suppress(Exception):
            await _screenshot(page, f"s{plan.index}-failed")
    finally:
        await page.close()
    return result


async def run_round(browser_, url: str, plans: list[SessionPlan]) -> list[SessionResult]:
    contexts = [await browser_.new_context(viewport={"width": 1400, "height": 1800}) for _ in plans]
    try:
        return list(await asyncio.gather(*(
            run_session(context, url, plan, [p for p in plans if p is not plan])
            for context, plan in zip(contexts, plans, strict=True))))
    finally:
        for context in contexts:
            await context.close()


class MemorySampler:
    """The server's resident memory, sampled every half second on a thread."""

    def __init__(self, server: browser.Server):
        self.server, self.peak, self._stop = server, server.rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self.server.rss_bytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def server_runs(run_log: Path, since: float, until: float) -> dict[str, list[float]]:
    """The server's script runs that finished in [since, until], by page: their seconds."""
    runs: dict[str, list[float]] = {}
    if run_log.exists():
        for line in run_log.read_text().splitlines():
            run = json.loads(line)
            if since <= run["time"] <= until and run["ending"] == "finished":
                runs.setdefault(run["page"], []).append(run["seconds"])
    return runs


def uploads_on_disk(folder: Path) -> list[Path]:
    return sorted(folder.glob("attnviz-upload-*"))


async def _settle(server: browser.Server, browser_, url: str, uploads: Path, timeout_s: float = 60) -> float:
    """After a round: open one short session (Streamlit drops expired sessions when another connects) and wait
    for the ended sessions' uploads to go; returns how long that took."""
    start = time.monotonic()
    while True:
        context = await browser_.new_context()
        page = await context.new_page()
        await page.goto(url)
        await page.wait_for_selector(browser.IDLE, timeout=120_000)
        await context.close()
        if not uploads_on_disk(uploads) or time.monotonic() - start > timeout_s:
            return time.monotonic() - start
        await asyncio.sleep(1)


async def bench_load_async(sessions: int, rounds: int, work: Path, progress=print, warm_alone: bool = True) -> dict:
    from playwright.async_api import async_playwright

    from attnviz.bench.tiny import make_tiny_checkpoint, zip_folder

    uploads = work / "server-tmp"
    uploads.mkdir(parents=True, exist_ok=True)
    archives = {}
    for index in range(1, sessions, 2):  # every other session uploads a checkpoint of its own
        folder = make_tiny_checkpoint("gpt2", work / f"tiny-gpt2-s{index}", seed=index)
        archives[index] = zip_folder(folder, work / f"tiny-gpt2-s{index}.zip")
    run_log = work / "runs.jsonl"
    # Keeping off (ATTNVIZ_KEEP_HOURS=0): each upload belongs to its session, and must be gone once it ends.
    env = {"TMPDIR": str(uploads), "STREAMLIT_SERVER_DISCONNECTED_SESSION_TTL": "2", "ATTNVIZ_JANITOR_SECONDS": "1",
           "ATTNVIZ_KEEP_HOURS": "0",
           "ATTNVIZ_RUN_LOG": str(run_log)}
    report = {"benchmark": "load", "sessions": sessions, "rounds": rounds, "memory_bound": MEMORY_BOUND,
              "baseline": {}, "rounds_results": []}
    with browser.streamlit_server(env) as server:
        async with async_playwright() as playwright:
            chromium = await playwright.chromium.launch(executable_path=browser.CHROMIUM, headless=True,
                                                        args=browser.CHROMIUM_ARGS)
            report["rss_start"] = server.rss_bytes()
            # One session alone, twice: the first warms what every session shares (the model, the Scaling
            # experiments), the second, with a sentence of its own, is the baseline.
            for warm_up in (True, False) if warm_alone else (False,):
                plan = SessionPlan(len(NOUNS) - 1 - int(warm_up))
                progress(f"one session alone ({'warming up' if warm_up else 'baseline'})")
                began = time.time()
                (alone,) = await run_round(chromium, server.url, [plan])
                report["baseline_server"] = server_runs(run_log, began, time.time())
                if alone.problems:
                    raise RuntimeError("a session alone failed: " + "; ".join(alone.problems))
            report["baseline"] = alone.seconds
            await _settle(server, chromium, server.url, uploads)
            report["rss_after_baseline"] = server.rss_bytes()
            for round_number in range(rounds):
                progress(f"round {round_number + 1}: {sessions} sessions at once")
                plans = [SessionPlan(i, archives.get(i)) for i in range(sessions)]
                sampler = MemorySampler(server)
                start, began = time.perf_counter(), time.time()
                results = await run_round(chromium, server.url, plans)
                wall = time.perf_counter() - start
                server_seconds = server_runs(run_log, began, time.time())
                peak = sampler.stop()
                settle = await _settle(server, chromium, server.url, uploads)
                report["rounds_results"].append({
                    "wall_s": wall, "server": server_seconds, "rss_peak": peak, "rss_after": server.rss_bytes(),
                    "settle_s": settle,
                    "uploads_left": [p.name for p in uploads_on_disk(uploads)],
                    "sessions": [{"index": r.plan.index, "model": r.plan.model, "noun": r.plan.noun,
                                  "seconds": r.seconds, "problems": r.problems} for r in results],
                })
            await chromium.close()
    return report


def bench_load(sessions: int = 8, rounds: int = 2, work: Path | None = None, progress=print,
               warm_alone: bool = True) -> dict:
    """``warm_alone=False`` (the tests' small version) skips the lone session that warms the server before the
    baseline: the baseline is then a cold first visit, and the crowd's ratios to it mean little."""
    if work is None:
        with tempfile.TemporaryDirectory(prefix="attnviz-load-") as folder:
            return asyncio.run(bench_load_async(sessions, rounds, Path(folder), progress, warm_alone))
    return asyncio.run(bench_load_async(sessions, rounds, work, progress, warm_alone))


def page_table(report: dict) -> list[dict]:
    """Per page: the lone session's time, and the crowd's median and slowest over every round and session."""
    rows = []
    for name in ("first load", "upload", *PAGES):
        crowd = [s["seconds"][name] for r in report["rounds_results"] for s in r["sessions"] if name in s["seconds"]]
        if not crowd:
            continue
        alone = report["baseline"].get(name)
        rows.append({"page": name, "alone_s": alone, "median_s": statistics.median(crowd), "max_s": max(crowd),
                     "ratio_median": statistics.median(crowd) / alone if alone else None,
                     "ratio_max": max(crowd) / alone if alone else None})
    return rows


def server_table(report: dict) -> list[dict]:
    """Per page, the server's script runs: the lone session's median, the crowd's median and slowest."""
    rows = []
    for page, alone in report["baseline_server"].items():
        crowd = [s for r in report["rounds_results"] for s in r["server"].get(page, [])]
        if crowd:
            rows.append({"page": page, "alone_s": statistics.median(alone), "median_s": statistics.median(crowd),
                         "max_s": max(crowd), "runs": len(crowd),
                         "ratio_median": statistics.median(crowd) / statistics.median(alone),
                         "ratio_max": max(crowd) / statistics.median(alone)})
    return rows


def problems_of(report: dict) -> list[str]:
    found = []
    for number, round_ in enumerate(report["rounds_results"], 1):
        for session in round_["sessions"]:
            found += [f"round {number}, session {session['index']}: {p}" for p in session["problems"]]
        if round_["uploads_left"]:
            found.append(f"round {number}: uploads still on disk after the sessions ended: {round_['uploads_left']}")
    return found


def print_load(report: dict) -> list[str]:
    from attnviz.core.units import human_bytes

    n = report["sessions"]
    lines = [f"{n} browser sessions at once on one server ({report['rounds']} rounds; every other session uploads "
             "its own tiny GPT-2); click to script finished, seconds",
             f"{'page':<20} {'alone':>7} {'median':>8} {'slowest':>8} {'median/alone':>13} {'slowest/alone':>14}"]
    rows = page_table(report)
    for row in rows:
        alone = "-" if row["alone_s"] is None else f"{row['alone_s']:.2f}"
        ratio_median = "-" if row["ratio_median"] is None else f"{row['ratio_median']:.1f}x"
        ratio_max = "-" if row["ratio_max"] is None else f"{row['ratio_max']:.1f}x"
        lines.append(f"{row['page']:<20} {alone:>7} {row['median_s']:>8.2f} {row['max_s']:>8.2f} {ratio_median:>13} "
                     f"{ratio_max:>14}")
    pages = [row for row in rows if row["page"] in PAGES]
    slowest = max(pages, key=lambda row: row["max_s"])
    lines.append(f"Slowest page in the browser under {n} sessions: {slowest['page']}, "
                 f"{slowest['max_s']:.2f} s at worst, {slowest['ratio_max']:.1f}x the same page for one session "
                 f"(median {slowest['ratio_median']:.1f}x).")
    lines.append("")
    lines.append("The server's script runs (app.py and the page), seconds")
    lines.append(f"{'page':<24} {'alone':>7} {'median':>8} {'slowest':>8} {'runs':>5} {'median/alone':>13} "
                 f"{'slowest/alone':>14}")
    served = server_table(report)
    for row in served:
        lines.append(f"{row['page']:<24} {row['alone_s']:>7.2f} {row['median_s']:>8.2f} {row['max_s']:>8.2f} "
                     f"{row['runs']:>5} {row['ratio_median']:>12.1f}x {row['ratio_max']:>13.1f}x")
    if served:
        worst = max(served, key=lambda row: row["median_s"])
        lines.append(f"Slowest page on the server under {n} sessions: {worst['page']}, median {worst['median_s']:.2f} s"
                     f" ({worst['ratio_median']:.1f}x one session), {worst['max_s']:.2f} s at worst.")
    memory = [f"after one session {human_bytes(report['rss_after_baseline'])}"]
    for number, round_ in enumerate(report["rounds_results"], 1):
        memory.append(f"round {number}: peak {human_bytes(round_['rss_peak'])}, "
                      f"after {human_bytes(round_['rss_after'])} ({len(round_['uploads_left'])} uploads left on disk "
                      f"{round_['settle_s']:.0f} s after)")
    lines.append("Server memory (RSS): " + "; ".join(memory) + ".")
    lines.append("Bounded by " + report["memory_bound"] + ".")
    problems = problems_of(report)
    lines.append(f"{len(problems)} problems (exceptions, another session's sentence or model, leftover uploads)"
                 + (":" if problems else "."))
    lines += [f"  {p}" for p in problems]
    return lines
