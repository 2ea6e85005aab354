"""The Compare, Teach and Explain tabs: built inside a small gr.Blocks, their handlers called
directly on a tiny in-process pair."""

from pathlib import Path

import gradio as gr
import pytest
import torch
from tiny_pair import PROMPT, TinyModels

from specviz import tabs, teach, ui
from specviz.compare import Comparison, Sweep

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request

ROWS = [[True, "", "ngram", 4, False, 0.0], [True, "", "same", 3, False, 0.0],
        [False, "", "self:2", 2, False, 0.0], [True, "", "small", 2, True, 0.7]]


@pytest.fixture(scope="module")
def tiny():
    torch.set_grad_enabled(False)
    return TinyModels()


@pytest.fixture(scope="module")
def demo(tiny):
    with gr.Blocks() as blocks:
        last_run = gr.State(None)
        with gr.Tabs():
            with gr.Tab("Compare"):
                compare_tab = tabs.build_compare_tab(load=tiny, hosted=False, last_run=last_run)
            with gr.Tab("Teach"):
                teach_tab = tabs.build_teach_tab(load=tiny, hosted=False, last_run=last_run)
            with gr.Tab("Explain"):
                explain_tab = tabs.build_explain_tab(last_run=last_run)
    return blocks, compare_tab, teach_tab, explain_tab, last_run


def functions_of(blocks, component, event="click"):
    return [fn for fn in blocks.fns.values() if (component._id, event) in fn.targets]


def test_model_events_share_the_gpu_queue_and_can_be_stopped(demo):
    blocks, compare_tab, teach_tab, _, _ = demo
    gpu_events = []
    for button in (compare_tab.compare, compare_tab.sweep, teach_tab.run):
        (fn,) = functions_of(blocks, button)
        assert fn.concurrency_id == ui.CONCURRENCY_ID == "gpu" and fn.concurrency_limit == 1
        gpu_events.append(fn)
    ids = {fn_id: fn for fn_id, fn in blocks.fns.items()}
    compare_cancels = [set(fn.cancels) for fn in functions_of(blocks, compare_tab.stop) if fn.cancels]
    teach_cancels = [set(fn.cancels) for fn in functions_of(blocks, teach_tab.stop) if fn.cancels]
    assert {ids[i].name for i in compare_cancels[0]} == {"run_flat"} and len(compare_cancels[0]) == 2
    assert [ids[i] for i in teach_cancels[0]] == [gpu_events[2]]
    # Stepping is instant and needs no queue slot.
    assert all(not fn.queue for fn in functions_of(blocks, teach_tab.next) + functions_of(blocks, teach_tab.previous))


def test_the_explain_tab_listens_to_the_shared_last_run(demo):
    blocks, _, _, explain_tab, last_run = demo
    (fn,) = functions_of(blocks, last_run, "change")
    assert [o._id for o in fn.outputs] == [explain_tab.formulas._id, explain_tab.figure._id, explain_tab.alpha._id,
                                           explain_tab.k._id, explain_tab.c._id]
    # Both run tabs write to it.
    writers = [fn for fn in blocks.fns.values() if any(o._id == last_run._id for o in fn.outputs)]
    assert len(writers) == 3


def test_compare_handler_streams_then_names_the_winner(tiny):
    handler = tabs.make_compare_handler(load=tiny)
    views = list(handler(PROMPT, ROWS, 16, 0, ui.CHAT))
    assert len(views) == 1 + 3                                  # "running", then after each configuration
    assert "Running" in views[0].status
    final = views[-1]
    comparison, sweep = final.result
    assert sweep is None and comparison.labels == ["ngram k=4", "same k=3", "small k=2..4 (dynamic) T=0.7"]
    assert "won" in final.status or "came closest" in final.status
    assert "plain decoding (greedy)" in final.table and "plain decoding (T=0.7)" in final.table
    visible = [c.get("visible") for c in final.columns]
    assert visible == [True, True, True, False]
    assert "same k=3" in final.columns[1]["value"] and "data-verdict=" in final.columns[1]["value"]
    # Partial views: finished columns filled, pending ones waiting.
    assert "waiting" in views[1].columns[2]["value"] and "data-verdict=" in views[1].columns[0]["value"]
    assert [t.name for t in final.tokens_per_pass.data] == comparison.labels
    assert final.sweep.get("visible") is False
    best = max(comparison.results, key=lambda r: r.speedup)
    assert final.last_run["speedup"] == best.speedup and final.last_run["stats"] == best.stats.to_dict()


def test_sweep_handler_sweeps_the_first_ticked_row(tiny):
    handler = tabs.make_compare_handler(load=tiny, sweep=True)
    views = list(handler(PROMPT, ROWS, 8, 0, ui.CHAT))
    final = views[-1]
    comparison, sweep = final.result
    assert len(views) == 1 + 8 and [r.config.k for r in comparison.results] == list(range(1, 9))
    assert {r.config.draft for r in comparison.results} == {"ngram"}
    assert final.sweep["visible"] is True and final.sweep["value"].data[0].name == "measured"
    assert "Best measured k" in final.status and all(c.get("visible") is False for c in final.columns)


@pytest.mark.parametrize("rows, prompt, message", [
    ([[False, "", "ngram", 4, False, 0.0]], PROMPT, "Tick"),
    ([[True, "", "ngram", 40, False, 0.0]], PROMPT, "k must be between 1 and 16"),
    ([[True, "", "ngram", "four", False, 0.0]], PROMPT, "whole number"),
    ([[True, "", "nope", 4, False, 0.0]], PROMPT, "'nope' does not exist"),
    ([[True, "x/y", "ngram", 4, False, 0.0]], PROMPT, "does not exist"),
    (ROWS, "  ", "The prompt is empty"),
    ([[True, "", "ngram", 4, False, 0.0]] * 5, PROMPT, "at most 4"),
])
def test_compare_handler_turns_bad_input_into_a_message(tiny, rows, prompt, message):
    views = list(tabs.make_compare_handler(load=tiny)(prompt, rows, 16, 0, ui.CHAT))
    assert 'class="sv-stats sv-error"' in views[-1].status and message in views[-1].status.replace("&#x27;", "'")


def test_parse_configs_reads_strings_from_the_page():
    configs = tabs.parse_configs([["true", " ", "self:3", "2", "false", "0.5"], ["false", "", "ngram", 4, False, 0]],
                                 max_new_tokens=32, seed=None, chat=False)
    assert len(configs) == 1
    config = configs[0]
    assert (config.target, config.draft, config.k, config.dynamic_k, config.temperature, config.chat) == \
        (None, "self:3", 2, False, 0.5, False)


def test_export_files_from_the_last_comparison(tiny):
    *_, final = tabs.make_compare_handler(load=tiny)(PROMPT, ROWS[:2], 8, 0, ui.CHAT)
    paths, note = tabs.export_files(final.result)
    names = {Path(p).name for p in paths}
    assert {"cycles.jsonl", "cycles.csv", "summary.json", "tokens_against_time.html"} <= names and note == ""
    with pytest.raises(ui.RunError, match="Nothing to export"):
        tabs.export_files(None)
    with pytest.raises(ui.RunError):
        tabs.export_files((Comparison("", [], [], []), Sweep(Comparison("", [], [], []), [])))


def test_teach_handler_decodes_then_steps(tiny):
    handler = tabs.make_teach_handler(load=tiny)
    view = handler(PROMPT, ui.DRAFT_MODEL, "small", 2, 3, 0.9, 0, 24, ui.RAW)
    run = view.run
    assert isinstance(run, teach.TeachRun) and view.index == 0 and view.position == f"Cycle 1 of {len(run.cycles)}"
    assert "Cycle 1 of" in view.narrative and "<table" in view.table
    assert view.last_run["label"] == "small k=3 T=0.9"
    following = tabs.step(run, view.index, +1)
    assert following.index == 1 and following.position.startswith("Cycle 2")
    assert tabs.step(run, 0, -1).index == 0                                   # clamped at the start
    assert tabs.step(run, len(run.cycles) - 1, +1).index == len(run.cycles) - 1   # and at the end
    assert tabs.step(None, 0, +1) is None


def test_teach_handler_reports_errors(tiny):
    view = tabs.make_teach_handler(load=tiny)("", ui.EARLY_EXIT, "", 2, 3, 0.0, 0, 24, ui.CHAT)
    assert "sv-error" in view.narrative and "empty" in view.narrative


def test_explain_outputs_fill_in_a_runs_numbers(tiny):
    text, figure, *sliders = tabs.explain_outputs(None)
    assert "Example numbers" in text and figure.data and sliders == [0.7, 4, 0.05]
    view = tabs.make_teach_handler(load=tiny)(PROMPT, ui.EARLY_EXIT, "", 2, 3, 0.9, 0, 24, ui.CHAT)
    numbers = dict(view.last_run, speedup=1.5)
    text, figure, alpha, k, c = tabs.explain_outputs(numbers)
    assert "the last run (self:2 k=3 T=0.9)" in text and "**1.50\u00d7**" in text
    assert figure.data[-1].name == "measured"
    assert (alpha, k) == (round(numbers["stats"]["alpha"], 2), 3) and 0 <= c <= 1
