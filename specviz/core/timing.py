"""How decoding is timed: the clock each event is read with, and keeping Python's garbage collector
out of the timed work.

A full collection walks every object in the process. Under the web app that is the whole of Gradio,
plotly and transformers (about 560,000 objects after start-up, 0.29 s of CPU time for one collection
on the 2-core machine in the README), and it runs on whichever thread happens to allocate when a
threshold is crossed: often the decoding thread, inside a timed pass. Like `timeit`, the events are
timed with automatic collection paused; it resumes between events, where rendering runs."""

from __future__ import annotations

import functools
import gc
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
        self.sync = None
        if device.type == "cuda":       # this device's queue: `cuda:1` waits for cuda:1, not the current device
            self.sync = functools.partial(torch.cuda.synchronize, device)
        elif device.type == "mps":      # one device: its synchronize takes none
            self.sync = getattr(torch.mps, "synchronize", None)
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


def median_seconds(work: Callable[[], object], clock: Clock, samples: int,
                   undo: Callable[[], object] | None = None) -> float:
    """Median seconds of `work` over `samples` timed runs after one untimed, `undo` (untimed) after
    each, with the collector paused as it is for every event: the one calibration routine of the
    package (`interleaved_seconds` with one work; the draft policy's pass costs time several in
    rounds, the load sweep's cost curve one at a time)."""
    return interleaved_seconds([work], clock, samples, undo)[0]


def interleaved_seconds(works: Sequence[Callable[[], object]], clock: Clock, rounds: int,
                        undo: Callable[[], object] | None = None) -> list[float]:
    """Seconds of each of `works` relative to the first, timed in interleaved rounds (each round runs
    every work once, in order; one untimed round first; `undo` after each, untimed; the collector
    paused as in `median_seconds`): the first's median seconds times each one's median ratio to the
    first within a round. A slow stretch of the host then slows a round's works alike and cancels in
    their ratios, where medians taken one work after another carry it into one work's figure (on a
    2-core CPU a plain step's median moved 55-78 ms between calibrations, and a 4-token pass read
    1.65-2.27 steps; in rounds, 1.73-1.88)."""
    seconds: list[list[float]] = [[] for _ in works]
    for _ in range(rounds + 1):
        for index, work in enumerate(works):
            with collector_paused():
                start = clock()
                work()
                seconds[index].append(clock() - start)
            if undo is not None:
                undo()
    first = statistics.median(seconds[0][1:])
    result = []
    for times in seconds:
        ratios = [own / base for own, base in zip(times[1:], seconds[0][1:]) if base > 0]
        result.append(first * statistics.median(ratios) if ratios else statistics.median(times[1:]))
    return result
