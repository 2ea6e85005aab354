"""A recorded run played back on its recorded clocks (`play`): the Replay tab's Play, a waiting
visitor's recording and a shared race's replay in the Run tab all play through here."""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..runs import recording
from ..views.report import DetailLimitedRenderer
from ..views.run_view import RunView
from .common import TICK, StopSignal, Throttle

SLEEP_SLICE = 0.1                   # a Stop lands within this long while a replay waits for its next event
FRAME_SHARE = 0.25                  # at most about this share of a replay's time goes on drawing its views


def play(recorded, speed: float, stop: StopSignal, playing: str, finished: str, *,
         charts: bool = True) -> Iterator[tuple[RunView, object] | object]:
    """`recorded` played back on its recorded clocks at `speed` (compressed past
    `recording.MAX_PLAYBACK_SECONDS`): yields (view, the run so far) when the page should change and
    TICK while it waits; `playing` heads the views until the end, `finished` the last one. A Stop
    ends it with the run as it stood. Without `charts` only the last view draws them (a waiting
    visitor's recording: cheaper, many may play at once)."""
    renderer, throttle = DetailLimitedRenderer(), Throttle()
    events = recording.timeline(recorded)
    scale = recording.playback_scale(events, speed)
    if scale < 1 / speed:
        playing += f", compressed to {recording.MAX_PLAYBACK_SECONDS:g} s"
    start = time.monotonic()
    run, quiet_until = None, 0.0
    for seconds, run in recording.replay(recorded, events):
        while (wait := start + seconds * scale - time.monotonic()) > 0 and not stop.requested:
            time.sleep(min(wait, SLEEP_SLICE))
            yield TICK
        if stop.requested:
            yield renderer.stopped(run), run
            return
        # A large run's view takes longer to draw than the throttle's interval: after each one,
        # wait in proportion to its cost, so that drawing cannot stretch the replay past its pacing.
        show, with_charts = throttle.due() if time.monotonic() >= quiet_until else (False, False)
        if show:
            drawing = time.monotonic()
            view = renderer.view(run, f"{playing}\u2026", with_charts=with_charts and charts)
            quiet_until = time.monotonic() + (time.monotonic() - drawing) * (1 / FRAME_SHARE - 1)
            yield view, run
        else:
            yield TICK
    yield renderer.view(run, finished, final=True), run
