"""A race in a forked process of its own (runs.race_worker): the same run as in this process, its cost
tables brought back, stopped when its consumer stops, its errors and its death said here."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
import weakref
from pathlib import Path

import pytest

from specviz.core.drafters import PromptLookupDrafter
from specviz.errors import SpecvizError
from specviz.models.tiny import tiny_pair
from specviz.runs import cost_tables, race_worker
from specviz.runs import run as runs
from specviz.settings import RunSettings, validate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="races fork on Linux only")

UNREAD_SECONDS = 15.0
LONG_RACE_TOKENS = 4000        # a race on the tiny pair that takes far longer than ...
CLOSED_WITHIN_SECONDS = 5.0    # ... what a socket's close or the race's end may take
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


def settings(**changes):
    return validate(RunSettings(**{"target": "tiny", "draft": "tiny", "k": 4, "max_new_tokens": 24,
                                   "chat": False, **changes}))


def test_a_forked_race_is_the_race_run_here_and_its_costs_come_back(monkeypatch):
    pair = tiny_pair("tiny")
    assert race_worker.can_fork(pair)
    monkeypatch.setattr(cost_tables, "_PASS_COSTS", weakref.WeakKeyDictionary())    # nothing measured here yet
    monkeypatch.setattr(cost_tables, "_DRAFT_COSTS", weakref.WeakKeyDictionary())
    seen = [(run, run.status, len(run.cycles) + len(run.steps))
            for run in race_worker.forked_race(settings(), PROMPT, pair, baseline=True)]
    forked = seen[-1][0]
    assert seen[0][1].startswith("Calibrating") and not forked.status
    assert all(run is forked for run, _, _ in seen)       # one run, grown here event by event
    assert [events for _, _, events in seen[1:-1]] == list(range(1, len(seen) - 1))
    # The child measured the policy's tables; this process keeps them, so a race here calibrates nothing.
    assert cost_tables._PASS_COSTS[pair.target] and cost_tables._DRAFT_COSTS[pair.target]
    here = runs.execute(settings(), PROMPT, pair, baseline=True)
    assert here.calibration_seconds == 0 and forked.calibration_seconds > 0
    assert [c.emitted for c in forked.cycles] == [c.emitted for c in here.cycles]
    assert [s.token for s in forked.steps] == [s.token for s in here.steps]
    assert forked.text == here.text and forked.identical and forked.spec_done and forked.plain_done
    assert forked.summary()["speedup"] > 0 and forked.summary()["decided_on"] == here.summary()["decided_on"]


def test_a_consumer_that_stops_reading_ends_the_child():
    pair = tiny_pair("tiny")
    before = {child.pid for child in multiprocessing.active_children()}
    runs_ = race_worker.forked_race(settings(max_new_tokens=64), PROMPT, pair, baseline=True)
    next(runs_)
    started = [child for child in multiprocessing.active_children() if child.pid not in before]
    assert len(started) == 1 and started[0].is_alive()
    runs_.close()
    assert not started[0].is_alive()


def test_an_error_in_the_child_is_raised_here_with_its_message():
    pair = tiny_pair("tiny")
    with pytest.raises(SpecvizError, match="token"):
        list(race_worker.forked_race(settings(), "the cat " * 5000, pair))


def test_a_child_that_dies_is_said_so(monkeypatch):
    def dies(*args, **kwargs):
        os._exit(9)
        yield

    monkeypatch.setattr(race_worker, "race", dies)       # the child is forked from this process: it runs this
    with pytest.raises(SpecvizError, match="ended before the race did"):
        list(race_worker.forked_race(settings(), PROMPT, tiny_pair("tiny")))


def test_races_stay_here_where_they_cannot_fork(monkeypatch):
    pair = tiny_pair("tiny")
    monkeypatch.setenv(race_worker.ENV, "0")
    assert not race_worker.can_fork(pair)


@pytest.mark.slow        # it waits UNREAD_SECONDS on purpose
def test_a_server_slow_to_read_never_stalls_the_race():
    # The child's messages go through a pipe (64 KiB on Linux); a server that reads nothing for a while
    # (its interpreter busy with a class's viewers) must not hold the race up: the child finishes alone.
    import pickle
    import time

    pair = tiny_pair("tiny")
    runs_ = race_worker.forked_race(settings(draft="ngram", max_new_tokens=400), PROMPT * 4,
                                    dataclasses.replace(pair, draft=PromptLookupDrafter(), draft_name="prompt lookup"),
                                    baseline=True)
    next(runs_)
    time.sleep(UNREAD_SECONDS)                      # reading nothing meanwhile
    run = runs.last(runs_)
    assert len(pickle.dumps((run.cycles, run.steps, run.texts, run.step_texts))) > 65536   # more than a pipe holds
    assert run.spec_done and run.plain_done
    # The race's own wall time (~4.5 s here alone): it never waited for the reader (stalled: ~UNREAD + 3 s).
    assert run.elapsed_wall_seconds < UNREAD_SECONDS - 3


def test_a_connection_the_server_closes_closes_though_a_race_runs():
    # The app closes an idle keep-alive connection while a race decodes in its child; the browser must
    # see it close. (A child holding its copy kept it open: the browser sent its next request, a Stop,
    # into it and waited for ever, and the server's port outlived the server.)
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=CLOSED_WITHIN_SECONDS)
    served, _ = listener.accept()
    runs_ = race_worker.forked_race(settings(max_new_tokens=LONG_RACE_TOKENS), PROMPT * 20, tiny_pair("tiny"),
                                    baseline=True)
    try:
        next(runs_)                                    # the child has started and holds what it inherited
        served.close()
        assert client.recv(1) == b""                   # closed, long before the race ends (no timeout)
        address = listener.getsockname()
        listener.close()
        with pytest.raises(ConnectionRefusedError):    # nothing listens on the port any more
            socket.create_connection(address, timeout=CLOSED_WITHIN_SECONDS)
    finally:
        runs_.close()
        client.close()


def test_a_race_ends_with_the_process_that_forked_it(tmp_path):
    # A server stopped by a signal runs no exit handlers (multiprocessing's would end its daemon
    # children): its race must not decode on alone.
    import signal
    import subprocess
    import time

    script = tmp_path / "server.py"
    script.write_text(f"""
import multiprocessing, os, signal, sys
from specviz.models.tiny import tiny_pair
from specviz.runs import cost_tables, race_worker
from specviz.settings import RunSettings, validate
settings = validate(RunSettings(target="tiny", draft="tiny", k=4, max_new_tokens={LONG_RACE_TOKENS}, chat=False))
runs = race_worker.forked_race(settings, {PROMPT!r} * 20, tiny_pair("tiny"), baseline=True)
next(runs)
print(multiprocessing.active_children()[0].pid, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
""")
    output = tmp_path / "server.out"       # a file, not a pipe: the child holds what it inherited until it ends
    with open(output, "w") as out:
        server = subprocess.run([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, timeout=120,
                                env=dict(os.environ, PYTHONPATH=str(Path(race_worker.__file__).parents[2])))
    assert server.returncode == -signal.SIGTERM, output.read_text()[-2000:]
    child = int(output.read_text().split()[0])
    deadline = time.monotonic() + CLOSED_WITHIN_SECONDS
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
