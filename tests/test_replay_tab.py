"""The Replay tab: a recording plays back through the Run tab's views at a chosen speed, cycle by
cycle, stops on Stop, and bad or missing files become a message; it needs no model (hosted too)."""

import html
import re
import time

import pytest
from tiny_pair import PROMPT

from specviz.catalog import bundled_recordings
from specviz.runs import execute
from specviz.runs import recording as rec
from specviz.settings import RunSettings
from specviz.ui import build_demo, replay_tab
from specviz.ui.common import TICK, StopSignal
from specviz.views.run_view import RunRenderer, RunView

STATS, POSITION = RunView._fields.index("stats"), len(RunView._fields)   # a replay page: the view, then its cycle

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request


def text(markup):
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from tiny_pair import TinyModels

    settings = RunSettings(fixed_k=True, target="tiny", draft="ngram", k=4, max_new_tokens=48, chat=False)
    run = execute(settings, PROMPT, TinyModels().loader(settings), baseline=True)
    return run, str(rec.save(tmp_path_factory.mktemp("r") / "tiny.json", [run]))


def pages(*args, stop=None):
    return [p for p in replay_tab.replay_work(*args, stop=stop) if p is not TICK]


def test_replay_ends_on_the_live_runs_own_view(recorded):
    run, path = recorded
    shown = pages(None, path, None, "4\u00d7")
    final = shown[-1]
    live = RunRenderer().view(run, "Replayed: the recorded run, as it finished.", final=True)
    assert final[:2] == live[:2] and final[STATS] == live.stats and final[POSITION] == len(run.cycles)
    assert any("Replaying" in text(p[STATS]) for p in shown[:-1])


def test_replay_takes_the_recorded_time_over_the_speed(recorded):
    run, path = recorded
    recorded_seconds = max(t for t, _ in rec.timeline(run))
    start = time.monotonic()
    pages(None, path, None, "2\u00d7")
    assert time.monotonic() - start >= recorded_seconds / 2 * 0.95


def test_slow_motion_takes_four_times_the_recorded_time(recorded):
    run, path = recorded
    recorded_seconds = max(t for t, _ in rec.timeline(run))
    assert list(replay_tab.SPEEDS)[:2] == ["0.25\u00d7 (slow motion)", "0.5\u00d7"]
    start = time.monotonic()
    shown = pages(None, path, None, "0.25\u00d7 (slow motion)")
    assert time.monotonic() - start >= recorded_seconds / 0.25 * 0.95
    assert any("Replaying at 0.25\u00d7" in text(p[STATS]) for p in shown[:-1])


def test_make_animation_offers_the_chosen_run_as_a_gif(recorded):
    from PIL import Image

    from specviz.ui.common import ANIMATION_SIZE, animation_file

    run, path = recorded
    update = animation_file(lambda: replay_tab.chosen_run(None, path, None), 0.5, "replay")
    assert update["interactive"] is True
    image = Image.open(update["value"])
    assert image.format == "GIF" and image.size == ANIMATION_SIZE and image.n_frames >= 3
    failed = animation_file(lambda: replay_tab.chosen_run(None, path + ".missing", None))
    assert failed["value"] is None and failed["interactive"] is False


def test_stop_ends_a_replay_with_a_stopped_view(recorded):
    _, path = recorded
    stop = StopSignal()
    stop.request()
    (only,) = pages(None, path, None, "Recorded speed", stop=stop)
    assert "Stopped." in text(only[STATS])


def test_cycle_by_cycle(recorded):
    run, path = recorded
    first = pages(None, path, None, replay_tab.CYCLE_BY_CYCLE)[-1]
    assert first[POSITION] == 1 and first[0].count('class="sv-cycle"') == 1     # the legend's sample aside
    second = replay_tab.step_view(None, path, None, 1, +1)
    assert second[POSITION] == 2 and "Cycle 2 of" in text(second[STATS])
    back = replay_tab.step_view(None, path, None, 2, -1)
    assert back[POSITION] == 1
    last = replay_tab.step_view(None, path, None, len(run.cycles), +1)
    assert last[POSITION] == len(run.cycles) and "as it finished" in text(last[STATS])


def test_bad_input_is_a_message(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    for args in ((None, str(bad), None, "2\u00d7"), (None, None, None, "2\u00d7")):
        (only,) = pages(*args)
        assert 'role="alert"' in only[STATS] and "Traceback" not in only[STATS]
    assert "not a specviz recording" in text(pages(None, str(bad), None, "2\u00d7")[0][STATS])
    assert "Choose a bundled recording" in text(pages("no-such.json", None, None, "2\u00d7")[0][STATS])


def test_bundled_recordings_open_and_the_tab_is_in_the_hosted_demo():
    files = bundled_recordings()
    assert len(files) >= 3
    for name, path in files.items():
        assert path.stat().st_size < 200_000, name
        opened = rec.load(path)
        assert opened.runs[0].cycles and opened.runs[0].steps, name
    kinds = {(r.settings.draft.split(":")[0], r.settings.temperature > 0)
             for path in files.values() for r in rec.load(path).runs}
    assert {("ngram", False), ("self", False), ("ngram", True), ("auto", False)} <= kinds
    # The hybrid one shows trees that held two drafters' branches (bf16), each node with its writer.
    hybrid = rec.load(files["hybrid-bf16-notice.json"]).runs[0]
    assert any(c.drafted_by and {"head"} < set(c.drafted_by) for c in hybrid.cycles)
    config = build_demo(hosted=True).get_config_file()
    tabs = [c["props"]["label"] for c in config["components"] if c["type"] == "tabitem"]
    assert "Replay" in tabs
    dropdown = next(c for c in config["components"] if c["props"].get("elem_id") == "replay-bundled")
    assert dropdown["props"]["value"] in files


def test_a_file_is_read_once_per_version(recorded, tmp_path):
    import os
    import shutil

    _, path = recorded
    copy = tmp_path / "copy.json"
    shutil.copy(path, copy)
    first = replay_tab.open_recording(None, str(copy))
    assert replay_tab.open_recording(None, str(copy)) is first         # Next / Previous reuse it
    text = copy.read_text().replace('"label":"', '"label":"edited ', 1)
    copy.write_text(text)
    os.utime(copy, ns=(first_ns := os.stat(copy).st_mtime_ns + 1_000_000, first_ns))
    assert replay_tab.open_recording(None, str(copy)).labels[0].startswith("edited ")
