"""The two pieces every cache here is built from: a bounded, thread-safe store that lets the least recently used
result go first, and a file's stamp (its modification time), which keys what is read from a file that may change."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path


class BoundedStore:
    """At most ``size`` results by key, the least recently used going first; thread-safe."""

    def __init__(self, size: int):
        self.size, self.results, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, key, default=None):
        with self.lock:
            if key in self.results:
                self.results.move_to_end(key)
                return self.results[key]
        return default

    def __len__(self) -> int:
        with self.lock:
            return len(self.results)

    def items(self) -> list[tuple]:
        """A snapshot of (key, result), least recently used first."""
        with self.lock:
            return list(self.results.items())

    def __contains__(self, key) -> bool:
        with self.lock:
            return key in self.results

    def drop(self, key) -> None:
        with self.lock:
            self.results.pop(key, None)

    def put(self, key, value) -> None:
        with self.lock:
            self.results[key] = value
            self.results.move_to_end(key)
            while len(self.results) > self.size:
                self.results.popitem(last=False)


def file_stamp(path: str | Path) -> float:
    """The file's modification time (0 when it is gone): part of the key of anything cached from its contents, so
    a file written again is read again."""
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return 0.0
