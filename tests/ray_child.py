"""A test's Ray run in a process of its own: ``python -m tests.ray_child MODULE:FUNCTION ARGUMENTS``.

A Ray driver's C++ core worker can end the process it lives in with no Python traceback (when it loses its raylet,
for one); inside a pytest-xdist worker that takes the worker and the test's fixtures down, and
pytest-xdist 3.8 then waits forever for the scheduler's next item (pytest-dev/pytest-xdist#1378): CI stopped at its
90-minute limit with nothing named (2026-12-07, in the patching Ray test, the second cluster of its worker). So a
test starts its cluster here, one per run, and what goes wrong is a failed test that shows the child's output and
its Ray driver's log.

The child imports FUNCTION from MODULE, starts a local 2-CPU cluster, calls it with the JSON object ARGUMENTS as
keyword arguments, shuts the cluster down and prints ``RAY-CHILD-ANSWER`` and the function's JSON answer on its last
line.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnviz.corpus.on_ray import ray_available, start_ray

ROOT = Path(__file__).resolve().parent.parent
ANSWER = "RAY-CHILD-ANSWER "
RAY_LOGS = Path("/tmp/ray")  # Ray's default temporary folder: session_*/logs/python-core-driver-*_<pid>.log


def on_ray(target: str, timeout: float = 540, **arguments) -> dict:
    """``target`` ("tests.module:function") called with ``arguments`` (JSON values) on a local Ray cluster in a child
    process; its answer. A child that fails, dies or outlives ``timeout`` fails the test with what it printed; the
    test is skipped where Ray is not installed (an optional extra)."""
    if not ray_available():
        pytest.skip("Ray is an optional extra")
    command = [sys.executable, "-m", "tests.ray_child", target, json.dumps(arguments)]
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        raise AssertionError(f"the Ray run {target} did not end in {timeout:.0f} s\n"
                             + _what_it_said(out, err, child.pid)) from None
    for line in reversed(out.splitlines()):
        if line.startswith(ANSWER):
            return json.loads(line[len(ANSWER):])
    raise AssertionError(f"the Ray run {target} ended with code {child.returncode} and no answer\n"
                         + _what_it_said(out, err, child.pid))


def _what_it_said(out: str, err: str, pid: int) -> str:
    said = f"stdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}"
    for log in sorted(RAY_LOGS.glob(f"session_*/logs/python-core-driver-*_{pid}.log")):
        said += f"\nRay driver log {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    return said


def main(argv: list[str]) -> int:
    target, arguments = argv
    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    import ray

    start_ray(None, num_cpus=2)
    try:
        answer = function(**json.loads(arguments))
    finally:
        ray.shutdown()
    print(ANSWER + json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
