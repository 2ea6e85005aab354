"""Shared races (`runs.shared_race`): a race asked for by many is measured once; whoever joins while it
runs sees every event so far and then the rest; a finished one is replayed, not measured again; the
kept races are bounded; a failure reaches every viewer; one viewer leaving stops nothing for the others."""

import threading

from tiny_pair import PROMPT

from specviz.errors import SpecvizError
from specviz.runs import execute, race
from specviz.runs.shared_race import (FAILED, FINISHED, JOIN, MEASURE, REPLAY, STOPPED, RunMirror, SharedRaces,
                                      race_key)
from specviz.settings import RunSettings

SETTINGS = RunSettings(target="tiny", draft="ngram", k=4, max_new_tokens=32, chat=False, fixed_k=True)


def gated_source(tiny, settings=SETTINGS, prompt=PROMPT, *, hold_after=3):
    """The real race on the tiny pair, held after `hold_after` events until `release` is set; `runs`
    counts how many times it was started."""
    release, held, runs = threading.Event(), threading.Event(), []

    def source(shared):
        runs.append(shared)
        for i, run in enumerate(race(settings, prompt, tiny.loader(settings), baseline=True)):
            if i == hold_after:
                held.set()
                assert release.wait(30)
            yield run

    return source, release, held, runs


def watch_to_the_end(ticket) -> list:
    """What one viewer sees: its mirror after each wait, until the race ends."""
    mirror, seen, views = RunMirror(ticket.race), 0, []
    while True:
        seen = ticket.race.wait_for(seen, timeout=30)
        run = mirror.grow()
        if run is not None:
            views.append((len(run.cycles), len(run.steps)))
        if ticket.race.ended and mirror.seen == len(ticket.race.events):
            return views


def test_a_viewer_who_joins_mid_race_sees_every_event_and_the_same_result(tiny):
    races = SharedRaces(slots=1)
    source, release, held, runs = gated_source(tiny)
    key = race_key(SETTINGS, PROMPT)
    first = races.watch(key, source)
    assert first.kind == MEASURE and held.wait(30)
    second = races.watch(key, source)                       # mid-race: the events so far are there
    assert second.kind == JOIN and second.race is first.race and len(second.race.events) == 3
    release.set()
    watch_to_the_end(second)
    assert first.race.wait_until_ended(30) and first.race.state == FINISHED
    joined = RunMirror(second.race).grow()
    alone = execute(SETTINGS, PROMPT, tiny.loader(SETTINGS), baseline=True)
    assert joined.tokens == first.race.result.tokens == alone.tokens          # greedy: the same text
    assert [c.drafted for c in joined.cycles] == [c.drafted for c in first.race.result.cycles]
    assert len(joined.steps) == len(first.race.result.steps) and joined.speedup == first.race.result.speedup
    assert len(runs) == 1 and first.race.shown_to == 2


def test_a_finished_race_is_replayed_within_its_time_and_measured_again_when_asked(tiny):
    now = [1000.0]
    races = SharedRaces(slots=1, keep_seconds=600, clock=lambda: now[0])
    source, release, _, runs = gated_source(tiny)
    release.set()
    key = race_key(SETTINGS, PROMPT)
    with races.watch(key, source) as first:
        assert first.race.wait_until_ended(60) and first.race.state == FINISHED
    now[0] += 300
    with races.watch(key, source) as again:
        assert again.kind == REPLAY and again.race is first.race and again.race.shown_to == 2
        assert again.race.result.done
    with races.watch(key, source, fresh=True) as fresh:      # "measure it again"
        assert fresh.kind == MEASURE and fresh.race is not first.race
        assert fresh.race.wait_until_ended(60)
    now[0] += 601
    with races.watch(key, source) as expired:                # the fresh one expired too
        assert expired.kind == MEASURE
        expired.race.wait_until_ended(60)
    assert len(runs) == 3


def test_another_prompt_or_setting_is_another_race():
    assert race_key(SETTINGS, PROMPT) != race_key(SETTINGS, PROMPT + " x")
    assert race_key(SETTINGS, PROMPT) != race_key(SETTINGS.__class__(**{**SETTINGS.to_dict(), "k": 5}), PROMPT)
    assert race_key(SETTINGS, PROMPT) != race_key(SETTINGS, PROMPT, "cuda:0")
    assert race_key(SETTINGS, PROMPT, viewer="a") != race_key(SETTINGS, PROMPT, viewer="b")


def test_the_kept_races_are_bounded(tiny):
    races = SharedRaces(slots=2, keep=3)
    for max_new_tokens in (8, 9, 10, 11, 12):
        settings = RunSettings(**{**SETTINGS.to_dict(), "max_new_tokens": max_new_tokens})
        source, release, _, _ = gated_source(tiny, settings)
        release.set()
        with races.watch(race_key(settings, PROMPT), source) as ticket:
            ticket.race.wait_until_ended(60)
    kept = races.finished()
    assert [r.result.settings.max_new_tokens for r in kept] == [10, 11, 12]


def test_a_failing_race_fails_every_viewer_with_its_message(tiny):
    races = SharedRaces(slots=1)
    gate = threading.Event()

    def failing(shared):
        shared.say("loading the models")
        assert gate.wait(30)
        raise SpecvizError("This prompt is too long for the hosted demo.")
        yield  # a generator: the race fails before its first event

    key = race_key(SETTINGS, "too long")
    tickets = [races.watch(key, failing) for _ in range(3)]
    assert [t.kind for t in tickets] == [MEASURE, JOIN, JOIN]
    gate.set()
    for ticket in tickets:
        assert ticket.race.wait_until_ended(30) and ticket.race.state == FAILED
        assert str(ticket.race.error) == "This prompt is too long for the hosted demo."
    with races.watch(key, failing) as again:                # a failure is not kept: asking again retries
        assert again.kind == MEASURE
        gate.set()


def test_a_viewer_who_leaves_stops_nothing_for_the_others_and_the_last_one_stops_the_race(tiny):
    races = SharedRaces(slots=1)
    source, release, held, runs = gated_source(tiny)
    key = race_key(SETTINGS, PROMPT)
    first, second = races.watch(key, source), races.watch(key, source)
    assert held.wait(30)
    first.leave()                                           # a Stop, or a closed page
    release.set()
    assert second.race.wait_until_ended(60) and second.race.state == FINISHED
    second.leave()

    source, release, held, runs = gated_source(tiny, prompt=PROMPT + " again")
    alone = races.watch(race_key(SETTINGS, PROMPT + " again"), source)
    assert held.wait(30)
    alone.leave()
    release.set()
    assert alone.race.wait_until_ended(60) and alone.race.state == STOPPED
    assert races.finished() == [second.race]                # a stopped race is no measurement to replay


def test_races_wait_for_a_slot_in_order_and_say_their_place(tiny):
    races = SharedRaces(slots=1)
    source, release, held, _ = gated_source(tiny)
    first = races.watch(race_key(SETTINGS, PROMPT), source)
    assert held.wait(30) and first.place == 0
    others = []
    for n in range(2):
        prompt = PROMPT + " " + "cat " * (n + 1)
        other_source, other_release, _, _ = gated_source(tiny, prompt=prompt)
        other_release.set()
        others.append(races.watch(race_key(SETTINGS, prompt), other_source))
    assert [t.place for t in others] == [1, 2]
    assert 0 < others[0].estimated_wait < others[1].estimated_wait
    release.set()
    for ticket in (first, *others):
        assert ticket.race.wait_until_ended(60) and ticket.race.state == FINISHED
    assert first.race.finished_at <= others[0].race.started_at
    assert others[0].race.finished_at <= others[1].race.started_at


def test_two_slots_run_two_races_at_once(tiny):
    races = SharedRaces(slots=2)
    started = []
    for n in range(2):
        prompt = PROMPT + " dog" * (n + 1)
        source, release, held, _ = gated_source(tiny, prompt=prompt)
        started.append((races.watch(race_key(SETTINGS, prompt), source), release, held))
    for _, _, held in started:
        assert held.wait(30)                                # both hold mid-race at once
    for ticket, release, _ in started:
        release.set()
        assert ticket.race.wait_until_ended(60)


def test_a_viewer_sees_the_races_calibration_and_its_clocks_not_only_its_events(tiny):
    # The cost-aware policy calibrates before the first event (its status says so) on a target this
    # process has not measured: every viewer's run carries what that cost and when the first token came.
    from specviz.models.tiny import tiny_pair

    settings = RunSettings(target="tiny", draft="tiny", k=3, max_new_tokens=16, chat=False)
    races = SharedRaces(slots=1)
    pair = tiny_pair("tiny")                                # a target of its own: never measured

    def source(shared):
        yield from race(settings, PROMPT, pair, baseline=True)

    ticket = races.watch(race_key(settings, PROMPT), source)
    assert ticket.race.wait_until_ended(60) and ticket.race.state == FINISHED
    seen = RunMirror(ticket.race).grow()
    result = ticket.race.result
    assert result.calibration_seconds > 0 and result.calibrated
    assert seen.calibration_seconds == result.calibration_seconds and seen.calibrated == result.calibrated
    assert seen.first_token_wall_seconds == result.first_token_wall_seconds is not None
    assert seen.elapsed_wall_seconds == result.elapsed_wall_seconds and not seen.status
    assert seen.summary()["calibration_seconds"] == result.summary()["calibration_seconds"]
