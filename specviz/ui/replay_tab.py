"""The Replay tab: a recording (uploaded, or one that ships in assets/recordings/) played back in the
Run tab's own views, at the recorded speed, 2x, 4x, in slow motion (0.5x, 0.25x), or a cycle at a
time, and made into a GIF (Make animation). Both methods race on their recorded clocks. No model is
loaded, so a CPU Space can show a GPU pair's run; the tab works the same in hosted mode.

What a visitor can make the server spend is bounded: a file is checked against `recording`'s caps
before anything is shown, opening and stepping wait in the queue (`OPEN_CONCURRENCY` at once), a
replay plays in at most `recording.MAX_PLAYBACK_SECONDS` (a longer one is compressed), each run's
token view details its first `report.DETAIL_TOKENS` tokens, and the opened files kept for Next and
Previous are bounded in bytes (`CACHE_BYTES`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import NamedTuple

import gradio as gr

from ..catalog import bundled_recordings
from ..errors import SpecvizError
from ..runs import recording
from ..runs.recording import Recording
from ..views import render
from ..views.report import DetailLimitedRenderer
from ..views.run_view import empty_view
from .common import (TICK, StopSignal, animation_buttons, animation_file, click_with_stop, error_html,
                     failure, streaming)
from .playback import FRAME_SHARE, play  # noqa: F401 - FRAME_SHARE: the tab's bound, as tests read it
from .run_tab import build_run_views, shown

DEFAULT_RECORDING = "prompt-lookup-rewrite.json"
# Slow motion for a class: each cycle's verdicts stay long enough to be pointed at.
SPEEDS = {"0.25\u00d7 (slow motion)": 0.25, "0.5\u00d7": 0.5, "Recorded speed": 1.0, "2\u00d7": 2.0, "4\u00d7": 4.0}
CYCLE_BY_CYCLE = "Cycle by cycle (Next / Previous)"
REPLAY_ERROR = dict(heading="This recording cannot be played.",
                    advice="Choose a bundled recording, or upload a file from Download recording or --record.")
REPLAY_CONCURRENCY = 8              # replays only sleep and render: several may play at once
OPEN_CONCURRENCY = 2                # opening a file and stepping cost CPU (a worst-case file: seconds)
CACHE_ENTRIES = 8                   # opened recordings kept for Play, Next and Previous ...
CACHE_BYTES = 128 * 2**20           # ... and their estimated size in memory (a worst-case file: ~65 MB)


def open_recording(bundled: str | None, upload: str | None) -> Recording:
    """The chosen recording: an upload wins over the bundled choice."""
    if upload:
        return _load(upload)
    files = bundled_recordings()
    if bundled in files:
        return _load(files[bundled])
    raise SpecvizError("Choose a bundled recording or upload one (a .json file from Download recording, "
                       "`python -m specviz run --record FILE` or `compare --record FILE`).")


def _load(path) -> Recording:
    """`recording.load`, read and checked once per file version: Play, Next and Previous each open
    the chosen file again (a replay never changes what it reads)."""
    try:
        stat = os.stat(path)
    except OSError:
        return recording.load(path)          # its message for a file that cannot be read
    return _load_version(str(path), stat.st_mtime_ns, stat.st_size)


_opened: OrderedDict[tuple, tuple[Recording, int]] = OrderedDict()   # version -> (recording, its bytes)
_opened_lock = threading.Lock()


def _load_version(path: str, mtime_ns: int, size: int) -> Recording:
    """The recording at this version of `path`, from the cache (least recently used dropped first,
    past CACHE_ENTRIES or CACHE_BYTES) or read now."""
    key = (path, mtime_ns, size)
    with _opened_lock:
        if key in _opened:
            _opened.move_to_end(key)
            return _opened[key][0]
    opened = recording.load(path)            # outside the lock: other files open meanwhile
    with _opened_lock:
        _opened[key] = (opened, recording.footprint(opened))
        while len(_opened) > 1 and (len(_opened) > CACHE_ENTRIES
                                    or sum(size for _, size in _opened.values()) > CACHE_BYTES):
            _opened.popitem(last=False)
    return opened


def chosen_run(bundled: str | None, upload: str | None, label: str | None):
    """The run to play: the one labelled `label` in the chosen recording (its first by default)."""
    opened = open_recording(bundled, upload)
    return opened.runs[opened.labels.index(label)] if label in opened.labels else opened.runs[0]


def opened_html(opened: Recording) -> str:
    env = opened.environment
    where = ", ".join(str(env[k]) for k in ("device_name", "torch", "transformers") if env.get(k))
    runs = "; ".join(f"{label}: {len(run.cycles)} cycles, {run.stats.tokens} tokens"
                     for label, run in zip(opened.labels, opened.runs))
    return render.info_html(f"{opened.name}: recorded {opened.created or 'at an unknown time'}"
                            f"{' on ' + where if where else ''}. {runs}. Press Play, or step with Next cycle.")


def replay_work(bundled: str | None, upload: str | None, label: str | None, speed: str,
                stop: StopSignal | None = None) -> Iterator[tuple | object]:
    """The Play button's work: the chosen run replayed on its recorded clocks (see `streaming`)."""
    stop = stop or StopSignal()
    try:
        recorded = chosen_run(bundled, upload, label)
        if speed not in SPEEDS:   # cycle by cycle: Play shows the first cycle
            yield (*shown(DetailLimitedRenderer().view(recording.up_to_cycle(recorded, 1),
                                                       "Cycle 1: press Next cycle.")), 1)
            return
        for step in play(recorded, SPEEDS[speed], stop, f"Replaying at {speed.lower()}",
                         "Replayed: the recorded run, as it finished."):
            yield step if step is TICK else (*shown(step[0]), len(step[1].cycles))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
        yield (*shown(empty_view(error_html(failure(exc, "replay"), **REPLAY_ERROR))), 0)


def step_view(bundled: str | None, upload: str | None, label: str | None, position: int, delta: int) -> tuple:
    """Next / Previous cycle: the run as it stood after one cycle more or fewer."""
    try:
        recorded = chosen_run(bundled, upload, label)
        cycles = max(1, min(len(recorded.cycles), int(position or 0) + delta))
        run = recording.up_to_cycle(recorded, cycles)
        final = cycles == len(recorded.cycles)
        state = ("Last cycle: the recorded run, as it finished." if final
                 else f"Cycle {cycles} of {len(recorded.cycles)}.")
        return (*shown(DetailLimitedRenderer().view(run, state, final=final)), cycles)
    except Exception as exc:  # noqa: BLE001
        return (*shown(empty_view(error_html(failure(exc, "replay"), **REPLAY_ERROR))), position or 0)


class ReplayTab(NamedTuple):
    bundled: gr.Dropdown
    upload: gr.File
    speed: gr.Radio
    play: gr.Button
    stop: gr.Button
    next: gr.Button
    previous: gr.Button
    stats: gr.HTML


def build_replay_tab() -> ReplayTab:
    """The Replay tab's components and events (call inside a `gr.Tab`)."""
    files = list(bundled_recordings())
    first = DEFAULT_RECORDING if DEFAULT_RECORDING in files else (files[0] if files else None)
    try:
        opened = open_recording(first, None) if first else None
    except SpecvizError:
        opened = None
    gr.Markdown("Play back a recorded run, with no model: one made here (**Download recording** under a "
                "run) or on another machine (`python -m specviz run --record run.json ...`, on a GPU say). "
                f"Files up to {recording.MAX_BYTES // 2**20} MB.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            bundled = gr.Dropdown(files, value=first, label="Bundled recording",
                                  elem_id="replay-bundled")
            upload = gr.File(label="Or upload a recording (.json)", file_types=[".json"], type="filepath",
                             elem_id="replay-upload")
        with gr.Column(scale=2):
            labels = opened.labels if opened else []
            which = gr.Dropdown(labels, value=labels[0] if labels else None, label="Run (a comparison holds several)",
                                elem_id="replay-run")
            speed = gr.Radio([*SPEEDS, CYCLE_BY_CYCLE], value="Recorded speed", label="Speed", elem_id="replay-speed")
            with gr.Row():
                play = gr.Button("Play", variant="primary", elem_id="replay-play")
                stop = gr.Button("Stop", variant="stop", elem_id="replay-stop")
            with gr.Row():
                previous = gr.Button("\u2190 Previous cycle", size="sm", elem_id="replay-previous")
                next_ = gr.Button("Next cycle \u2192", size="sm", elem_id="replay-next")
    info = gr.HTML(opened_html(opened) if opened else "", elem_id="replay-info")
    made = []
    views = build_run_views("replay-", action="Play", under_summary=lambda: made.extend(animation_buttons("replay-")))
    make_animation, animation = made
    position = gr.State(0)
    # Opening and stepping read and render a whole file: in the queue, a few at once.
    private = dict(api_visibility="private", concurrency_limit=OPEN_CONCURRENCY, concurrency_id="replay-open")

    def on_open(bundled_name, uploaded):
        try:
            opened = open_recording(bundled_name, uploaded)
        except Exception as exc:  # noqa: BLE001
            return gr.update(choices=[], value=None), error_html(failure(exc, "opening a recording"), **REPLAY_ERROR), 0
        return gr.update(choices=opened.labels, value=opened.labels[0]), opened_html(opened), 0

    chosen = [bundled, upload, which]
    outputs = [*views, position]
    # Choosing a bundled recording clears an upload (an upload wins while it is there).
    bundled.input(lambda name: (None, *on_open(name, None)), bundled, [upload, which, info, position], **private)
    upload.change(on_open, [bundled, upload], [which, info, position], **private)
    click_with_stop(play, stop, streaming(replay_work), [*chosen, speed], outputs,
                    concurrency_limit=REPLAY_CONCURRENCY, concurrency_id="replay", show_progress="hidden",
                    api_visibility="private")
    next_.click(lambda b, u, w, p: step_view(b, u, w, p, +1), [*chosen, position], outputs, **private)
    previous.click(lambda b, u, w, p: step_view(b, u, w, p, -1), [*chosen, position], outputs, **private)
    # The chosen run as a GIF at the chosen speed (cycle by cycle: the recorded speed).
    make_animation.click(lambda b, u, w, s: animation_file(lambda: chosen_run(b, u, w), SPEEDS.get(s, 1.0), "replay"),
                         [*chosen, speed], animation, concurrency_limit=1, concurrency_id="animation",
                         api_visibility="private")
    return ReplayTab(bundled, upload, speed, play, stop, next_, previous, views.stats)
