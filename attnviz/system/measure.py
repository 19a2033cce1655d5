"""How attnviz measures: one timing helper and one memory probe, shared by the benchmarks and the pages.

Peak memory is measured in a fresh Python process per call, so nothing else this process holds counts: the
child runs the call once to warm up, resets the kernel's high-water mark, runs it again and prints the extra
resident memory as JSON. Linux only (it reads ``/proc/self``). Imports only the standard library.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

# glibc hands freed blocks of up to 32 MiB back to the next allocation instead of to the OS, so a second call
# could reuse the first one's memory and show no new peak. A fixed mmap threshold makes every block over 64 KiB
# its own mapping, returned on free: the measured peak is then the call's own.
MEASURING_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0",
                 "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536:glibc.malloc.trim_threshold=0"}


class MeasurementUnavailable(RuntimeError):
    """This measurement cannot be taken here; the message says why."""


def median_seconds(function: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def environment() -> dict:
    """The facts a reader needs to compare two measurements."""
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise MeasurementUnavailable(f"{field} not in /proc/self/status")


def print_peak_of(call: Callable[[], object], extra: Callable[[object], dict] | None = None, repeats: int = 1) -> None:
    """In a fresh process: run ``call`` once to warm up, then ``repeats`` times, and print as JSON the largest
    extra peak resident memory of those runs, their median wall time (and ``extra(result)``, e.g. sizes of what
    the call returned).

    The warm-up keeps one-time costs (thread pools, packing buffers) out. The kernel's high-water mark (VmHWM) is
    reset before each measured run (``echo 5 > /proc/self/clear_refs``), so imports and inputs do not count
    either: peak = VmHWM after the run - VmRSS before it. A small call can fit in memory the process already
    holds and read 0; the largest of several runs is reported.
    """
    import gc

    result = call()
    del result
    peaks, times = [], []
    for _ in range(max(1, repeats)):
        gc.collect()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM to the current RSS
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
        peaks.append(max(_status_kib("VmHWM") - before, 0) * 1024)
        if len(peaks) < repeats:
            del result
    print(json.dumps({"peak_bytes": max(peaks), "seconds": statistics.median(times),
                      **(extra(result) if extra else {})}))


def peak_in_fresh_process(module: str, function: str, spec: str, timeout: float = 600) -> int:
    """Run ``module.function(spec)`` in a fresh Python process (which calls :func:`print_peak_of`) and return
    the peak bytes it prints."""
    return int(run_in_fresh_process(module, function, spec, timeout)["peak_bytes"])


def run_in_fresh_process(module: str, function: str, spec: str, timeout: float = 600) -> dict:
    """Run ``module.function(spec)`` in a fresh Python process (which calls :func:`print_peak_of`) and return
    everything it prints: peak bytes, seconds and any extra numbers."""
    if not Path("/proc/self/clear_refs").exists():
        raise MeasurementUnavailable("peak memory is measured through Linux's /proc; not available on this system")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, **MEASURING_ENV, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        result = subprocess.run(
            [sys.executable, "-c", f"from {module} import {function}; {function}({spec!r})"],
            capture_output=True, text=True, timeout=timeout, env=env, cwd=root,
        )
    except subprocess.TimeoutExpired:
        raise MeasurementUnavailable(f"the measuring process took longer than {timeout:.0f} s") from None
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or ["the measuring process failed"])[-1][:200]
        raise MeasurementUnavailable(last_line)
    return json.loads(result.stdout.strip().splitlines()[-1])
