"""One race measured once and watched by everyone who asked for it (a class pressing Run at once).

`SharedRaces.watch` keys a request by what decides its race (`race_key`: the settings that change its
events, the prompt, the machine) and answers with a `Ticket`:

- while a race for that key waits or runs, the request joins it and sees every event so far, then
  the rest live (`SharedRace.wait_for`, `RunMirror`);
- once it has finished, a request within `keep_seconds` gets that measured race to replay (its
  `result`, played with `recording.replay`), never a new measurement; `fresh=True` measures again;
- otherwise a new race is queued; races wait for one of `slots` workers in the order they were asked
  for (`place`, `estimated_wait`), each on a thread of its own;
- a failing race fails every viewer with its error; a viewer that leaves stops nothing for the others,
  and the last one to leave stops the race (an unwatched measurement is not kept for replay).

Memory is bounded: at most `keep` finished races (least recently asked for dropped first), each a
finished `Run`; the races waiting or running are bounded by whoever calls (the app's queue size).
Pure Python and threads: no UI here, the app only renders what a ticket shows.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from ..core.events import Cycle, Step
from ..settings import RunSettings
from .result import CycleText, Run

log = logging.getLogger("specviz.runs")

WAITING, RUNNING, FINISHED, FAILED, STOPPED = "waiting", "running", "finished", "failed", "stopped"
MEASURE, JOIN, REPLAY = "measure", "join", "replay"     # how a ticket sees its race
KEEP_RACES = 8                     # finished races kept for replay ...
KEEP_SECONDS = 600.0               # ... for this long after they finished
TYPICAL_SECONDS = 10.0             # a race's wall time before any has finished here (the estimate's start)

Source = Callable[["SharedRace"], Iterator[Run]]   # the race itself: yields the growing Run


def race_key(settings: RunSettings, prompt: str, machine: str = "", viewer: str | None = None) -> str:
    """What decides a race's events: every setting, the prompt and the machine (its device and
    threads, `machine`). `viewer` for a drafter that remembers its viewer's earlier runs (suffix
    decoding): such a race is its viewer's own."""
    return json.dumps([settings.to_dict(), prompt, machine, viewer], sort_keys=True, default=str)


class SharedRace:
    """One measurement: its state, its events as they came (each a `Cycle` or `Step` with its text),
    and who watched it. Written by its producer thread, read by any number of viewers."""

    def __init__(self, key: str, asked_at: float):
        self.key = key
        self.asked_at = asked_at
        self.started_at: float | None = None       # wall time (time.time) the measurement began
        self.finished_at: float | None = None
        self.finished_at_clock: float | None = None  # on the SharedRaces' clock: when its replay expires
        self.state = WAITING
        self.status = ""                            # what the source says before its first event (loading)
        self.template: Run | None = None            # the run with no events: its settings, models, clock
        self.measured: dict = {}                    # the run's own fields as last published (MEASURED_AS_IT_GOES)
        self.events: list[tuple[Cycle | Step, CycleText | str]] = []
        self.result: Run | None = None              # the finished run
        self.error: BaseException | None = None
        self.viewers = 0                            # watching now
        self.tickets: list[Ticket] = []             # theirs
        self.shown_to = 0                           # everyone it was shown to, live or replayed
        self.stop_requested = False
        self._changed = threading.Condition()

    @property
    def ended(self) -> bool:
        return self.state in (FINISHED, FAILED, STOPPED)

    def say(self, status: str) -> None:
        """The source's word before its first event (a model loading)."""
        with self._changed:
            self.status = status
            self._changed.notify_all()

    def wait_for(self, seen: int, timeout: float | None = None) -> int:
        """The number of events once there are more than `seen` or the race has ended (or `timeout`
        seconds passed: 0 only looks)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.events) > seen or self.ended, timeout)
            return len(self.events)

    def wait_until_ended(self, timeout: float | None = None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.ended, timeout)

    # --- the producer's side
    def _publish(self, run: Run) -> None:
        with self._changed:
            if self.template is None:
                self.template = _without_events(run)
            self.measured = {name: copy.copy(getattr(run, name)) for name in MEASURED_AS_IT_GOES}
            cycles = sum(isinstance(event, Cycle) for event, _ in self.events)
            steps = len(self.events) - cycles
            self.events += list(zip(run.cycles[cycles:], run.texts[cycles:]))
            self.events += list(zip(run.steps[steps:], run.step_texts[steps:]))
            self._changed.notify_all()

    def _end(self, state: str, *, result: Run | None = None, error: BaseException | None = None) -> None:
        with self._changed:
            self.state, self.result, self.error = state, result, error
            self.finished_at = time.time()
            self._changed.notify_all()


# A run's fields that change as it goes, besides its events: what it is doing before its first event
# (calibrating), what its calibration cost, when its first token came, its elapsed time, the host's load,
# plain decoding along the speculative text where greedy outputs parted.
MEASURED_AS_IT_GOES = ("status", "calibration_seconds", "calibrated", "first_token_wall_seconds",
                       "elapsed_wall_seconds", "host_load", "followed")


def _without_events(run: Run) -> Run:
    return dataclasses.replace(run, cycles=[], texts=[], steps=[], step_texts=[], spec_done=False, plain_done=False,
                               _stats=(-1, None), _speed=((-1, -1), None, None))


class RunMirror:
    """A viewer's own `Run`, grown from a shared race's events (the producer's run is never read by a
    viewer's thread). Not thread-safe: one viewer, or its callers' lock."""

    def __init__(self, race: SharedRace):
        self.race = race
        self.run: Run | None = None
        self.seen = 0

    def grow(self) -> Run | None:
        """The run with every event the race has published so far (None before its first)."""
        race = self.race
        if self.run is None:
            if race.template is None:
                return None
            self.run = _without_events(race.template)
        events = race.events[self.seen:]      # a list only grows: a slice is a consistent prefix
        for event, text in events:
            if isinstance(event, Cycle):
                self.run.cycles.append(event)
                self.run.texts.append(text)
            else:
                self.run.steps.append(event)
                self.run.step_texts.append(text)
        self.seen += len(events)
        for name, value in race.measured.items():
            setattr(self.run, name, value)
        if race.state == FINISHED and race.result is not None and self.seen == len(race.events):
            self.run.spec_done, self.run.plain_done = race.result.spec_done, race.result.plain_done
            for name in MEASURED_AS_IT_GOES:
                setattr(self.run, name, copy.copy(getattr(race.result, name)))
        return self.run


@dataclasses.dataclass
class Ticket:
    """One viewer's hold on a race: `kind` (MEASURE: its request started it, JOIN: it joined one
    waiting or running, REPLAY: a finished one). `leave` (or the `with` block's end) lets it go."""
    race: SharedRace
    kind: str
    races: SharedRaces
    stopped: Callable[[], bool] | None = None    # the viewer's Stop, read by the race at every event
    left: bool = False

    @property
    def gone(self) -> bool:
        return self.left or (self.stopped is not None and self.stopped())

    def leave(self) -> None:
        if not self.left:
            self.left = True
            self.races._leave(self)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    @property
    def place(self) -> int:
        """1 for the next race to start, 0 once it runs (or has run)."""
        return self.races.place(self.race)

    @property
    def estimated_wait(self) -> float:
        return self.races.estimated_wait(self.race)


class SharedRaces:
    """The races of one server: shared by key, run on at most `slots` threads at once."""

    def __init__(self, slots: int = 1, *, keep: int = KEEP_RACES, keep_seconds: float = KEEP_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.slots = max(1, slots)
        self.keep, self.keep_seconds, self.clock = keep, keep_seconds, clock
        self._live: dict[str, SharedRace] = {}                  # waiting or running, by key
        self._finished: OrderedDict[str, SharedRace] = OrderedDict()   # least recently asked for first
        self._line: deque[SharedRace] = deque()                 # waiting for a slot, in order
        self._running = 0
        self._durations: deque[float] = deque(maxlen=16)        # recent races' wall times
        self._lock = threading.Condition()

    def watch(self, key: str, source: Source, *, fresh: bool = False,
              stopped: Callable[[], bool] | None = None) -> Ticket:
        """A ticket to the race for `key`: the one waiting or running, else (unless `fresh`) the one
        that finished within `keep_seconds`, else a new one that `source` runs once a slot is free.
        `stopped`: the viewer's Stop; once every viewer has stopped or left, the race stops at its
        next event (a Stop reaches it without waiting for the viewer's next look)."""
        with self._lock:
            self._expire()
            race = self._live.get(key)
            if race is not None and not race.stop_requested:
                kind = JOIN
            elif not fresh and key in self._finished:
                race, kind = self._finished[key], REPLAY
                self._finished.move_to_end(key)
            else:
                race, kind = SharedRace(key, self.clock()), MEASURE
                self._live[key] = race
                slot = not self._line and self._running < self.slots      # it starts now
                if slot:
                    self._running += 1
                    race.started_at, race.state = time.time(), RUNNING
                else:
                    self._line.append(race)
                threading.Thread(target=self._produce, args=(race, source, slot), name="specviz-shared-race",
                                 daemon=True).start()
            ticket = Ticket(race, kind, self, stopped)
            race.viewers += 1
            race.shown_to += 1
            if not race.ended:
                race.tickets.append(ticket)
            return ticket

    def place(self, race: SharedRace) -> int:
        with self._lock:
            return self._line.index(race) + 1 if race in self._line else 0

    def estimated_wait(self, race: SharedRace) -> float:
        """Seconds until `race` starts, roughly: the races ahead of it, `slots` at a time, each as long
        as the recent ones took (their median)."""
        with self._lock:
            if race not in self._line:
                return 0.0
            ahead = self._line.index(race)
            typical = statistics.median(self._durations) if self._durations else TYPICAL_SECONDS
            rounds = ahead // self.slots + (1 if self._running >= self.slots else 0)
            return rounds * typical

    def finished(self) -> list[SharedRace]:
        """The finished races kept for replay, least recently asked for first."""
        with self._lock:
            self._expire()
            return list(self._finished.values())

    # --- inside
    def _leave(self, ticket: Ticket) -> None:
        with self._lock:
            race = ticket.race
            race.viewers -= 1
            if ticket in race.tickets:
                race.tickets.remove(ticket)
            if race.viewers <= 0 and not race.ended:
                race.stop_requested = True          # nobody watches: the producer stops at its next event
                self._lock.notify_all()             # (one waiting for a slot stops at once)

    def _expire(self) -> None:
        now = self.clock()
        for key, race in list(self._finished.items()):
            if now - (race.finished_at_clock or now) > self.keep_seconds:
                del self._finished[key]
        while len(self._finished) > self.keep:
            self._finished.popitem(last=False)

    def _take_slot(self, race: SharedRace) -> bool:
        """Wait until `race` is first in line and a slot is free; False when it was abandoned first."""
        with self._lock:
            self._lock.wait_for(lambda: race.stop_requested or (self._line[0] is race and self._running < self.slots))
            self._line.remove(race)
            self._lock.notify_all()
            if race.stop_requested:
                return False
            self._running += 1
            return True

    def _produce(self, race: SharedRace, source: Source, slot: bool) -> None:
        if not slot:
            if not self._take_slot(race):
                self._done(race, STOPPED, ran=False)
                return
            with race._changed:
                race.started_at, race.state = time.time(), RUNNING
                race._changed.notify_all()
        began = time.monotonic()
        state, result, error = FINISHED, None, None
        runs = None
        try:
            runs = source(race)
            for result in runs:
                race._publish(result)
                if race.stop_requested or all(ticket.gone for ticket in list(race.tickets)):
                    state = STOPPED
                    break
        except BaseException as exc:  # noqa: BLE001 - every viewer gets it
            state, error = FAILED, exc
        finally:
            if runs is not None and hasattr(runs, "close"):
                runs.close()
        if state == FINISHED and result is None:
            state, error = FAILED, RuntimeError("the race produced nothing")
        self._done(race, state, ran=True, result=result, error=error, seconds=time.monotonic() - began)

    def _done(self, race: SharedRace, state: str, *, ran: bool, result: Run | None = None,
              error: BaseException | None = None, seconds: float = 0.0) -> None:
        with self._lock:
            race._end(state, result=result, error=error)      # before a replay can be handed out
            log.info("a shared race %s after %.1f s (waited %.1f s), shown to %d so far", state, seconds,
                     (race.started_at or race.asked_at) - race.asked_at if ran else 0.0, race.shown_to)
            race.tickets.clear()
            if ran:
                self._running -= 1
            if self._live.get(race.key) is race:
                del self._live[race.key]
            if state == FINISHED:
                race.finished_at_clock = self.clock()
                self._finished[race.key] = race
                self._finished.move_to_end(race.key)
                self._durations.append(seconds)
                self._expire()
            self._lock.notify_all()
