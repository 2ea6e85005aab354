"""How decoding is timed: the clock each event is read with, and keeping Python's garbage collector
out of the timed work.

A full collection walks every object in the process. Under the web app that is the whole of Gradio,
plotly and transformers (about 560,000 objects after start-up, 0.29 s of CPU time for one collection
on the 2-core machine in the README), and it runs on whichever thread happens to allocate when a
threshold is crossed: often the decoding thread, inside a timed pass. Like `timeit`, the events are
timed with automatic collection paused; it resumes between events, where rendering runs."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from functools import partial
from contextlib import contextmanager
from typing import TypeVar

import torch

T = TypeVar("T")


class Clock:
    """The clock every event is timed with, chosen for the device.

    GPU (and MPS): wall time, read after the device has finished its queued work. CPU with one torch
    thread: this thread's own CPU time: every op of a forward then runs on the calling thread, so
    other processes' work (the browser, the web server) is not counted. A busy host still slows it: a
    virtual CPU's stolen time counts as the thread's, and a shared core runs its instructions slower,
    which is why each run records the host's load (models.host). CPU with more threads: wall time
    (another thread's work would be missed by a thread clock)."""

    def __init__(self, device: torch.device):
        # cuda: that device's queue (a bare synchronize() waits for the current device, cuda:0 unless set)
        self.sync = {"cuda": partial(torch.cuda.synchronize, device),
                     "mps": getattr(torch.mps, "synchronize", None)}.get(device.type)
        if device.type == "cpu" and torch.get_num_threads() == 1:
            self.read, self.name = time.thread_time, "thread CPU time"
        else:
            self.read = time.perf_counter
            self.name = "wall clock, device-synchronised" if self.sync else "wall clock"

    def __call__(self) -> float:
        if self.sync is not None:
            self.sync()
        return self.read()


_pauses = 0                     # timed regions open now, on any thread
_collector_was_enabled = False  # the collector's state when the first of them opened
_lock = threading.Lock()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Automatic garbage collection off for the duration (it stays off until the last of several
    overlapping regions, on any thread, has closed; then it returns to what it was)."""
    global _pauses, _collector_was_enabled
    with _lock:
        if _pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _collector_was_enabled:
                gc.enable()


_END = object()


def timed_events(events: Iterator[T]) -> Iterator[T]:
    """`events`, each computed with the collector paused (a generator's work between two yields is
    one event: one pass, one step)."""
    while True:
        with collector_paused():
            event = next(events, _END)
        if event is _END:
            return
        yield event
