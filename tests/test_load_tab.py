"""The Load tab: its views (figures and the decision from a hand-made LoadResult), its work on the tiny
in-process pair (streamed rows, growing charts, Stop, refusals) and its hosted caps."""

import math
import time
from dataclasses import replace

import gradio as gr
import plotly.graph_objects as go
import pytest
from conftest import counting_forwards

from specviz.runs.load_result import LoadPoint, LoadResult
from specviz.settings import LOCAL, hosted
from specviz.ui import load_tab
from specviz.ui.budget import LOAD_MAX_BATCH, load_work
from specviz.ui.common import DRAFT_MODEL, PROMPT_LOOKUP, PROMPT_LOOKUP_TREE, TICK, StopSignal, presets
from specviz.views import load_view

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request


def point(batch, k, speedup, low=None, high=None, theory=None):
    return LoadPoint(batch=batch, k=k, speedup=speedup, speedup_low=speedup - 0.1 if low is None else low,
                     speedup_high=speedup + 0.1 if high is None else high, tokens_per_pass=2.0 if k else 1.0,
                     spec_tokens_per_s=100.0 * speedup * batch, plain_tokens_per_s=100.0 * batch,
                     spec_latency=0.01 / speedup, plain_latency=0.01,
                     theory=speedup + 0.2 if theory is None else theory,
                     identical=True, alpha=0.5, passes=10, steps=20, padding_share=0.0, regathers=0)


def result(points):
    return LoadResult(settings={}, environment={}, points=points, cost_curve=[])


CROSSING = result([point(1, 0, 1.0), point(1, 2, 1.6), point(1, 4, 1.9),
                   point(2, 0, 1.0), point(2, 2, 1.3), point(2, 4, 1.1),
                   point(4, 0, 1.0), point(4, 2, 0.9), point(4, 4, 0.7)])


def traces(figure: go.Figure, name: str):
    return [t for t in figure.data if t.name == name]


def test_speedup_figure_shows_points_ranges_theory_one_x_and_the_crossover():
    figure = load_view.speedup_figure(CROSSING)
    (k2,) = traces(figure, "k = 2")
    assert list(k2.x) == [1, 2, 4] and list(k2.y) == [1.6, 1.3, 0.9]
    assert list(k2.error_y.array) == pytest.approx([0.1] * 3)          # up to speedup_high
    assert list(k2.error_y.arrayminus) == pytest.approx([0.1] * 3)     # down to speedup_low
    (theory,) = traces(figure, "theory, k = 2")
    assert list(theory.y) == pytest.approx([1.8, 1.5, 1.1]) and theory.line.dash == "dash"
    assert [s.y0 for s in figure.layout.shapes if s.type == "line" and s.y0 == s.y1] == [1.0]   # 1x marked
    texts = [a.text for a in figure.layout.annotations]
    (crossover,) = [a for a in figure.layout.annotations if a.text == "crossover: batch 4"]
    assert crossover.x == pytest.approx(math.log10(4))                # where a log axis puts batch 4
    assert [s.x0 for s in figure.layout.shapes if s.x0 == s.x1] == [4] and any(t.startswith("1\u00d7") for t in texts)
    assert "k = 0" not in [t.name for t in figure.data]               # plain decoding is the 1x line


def test_a_sweep_that_always_pays_annotates_no_crossover():
    figure = load_view.speedup_figure(result([point(1, 2, 1.5), point(2, 2, 1.2)]))
    assert not [a for a in figure.layout.annotations if a.text.startswith("crossover")]


def test_throughput_and_latency_have_both_methods():
    throughput, latency = load_view.throughput_figure(CROSSING), load_view.latency_figure(CROSSING)
    assert list(traces(throughput, "plain")[0].y) == [100.0, 200.0, 400.0]
    assert list(traces(throughput, "speculative, k = 4")[0].y) == pytest.approx([190.0, 220.0, 280.0])
    assert list(traces(latency, "plain")[0].y) == pytest.approx([10.0] * 3)      # milliseconds
    assert list(traces(latency, "speculative, k = 2")[0].y) == pytest.approx([10 / 1.6, 10 / 1.3, 10 / 0.9])


def test_empty_charts_say_run_to_see():
    for figure in load_view.load_figures(None):
        assert figure.layout.annotations[0].text.startswith("Run to see")
        assert not figure.data


def test_the_decision_in_its_three_cases():
    assert load_view.decision(CROSSING) == ("On this machine, with this pair, speculate up to batch 2 (from batch 4 "
                                            "it no longer pays); best k per batch size: batch 1: k 4, batch 2: k 2, "
                                            "batch 4: off.")
    always = load_view.decision(result([point(1, 2, 1.5), point(2, 2, 1.2), point(2, 4, 1.4)]))
    assert always == ("On this machine, with this pair, speculate up to batch 2 (it paid at every batch size "
                      "measured); best k per batch size: batch 1: k 2, batch 2: k 4.")
    never = load_view.decision(result([point(1, 0, 1.0), point(1, 2, 0.8), point(2, 2, 0.6)]))
    assert never.startswith("Speculation does not pay here at any batch size measured (1, 2)")
    assert load_view.decision(None) == "" and load_view.decision(result([])) == ""
    assert load_view.decision(result([point(1, 0, 1.0)])).startswith("Only plain decoding (k = 0) was measured")
    assert "add a draft length" in load_view.speedup_figure(result([point(1, 0, 1.0)])).layout.annotations[0].text


# ----------------------------------------------------------------------------- the work, on the tiny pair

def views(work, *args):
    return [view for view in work(*args) if view is not TICK]


def test_the_outputs_note_says_what_identical_compared():
    # `identical` compares the batched speculative output with the same batch decoded plainly: the
    # note says so, and that in bf16 this is not "each prompt decoded alone".
    bf16 = replace(CROSSING, settings={"dtype": "bfloat16"})
    note = load_view.outputs_note(bf16)
    assert note == ("Greedy outputs, each request's batched speculative output against its batched plain output of "
                    "the same batch (not against the prompt decoded alone): the same for every request at every "
                    "point. In bfloat16 a batch's arithmetic can flip a near-tie, so this does not show that each "
                    "request matches its prompt decoded alone; that needs float32.")
    fp32 = replace(CROSSING, settings={"dtype": "float32"},
                   points=[replace(p, identical=p.k != 4 or p.batch != 2) for p in CROSSING.points])
    assert load_view.outputs_note(fp32).endswith("(not against the prompt decoded alone): different at 1 of 6 "
                                                 "points (batch 2, k = 4).")
    sampled = replace(CROSSING, points=[replace(p, identical=None) for p in CROSSING.points])
    assert load_view.outputs_note(sampled) == load_view.outputs_note(result([point(1, 0, 1.0)])) == ""


def test_the_sweep_streams_rows_then_grows_charts_and_decides(tiny):
    work = load_tab.load_work_fn(LOCAL, tiny.loader)
    shown = views(work, PROMPT_LOOKUP, "", 8, "1,2", "0,2", "repeated", 16)
    assert "Finished." in shown[-1].status
    with_rows = [v for v in shown if isinstance(v.rows, str)]
    assert with_rows and all("sv-load-rows" in v.rows for v in with_rows)
    assert any('data-verdict="' in v.rows for v in with_rows)            # tokens in their verdict colours
    assert max(v.rows.count('class="sv-panel ') for v in with_rows) == 2  # one view per request of batch 2
    grown = [v for v in shown if isinstance(v.speedup, go.Figure)]
    assert [sum(len(t.x) for t in traces(v.speedup, "k = 2")) for v in grown][-1] == 2
    # A finished point (k = 0 too) leaves the batch's speculative rows on the page, not empty panels.
    assert all('data-verdict="' in v.rows for v in grown if isinstance(v.rows, str))
    assert "speculate" in shown[-1].decision.lower() or "does not pay" in shown[-1].decision
    assert shown[-1].decision.endswith("\n\nGreedy outputs, each request's batched speculative output against its "
                                       "batched plain output of the same batch (not against the prompt decoded "
                                       "alone): the same for every request at every point.")


def test_stop_ends_the_sweep_within_one_forward_and_keeps_the_points(tiny):
    stop = StopSignal()
    work = load_tab.load_work_fn(LOCAL, tiny.loader)(PROMPT_LOOKUP, "", 8, "1,2,4", "2", "repeated", 16, stop=stop)
    with counting_forwards(tiny.target) as forwards:
        for view in work:
            if view is not TICK and isinstance(view.speedup, go.Figure):   # the first point is measured
                stop.request()
                break
        at_stop = len(forwards)
        after = [v for v in work if v is not TICK]
        at_end = len(forwards)
        time.sleep(0.2)
    assert at_end - at_stop <= 1 and len(forwards) == at_end, (at_stop, at_end, len(forwards))
    assert len(after) == 1 and "Stopped after 1 point." in after[0].status
    assert "up to batch" in after[0].decision or "does not pay" in after[0].decision


@pytest.mark.parametrize("drafter, batches, ks, message", [
    (PROMPT_LOOKUP_TREE, "1,2", "2", "trees and suffix decoding run one request at a time"),
    (PROMPT_LOOKUP, "1,two", "2", "Batch sizes takes whole numbers"),
    (PROMPT_LOOKUP, "1", "0,99", "outside 0..64"),
    (DRAFT_MODEL, "1", "2", "Type a draft model id"),
])
def test_bad_choices_are_refused_before_loading(tiny, drafter, batches, ks, message):
    calls = len(tiny.calls)
    (view,) = views(load_tab.load_work_fn(LOCAL, tiny.loader), drafter, "", 8, batches, ks, "repeated", 16)
    assert message in view.status and len(tiny.calls) == calls


# ----------------------------------------------------------------------------- hosted

HOSTED = hosted(presets())


@pytest.mark.parametrize("batches, ks, new_tokens, message", [
    ("1,8", "2", 16, f"batch sizes up to {LOAD_MAX_BATCH}"),
    ("1", "2,12", 16, "k up to 8"),
    ("1", "2", 96, "at most 64 new tokens"),
])
def test_hosted_caps_are_checked_before_anything_loads(tiny, batches, ks, new_tokens, message):
    calls = len(tiny.calls)
    (view,) = views(load_tab.load_work_fn(HOSTED, tiny.loader), PROMPT_LOOKUP, "", 8, batches, ks, "repeated",
                    new_tokens)
    assert message in view.status and len(tiny.calls) == calls


def test_hosted_total_work_is_counted_before_any_decoding(tiny):
    small_budget = replace(HOSTED, max_work_tokens=500)
    shown = views(load_tab.load_work_fn(small_budget, tiny.loader), PROMPT_LOOKUP, "", 8, "1,2,4", "0,2,4",
                  "repeated", 32)
    assert "tokens of work" in shown[-1].status and "this hosted demo allows 500" in shown[-1].status
    assert not [v for v in shown if isinstance(v.rows, str) or isinstance(v.speedup, go.Figure)]   # nothing decoded


def test_load_work_counts_every_speculative_and_plain_decode():
    # Batches 1 and 2 over prompts of 10 and 20 tokens, k 0, 2, 4: two drafting k, each with its own plain run.
    work = load_work([10, 20], [1, 2], [0, 2, 4], new_tokens=8)
    assert (work.speculative, work.plain) == (6, 6)
    assert work.prompt_tokens == 10 * 4 + 30 * 4
    assert work.total == 160 + 12 * 8
    only_plain = load_work([10], [1, 2], [0], new_tokens=8)
    assert (only_plain.speculative, only_plain.plain, only_plain.prompt_tokens) == (0, 3, 30)


def test_the_tab_joins_the_gpu_queue_and_its_stop_sets_the_runs_signal(tiny):
    with gr.Blocks() as blocks:
        tab = load_tab.build_load_tab(limits=LOCAL, loader=tiny.loader)
    fn = {f.api_name: f for f in blocks.fns.values()}["load"]
    assert fn.concurrency_id == "gpu" and fn.concurrency_limit == 1 and fn.trigger_mode == "once"
    (stop,) = [f for f in blocks.fns.values() if (tab.stop._id, "click") in f.targets]
    assert stop.fn.__qualname__ == "StopSignal.request" and not stop.queue
    assert stop.inputs[0]._id == fn.inputs[-1]._id


# ----------------------------------------------------------------------------- all three engines

def engine_point(batch, k, tpot_ratio, plain_tpot_ms, acceptance_length=2.0, throughput_ratio=None):
    """A point whose decode-only TPOT ratio and whose (other-basis) throughput ratio differ: the table
    must show the first."""
    ratio = throughput_ratio if throughput_ratio is not None else tpot_ratio * 0.7
    return replace(point(batch, k, ratio), plain_latency=plain_tpot_ms / 1000,
                   spec_latency=plain_tpot_ms / 1000 / tpot_ratio, tpot_ratio=tpot_ratio,
                   tpot_low=tpot_ratio - 0.05, tpot_high=tpot_ratio + 0.05,
                   mean_acceptance_length=acceptance_length if k else 1.0, draft_acceptance_rate=0.4 if k else 0.0,
                   tokens_per_pass=1.9 if k else 1.0, alpha=0.8 if k else 0.0)


def test_three_engines_side_by_side_show_one_basis_for_every_engine_and_a_failure():
    from specviz.views.engines_side_by_side import (BASIS, EngineRun, acceptance_length_figure, lesson,
                                                    side_by_side_html, side_by_side_records,
                                                    speedup_by_engine_figure, step_cost_figure)

    own = LoadResult(settings={"dtype": "bfloat16", "clock": "thread CPU time"}, environment={},
                     points=[engine_point(1, 0, 1.0, 125.0), engine_point(1, 4, 1.66, 125.0, 2.9),
                             engine_point(2, 4, 1.2, 130.0, 2.8)])
    llama = LoadResult(settings={"engine": "llamacpp", "decision_metric_text": "output throughput (tokens/s) x",
                                 "clock": "wall time at the client", "dtype": "auto"}, environment={},
                       points=[engine_point(1, 0, 1.0, 8.0), engine_point(1, 4, 1.04, 8.0, 2.7),
                               engine_point(2, 4, 0.9, 10.0, 2.6)])
    runs = [EngineRun("specviz's loop", own), EngineRun("vLLM", error="No Python interpreter at /x"),
            EngineRun("llama.cpp", llama)]
    table = side_by_side_html(runs)
    ratios, *per_clock = table.split("TPOT timed by ")
    assert ratios.count("<tr>") == 1 + 4                   # the header, two speculative points per measured engine
    assert "<b>1.66×</b> (1.61-1.71)" in ratios                        # the TPOT ratio, not throughput's
    assert "TPOT (ms)" not in ratios                                    # no milliseconds of two clocks side by side
    # each clock's absolute TPOT in a table of its own: a plain step in ms is plain TPOT
    assert [part.split(" (")[0] for part in per_clock] == ["thread CPU time", "wall time at the client"]
    assert "<td>125.0</td>" in per_clock[0] and "<td>8.0</td>" not in per_clock[0]
    assert "<td>8.0</td>" in per_clock[1] and "<td>10.0</td>" in per_clock[1] and "<td>125.0</td>" not in per_clock[1]
    assert "<td>40%</td>" in table and "<td>2.90</td>" in table and "80%" not in table and "1.90" not in table
    assert BASIS in table and "No Python interpreter at /x" in table and "GGUF as stored" in table
    assert "thread CPU time" in table and "wall time at the client (other programs" in table
    assert "<th>dtype</th>" in table and "<td>bfloat16</td>" in table      # each engine's own dtype, per row
    records = side_by_side_records(runs)
    assert [r["dtype"] for r in records["rows"]] == ["bfloat16"] * 2 + ["GGUF as stored"] * 2
    assert [r["clock"] for r in records["rows"]] == ["thread CPU time"] * 2 + ["wall time at the client"] * 2
    assert records["basis"] == BASIS and records["timing"]["llama.cpp"]["basis"]["tpot_ratio"] == "decode only"
    assert [(r["engine"], r["batch"], r["tpot_ratio"]) for r in records["rows"]] == [
        ("specviz's loop", 1, 1.66), ("specviz's loop", 2, 1.2), ("llama.cpp", 1, 1.04), ("llama.cpp", 2, 0.9)]
    text = lesson(runs)
    assert text.startswith("Batch 1, k = 4, speedup in decode-only time per token:")
    assert "specviz's loop **1.66×**" in text
    assert "llama.cpp **1.04×**" in text and "vLLM" not in text
    assert text.endswith("A plain step: specviz's loop 125.0 ms (thread CPU time); llama.cpp 8.0 ms (wall time at "
                         "the client); times on different clocks are not compared.")
    assert "the cheaper an engine's plain step" not in text     # the lesson drawn across two clocks is gone
    speedups = speedup_by_engine_figure(runs)
    assert [t.name for t in speedups.data] == ["specviz's loop", "llama.cpp"]
    assert list(speedups.data[0].y) == [1.66, 1.2] and list(speedups.data[0].x) == ["1", "2"]
    steps = step_cost_figure(runs)       # a panel per clock, each on its own axis
    assert list(steps.data[1].y) == [pytest.approx(8.0), pytest.approx(10.0)]
    assert (steps.data[0].yaxis, steps.data[1].yaxis) == ("y", "y2")
    assert steps.layout.yaxis2.title.text == "ms per step (wall time at the client)"
    assert list(acceptance_length_figure(runs).data[0].y) == [2.9, 2.8]
    empty = [EngineRun("vLLM", error="x")]
    assert lesson(empty) == "" and not speedup_by_engine_figure(empty).data


def test_all_three_engines_is_offered_locally_only_with_every_engine_and_refuses_early_exit(monkeypatch):
    from specviz.ui.common import EARLY_EXIT

    assert load_tab.ALL in load_tab.engine_choices(LOCAL)
    monkeypatch.delenv("SPECVIZ_HOSTED_VLLM", raising=False)
    limits = hosted(presets())
    assert load_tab.ALL not in load_tab.engine_choices(limits)
    (view,) = list(load_tab.load_work_fn(limits)(PROMPT_LOOKUP, "", 8, "1", "0,4", "rewrite", 16, load_tab.ALL))
    assert "does not offer all three engines" in view.status
    (view,) = list(load_tab.load_work_fn(LOCAL)(EARLY_EXIT, "", 8, "1", "0,4", "rewrite", 16, load_tab.ALL))
    assert "early exit runs only in specviz" in view.status


def test_all_three_engines_run_in_turn_and_a_failing_engine_leaves_its_reason(tiny, monkeypatch):
    """The tab's own work for each engine in turn: the own loop on the tiny pair, then vLLM and llama.cpp
    as a hosted app that enables neither (their refusals); the last view puts what ran beside the reasons.
    (tests/test_engine_vllm.py runs all three for real.)"""
    from specviz.ui.load_engine import OWN

    monkeypatch.delenv("SPECVIZ_HOSTED_VLLM", raising=False)
    monkeypatch.delenv("SPECVIZ_HOSTED_LLAMACPP", raising=False)
    stop = StopSignal()

    def run_one(choice, outcome, dtype):
        limits = LOCAL if choice == OWN else hosted(presets())
        return load_tab.load_work_fn(limits, tiny.loader)(PROMPT_LOOKUP, "", 8, "1", "0,2", "repeated", 8, choice,
                                                          stop, outcome, dtype)

    shown = [v for v in load_tab.all_engines_work(run_one, PROMPT_LOOKUP, LOCAL, stop) if v is not TICK]
    steps = [next((n for n in (1, 2, 3) if f"Engine {n} of 3" in v.status), None) for v in shown[:-1]]
    assert steps == sorted(steps) and set(steps) == {1, 2, 3}          # one engine after the other
    last = shown[-1]
    assert "Finished: three engines" in last.status
    assert "does not run vLLM" in last.rows and "does not run llama.cpp" in last.rows
    # one row in the table of ratios, one in its clock's table of times
    assert last.rows.count("<td>specviz&#x27;s loop</td>") == 2 and "<td>vLLM</td>" not in last.rows
    assert [t.name for t in last.speedup.data] == ["specviz's loop"]
    assert last.decision.startswith("Batch 1, k = 2, speedup in decode-only time per token: specviz's loop **")


def test_vllm_servers_named_by_the_operator_are_used_by_k(monkeypatch):
    from specviz.errors import SpecvizError
    from specviz.ui.load_engine import operator_urls

    monkeypatch.setenv("SPECVIZ_VLLM_URLS", "0=http://127.0.0.1:8000, 4=http://127.0.0.1:8001")
    assert operator_urls() == {0: "http://127.0.0.1:8000", 4: "http://127.0.0.1:8001"}
    monkeypatch.setenv("SPECVIZ_VLLM_URLS", "4:http://x")
    with pytest.raises(SpecvizError, match="SPECVIZ_VLLM_URLS '4:http://x': write K=URL"):
        operator_urls()
