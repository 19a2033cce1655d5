"""The hostile-input suite: every crafted checkpoint of :mod:`tests.hostile_checkpoints`, each fed to the same
functions the Checkpoints page calls, in child processes with a memory cap (:mod:`tests.hostile_runner`) and a
time limit per case. One test per case asserts what its child saw."""

import atexit
import json
import math
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.hostile_checkpoints import write_plan
from tests.tiny_models import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CASE_LIMIT = 90.0  # seconds a case may take before it counts as a hang (the slowest take ~3 s here)
FAST = 1.0  # a refusal on the config or the files comes well under this
SMALL_LOAD_LIMIT = 30.0  # a small model beside a hostile one (about 0.5 s; n_layer = 10^6 used to block for 35 min)
CHILDREN = 2


def _children(plan: Path, count: int, environment: dict) -> dict[str, dict]:
    """Run cases 0..count-1 in ``CHILDREN`` processes. A case that passes CASE_LIMIT is recorded as hung and its
    child killed; a child that dies records its case as died; either way the rest of its cases run in a new one."""
    names = [case["name"] for case in json.loads(plan.read_text())["cases"]]
    results: dict[str, dict] = {}
    lines: queue.Queue = queue.Queue()
    running: dict[int, dict] = {}

    def start(first: int, last: int) -> None:
        child = subprocess.Popen([sys.executable, "-m", "tests.hostile_runner", str(plan), str(first), str(last)],
                                 cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        running[child.pid] = {"child": child, "next": first, "last": last, "since": time.monotonic(), "log": []}

        def read():
            for line in child.stdout:
                lines.put((child.pid, line.rstrip("\n")))
            lines.put((child.pid, None))
        threading.Thread(target=read, daemon=True).start()

    share = (count + CHILDREN - 1) // CHILDREN
    for first in range(0, count, share):
        start(first, min(count, first + share))
    while running:
        try:
            pid, line = lines.get(timeout=1.0)
        except queue.Empty:
            pid, line = None, ""
        state = running.get(pid)
        if state is not None and line is None:  # the child ended (or was killed)
            state["child"].wait()
            if state["next"] < state["last"]:
                name = names[state["next"]]
                results.setdefault(name, {"case": name, "outcome": "died", "log": state["log"][-20:]})
                if state["next"] + 1 < state["last"]:
                    start(state["next"] + 1, state["last"])
            del running[pid]
        elif state is not None and line.startswith("HOSTILE-START "):
            state["since"] = time.monotonic()
        elif state is not None and line.startswith("HOSTILE-RESULT "):
            result = json.loads(line.removeprefix("HOSTILE-RESULT "))
            results[result["case"]] = result
            state["next"] += 1
        elif state is not None:
            state["log"].append(line)
        for state in running.values():
            if time.monotonic() - state["since"] > CASE_LIMIT and state["next"] < state["last"]:
                name = names[state["next"]]
                results.setdefault(name, {"case": name, "outcome": "hung", "log": state["log"][-20:]})
                state["child"].kill()  # its reader then reports the end, which starts the rest
                state["since"] = math.inf
    return results


# The cases are written once, when this module is collected (a few seconds), and run once by the fixture.
PLAN_ROOT = Path(tempfile.mkdtemp(prefix="attnviz-hostile-"))
atexit.register(shutil.rmtree, PLAN_ROOT, ignore_errors=True)
PLAN = write_plan(PLAN_ROOT / "cases", make_tiny_checkpoint("gpt2", PLAN_ROOT / "small-gpt2"))
CASES = [case["name"] for case in json.loads(PLAN.read_text())["cases"]]


@pytest.fixture(scope="module")
def hostile():
    """Every case run once: ``(cases by name, results by name, the runner's temporary folder)``."""
    content = json.loads(PLAN.read_text())
    environment = {**os.environ, "TMPDIR": content["facts"]["tmp"], "PYTHONPATH": str(ROOT)}
    results = _children(PLAN, len(content["cases"]), environment)
    return {c["name"]: c for c in content["cases"]}, results, Path(content["facts"]["tmp"])


@pytest.mark.parametrize("name", CASES)
def test_hostile_checkpoint(hostile, name):
    cases, results, _ = hostile
    case, result = cases[name], results.get(name)
    assert result is not None, "the case never ran"
    assert result["outcome"] not in ("hung", "died", "crashed"), result
    assert result["unpickled"] == [] and not result["marker"], "something was unpickled"
    assert result["opened_outside"] == [], "a file outside the upload was opened"
    assert result["small_seconds"] < SMALL_LOAD_LIMIT, "a small model waited behind the hostile one"
    if case["expect"] == "refused":
        assert result["outcome"] == "refused", result
        assert re.search(case["match"], result["message"]), result["message"]
        # Refused on what the checkpoint says, never on what the server's disk holds: no error of the file system.
        assert not re.search(r"exist|No such file|Errno|ermission", result["message"]), result["message"]
        if case["fast"]:
            assert result["seconds"] < FAST, result
            assert not result["locked_by_hostile"], "a cheap refusal waited for or held LOADING"
    else:
        assert result["outcome"] == "loaded", result
        assert result["leaked"] == [], result["leaked"]
        assert result.get("absent_present", []) == [], "files the model does not need were written"
        if case["match"]:
            assert any(re.search(case["match"], note) for note in result["notes"]), result["notes"]
        if case["fallback_tokenizer"]:
            assert result["fallback_tokenizer"], result["notes"]
        if case["nonfinite"]:
            assert result["capture_nonfinite"] and result["load_nonfinite"], result
            assert math.isnan(float(result["replay"])), "the replay check must not compare NaN"
        else:
            assert result["replay_finite"], result


def test_the_suite_covers_every_attack_of_the_issue():
    """The attacks the upload review found, each present as a case (a rename would drop one silently)."""
    joined = " | ".join(CASES)
    for attack in ("absolute path", "../", "/dev/zero", "FIFO", "a.txt", "n_layer = 20000", "n_layer = 1000000",
                   "n_head = -4", "tokenizer_config.json of 5 MB", "vocab.txt of 2M", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "empty text_config", "model_type is a list",
                   "model_type is a dict", "nested 100,000", "bad CRC", "lies", "encrypted", "compression method",
                   "x.json beside x.json/y.json", "extracted.zip", "README.md", "1e38", "NaN", "NUL"):
        assert attack in joined, attack


def test_nothing_is_left_in_the_uploads_folder(hostile):
    """After every case, only the lock, an empty reservations folder and the planted upload of 'another browser'
    remain where uploads live (the runner removed each workspace as the page does; views went with their
    models)."""
    _, _, temporary = hostile
    root = temporary / f"attnviz-uploads-{os.getuid()}"
    left = sorted(p.name for p in root.iterdir() if p.name not in (".lock", ".reservations", "attnviz-upload-x"))
    assert left == [] and list((root / ".reservations").glob("*")) == []
