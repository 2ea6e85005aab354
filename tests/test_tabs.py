"""The Compare, Teach and Explain tabs: built inside a small gr.Blocks, their work called directly on
the tiny in-process pair."""

import html
import re
import time
from pathlib import Path

import gradio as gr
import pytest
from conftest import counting_forwards
from tiny_pair import PROMPT

from specviz.errors import SpecvizError
from specviz.runs import Comparison, Sweep, race
from specviz.settings import LOCAL
from specviz.ui import common, compare_tab, explain_tab, teach_tab
from specviz.ui.common import CHAT, DRAFT_MODEL, EARLY_EXIT, RAW, TICK
from specviz.views import explain, teach

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request

ROWS = [[True, "", "ngram", 4, False, 0.0], [True, "", "same", 3, False, 0.0],
        [False, "", "self:2", 2, False, 0.0], [True, "", "small", 2, True, 0.7]]


def views(work, *args):
    return [view for view in work(*args) if view is not TICK and not decoding(view)]


def decoding(view) -> bool:
    """A Teach view shown while it decodes (the tokens so far), not a step."""
    return isinstance(view, teach_tab.TeachView) and str(view.position).startswith(teach_tab.DECODING)


@pytest.fixture(scope="module")
def demo(tiny):
    with gr.Blocks() as blocks:
        last_run = gr.State(None)
        with gr.Tabs():
            with gr.Tab("Compare"):
                compare = compare_tab.build_compare_tab(limits=LOCAL, loader=tiny.loader, last_run=last_run)
            with gr.Tab("Teach"):
                teach_ui = teach_tab.build_teach_tab(limits=LOCAL, loader=tiny.loader, last_run=last_run)
            with gr.Tab("Explain"):
                explain_ui = explain_tab.build_explain_tab(last_run=last_run)
    return blocks, compare, teach_ui, explain_ui, last_run


def functions_of(blocks, component, event="click"):
    return [fn for fn in blocks.fns.values() if (component._id, event) in fn.targets]


def test_model_events_share_the_gpu_queue_and_can_be_stopped(demo):
    blocks, compare, teach_ui, _, _ = demo
    by_name = {fn.api_name: fn for fn in blocks.fns.values()}
    gpu_events = [by_name["compare"], by_name["sweep"], by_name["teach"]]
    for fn in gpu_events:
        assert fn.concurrency_id == common.CONCURRENCY_ID == "gpu" and fn.concurrency_limit == 1
    # Stop is a signal the work reads (its last view then says "Stopped"), in Compare and in Teach;
    # each button click puts its signal in its own state before its work is queued (Compare's Stop
    # sets both of its buttons'). Nothing cancels. A button's work is not started again while it is
    # pending (trigger mode "once"): what lets a second click keep the running work's signal.
    for stop, events in ((compare.stop, gpu_events[:2]), (teach_ui.stop, gpu_events[2:])):
        stop_fns = functions_of(blocks, stop)
        assert len(stop_fns) == len(events)
        assert all(f.fn.__qualname__ == "StopSignal.request" and not f.queue and not f.cancels for f in stop_fns)
        assert {fn.inputs[-1]._id for fn in events} == {f.inputs[0]._id for f in stop_fns}
        assert len({fn.inputs[-1]._id for fn in events}) == len(events)   # one state per button
        assert all(fn.trigger_mode == "once" for fn in events)
    # Stepping is instant and needs no queue slot.
    assert all(not fn.queue for fn in functions_of(blocks, teach_ui.next) + functions_of(blocks, teach_ui.previous))


def test_a_stopped_comparison_keeps_what_finished_and_says_so(tiny):
    signal = common.StopSignal()
    shown = []
    with counting_forwards(tiny.target) as forwards:
        for view in compare_tab.compare_work(LOCAL, tiny.loader)(PROMPT, ROWS, 16, 0, CHAT, stop=signal):
            if view is TICK:
                continue
            shown.append(view)
            if isinstance(view.result, tuple) and len(view.result[0].results) == 1 and not signal.requested:
                signal.request()                      # Stop, once the first configuration has finished
                at_stop = len(forwards)
        at_end = len(forwards)
        time.sleep(0.2)
    # Stop is read between two of the next configuration's events: what it ran is at most its warm-up and
    # first event (its draft is the target itself, so drafting counts too), and nothing runs afterwards.
    second = compare_tab.parse_configs(ROWS[:2], max_new_tokens=16, seed=0, chat=True, limits=LOCAL)[1]
    with counting_forwards(tiny.target) as up_to_first_event:
        next(race(second, PROMPT, tiny.loader(second), baseline=False))
    assert at_end - at_stop <= len(up_to_first_event) and len(forwards) == at_end, (at_stop, at_end, len(forwards))
    last = html.unescape(re.sub(r"<[^>]+>", " ", shown[-1].status))
    assert "Stopped after 1 of 3 configurations" in last
    assert len(shown[-1].result[0].results) == 1


def test_the_explain_tab_listens_to_the_shared_last_run(demo):
    blocks, _, _, explain_ui, last_run = demo
    (fn,) = functions_of(blocks, last_run, "change")
    assert [o._id for o in fn.outputs] == [explain_ui.formulas._id, explain_ui.figure._id, explain_ui.alpha._id,
                                           explain_ui.k._id, explain_ui.c._id]
    writers = [fn for fn in blocks.fns.values() if any(o._id == last_run._id for o in fn.outputs)]
    assert len(writers) == 3    # Compare, Sweep and Teach


def test_compare_streams_then_names_the_winner(tiny):
    found = views(compare_tab.compare_work(LOCAL, tiny.loader), PROMPT, ROWS, 16, 0, CHAT)
    finished = [v for v in found if v.result is not gr.skip() and not isinstance(v.result, dict)]
    assert "Running" in found[0].status and len(finished) == 3      # one full view per configuration
    final = found[-1]
    comparison, sweep = final.result
    assert sweep is None and comparison.labels == ["ngram k=4", "same k=3", "small k=2..4 (dynamic) T=0.7"]
    assert "won" in final.status or "came closest" in final.status
    assert "plain decoding (greedy)" in final.table and "plain decoding (T=0.7)" in final.table
    assert "95% range" in final.table and "theory here" in final.table
    visible = [c.get("visible") for c in final.columns]
    assert visible == [True, True, True, False]
    assert "same k=3" in final.columns[1]["value"] and "data-verdict=" in final.columns[1]["value"]
    first = finished[0]
    assert "running" in first.columns[1]["value"] and "waiting" in first.columns[2]["value"]
    assert [t.name for t in final.tokens_per_pass["value"].data] == comparison.labels
    assert final.tokens_per_pass["visible"]
    assert final.sweep.get("visible") is False
    best = max(comparison.results, key=lambda r: r.speedup)
    assert final.last_run["speedup"] == best.speedup and final.last_run["stats"] == best.stats.to_dict()


def test_sweep_sweeps_the_first_ticked_row(tiny):
    found = views(compare_tab.compare_work(LOCAL, tiny.loader, sweep=True), PROMPT, ROWS, 8, 0, CHAT)
    final = found[-1]
    comparison, sweep = final.result
    assert [r.settings.k for r in comparison.results] == list(range(1, 9))
    assert {r.settings.draft for r in comparison.results} == {"ngram"}
    assert final.sweep["visible"] is True and final.sweep["value"].data[0].name == "measured"
    assert "Best measured k" in final.status and all(c.get("visible") is False for c in final.columns)


@pytest.mark.parametrize("rows, prompt, message", [
    ([[False, "", "ngram", 4, False, 0.0]], PROMPT, "Tick"),
    ([[True, "", "ngram", 100, False, 0.0]], PROMPT,
     "Row 1: k (tokens drafted per cycle) must be a whole number from 1 to 64"),
    ([[True, "", "ngram", "four", False, 0.0]], PROMPT, "whole number"),
    ([[True, "", "ngram", "inf", False, 0.0]], PROMPT, "Row 1: k (tokens drafted per cycle) must be a whole number"),
    ([[True, "", "nope", 4, False, 0.0]], PROMPT, "'nope' does not exist"),
    ([[True, "x/y", "ngram", 4, False, 0.0]], PROMPT, "does not exist"),
    (ROWS, "  ", "The prompt is empty"),
    ([[True, "", "ngram", 4, False, 0.0]] * 5, PROMPT, "at most 4"),
    ("not a table", PROMPT, "not a row"),
])
def test_compare_turns_bad_input_into_a_message(tiny, rows, prompt, message):
    found = views(compare_tab.compare_work(LOCAL, tiny.loader), prompt, rows, 16, 0, CHAT)
    assert 'class="sv-stats sv-error"' in found[-1].status and message in found[-1].status.replace("&#x27;", "'")


def test_parse_configs_reads_strings_from_the_page():
    configs = compare_tab.parse_configs([["true", " ", "self:3", "2", "false", "0.5"],
                                         ["false", "", "ngram", 4, False, 0]],
                                        max_new_tokens=32, seed=None, chat=False, limits=LOCAL)
    assert len(configs) == 1
    config = configs[0]
    assert (config.target, config.draft, config.k, config.dynamic_k, config.temperature, config.chat) == \
        (None, "self:3", 2, False, 0.5, False)


@pytest.mark.parametrize("cell, fixed", [("false", False), ("no", False), ("", False), (None, False),
                                         ("true", True), (True, True), (False, False)])
def test_the_fixed_k_cell_reads_text_as_the_other_ticks_do(cell, fixed):
    row = ["true", "", "ngram", 4, "false", 0, 1, cell]
    (config,) = compare_tab.parse_configs([row], max_new_tokens=16, seed=None, chat=False, limits=LOCAL)
    assert config.fixed_k is fixed


def test_compare_puts_a_chain_and_a_tree_side_by_side(tiny):
    from specviz.runs import config_labels
    from specviz.runs.compare import compare

    chain, tree = compare_tab.parse_configs([[True, "", "self:2", 3, False, 0, 1],
                                             [True, "", "self:2", 3, False, 0, "2"]],
                                            max_new_tokens=24, seed=None, chat=False, limits=LOCAL)
    assert (chain.branch, tree.branch) == (1, 2)
    assert config_labels([chain, tree]) == ["self:2 k=3", "self:2 k=3 tree b=2"]
    comparison = compare([chain, tree], PROMPT, loader=tiny.loader)
    first, second = comparison.results
    assert not any(c.is_tree for c in first.cycles) and any(c.is_tree for c in second.cycles)
    assert first.tokens == second.tokens == first.baseline_tokens         # both lossless, one shared baseline


def test_export_writes_one_folder_and_old_folders_go(tiny, tmp_path, monkeypatch):
    import os
    import tempfile
    import time

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / (common.EXPORT_PREFIX + "old")
    stale.mkdir()
    os.utime(stale, (time.time() - 2 * common.TEMP_FILE_SECONDS,) * 2)
    *_, final = views(compare_tab.compare_work(LOCAL, tiny.loader), PROMPT, ROWS[:2], 8, 0, CHAT)
    paths, note = compare_tab.export_files(final.result)
    names = {Path(p).name for p in paths}
    assert names == {"cycles.jsonl", "cycles.csv", "summary.json", "recording.json", "charts.html"} and note == ""
    assert len({Path(p).parent for p in paths}) == 1 and not stale.exists()
    html = (Path(paths[0]).parent / "charts.html").read_text()
    assert html.count("* plotly.js (") == 1 and html.count('class="plotly-graph-div"') == 3
    with pytest.raises(SpecvizError, match="Nothing to export"):
        compare_tab.export_files(None)
    with pytest.raises(SpecvizError):
        compare_tab.export_files((Comparison("", [], []), Sweep(Comparison("", [], []), [])))


def test_teach_decodes_then_steps(tiny):
    (view,) = views(teach_tab.teach_work(LOCAL, tiny.loader), PROMPT, DRAFT_MODEL, "small", 2, 3, 0.9, 0, 24, RAW)
    run = view.run
    assert isinstance(run, teach.TeachRun) and view.index == 0 and view.position == f"Cycle 1 of {len(run.cycles)}"
    assert "Cycle 1 of" in view.narrative and "<table" in view.table
    assert view.last_run["label"] == "small k=3 T=0.9"
    from specviz.runs import recording
    recorded = recording.load(view.record["value"]).runs[0]      # the decoded run, offered for download
    assert view.record["visible"] and len(recorded.cycles) == len(run.cycles) and recorded.settings.temperature == 0.9
    following = teach_tab.step(run, view.index, +1)
    assert following.index == 1 and following.position.startswith("Cycle 2")
    assert teach_tab.step(run, 0, -1).index == 0                                   # clamped at the start
    assert teach_tab.step(run, len(run.cycles) - 1, +1).index == len(run.cycles) - 1   # and at the end
    assert teach_tab.step(None, 0, +1) is None


def test_teach_yields_once_per_cycle_so_a_stop_lands_within_one(tiny):
    steps = list(teach_tab.teach_work(LOCAL, tiny.loader)(PROMPT, EARLY_EXIT, "", 2, 3, 0.0, 0, 24, CHAT))
    *ticks, view = steps
    assert all(t is TICK or decoding(t) for t in ticks) and len(ticks) >= len(view.run.cycles)


def test_a_stopped_teach_run_keeps_its_cycles_to_step_through(tiny):
    signal = common.StopSignal()
    ticks = 0
    shown = []
    with counting_forwards(tiny.target) as forwards:     # the target's own passes, not the early exit's
        for view in teach_tab.teach_work(LOCAL, tiny.loader)(PROMPT, EARLY_EXIT, "", 2, 2, 0.0, 0, 128, RAW,
                                                             signal):
            if view is TICK or decoding(view):
                ticks += 1
                if ticks == 5:
                    signal.request()          # as the Stop button does, mid-run
                    at_stop = len(forwards)
                continue
            shown.append(view)
        at_end = len(forwards)
        time.sleep(0.2)
    assert at_end - at_stop <= 1 and len(forwards) == at_end, (at_stop, at_end, len(forwards))
    (view,) = shown
    cycles = len(view.run.cycles)
    assert 0 < cycles < 128 and sum(len(c.emitted) for c in view.run.cycles) < 128
    assert view.position.startswith(f"Stopped after {cycles} cycle") and f"Cycle 1 of {cycles}" in view.position
    assert teach_tab.step(view.run, cycles - 1, +1).position == f"Cycle {cycles} of {cycles}"

    signal.request()                        # pressed while the run waited for the queue: nothing loads

    def loader(settings, progress=None):
        raise AssertionError("a stopped run must not load models")
    (view,) = views(teach_tab.teach_work(LOCAL, loader), PROMPT, EARLY_EXIT, "", 2, 2, 0.0, 0, 24, RAW, signal)
    assert view.position == teach_tab.STOPPED and view.run is None   # no earlier run to step through


def test_teach_reports_errors(tiny):
    (view,) = views(teach_tab.teach_work(LOCAL, tiny.loader), "", EARLY_EXIT, "", 2, 3, 0.0, 0, 24, CHAT)
    assert "sv-error" in view.narrative and "empty" in view.narrative


def test_explain_outputs_fill_in_a_runs_numbers(tiny):
    text, figure, *sliders = explain.explain_outputs(None)
    assert "Example numbers" in text and figure.data and sliders == [0.7, 4, 0.05]
    (view,) = views(teach_tab.teach_work(LOCAL, tiny.loader), PROMPT, EARLY_EXIT, "", 2, 3, 0.9, 0, 24, CHAT)
    numbers = dict(view.last_run, speedup=1.5, theory_here=1.2)
    text, figure, alpha, k, c = explain.explain_outputs(numbers)
    assert "the last run (self:2 k=3 T=0.9)" in text and "**1.50\u00d7**" in text and "**1.20\u00d7**" in text
    assert figure.data[-1].name == "measured"
    assert (alpha, k) == (round(numbers["stats"]["alpha"], 2), 3) and 0 <= c <= 1


def test_explain_sliders_refuse_bad_numbers():
    assert explain_tab.on_numbers("x", 4, 0.1) == (gr.skip(), gr.skip())
    text, figure = explain_tab.on_numbers(0.5, 4, 0.1)
    assert "0.50" in text and figure.data


def test_compare_yields_after_every_event_so_a_stop_lands_within_one_cycle(tiny):
    steps = list(compare_tab.compare_work(LOCAL, tiny.loader)(PROMPT, ROWS[:2], 16, 0, CHAT))
    *_, final = [s for s in steps if s is not TICK]
    events = (sum(len(run.cycles) + len(run.steps) for run in final.result[0].results)
              - len(final.result[0].results[1].steps))
    assert len(steps) >= events      # one step (a view or a TICK) per cycle and per plain step at least


def test_compare_keeps_yielding_while_a_model_loads(tiny):
    # A Stop lands between two steps: a long load (a hub download) must not hold it up.
    import time

    def slow_loader(settings, progress=None):
        time.sleep(1.0)
        return tiny.loader(settings, progress)

    steps = compare_tab.compare_work(LOCAL, slow_loader)(PROMPT, ROWS[:1], 8, 0, CHAT)
    started = time.monotonic()
    next(steps), next(steps)          # the "running" view, then a step while the load goes on
    assert time.monotonic() - started < 0.8
    steps.close()


def test_compare_over_a_prompt_set_names_a_winner_with_intervals(tiny, tmp_path):
    from specviz.ui import compare_sets

    upload = tmp_path / "prompts.txt"
    # Five prompts: the winner is named only where the paired interval over the prompts excludes 1, and over
    # three one prompt timed on a busy host (the suite's parallel run) was its whole lower bound.
    upload.write_text("\n".join(PROMPT + " the cat" * i for i in range(5)))
    # Fixed k: the tiny models' passes cost about what a step does, so the policy would pause both.
    rows = [[True, "", "same", 3, False, 0.0, 1, True], [True, "", "random", 3, False, 0.0, 1, True]]
    found = views(compare_tab.compare_work(LOCAL, tiny.loader), "", rows, 12, 0, RAW, compare_sets.FROM_FILE,
                  str(upload), 1)
    final = found[-1]
    comparison, _ = final.result
    assert comparison.done and len(comparison.results) == 10
    assert all(config.fixed_k for config in comparison.configs)
    assert "same k=3 wins" in final.status and "95% interval" in final.status
    assert "median speedup by category" in final.table and final.set_plot["visible"] is True
    assert all(c.get("visible") is False for c in final.columns)
    paths, _ = compare_tab.export_files(final.result)
    assert {Path(p).name for p in paths} == {"rows.csv", "summary.json", "charts.html"}


def test_hosted_prompt_sets_are_presets_within_a_budget(tiny):
    from specviz.settings import hosted
    from specviz.ui import compare_sets

    limits = hosted([])
    assert compare_sets.FROM_FILE not in compare_sets.sources(limits)
    rows = [[True, "", "ngram", 4, False, 0.0]] * 4
    examples = next(s for s in compare_sets.sources(limits) if "examples" in s)
    found = views(compare_tab.compare_work(limits, tiny.loader), "", rows, 256, 0, CHAT, examples, None, 5)
    assert "this hosted demo allows" in found[-1].status
    found = views(compare_tab.compare_work(limits, tiny.loader), "", rows, 16, 0, CHAT, compare_sets.FROM_FILE,
                  "/etc/passwd", 1)
    assert "Unknown prompt set" in found[-1].status


@pytest.mark.parametrize("temperature", [0.0, 0.8])   # 0.8: the tab's default (a sampled tree's table once failed)
def test_teach_steps_through_a_token_tree(tiny, temperature):
    from specviz.ui.common import PROMPT_LOOKUP_TREE

    (view,) = views(teach_tab.teach_work(LOCAL, tiny.loader), PROMPT, PROMPT_LOOKUP_TREE, "", 2, 4, temperature, 0,
                    24, RAW)
    assert "sv-error" not in view.narrative
    trees = [i for i, c in enumerate(view.run.cycles) if c.is_tree and len(c.drafted) > 1]
    for index in trees:
        step = teach_tab.step(view.run, index, 0)
        assert "form a **tree**" in step.narrative and step.verification.layout.title.text.startswith("The token tree")
    # Test by test: from a tree cycle's whole view (a cycle step), Next test starts its tests, node by node.
    index = trees[0]
    first = teach_tab.step_test(view.run, index, None, +1)
    assert (first.index, first.test) == (index, 0) and first.position.endswith(", test 1")
    assert "this test" in first.narrative and "Depth 1" in first.narrative
    second = teach_tab.step_test(view.run, first.index, first.test, +1)
    assert second.index == index and second.test == 1   # a second test, or the outcome after one
    assert teach_tab.step_test(None, 0, None, +1) is None


def test_a_stopped_prompt_set_comparison_says_so(tiny):
    from specviz.ui import compare_sets

    signal = common.StopSignal()
    signal.request()
    source = next(c for c in compare_sets.sources(LOCAL) if "rewrite" in c)
    shown = [v for v in compare_tab.compare_work(LOCAL, tiny.loader)(PROMPT, ROWS, 8, 0, CHAT, source, None, 1,
                                                                      stop=signal) if v is not TICK]
    assert "Stopped: " in html.unescape(re.sub(r"<[^>]+>", " ", shown[-1].status))


def test_teach_shows_its_tokens_while_it_decodes(tiny, monkeypatch):
    # Issue 18: a decode of several seconds showed only "processing"; now the tokens so far stream.
    monkeypatch.setattr(common, "UPDATE_SECONDS", 0.0)       # every cycle due, however fast the tiny pair is
    steps = [v for v in teach_tab.teach_work(LOCAL, tiny.loader)(PROMPT, EARLY_EXIT, "", 2, 2, 0.0, 0, 24, RAW)
             if v is not TICK]
    *progress, final = steps
    assert progress and all(decoding(v) for v in progress)
    counts = [len(re.findall(r'data-verdict="', v.tokens)) for v in progress]
    assert counts == sorted(counts) and counts[-1] > 0 and "decoding:" in progress[-1].tokens
    assert final.position.startswith("Cycle 1 of")


def test_stepping_before_decoding_says_so_in_the_page(demo):
    # Issue 18: the warning went to the server log (a toast needs the queue, which stepping skips).
    blocks, _, teach_ui, _, _ = demo
    (fn,) = functions_of(blocks, teach_ui.next)
    outputs = fn.fn(None, 0, None)
    assert "Decode, then step through" in outputs[-1] and all(o == gr.skip() for o in outputs[:-1])


def test_a_prompt_set_answers_first_and_unstarted_rows_wait():
    # Issue 18: the answer was the second sentence of the headline; a configuration not started read
    # "0 prompts, 0.00x, 0.00-0.00x".
    from specviz.catalog import BenchPrompt
    from specviz.runs.prompt_set_result import PromptRun, PromptSetComparison
    from specviz.settings import RunSettings
    from specviz.views import prompt_sets

    configs = [RunSettings(fixed_k=True, draft="ngram", k=4), RunSettings(draft="ngram", k=2)]
    prompts = [BenchPrompt(f"p{i}", "a", "x") for i in range(5)]
    comparison = PromptSetComparison(configs, ["lookup", "other"], prompts, 1)
    for p, value in enumerate([1.8, 2.0, 2.2, 1.9, 2.1]):
        comparison.results.append(PromptRun(0, p, 0, value, 10, 10, 4, 8, 6, 1.0, None))
    assert prompt_sets.answer_line(comparison) == "lookup beats plain decoding on these 5 prompts: yes."
    rows = {row[0]: row for row in prompt_sets.table_rows(comparison)}
    assert rows["other"][2] == "waiting" and "0.00" not in " ".join(rows["other"])
    mixed = PromptSetComparison(configs[:1], ["lookup"], prompts, 1)
    for p, value in enumerate([0.8, 1.3, 0.9, 1.4, 1.1]):
        mixed.results.append(PromptRun(0, p, 0, value, 10, 10, 4, 8, 6, 1.0, None))
    assert prompt_sets.answer_line(mixed).endswith(": not settled.")


def test_compare_opens_on_one_fast_drafter_and_a_prompt_long_enough():
    # Issue 18: the default ticked an early-exit row running at 0.30x and measured an 18-token answer.
    from specviz.catalog import load_examples
    from specviz.ui.run_tab import default_example

    ticked = [row for row in compare_tab.DEFAULT_CONFIGS if row[0]]
    assert [row[2] for row in ticked] == ["ngram"]
    examples = load_examples()
    assert compare_tab.DEFAULT_PROMPT == examples[default_example(examples)]["prompt"]


def test_table_headers_line_up_with_their_numbers():
    from specviz.views import render

    markup = render.table_html(["category", "a", "b"], [["chat", "1.20x", "0.90x"]], label="t")
    assert (re.findall(r'<th class="([^"]*)"', markup) == re.findall(r'<td class="([^"]*)"', markup)
            == ["", "sv-num", "sv-num"])


def test_a_drafted_token_the_target_never_tested_is_not_drawn_as_rejected():
    # Issue 18: Teach's "not checked" rows used the rejected colour.
    from specviz.views import teach_rows

    markup = teach_rows._verdict_cell(teach_rows.NOT_CHECKED)
    assert "not checked" in markup and "sv-rejected" not in markup and "data-verdict" not in markup
