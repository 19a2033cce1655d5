"""The Flash page's timings, measured once on this server and shared by every session."""

from __future__ import annotations

import contextlib
import threading
import time

import streamlit as st

from attnviz.ui.caches.store import BoundedStore


class SharedMeasurements:
    """Timings measured on this server, shared by every session, and one measurement at a time.

    Many people opening a page that times code on the same CPU would slow each other and distort every figure;
    with one lock the second waits for the first and reuses its result (for the same inputs), so a class sees the
    same honest numbers. Holds the ``limit`` most recent results."""

    def __init__(self, limit: int = 32):
        self.lock = threading.Lock()  # held while measuring: one measurement at a time
        self.results = BoundedStore(limit)  # key -> (value, time measured)

    def get(self, key, measure, again: bool = False, waiting=None):
        """The stored ``(value, measured_at)`` for ``key``, or ``measure()``'s, timed while no other runs.
        ``waiting``: a context manager to show while another session's measurement holds the lock."""
        if not self.lock.acquire(blocking=False):
            with waiting or contextlib.nullcontext():
                self.lock.acquire()
        try:
            if again or key not in self.results:
                self.results.put(key, (measure(), time.time()))
            return self.results.get(key)
        finally:
            self.lock.release()


@st.cache_resource(max_entries=1)
def shared_measurements() -> SharedMeasurements:
    """The process-wide store of the Flash page's timings (32 settings)."""
    return SharedMeasurements(32)
