"""The Run tab's work with shared races (`ui.shared_run`): a waiting visitor's first view is its place
in line and an estimated wait, then a bundled recording plays, marked as one; a race asked for again
is replayed under a label that says when it was measured and for how many, never as a new one."""

import html
import re
import threading

import pytest
from test_ui import inputs

from specviz.runs.shared_race import SharedRaces
from specviz.settings import LOCAL
from specviz.ui import run_tab
from specviz.ui.common import TICK, StopSignal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request


def text(markup):
    return html.unescape(re.sub(r"<[^>]+>", " ", markup)) if isinstance(markup, str) else ""


def pages(work, **changes):
    fresh = changes.pop("fresh", False)
    return [p for p in work(*inputs(**changes), fresh) if p is not TICK]


def test_a_race_asked_for_again_is_a_labelled_replay_unless_measured_again(tiny):
    work = run_tab.run_work(LOCAL, tiny.loader, races=SharedRaces(slots=1))
    first = pages(work, max_new_tokens=24)[-1]
    assert "Finished" in text(first.stats) and first.summary["measurement"]["replay"] is False
    again = pages(work, max_new_tokens=24)
    label = text(again[-1].stats)
    assert re.search(r"Replay of a race measured at \d\d:\d\d:\d\d UTC, shown to 2 people: not a new measurement",
                     label), label
    assert all("Replay of a race" in text(p.stats) for p in again if "sv-tile" in str(p.stats))   # every summary
    assert again[-1].summary["measurement"] == dict(first.summary["measurement"], replay=True, shown_to=2,
                                                    label=again[-1].summary["measurement"]["label"])
    assert again[-1].summary["summary"] == first.summary["summary"]          # the same measurement
    fresh = pages(work, max_new_tokens=24, fresh=True)[-1]
    assert "Replay" not in text(fresh.stats) and fresh.summary["measurement"]["replay"] is False
    assert fresh.summary["measurement"]["shown_to"] == 1


def test_everyone_watching_a_shared_race_is_offered_its_recording(tiny):
    # The finished race's download-button update is made once for all its viewers; Gradio pops an
    # update's value as it sends it, so each viewer must get its own (the others' buttons were empty).
    work = run_tab.run_work(LOCAL, tiny.loader, races=SharedRaces(slots=1))
    bell, finals = threading.Barrier(2), [None, None]

    def viewer(i):
        bell.wait()
        finals[i] = pages(work, max_new_tokens=48)[-1]

    threads = [threading.Thread(target=viewer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(f.summary["measurement"]["joined"] for f in finals) == [False, True]     # one race, two viewers
    finals[0].record.pop("value")                  # as Gradio sends the first viewer's
    assert finals[1].record["value"] and finals[1].record["interactive"] is True


def recording_shown(page) -> bool:
    return (isinstance(page.tokens, str) and 'class="sv-cycle"' in page.tokens
            and "Recording, while you wait" in text(page.stats))


def test_a_waiting_visitor_sees_its_place_at_once_then_a_recording_marked_as_one(tiny):
    release = threading.Event()

    def slow_loader(settings, progress=None):
        assert release.wait(60)
        return tiny.loader(settings, progress)

    races = SharedRaces(slots=1)
    work = run_tab.run_work(LOCAL, slow_loader, races=races)
    busy = work(*inputs(max_new_tokens=16), False)
    assert "Loading" in text(next(busy).stats)             # the first race holds the only slot
    seen, signal = [], StopSignal()
    for page in work(*inputs(prompt="a prompt of its own", max_new_tokens=16), False, stop=signal):
        if page is TICK:
            continue
        seen.append(page)
        if recording_shown(page) or len(seen) > 30:
            release.set()
        if len(seen) >= 4 and "Finished" in text(page.stats):
            break
    assert "You are number 1 in line: about 10 s until your race starts." in text(seen[0].stats)
    assert "a recording measured earlier, not your race" in text(seen[0].stats)
    recorded = [p for p in seen if recording_shown(p)]
    assert recorded, [text(p.stats)[:80] for p in seen]
    assert "Finished" in text(seen[-1].stats)
    for _ in busy:
        pass
