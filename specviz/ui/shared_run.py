"""What the Run tab shows when a class presses Run at once (`runs.shared_race` decides; this renders).

- Waiting for a free slot: the visitor's place in line and an estimated wait, at once, and meanwhile
  the bundled recording of the chosen example plays, marked as a recording (`waiting_views`).
- A race shared with others: one `LiveViews` per race draws its views for everyone watching, at most
  every UPDATE_SECONDS (charts every CHART_SECONDS), less often for a large audience, so thirty
  viewers cost about one viewer's drawing.
- A race measured minutes ago: replayed at its recorded pace, labelled as a replay with the time it
  was measured and how many it was shown to (`measured_label`); never passed off as a new measurement.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import gradio as gr
import torch

from ..catalog import bundled_recordings
from ..errors import SpecvizError
from ..runs import Loader, load_stepwise, race, recording
from ..runs.race_worker import can_fork, forked_race
from ..runs.shared_race import JOIN, REPLAY, WAITING, RunMirror, SharedRace, SharedRaces, Ticket, race_key
from ..settings import Limits, RunSettings, parse_draft
from ..views import render
from ..views.export import finite_json
from ..views.run_view import RunRenderer, RunView, empty_view
from .budget import check_pair_prompt
from .playback import play
from .common import CHART_SECONDS, TICK, UPDATE_SECONDS, SessionMemories, StopSignal, gpu_task

DEFAULT_WAITING_RECORDING = "prompt-lookup-rewrite.json"
WAITING_SPEED = 1.0
WAITING_FRAME_SECONDS = 1.0        # a waiting visitor's recording is redrawn at most this often
# A race with many viewers is redrawn less often: every view goes to every viewer, and serialising
# them (the token view grows to ~100 KB) costs the server the CPU the race runs on. Per AUDIENCE_STEP
# viewers, the interval grows by UPDATE_SECONDS (charts: CHART_SECONDS), up to the caps.
AUDIENCE_STEP = 4
MAX_UPDATE_SECONDS, MAX_CHART_SECONDS = 2.0, 6.0


def race_slots() -> int:
    """Races run at once: one per core on a CPU (each race runs on one thread, timed by its own CPU
    time; two at once on two cores kept their figures, see docs/spaces.md), one on a GPU.
    SPECVIZ_RACES=N overrides."""
    chosen = os.environ.get("SPECVIZ_RACES", "").strip()
    if chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    if torch.cuda.is_available():
        return 1
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine() -> str:
    """The part of a race's key that names this machine's way of running it (its torch threads)."""
    return f"threads={torch.get_num_threads()}"


def clock_time(seconds: float | None) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(seconds or time.time()))


def people(n: int) -> str:
    return f"{n} {'person' if n == 1 else 'people'}"


def measured_label(ticket: Ticket) -> str:
    """What the view says about whose measurement it is."""
    race = ticket.race
    if ticket.kind == REPLAY:
        return (f"Replay of a race measured at {clock_time(race.started_at)}, shown to {people(race.shown_to)}: "
                "not a new measurement (tick \u201cMeasure again\u201d for one).")
    if race.shown_to > 1:
        return f"Shared race measured at {clock_time(race.started_at)}, shown to {people(race.shown_to)}."
    return f"Measured at {clock_time(race.started_at)} for you."


def labelled(view: RunView, label: str) -> RunView:
    return view._replace(stats=render.info_html(label) + view.stats)


def measurement(ticket: Ticket) -> dict:
    """The JSON's word on the measurement: when, for how many, and whether this is a replay."""
    race = ticket.race
    return {"measured_at": clock_time(race.started_at), "shown_to": race.shown_to, "replay": ticket.kind == REPLAY,
            "joined": ticket.kind == JOIN, "label": measured_label(ticket)}


def summary_json(run, ticket: Ticket) -> dict:
    """The run as `python -m specviz run --json` writes it, less its cycles (`Run.to_json`), and the
    measurement's label."""
    return finite_json({**run.to_json(cycles=False), "measurement": measurement(ticket)})


def race_stream(limits: Limits, loader: Loader | None, memories: SessionMemories) -> Callable:
    """The GPU work of a race (one ZeroGPU call: its arguments and what it yields cross to and from a
    worker, so both pickle): `stream(settings, prompt, viewer)` yields what loading says (HTML), then
    the growing run. It loads the pair, checks the prompt's tokens against `limits` and races both
    methods, a remembering drafter (suffix) with `viewer`'s memory."""
    def stream(settings: RunSettings, prompt: str, viewer: str | None):
        yield render.summary_loading_html(settings.target, settings.draft)
        for pair in load_stepwise(settings, loader):
            if isinstance(pair, str):
                yield render.summary_loading_html(settings.target, settings.draft, pair)
        check_pair_prompt(pair, prompt, settings, limits)     # hosted: in tokens, before any decoding
        raced = memories.pair_for(pair, viewer)
        # A race in a process of its own, away from the server's interpreter lock (runs.race_worker),
        # unless its drafter remembers the session's runs (the memory lives here).
        runner = forked_race if raced is pair and can_fork(pair) else race
        yield from runner(settings, prompt, raced, baseline=True)

    return gpu_task(stream)


def race_ticket(races: SharedRaces, stream: Callable, settings: RunSettings, prompt: str, viewer: str | None, *,
                fresh: bool = False, stopped: Callable[[], bool] | None = None) -> Ticket:
    """A ticket to the race of `settings` on `prompt` (validated both): joined, replayed or queued
    (`SharedRaces.watch`), run by `stream` (`race_stream`). A drafter that remembers its session's
    runs (suffix) races for `viewer` alone, afresh every time."""
    remembers = parse_draft(settings.draft).kind == "suffix"

    def measure(shared):
        for item in stream(settings, prompt, viewer):
            if isinstance(item, str):
                shared.say(item)
            else:
                yield item

    key = race_key(settings, prompt, machine(), viewer if remembers else None)
    return races.watch(key, measure, fresh=fresh or remembers, stopped=stopped)


# ----------------------------------------------------------------------------- waiting

def waiting_html(ticket: Ticket, example: str | None) -> str:
    race = ticket.race
    meanwhile = f"Meanwhile: {example}, a recording measured earlier, not your race." if example else ""
    if race.started_at is not None:       # its models load
        loading = race.status or render.info_html("Loading the models\u2026")
        return loading + (render.info_html(meanwhile) if meanwhile else "")
    else:
        line = (f"You are number {ticket.place} in line: about {ticket.estimated_wait:.0f} s until your race "
                "starts.")
        if ticket.kind == JOIN:
            line += f" You share it with {people(race.viewers - 1)} who asked for the same."
    return render.info_html(f"{line} {meanwhile}")


_recordings: dict[str, tuple[str, object]] = {}       # prompt -> (bundled name, its first run)
_recordings_lock = threading.Lock()


def waiting_recording(prompt: str):
    """The bundled recording of this prompt's example, or the default one: (its words, its run)."""
    with _recordings_lock:
        if not _recordings:
            for name, path in bundled_recordings().items():
                try:
                    run = recording.load(path).runs[0]
                except SpecvizError:
                    continue
                _recordings.setdefault(run.prompt, (name, run))
                if name == DEFAULT_WAITING_RECORDING:
                    _recordings.setdefault("", (name, run))
        found = _recordings.get(prompt)
        if found is not None:
            return f"the recording of this example ({found[0]})", found[1]
        other = _recordings.get("")
        return (f"the recording of another example ({other[0]})", other[1]) if other else (None, None)


def waiting_views(ticket: Ticket, prompt: str, stop: StopSignal) -> Iterator[RunView | object]:
    """Before the race's first event: the place in line at once, and while the race waits for a slot
    the example's recording playing under it; then what loading the models says. Ends when the race
    has its first event or has ended."""
    race = ticket.race
    words, recorded = waiting_recording(prompt) if race.state == WAITING else (None, None)
    yield blank(waiting_html(ticket, words))      # the last run's views go at once
    if recorded is not None:
        shown_line, pending = time.monotonic(), None
        for step in play(recorded, WAITING_SPEED, stop, "Recording, while you wait",
                         "Recording, while you wait: ended.", charts=False):
            if race.state != WAITING or race.ended or stop.requested:
                break
            pending = step[0] if step is not TICK else pending      # the recording's latest frame
            if time.monotonic() - shown_line < WAITING_FRAME_SECONDS:
                yield TICK
                continue
            shown_line = time.monotonic()
            place = waiting_html(ticket, words)          # the place and the wait, kept current
            yield (pending._replace(stats=place + pending.stats) if pending is not None
                   else RunView(*(gr.skip(),) * (len(RunView._fields) - 1), place))
            pending = None
    said = None
    while not (race.events or race.ended or stop.requested):
        if race.state != WAITING and race.status != said:
            said = race.status
            yield blank(waiting_html(ticket, None))
        else:
            yield TICK
        race.wait_for(0, timeout=UPDATE_SECONDS)


_blank: list[RunView] = []


def blank(stats: str) -> RunView:
    """The empty views under `stats`: their figures made once for every visitor (a class's first
    views each made five empty figures)."""
    if not _blank:
        _blank.append(empty_view(""))
    return _blank[0]._replace(stats=stats)


# ----------------------------------------------------------------------------- watching live

class LiveViews:
    """One race's views as everyone watching it sees them: drawn at most every UPDATE_SECONDS
    (charts every CHART_SECONDS) whoever asks, from one mirror of the race's events."""

    def __init__(self, race: SharedRace):
        self._race = race
        self._lock = threading.Lock()
        self._mirror = RunMirror(race)
        self._renderer = RunRenderer()
        self._last: RunView | None = None
        self._drawn = self._charts_drawn = 0.0
        self._final: dict = {}

    def interval(self, seconds: float = UPDATE_SECONDS, cap: float = MAX_UPDATE_SECONDS) -> float:
        """How often the views are drawn for this race's audience."""
        return min(cap, seconds * max(1.0, self._race.viewers / AUDIENCE_STEP))

    def view(self, label: str) -> RunView | None:
        """The latest view (None before the race's first event)."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._drawn < self.interval():
                return self._last
            run = self._mirror.grow()
            if run is None:
                return None
            with_charts = now - self._charts_drawn >= self.interval(CHART_SECONDS, MAX_CHART_SECONDS)
            doing = run.status or "Running: speculative and plain decoding take turns on the same model\u2026"
            view = self._renderer.view(run, f"{doing} {label}", with_charts=with_charts)
            self._last, self._drawn = view, now
            self._charts_drawn = now if with_charts else self._charts_drawn
            return self._last

    def final(self, label: str, make) -> tuple:
        """The finished race's view and `make(run)`'s extras, drawn once for everyone."""
        with self._lock:
            if label not in self._final:
                run = self._mirror.grow()
                view = self._renderer.view(run, f"Finished. {label}", final=True)
                self._final = {label: (view, run, make(run))}
            return self._final[label]

    def stopped(self, label: str) -> RunView | None:
        with self._lock:
            run = self._mirror.grow()
            return None if run is None else labelled(RunRenderer().stopped(run), label)


_live: weakref.WeakKeyDictionary[SharedRace, LiveViews] = weakref.WeakKeyDictionary()
_live_lock = threading.Lock()


def live_views(race: SharedRace) -> LiveViews:
    with _live_lock:
        views = _live.get(race)
        if views is None:
            views = _live[race] = LiveViews(race)
        return views
