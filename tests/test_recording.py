"""Recordings: a finished run saved as JSON reads back into a `Run` that renders exactly as the live
one did (one rendering path), plays back in the race's order, and bad files get one clear message."""

import json

import pytest
from tiny_pair import PROMPT

from specviz.errors import SpecvizError
from specviz.models.pairs import CROSS_TOKENIZER_NOTE
from specviz.runs import execute
from specviz.runs import recording as rec
from specviz.settings import RunSettings
from specviz.views.run_view import RunRenderer


def live_run(tiny, **changes):
    settings = RunSettings(**{**dict(target="tiny", draft="ngram", k=4, max_new_tokens=32, chat=False, fixed_k=True),
                               **changes})
    return execute(settings, PROMPT, tiny.loader(settings), baseline=True)


def final_view(run, state="Finished."):
    view = RunRenderer().view(run, state, final=True)
    return view._replace(**{name: getattr(view, name).to_json() for name in ("acceptance", "per_pass", "race",
                                                                           "positions")})


@pytest.mark.parametrize("changes", [{}, dict(draft="small", temperature=0.8, seed=3), dict(draft="ngram-tree"),
                                     dict(draft="small", branch=3, tree_budget=12),
                                     dict(draft="small", branch=3, tree_budget=12, temperature=0.9, seed=2),
                                     dict(draft="suffix"), dict(draft="other-tokenizer"),
                                     dict(draft="other-tokenizer", temperature=0.8, seed=1)])
def test_a_replay_renders_what_the_live_run_showed(tiny, tmp_path, changes):
    run = live_run(tiny, **changes)
    path = rec.save(tmp_path / "run.json", [run])
    loaded = rec.load(path)
    assert loaded.kind == "run" and len(loaded.runs) == 1
    replayed = loaded.runs[0]
    assert final_view(replayed) == final_view(run)       # tokens, baseline, every chart, the summary
    assert replayed.summary() == run.summary()
    assert "".join(replayed.emitted_texts()) == "".join(run.emitted_texts())
    # Played back event by event, it ends where the recording does, through the race's order.
    *_, (_, played) = rec.replay(replayed)
    assert final_view(played) == final_view(run)
    record = json.loads(path.read_text())
    assert record["format"] == "specviz-recording" and record["version"] == rec.VERSION
    assert {"torch", "transformers", "specviz", "device_name"} <= set(record["environment"])
    assert record["runs"][0]["text"] == run.text
    # Drafted across tokenizers: each cycle's own draft tokens and cut text come back as recorded.
    assert replayed.cycles == run.cycles
    assert any(c.is_cross_tokenizer for c in replayed.cycles) == (changes.get("draft") == "other-tokenizer")


def test_a_recording_keeps_the_runs_note(tiny):
    run = live_run(tiny, draft="other-tokenizer")
    run.note = CROSS_TOKENIZER_NOTE           # as runs.run sets it from the loaded pair
    record = rec.recording([run])
    assert record["runs"][0]["note"] == CROSS_TOKENIZER_NOTE
    assert rec.loads(rec.dumps(record)).runs[0].note == CROSS_TOKENIZER_NOTE
    record["runs"][0]["note"] = "x" * 5000
    with pytest.raises(SpecvizError, match="run 1 is damaged or incomplete .its note is longer than 1,000"):
        rec.loads(rec.dumps(record), "noted.json")


def test_a_recording_keeps_the_sampling_rule_and_an_older_one_reads_as_classic(tiny):
    run = live_run(tiny, draft="small", temperature=0.8, seed=3)
    record = rec.recording([run])
    assert record["runs"][0]["settings"]["sampling"] == "invariant" and run.identical
    assert rec.loads(rec.dumps(record)).runs[0].settings.sampling == "invariant"
    del record["runs"][0]["settings"]["sampling"]        # made before drafter-invariant sampling
    older = rec.loads(rec.dumps(record)).runs[0]
    assert older.settings.sampling == "classic" and older.identical is not None


def test_replay_follows_each_methods_clock(tiny):
    run = live_run(tiny)
    events = rec.timeline(run)
    assert len(events) == len(run.cycles) + len(run.steps)
    spec_times = [t for t, e in events if hasattr(e, "drafted")]
    assert spec_times == sorted(spec_times)
    assert spec_times[-1] == pytest.approx(sum(c.seconds for c in run.cycles))
    partial = rec.up_to_cycle(run, 2)
    assert len(partial.cycles) == 2 and partial.cycles == run.cycles[:2]
    assert not partial.spec_done
    assert len(rec.up_to_cycle(run, len(run.cycles)).cycles) == len(run.cycles)


def test_a_recording_keeps_the_races_elapsed_wall_time_and_its_replay_says_it_at_the_end(tiny):
    run = live_run(tiny)
    assert run.elapsed_wall_seconds > 0
    record = rec.recording([run])
    assert record["runs"][0]["summary"]["elapsed_wall_seconds"] == run.elapsed_wall_seconds
    loaded = rec.loads(rec.dumps(record)).runs[0]
    assert loaded.elapsed_wall_seconds == run.elapsed_wall_seconds
    assert rec.up_to_cycle(loaded, 2).elapsed_wall_seconds is None     # the whole race's time, said once played
    *_, (_, played) = rec.replay(loaded)
    assert played.elapsed_wall_seconds == run.elapsed_wall_seconds
    del record["runs"][0]["summary"]["elapsed_wall_seconds"]             # a file from before it was recorded
    assert rec.loads(rec.dumps(record)).runs[0].elapsed_wall_seconds is None
    record["runs"][0]["summary"]["elapsed_wall_seconds"] = -1
    with pytest.raises(SpecvizError, match="elapsed wall time"):
        rec.loads(rec.dumps(record))
    del record["runs"][0]["summary"]["elapsed_wall_seconds"]
    for name, what in (("calibration_seconds", "calibration time"), ("first_token_wall_seconds", "first token")):
        kept = record["runs"][0]["summary"][name]
        record["runs"][0]["summary"][name] = float("nan")              # read by the same rule as the elapsed time
        with pytest.raises(SpecvizError, match=what):
            rec.loads(rec.dumps(record))
        record["runs"][0]["summary"][name] = kept


def test_a_comparison_records_every_configuration(tiny, tmp_path):
    runs = [live_run(tiny), live_run(tiny, draft="self:1")]
    loaded = rec.load(rec.save(tmp_path / "c.json", runs, ["lookup", "early exit"], kind="compare"))
    assert loaded.labels == ["lookup", "early exit"] and loaded.kind == "compare"
    assert [r.summary() for r in loaded.runs] == [r.summary() for r in runs]


def damaged(record, change):
    record = json.loads(json.dumps(record))
    change(record)
    return json.dumps(record)


def test_bad_files_get_one_clear_message(tiny, tmp_path):
    good = rec.recording([live_run(tiny)])
    cases = {
        "not valid JSON": '{"format": "specviz-recording", "version": 1, "runs": [',
        "not a specviz recording": json.dumps({"hello": "world"}),
        "newer specviz": damaged(good, lambda r: r.update(version=rec.VERSION + 1)),
        "holds no runs": damaged(good, lambda r: r.update(runs=[])),
        "run 1 is damaged": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(num_accepted="lots")),
        "do not match": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(emitted=[1, 2, 3, 4, 5, 6, 7])),
        "counts do not add up": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(num_accepted=99)),
        "incomplete": damaged(good, lambda r: r["runs"][0].pop("steps")),
        "more than 512 drafted": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(k=10**12)),
        "not finite": damaged(good, lambda r: r["runs"][0]["steps"][0].update(seconds=float("inf"))),
        "negative": damaged(good, lambda r: r["runs"][0]["cycles"][1].update(verify_seconds=-1.0)),
        # Found by a hostile second reading: each reached a view or a chart before.
        "nested too deeply": "[" * 100_000 + "]" * 100_000,
        "no known kind": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(correction_kind="foo")),
        "a chain with a tree": damaged(good,
                                       lambda r: r["runs"][0]["cycles"][0].update(node_verdicts=["accepted"] * 9)),
        "parameters": damaged(good, lambda r: r["runs"][0]["target"].update(parameters=float("inf"))),
        "another cycle's index": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(index=10**400)),
        "must be a whole number": damaged(good, lambda r: r["runs"][0]["settings"].update(k=-3)),
        "valid integer": damaged(good, lambda r: r["runs"][0]["cycles"][0].update(num_accepted=False)),
        "no valid format version": damaged(good, lambda r: r.update(version=True)),
        "along the speculative text has another step's index": damaged(good, lambda r: r["runs"][0].update(
            followed={"start": 3, "steps": [{"index": 5, "token": 1, "prob": 0.5, "seconds": 0.01}],
                      "near_ties": [], "stopped_at": None})),
    }
    for expected, text in cases.items():
        with pytest.raises(SpecvizError, match=expected):
            rec.loads(text, "x.json")
    with pytest.raises(SpecvizError, match="up to 16 MB"):
        rec.loads(b" " * (rec.MAX_BYTES + 1))
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecvizError, match="not valid JSON"):
        rec.load(tmp_path / "bin.json")
    with pytest.raises(SpecvizError, match="Cannot read"):
        rec.load(tmp_path / "absent.json")


def test_token_texts_are_escaped_when_shown(tiny):
    text = '<script>alert("x")</script>'
    record = rec.recording([live_run(tiny)])
    record["runs"][0]["cycles"][0]["drafted_text"][0] = text
    run = rec.loads(json.dumps(record)).runs[0]
    view = RunRenderer().view(run, "Recorded.", final=True)
    assert "<script>" not in view.tokens and "&lt;script&gt;" in view.tokens
