"""``python -m attnviz.bench pages``: every page run in Streamlit's AppTest as a user meets it: the first visit,
then warm reruns (the same widgets, and a change of one widget that is cheap to show), with the slowest parts of
the widget change named from a profile of the script thread.

AppTest runs the real ``app.py`` and page scripts with Streamlit's caches, without a browser or websocket, so the
times are the server's share of a rerun."""

from __future__ import annotations

import atexit
import contextlib
import cProfile
import functools
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "attnviz" / "app" / "streamlit_app.py"  # the app's script (a file: the benchmarks sit below the app)
WARM_TARGET_S = 0.3  # a warm rerun (a widget change, the same sentence and model) on the server, on a laptop CPU
WIDGET_KINDS = ("number_input", "slider", "select_slider", "selectbox", "segmented_control", "radio", "toggle",
                "checkbox", "multiselect")


@dataclass(frozen=True)
class PageVisit:
    """A page and the widget a user typically moves on it: ``key`` alternates between its two ``values``."""

    title: str
    script: str
    key: str | None
    values: tuple = ()
    state: tuple = ()  # (key, value) pairs set in the session before the first visit
    scan: bool = False  # the page reads a scan of the bundled corpus (SCAN_DOCUMENTS documents, made once)


PAGES = (
    PageVisit("Explore heads", "app_pages/explore_heads.py", "head", (5, 6)),
    PageVisit("Attention step by step", "app_pages/step_by_step.py", "sbs_seed", (1, 2)),
    PageVisit("Masks", "app_pages/masks.py", "masks_head", (1, 2)),
    PageVisit("Positional encodings", "app_pages/positional.py", "pos_sin_k", (7, 8)),
    PageVisit("Scaling and softmax", "app_pages/scaling.py", "scale_temperature", (1.5, 2.5)),
    PageVisit("Heads and KV cache", "app_pages/heads_kv_cache.py", "kv_seq", (8192, 16384)),
    PageVisit("Flash vs naive", "app_pages/flash.py", "flash_step", (1, 2)),
    PageVisit("Generation and KV cache", "app_pages/generation.py", "gen_step", (3, 4)),
    PageVisit("Heads across a corpus", "app_pages/corpus.py", "corpus_docs", (300, 400)),
    PageVisit("Corpus: a scan's map", "app_pages/corpus.py", "corpus_statistic", ("entropy", "first"), scan=True),
    PageVisit("Corpus: a head", "app_pages/corpus.py", "corpus_layer", (1, 2), (("corpus_view", "Head"),), scan=True),
    PageVisit("Does this head matter?", "app_pages/importance.py", "imp_circuit_seed", (12, 13)),
    PageVisit("Over training", "app_pages/over_training.py", "ot_step", (3720, 4433)),  # the phase change
    PageVisit("Queries and keys", "app_pages/queries_keys.py", "qk_head", (3, 4)),
    PageVisit("Checkpoints", "app_pages/checkpoints.py", "ckpt_dtype", ("fp32", "stored")),
)


SCAN_DOCUMENTS = 200


@functools.cache
def scans_root() -> Path:
    """A folder holding one scan of the bundled corpus's first SCAN_DOCUMENTS documents with the default model, made
    once per run (removed when the process ends): what the corpus page's visits read."""
    from attnviz.corpus.documents import Corpus, bundled_corpus
    from attnviz.corpus.scan.runner import ScanSettings, run_scan
    from attnviz.models.loading import load_model_dir
    from attnviz.models.shipped import DEFAULT_MODEL_NAME, bundled_models

    root = Path(tempfile.mkdtemp(prefix="attnviz-bench-pages-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    corpus = bundled_corpus()
    bundle = load_model_dir(bundled_models()[DEFAULT_MODEL_NAME], name=DEFAULT_MODEL_NAME)
    run_scan(Corpus(corpus.name, corpus.documents[:SCAN_DOCUMENTS]), bundle, root / "bench.duckdb",
             ScanSettings(max_docs=SCAN_DOCUMENTS, qk_points=0))
    return root


def scans_shown(visit: PageVisit):
    """While a visit that reads a scan runs, the page finds :func:`scans_root` as the server's scans folder."""
    from attnviz.corpus.background import SCAN_ROOT_VARIABLE

    if not visit.scan:
        return contextlib.nullcontext()
    return mock.patch.dict(os.environ, {SCAN_ROOT_VARIABLE: str(scans_root())})


def widget(at, key: str):
    """The widget with this key, whatever its kind."""
    for kind in WIDGET_KINDS:
        try:
            return getattr(at, kind)(key=key)
        except KeyError:
            continue
    raise KeyError(f"no widget with key {key!r} on this page")


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def check(at, what: str) -> None:
    if at.exception:
        raise RuntimeError(f"{what} raised: " + "; ".join(str(e.value) for e in at.exception))


def profiled(action) -> cProfile.Profile:
    """Profile ``action``'s script thread: AppTest runs each script in a new thread, which cProfile (one thread
    only) would not see, so the profiler is switched on inside every thread started meanwhile."""
    profiler = cProfile.Profile()

    def switch_on(frame, event, arg):  # the first event in a new thread: hand over to cProfile
        sys.setprofile(None)
        profiler.enable()

    threading.setprofile(switch_on)
    try:
        action()
    finally:
        threading.setprofile(None)
    return profiler


OWN_FOLDERS = ("attnviz",)  # the repository's code (the app and its pages too); not tests/, nor a virtual environment


APP_SCRIPTS = ("app", "attnviz.app.streamlit_app")  # the navigation and sidebar around every page


def own_module(filename: str, root: Path = ROOT) -> str | None:
    """The dotted module of a profiled ``filename`` when it is the repository's own code (``app.py``, a page or the
    package under ``root``), else None. Decided by path parts, never by a string prefix: a virtual environment in a
    sibling folder whose name starts with the checkout's (``…/attnviz-venv`` beside ``…/attnviz``) is not inside it,
    and neither is one inside it (``.venv``)."""
    if filename.startswith("<") or filename == "~":  # built-ins and frozen modules have no file
        return None
    path = Path(filename)
    if not path.is_absolute():
        return None
    if not path.is_relative_to(root):
        path = Path(os.path.realpath(path))  # reached through a link
        if not path.is_relative_to(root):
            return None
    relative = path.relative_to(root)
    if not relative.parts or (relative.parts != ("app.py",) and relative.parts[0] not in OWN_FOLDERS):
        return None
    return ".".join(relative.with_suffix("").parts)


def page_module(script: str) -> str:
    """``app_pages/explore_heads.py`` (as the app's script names it) -> ``attnviz.app.app_pages.explore_heads``."""
    return ".".join(("attnviz", "app", *Path(script).with_suffix("").parts))


def slowest_parts(profiler: cProfile.Profile, script: str, total_s: float, top: int = 3) -> list[tuple[str, float]]:
    """The repository's own functions that took longest (cumulative), leaving out the page's entry points, each as
    a share of the profiled run (``total_s``): cProfile slows every call, so shares, not its seconds, carry over."""
    stats = pstats.Stats(profiler)
    parts = []
    for (filename, _line, function), (_cc, _nc, _tt, cumulative, _callers) in stats.stats.items():
        module = own_module(filename)
        if module is None or module in APP_SCRIPTS or (
                module == page_module(script) and function in ("<module>", "main")):
            continue
        parts.append((f"{module}.{function}", min(cumulative / total_s, 1.0)))
    parts.sort(key=lambda part: -part[1])
    return parts[:top]


def bench_page(visit: PageVisit, repeats: int, sentence: str | None = None) -> dict:
    with scans_shown(visit):
        return _bench_page(visit, repeats, sentence)


def _bench_page(visit: PageVisit, repeats: int, sentence: str | None = None) -> dict:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(SCRIPT), default_timeout=600)
    if sentence is not None:
        at.session_state["sentence"] = sentence
    for key, value in visit.state:
        at.session_state[key] = value
    row = {"page": visit.title, "script": visit.script, "widget": visit.key,
           "start_s": timed(at.run)}  # app.py and its default page, in a new session
    check(at, "app.py")
    row["first_s"] = timed(lambda: at.switch_page(visit.script).run())
    check(at, f"the first visit of {visit.title}")
    row["rerun_s"] = statistics.median(timed(at.run) for _ in range(repeats))
    check(at, f"a rerun of {visit.title}")
    if visit.key is None:
        return row

    def change(i: int):
        widget(at, visit.key).set_value(visit.values[i % 2]).run()

    change(0)  # both values once, so every later change finds its result cached
    change(1)
    check(at, f"moving {visit.key} on {visit.title}")
    row["widget_change_s"] = statistics.median(timed(lambda i=i: change(i)) for i in range(repeats))
    check(at, f"moving {visit.key} on {visit.title}")
    start = time.perf_counter()
    profiler = profiled(lambda: change(repeats))
    row["slowest_parts"] = slowest_parts(profiler, visit.script, time.perf_counter() - start)
    return row


def bench_pages(repeats: int = 5, only: list[str] | None = None, sentence: str | None = None) -> dict:
    from attnviz.ui.sidebar import DEFAULT_SENTENCE

    visits = [v for v in PAGES if not only or any(name.lower() in v.title.lower() for name in only)]
    rows = [bench_page(visit, repeats, sentence) for visit in visits]
    return {"benchmark": "pages", "repeats": repeats, "sentence": sentence or DEFAULT_SENTENCE,
            "target_s": WARM_TARGET_S, "results": rows}


def print_pages(report: dict) -> list[str]:
    start = report["results"][0]["start_s"] if report["results"] else 0.0
    lines = [f"Every page in AppTest, the default model, the sentence {report['sentence'][:60]!r} "
             f"(medians of {report['repeats']} reruns; a new session's start, model load included: {start:.2f} s)",
             "first = the page's first visit in a new session; rerun = the same widgets; change = one widget moved "
             "between two values already seen; slowest parts = share of a profiled change; the \"Corpus:\" visits read "
             f"a scan of the bundled corpus's first {SCAN_DOCUMENTS} documents",
             f"{'page':<24} {'first':>8} {'rerun':>8} {'change':>8}  {'widget':<18} slowest parts of the change"]
    for row in report["results"]:
        change = row.get("widget_change_s")
        parts = ", ".join(f"{name.split('.', 1)[1] if name.startswith('attnviz.') else name} {share:.0%}"
                          for name, share in row.get("slowest_parts", []))
        lines.append(f"{row['page']:<24} {row['first_s']:>7.2f}s {row['rerun_s']:>7.3f}s "
                     f"{change if change is None else format(change, '7.3f') + 's':>8}  {row['widget'] or '':<18} "
                     f"{parts}")
    warm = [max(row["rerun_s"], row.get("widget_change_s", 0)) for row in report["results"]]
    slowest = max(report["results"], key=lambda row: max(row["rerun_s"], row.get("widget_change_s", 0)))
    verdict = "meets" if max(warm) <= report["target_s"] else "misses"
    lines.append(f"Slowest warm rerun: {slowest['page']}, {max(warm):.3f} s: {verdict} the {report['target_s']} s "
                 "target for every page.")
    return lines
