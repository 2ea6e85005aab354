"""The load sweep (runs.load) and its command line (`python -m specviz load`), on the tiny pair."""

import importlib
import json
import sys
import time

import pytest
import torch
from conftest import counting_forwards, make_llama

from specviz.catalog import BenchPrompt
from specviz.cli import entry
from specviz.errors import SpecvizError
from specviz.models import ModelPair
from specviz.runs.bench import plain_against_generate
from specviz.runs.calibration import CALIBRATION_SAMPLES, calibrate, cost_at
from specviz.runs.load import run_sweep, sweep
from specviz.runs.load_result import LoadPoint, LoadResult
from specviz.settings import LOCAL, DraftSpec, RunSettings, parse_draft, validate

PROMPTS = [BenchPrompt("a", "test", "the cat sat on the mat and the cat sat on the"),
           BenchPrompt("b", "test", "the dog ran"),
           BenchPrompt("c", "test", "a big red sun over the sea and a big red sun over")]


def settings(**values) -> RunSettings:
    return validate(RunSettings(**dict({"max_new_tokens": 12, "chat": False}, **values)), LOCAL)


def test_sweep_points_cover_every_batch_and_k(tiny):
    pair = tiny.pair(draft="small")
    result = run_sweep(settings(draft="small"), PROMPTS, pair, batches=(1, 2, 4), ks=(0, 1, 3))
    assert [(p.batch, p.k) for p in result.points] == [(b, k) for b in (1, 2, 4) for k in (0, 1, 3)]
    for point in result.points:
        assert len(point.rows) == point.batch            # batch 4 cycles the 3 prompts
        assert point.identical is True                   # greedy: every row equal in both methods
        assert all(row["tokens"] == row["plain_tokens"] for row in point.rows)
        if point.k == 0:
            assert point.speedup == 1.0 and point.tokens_per_pass == 1.0
        else:
            assert point.speedup_low <= point.speedup <= point.speedup_high
            assert 1.0 <= point.tokens_per_pass <= point.k + 1 and point.theory > 0
    assert result.cost_curve[0]["cost"] == pytest.approx(result.cost_curve[0]["tokens"])   # the unit is the smallest
    data = json.loads(json.dumps(result.to_dict()))
    assert set(data) >= {"settings", "environment", "cost_curve", "points", "crossover_batch", "recommended_k"}
    assert set(data["points"][0]) >= {"batch", "k", "speedup", "speedup_low", "speedup_high", "tokens_per_pass",
                                      "spec_tokens_per_s", "plain_tokens_per_s", "theory", "identical", "rows"}
    assert set(data["points"][0]["rows"][0]) >= {"prompt", "text", "plain_text", "tokens", "plain_tokens"}
    assert data["settings"]["timing"]["basis"]["speedup"] == "decode only"
    assert set(data["recommended_k"]) == {"1", "2", "4"}


def test_every_rows_texts_are_greedy_decodings_of_its_prompt_alone(tiny):
    # A reader checks the own loop's rows as the engines' rows: each carries the speculative and the plain
    # text, and both are `target.generate`'s greedy continuation of that prompt decoded alone.
    from conftest import reference
    from specviz.runs.run import encode

    pair = tiny.pair(draft="small")
    run_settings = settings(draft="small")
    result = run_sweep(run_settings, PROMPTS, pair, batches=(1, 4), ks=(0, 2), warm_up=False)
    expected = {p.prompt: pair.tokenizer.decode(reference(pair.target, encode(run_settings, p.prompt, pair), n=12),
                                                skip_special_tokens=True) for p in PROMPTS}
    assert len(set(expected.values())) == len(PROMPTS) and all(expected.values())     # three texts to tell apart
    for point in result.points:
        assert len(point.rows) == point.batch
        for row in point.rows:
            assert row["text"] == row["plain_text"] == expected[row["prompt"]], (point.batch, point.k, row)


def test_sweep_streams_events_and_stops_when_the_consumer_does(tiny):
    pair = tiny.pair(draft="ngram")
    progress = sweep(settings(draft="ngram"), PROMPTS, pair, batches=(2, 4), ks=(2,))
    with counting_forwards(pair.target) as forwards:
        first = next(p for p in progress if p.event is not None)      # after the warm-up's forwards
        at_close = len(forwards)
        progress.close()                                  # a Stop: no further work, no error
        time.sleep(0.2)
        assert len(forwards) == at_close > 0               # no forward after close, here or in the background
    assert first.event is not None and first.point is None and first.batch == 2
    assert first.result.points == []
    with pytest.raises(StopIteration):
        next(progress)


def test_a_drafter_that_cannot_batch_is_refused_before_any_work(tiny):
    pair = tiny.pair(draft="ngram-tree")
    with pytest.raises(SpecvizError, match="one request at a time"):
        next(sweep(settings(draft="ngram-tree"), PROMPTS, pair, batches=(1,), ks=(2,)))
    # A draft model with another tokenizer passes the spec check (it is a model) and is refused,
    # saying why, once its pair has loaded.
    pair = tiny.pair(draft="other-tokenizer")
    with pytest.raises(SpecvizError, match=r"other-tokenizer \(its tokenizer differs.*across tokenizers runs one"):
        next(sweep(settings(draft="other-tokenizer"), PROMPTS, pair, batches=(1,), ks=(2,)))


def point(batch, k, speedup, low=None, high=None) -> LoadPoint:
    return LoadPoint(batch=batch, k=k, speedup=speedup, speedup_low=low or speedup, speedup_high=high or speedup,
                     tokens_per_pass=1.0, spec_tokens_per_s=1.0, plain_tokens_per_s=1.0, spec_latency=1.0,
                     plain_latency=1.0, theory=1.0, identical=True, alpha=0.5, passes=10, steps=10,
                     padding_share=0.0, regathers=0)


def test_crossover_and_best_k_per_batch():
    result = LoadResult(settings={}, environment={}, points=[
        point(1, 0, 1.0), point(1, 2, 1.8), point(1, 4, 2.1),
        point(4, 0, 1.0), point(4, 2, 1.2, 0.95, 1.4), point(4, 4, 1.1),
        point(16, 0, 1.0), point(16, 2, 0.8), point(16, 4, 0.6)])
    assert result.recommended_k == {1: 4, 4: 2, 16: 0}
    assert result.crossover_batch == 16
    assert result.crossover_range == (4, 16)              # batch 4's best range reaches below 1x
    wins = LoadResult(settings={}, environment={}, points=[point(1, 2, 1.5), point(2, 2, 1.2)])
    assert wins.crossover_batch is None and wins.to_dict()["crossover_batch"] is None


def test_cost_at_interpolates_and_extends_its_ends():
    curve = [{"tokens": 1, "cost": 1.0}, {"tokens": 4, "cost": 2.0}, {"tokens": 8, "cost": 4.0}]
    assert cost_at(curve, 6) == pytest.approx(3.0)
    assert cost_at(curve, 16) == pytest.approx(8.0)      # beyond the last point: its segment extended


def forward_shapes(model, into: list):
    """Record (rows, new tokens, key slots) of each forward of `model`; returns the hook's handle."""
    def record(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        into.append((ids.shape[0], ids.shape[1], kwargs["attention_mask"].shape[-1]))
    return model.register_forward_pre_hook(record, with_kwargs=True)


@pytest.mark.parametrize("draft", ["small", "ngram"])
def test_calibration_times_the_shapes_the_sweep_runs(tiny, draft):
    pair = tiny.pair(draft=draft)
    ids = [[2, 4, 6, 7], [3, 5, 6]]                          # two rows, left-padded to 4 slots
    target_shapes, draft_shapes = [], []
    handles = [forward_shapes(pair.target, target_shapes)]
    if draft == "small":
        handles.append(forward_shapes(pair.draft.model, draft_shapes))
    try:
        calibration = calibrate(pair, ids, ks=(0, 2, 4), max_new_tokens=10)
    finally:
        for handle in handles:
            handle.remove()
    context = 4 + 10 // 2                                    # the prompts, then half the new tokens
    runs = CALIBRATION_SAMPLES + 1                           # one untimed, then the samples
    # The prefill of the context, then every width the sweep's forwards have (1: a plain step; k + 1:
    # a pass over k drafted tokens), each at that context.
    assert target_shapes == [(2, context, context)] + [(2, n, context + n) for n in (1, 3, 5) for _ in range(runs)]
    assert sorted(calibration.target) == [(2, 1), (2, 3), (2, 5)]
    assert sorted(calibration.draft) == [(2, 2), (2, 4)] and all(s > 0 for s in calibration.draft.values())
    if draft == "small":                                     # k draft steps of one token per row
        assert draft_shapes == [(2, context, context)] + [(2, 1, context + 1)] * runs
        assert calibration.draft[2, 4] == pytest.approx(2 * calibration.draft[2, 2])
    curve = calibration.curve()
    assert [(c["batch"], c["tokens_per_row"], c["tokens"]) for c in curve] == [(2, 1, 2), (2, 3, 6), (2, 5, 10)]
    assert curve[0]["cost"] == pytest.approx(2.0)            # no batch 1: the unit is the step per row
    assert calibration.target_seconds(2, 4) == pytest.approx((calibration.target[2, 3] + calibration.target[2, 5]) / 2)


def test_the_theory_reads_no_time_of_the_sweep(tiny, monkeypatch):
    # Slow down every wide forward of the sweep itself (its verification passes), not the calibration's:
    # the measured speedup falls, the theory (calibrated apart) stays where it was.
    pair = tiny.pair(draft="small")
    calibrating = [False]
    load_sweep = importlib.import_module("specviz.runs.load")   # (specviz.runs.load is also a function's name)
    real_calibrate = getattr(load_sweep, "calibrate", None)

    def flagged(*args, **kwargs):
        calibrating[0] = True
        try:
            return real_calibrate(*args, **kwargs)
        finally:
            calibrating[0] = False

    monkeypatch.setattr(load_sweep, "calibrate", flagged, raising=False)
    slow = [False]

    def busy(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        if slow[0] and not calibrating[0] and ids.shape[1] > 1:
            end = time.perf_counter() + 0.05                 # CPU work, seen by either clock (20 ms left
            # the slowed speedup at 0.52 of the other, not under half, in a loaded CI run here)
            while time.perf_counter() < end:
                pass

    handle = pair.target.register_forward_pre_hook(busy, with_kwargs=True)
    try:
        points = {}
        for slowed in (False, True):
            slow[0] = slowed
            result = run_sweep(settings(draft="small"), PROMPTS, pair, batches=(2,), ks=(3,))
            points[slowed] = next(p for p in result.points if p.k == 3)
    finally:
        handle.remove()
    assert points[True].speedup < 0.5 * points[False].speedup
    assert 0.6 < points[True].theory / points[False].theory < 1.6


# ----------------------------------------------------------------------------- command line

def test_load_command_writes_the_json_shape(tmp_path, capsys):
    out = tmp_path / "load.json"
    code = entry(["load", "--target", "tiny", "--draft", "ngram", "--batch", "1,2", "--k", "0,2",
                  "--max-new-tokens", "8", "--prompts", "examples", "--json", str(out), "--quiet", "--threads", "1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads(out.read_text())
    assert [(p["batch"], p["k"]) for p in data["points"]] == [(1, 0), (1, 2), (2, 0), (2, 2)]
    assert "crossover batch" in printed and "best k per batch size" in printed
    # The identical column says what it compared (the same batch decoded plainly), and k = 0 compares nothing.
    assert ("Greedy outputs, each request's batched speculative output against its batched plain output of the "
            "same batch (not against the prompt decoded alone): ") in printed
    rows = [line.split() for line in printed.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [(row[1], row[-1]) for row in rows] == [("0", "-"), ("2", "yes"), ("0", "-"), ("2", "yes")]


def test_load_command_parses_its_draft_once(monkeypatch, capsys):
    # Every module's parse_draft, wrapped: a call with text is a parse; a DraftSpec (parsed already)
    # comes back unparsed. `validate` parses where the draft enters; nothing downstream parses again.
    parsed = []

    def counting(spec):
        if not isinstance(spec, DraftSpec):
            parsed.append(spec)
        return parse_draft(spec)

    for module in [m for name, m in sys.modules.items() if name.startswith("specviz")]:
        if getattr(module, "parse_draft", None) is parse_draft:
            monkeypatch.setattr(module, "parse_draft", counting)
    code = entry(["load", "--target", "tiny", "--draft", "tiny-draft", "--batch", "1", "--k", "2",
                  "--max-new-tokens", "4", "--prompts", "examples", "--quiet", "--threads", "1"])
    assert code == 0, capsys.readouterr()
    # The draft once, and the target once (validate refuses a draft kind as the target).
    assert parsed == ["tiny-draft", "tiny"]


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0,2"], "--batch: 0 is outside 1..64"),
    (["--k", "two"], "--k takes whole numbers"),
    (["--prompts", "no/such/file.txt"], "no such file"),
    (["--prompts", "nosuchset"], "No prompt set 'nosuchset'"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--draft", "suffix"], "one request at a time"),
    (["--draft", "ngram-tree"], "one request at a time"),
])
def test_bad_load_input_fails_before_loading(monkeypatch, capsys, argv, message):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specviz.cli.load.load", refuse)
    code = entry(["load", "--target", "tiny", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


# ----------------------------------------------------------------------------- the baseline's strength

@pytest.mark.slow
def test_batched_plain_decoding_is_not_a_weak_baseline():
    # A model big enough that the forward, not Python, dominates (as a real model's does), fp32, one
    # thread, four prompts of different lengths, left padding in both.
    target = make_llama(0, layers=4, vocab=4096, hidden=256)
    pair = ModelPair(target=target, tokenizer=None, draft=None, target_name="t", draft_name="-", target_parameters=0,
                     draft_parameters=0, device=target.device, dtype=torch.float32, eos_token_ids=[])
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(1, 4096, (n,), generator=g).tolist() for n in (20, 35, 50, 64)]
    check = plain_against_generate(pair, ids, 48, repeats=9)      # medians of 9: 5 read 0.89 once under CI load
    assert check["ratio"] >= 0.9, check


def test_a_points_speedup_theory_and_latency_equal_hand_computed_values():
    from conftest import make_cycle
    from specviz.core.events import BatchCycle, BatchStep
    from specviz.runs.calibration import Calibration
    from specviz.runs.load import spec_point

    # Batch 2, k = 2, calibrated apart from the runs: a pass over 2 rows x (1 pending + 2 drafted)
    # costs 0.1 s, a plain step over 2 rows 0.06 s, drafting 2 tokens for both rows 0.01 s. The first
    # event of each method is the prefill.
    calibration = Calibration(target={(2, 1): 0.06, (2, 3): 0.1}, draft={(2, 2): 0.01})

    def passed(index, accepted, draft_seconds, verify_seconds, tokens=6):
        return BatchCycle(index=index, requests=[0, 1], cycles=[make_cycle(drafted=[1, 2], num_accepted=n)
                                                            for n in accepted],
                          draft_seconds=draft_seconds, verify_seconds=verify_seconds, tokens=tokens, slots=0,
                          padded_slots=0, regathered=False)

    spec = [passed(0, (2, 2), 0.0, 1.0, tokens=20), passed(1, (2, 1), 0.01, 0.1), passed(2, (0, 2), 0.01, 0.1)]
    plain = [BatchStep(index=i, requests=[0, 1], tokens=[1, 1], probs=[0.5, 0.5], seconds=0.9 if i == 0 else 0.06,
                       slots=0, padded_slots=0) for i in range(7)]
    point = spec_point(2, 2, [spec], [plain], PROMPTS[:2], calibration, greedy=False,
                       decode=lambda ids: " ".join(map(str, ids)))
    # Acceptance over every row's cycles: 9 accepted, 2 rejections.
    assert point.alpha == pytest.approx(9 / 11)
    # Measured, decode only: (3 + 2) + (1 + 3) = 9 tokens in 0.22 s, against 12 plain tokens in 0.36 s.
    assert point.speedup == pytest.approx((9 / 0.22) / (12 / 0.36))               # 27/22
    assert point.tokens_per_pass == pytest.approx(9 / 4)
    # Theory: 4 decode cycles expecting 1 + a + a^2 = 301/121 tokens each, in 2 passes of 0.1 + 0.01 s;
    # plain: 12 tokens in 6 steps of 0.06 s (the sweep's own seconds are not read).
    assert point.theory == pytest.approx((4 * 301 / 121 / 0.22) / (12 / 0.36))    # 1806/1331
    # Latency: row 0 waited 0.22 s for 4 tokens, row 1 0.22 s for 5; plain 0.06 s a token.
    assert point.spec_latency == pytest.approx((0.22 / 4 + 0.22 / 5) / 2)
    assert point.plain_latency == pytest.approx(0.06)
    assert point.identical is None and point.steps == 6 and point.passes == 2
    # The engines' basis: plain TPOT / speculative TPOT, and vLLM's figures over the 6 row cycles that drafted
    # 2 tokens each: 9 of 12 accepted, 1 + 9 / 6 tokens per drafting step.
    assert point.tpot_ratio == pytest.approx(0.06 / ((0.22 / 4 + 0.22 / 5) / 2))
    assert point.tpot_low <= point.tpot_ratio <= point.tpot_high
    assert point.draft_acceptance_rate == pytest.approx(9 / 12)
    assert point.mean_acceptance_length == pytest.approx(1 + 9 / 6)


def test_every_request_writes_the_same_number_of_tokens_unless_asked_to_stop_at_eos(tiny):
    # Equal work: a point's throughputs count the same tokens on both sides, so EOS is ignored (as
    # `vllm bench serve --ignore-eos`); an EOS the tiny model writes early would otherwise end a row.
    from dataclasses import replace

    from specviz.core.plain import autoregressive_decode
    from specviz.runs.run import encode

    pair = tiny.pair(draft="ngram")
    run_settings = settings(draft="ngram")
    written = [s.token for s in autoregressive_decode(pair.target, encode(run_settings, PROMPTS[1].prompt, pair), 12)]
    with_eos = replace(pair, eos_token_ids=[written[2]])          # a token the row writes third
    fixed = run_sweep(run_settings, PROMPTS, with_eos, batches=(2,), ks=(0, 2), warm_up=False)
    assert "EOS ignored" in fixed.settings["output_length"]
    assert all(row["tokens"] == row["plain_tokens"] == 12 for p in fixed.points for row in p.rows)
    ended = run_sweep(run_settings, PROMPTS, with_eos, batches=(2,), ks=(0, 2), warm_up=False, fixed_length=False)
    assert "ending at EOS" in ended.settings["output_length"]
    assert [row["plain_tokens"] for row in ended.points[0].rows][1] <= 3
