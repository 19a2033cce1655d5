"""How a corpus run started from Python shows its progress and stops: a ``tqdm.auto`` bar over its documents, and
the first interrupt (the notebook's stop button, Ctrl-C) asking for a stop at the next chunk, resumably."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from tqdm.auto import tqdm

from attnviz.corpus.runner import Progress
from attnviz.corpus.scan.store import STATUS_RUNNING, STATUS_STOPPED


class StopRequests:
    """The run's ``should_stop``: True once an interrupt was asked. The notebook's stop button (and Ctrl-C) sends
    SIGINT, which Python turns into a KeyboardInterrupt wherever the run is (inside a forward, in a commit): while
    :meth:`listening`, the first one only asks for a stop, which the runner sees between chunks (every finished
    chunk is committed, the one in flight dropped); a second one interrupts at once. A KeyboardInterrupt raised in
    the progress callback (:meth:`guarded`) asks for a stop the same way."""

    def __init__(self):
        self.asked = False

    def __call__(self) -> bool:
        return self.asked

    def ask(self) -> None:
        self.asked = True

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """SIGINT asks for a stop for the time of the block (only the main thread can catch signals: elsewhere
        nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def interrupted(signum, frame):
            if self.asked:  # asked twice: stop now, what was committed is kept
                raise KeyboardInterrupt
            self.ask()
            print("Stopping after the chunk in progress (interrupt again to stop at once)…", flush=True)

        before = signal.signal(signal.SIGINT, interrupted)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def guarded(self, report: Callable[[Progress], None]) -> Callable[[Progress], None]:
        """``report`` as the runner's progress callback: a KeyboardInterrupt raised in it (the chunk it reports is
        committed already) asks for a stop instead of leaving the runner in the middle of its loop."""

        def reported(state: Progress) -> None:
            try:
                report(state)
            except KeyboardInterrupt:
                self.ask()

        return reported


class ProgressBar:
    """A ``tqdm.auto`` bar over the run's documents, moved by the runner's progress reports (after each chunk);
    its description says the pass (an importance run's first pass computes the corpus means) and the sample of
    queries and keys a scan keeps at its end."""

    def __init__(self, shown: bool, planned: int, done: int):
        self.bar = tqdm(total=planned, initial=min(done, planned), unit="doc", desc="documents") if shown else None

    def show(self, state: Progress) -> None:
        if self.bar is None:
            return
        phase = getattr(state, "phase", None)
        self.bar.set_description("corpus means (first pass)" if phase == "means" else "documents", refresh=False)
        if state.sample_planned:
            self.bar.set_postfix_str(f"queries and keys of {state.sampled}/{state.sample_planned} documents kept",
                                     refresh=False)
        self.bar.total = state.planned
        self.bar.update(state.done - self.bar.n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def mark_stopped(writer: type, path: Path) -> None:
    """A run cut short by an interrupt mid-chunk marked stopped (its committed chunks are whole: each was one
    transaction); nothing where it never began or had already finished."""
    if not path.is_file():
        return
    with writer(path) as opened:
        if opened.settings().get("status") == STATUS_RUNNING:
            opened.set(status=STATUS_STOPPED)
