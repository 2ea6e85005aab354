"""The Run tab's work on the tiny in-process pair (what it yields, how it fails, hosted limits), the
shared pieces of the UI (`streaming`, the queue, API names), and the page as a whole."""

import asyncio
import dataclasses
import html
import re
import time

import gradio as gr
import pytest
import torch
from conftest import counting_forwards
from tiny_pair import PROMPT

from specviz.errors import SpecvizError
from specviz.runs import last, race
from specviz.core.events import interleave
from specviz.settings import LOCAL, RunSettings, hosted
from specviz.ui import build_demo, common, run_tab, tools
from specviz.ui.common import DRAFT_MODEL, EARLY_EXIT, PROMPT_LOOKUP, RAW, TICK

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request

PRESETS = [dict(name="builtin lookup", target="SmolLM2-135M-Instruct", draft="ngram", k=8),
           dict(name="pair", target="org/big", draft="org/small", k=4)]
HOSTED = hosted(PRESETS)


def inputs(prompt=PROMPT, target="tiny", drafter=PROMPT_LOOKUP, draft_model="", exit_layer=1, k=4,
           dynamic_k=False, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=24, seed=0, prompt_format=RAW,
           branch=1, fixed_k=True, sampling="invariant"):
    return [prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
            max_new_tokens, seed, prompt_format, branch, fixed_k, sampling]


def views_of(tiny, limits=LOCAL, **settings):
    """The views the Run button's work yields (TICKs left out)."""
    work = run_tab.run_work(limits, tiny.loader)
    return [view for view in work(*inputs(**settings)) if view is not TICK]


def verdicts(markup):
    return re.findall(r'data-verdict="(\w+)"', markup)


def text(markup):
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


# ----------------------------------------------------------------------------- runs

def test_run_streams_tokens_charts_and_summary(tiny):
    views = views_of(tiny, max_new_tokens=32)
    assert len(views) >= 2
    final = views[-1]
    assert isinstance(final, run_tab.RunPage) and len(final) == 10
    data = final.summary        # the API's named fields: `run --json`'s, less the cycles
    assert data["summary"]["tokens"] == 32 and data["summary"]["clock"] == "thread CPU time"
    assert data["summary"]["speedup_low"] <= data["summary"]["speedup"] <= data["summary"]["speedup_high"]
    assert data["text"] and "cycles" not in data and data["measurement"]["replay"] is False
    found = verdicts(final.tokens)
    assert found and set(found) <= {"accepted", "rejected", "resampled", "bonus"}
    assert 'class="sv-cycle"' in final.tokens and "sv-legend" in final.tokens
    assert [t.name for t in final.acceptance.data] == ["this cycle", "cumulative"]
    assert [t.name for t in final.per_pass.data][:2] == ["this pass", "running mean"]
    assert [t.name for t in final.race.data] == ["speculative", "plain", "running speedup (right)"]
    assert final.race.data[0].y[-1] == 32 and final.race.data[1].y[-1] == 32
    assert len(final.positions.data[0].y) == 4
    assert [t.name for t in final.timeline.data] == ["drafting", "verification pass", "plain step (one token)"]
    summary = text(final.stats)
    assert "Finished" in summary and "95% range" in summary and "thread CPU time" in summary
    assert "decode-only time per token over the same 32 tokens, written by both" in summary
    assert "Theory at this pass cost" in summary and "Ideal theory (pass cost 1)" in summary
    assert "identical" in summary  # greedy in float32: both methods write the same tokens
    assert "32 tokens" in text(final.baseline) and "done" in text(final.baseline)
    # The finished run is offered as a recording, which reads back to the same numbers.
    from specviz.runs import recording
    # The last run's file goes with the first view; the views between leave the button alone.
    assert views[0].record["interactive"] is False and views[0].record["value"] is None
    assert run_tab.no_recording_yet() is not run_tab.no_recording_yet()     # Gradio edits an update in place
    assert all(v.record == gr.skip() for v in views[1:-1]) and final.record["interactive"] is True
    assert recording.load(final.record["value"]).runs[0].stats.tokens == 32


def test_first_view_says_it_is_loading(tiny):
    views = views_of(tiny)
    assert "Loading" in views[0].stats
    assert verdicts(views[0].tokens) == []


def test_same_draft_accepts_everything_and_random_draft_gets_rejections(tiny):
    same = verdicts(views_of(tiny, drafter=DRAFT_MODEL, draft_model="same", k=3)[-1].tokens)
    assert set(same) == {"accepted", "bonus"}
    rejected = verdicts(views_of(tiny, drafter=DRAFT_MODEL, draft_model="random", k=3)[-1].tokens)
    assert "rejected" in rejected and "resampled" in rejected


def test_sampled_run_with_early_exit_and_dynamic_k(tiny):
    # Dynamic k is transformers' heuristic: +2 after a cycle that accepted its whole draft, -1 after
    # one that did not, within [1, max_k] (default 2k). Read the k of every cycle back from the
    # run's recording (what the tab offers for download) and check each step against the rule.
    from specviz.runs import recording

    final = views_of(tiny, drafter=EARLY_EXIT, exit_layer=1, temperature=1.0, top_p=0.9, top_k=50, seed=3,
                     dynamic_k=True, k=3, max_new_tokens=64)[-1]
    assert "Sampled" in final.stats and "speedup" in final.stats.lower()
    run = recording.load(final.record["value"]).runs[0]
    assert run.settings.dynamic_k and run.settings.max_k == 6
    ks = [cycle.k for cycle in run.cycles]
    assert ks[0] == 3
    for cycle, next_k in zip(run.cycles, ks[1:]):
        if not cycle.drafted:                    # nothing drafted (the length budget's last token): k stays
            assert next_k == cycle.k
        elif cycle.num_accepted == len(cycle.drafted):
            assert next_k == min(cycle.k + 2, 6)
        else:
            assert next_k == max(cycle.k - 1, 1)
    steps = {b - a for a, b in zip(ks, ks[1:])}
    assert {2, -1} <= steps                      # both rules were exercised, not only one


def test_a_short_run_says_it_is_too_short_to_measure(tiny):
    final = views_of(tiny, drafter=DRAFT_MODEL, draft_model="same", k=8, max_new_tokens=16, fixed_k=True)[-1]
    assert "too short to measure reliably" in text(final.stats)


def test_the_race_advances_the_method_that_is_behind():
    from conftest import make_cycle
    from specviz.core.events import Cycle, Step

    def cycle(i, seconds):
        return make_cycle(index=i, drafted=[], num_accepted=0, correction=1, draft_seconds=0.0, verify_seconds=seconds)
    spec = iter([cycle(0, 0.3), cycle(1, 0.3)])
    plain = iter([Step(i, 1, 1.0, 0.1) for i in range(7)])
    order = ["S" if isinstance(e, Cycle) else "P" for e in interleave(spec, plain)]
    assert order == ["S", "P", "P", "P", "S", "P", "P", "P", "P"]


def test_the_baseline_text_shows_no_end_of_turn_token(tiny):
    # The target ends its answer with "." here: plain decoding stops on it, and its panel shows
    # the answer, not the end-of-turn marker's text (the token view marks it as a token).
    pair = tiny.pair("tiny", "ngram")
    settings = RunSettings(max_new_tokens=40, chat=False)
    free = last(race(settings, PROMPT, pair, baseline=True))
    stop = free.baseline_tokens[5]
    ended = last(race(settings, PROMPT, dataclasses.replace(pair, eos_token_ids=[stop]), baseline=True))
    assert ended.steps[-1].token == stop and len(ended.steps) < 40
    assert ended.step_texts[-1] == "" and "".join(ended.step_texts) == "".join(free.step_texts[: len(ended.steps) - 1])


# ----------------------------------------------------------------------------- failures

@pytest.mark.parametrize("settings, expected", [
    (dict(target="no-such/model"), "does not exist"),
    (dict(prompt="   "), "The prompt is empty"),
    (dict(drafter=DRAFT_MODEL, draft_model=""), "Type a draft model id"),
    (dict(target="short-context", max_new_tokens=40), "exceeds the target model's context of 32"),
    (dict(top_p=0.0), "top-p must be above 0"),
    (dict(max_new_tokens=5000), "max new tokens must be a whole number from 1 to 4096"),
    (dict(seed="x"), "seed must be a whole number"),
    (dict(seed=2**80), "seed must be a whole number from 0 to 9223372036854775807"),
    (dict(k="inf"), "k (tokens drafted per cycle) must be a whole number"),
    (dict(exit_layer=float("nan"), drafter=EARLY_EXIT), "early-exit layer must be a whole number"),
    (dict(drafter="Something else"), "Unknown drafter"),
])
def test_errors_become_messages(tiny, settings, expected):
    final = views_of(tiny, **settings)[-1]
    assert 'role="alert"' in final.stats and expected in html.unescape(final.stats)
    assert "Traceback" not in final.stats


def test_out_of_memory_is_reported_and_the_next_run_works(tiny, monkeypatch):
    from specviz.runs import run as run_module

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    monkeypatch.setattr(run_module, "autoregressive_decode", boom)
    assert "Out of memory" in views_of(tiny)[-1].stats
    monkeypatch.undo()
    assert "Finished" in views_of(tiny)[-1].stats


def test_unexpected_errors_are_logged_not_shown(caplog):
    def broken(settings, progress=None):
        raise RuntimeError("kaboom")
    final = [v for v in run_tab.run_work(LOCAL, broken)(*inputs()) if v is not TICK][-1]
    assert "Unexpected error" in final.stats and "Traceback" not in final.stats
    assert any(r.exc_info for r in caplog.records)


def test_stop_ends_the_run_with_its_own_stopped_summary(tiny):
    signal = common.StopSignal()
    views = []
    with counting_forwards(tiny.target) as forwards:
        for view in run_tab.run_work(LOCAL, tiny.loader)(*inputs(max_new_tokens=256), stop=signal):
            if view is TICK:
                continue
            views.append(view)
            if "Running" in view.stats and not signal.requested:
                signal.request()             # as the Stop button does, mid-run
                at_stop = len(forwards)
        at_end = len(forwards)
        time.sleep(0.2)                      # nothing left running in the background either
    # The event in flight when Stop landed (one speculative pass or one plain step), then no forward.
    assert at_end - at_stop <= 1 and len(forwards) == at_end, (at_stop, at_end, len(forwards))
    final = text(views[-1].stats)
    assert "Running" in text(views[-2].stats)
    assert "Stopped." in final and "cover the run up to the stop" in final and "Running" not in final
    assert "Tokens per target pass" in final            # the numbers up to the stop stay
    spec_tokens = int(re.search(r"(\d+) tokens in \d+ passes", final).group(1))
    assert 0 < spec_tokens < 256
    assert "done" not in text(views[-1].baseline)


def test_suffix_decoding_remembers_a_sessions_runs_and_only_its_own(tiny):
    from types import SimpleNamespace

    from specviz.ui.common import SUFFIX, SessionMemories, session_loader

    loader = session_loader(tiny.loader)            # as build_demo wraps it: the cached pair is shared
    memories = SessionMemories()
    work = run_tab.run_work(LOCAL, loader, memories)
    session, other = SimpleNamespace(session_hash="a"), SimpleNamespace(session_hash="b")   # as gr.Request

    def final(request):
        # Fixed k: what the session's memory drafts is the point here, not whether drafting pays on the tiny pair.
        pages = [p for p in work(*inputs(drafter=SUFFIX, max_new_tokens=48, fixed_k=True), session=request)
                 if p is not TICK]
        return text(pages[-1].stats), pages[-1].tokens

    first, _ = final(session)
    again, tokens = final(session)                   # the same request again, same session
    fresh, _ = final(other)                          # another visitor: nothing of the first session's
    def accepted_from_earlier(summary):
        return int(re.search(r"From earlier requests\s+(\d+) accepted", summary).group(1))
    assert accepted_from_earlier(first) == 0 == accepted_from_earlier(fresh)
    assert accepted_from_earlier(again) > 10 and 'data-earlier="1"' in tokens
    assert "identical" in again                      # and the output is still the target's own
    memories.end(session)                            # the session ended (the page's unload event)
    assert len(memories) == 1
    ended, _ = final(session)                        # the same hash again starts from nothing
    assert accepted_from_earlier(ended) == 0


def test_a_stop_pressed_while_queued_stops_the_run_before_it_loads_anything():
    signal = common.StopSignal()
    signal.request()

    def loader(settings, progress=None):
        raise AssertionError("a stopped run must not load models")
    views = [v for v in run_tab.run_work(LOCAL, loader)(*inputs(), stop=signal) if v is not TICK]
    assert len(views) == 1 and "Stopped." in text(views[0].stats)



def test_a_second_run_click_while_one_streams_keeps_the_signal_stop_must_reach():
    async def handler(*args):
        yield "view"

    async def drain(generator):
        return [item async for item in generator]

    work = common.holding_its_signal(handler)
    running = common.StopSignal.for_click(common.StopSignal())   # Run: its work is queued, then streams
    assert running.live and not running.requested
    assert common.StopSignal.for_click(running) is running       # Run again meanwhile (Gradio skips its work)
    running.request()                                             # so Stop still reaches the running work
    assert asyncio.run(drain(work(running))) == ["view"] and not running.live   # it ended: no longer live
    after_stop = common.StopSignal.for_click(running)             # Run after Stop: a signal of its own
    assert after_stop is not running and not after_stop.requested
    after_stop.live = False                                       # (its work ended)
    assert common.StopSignal.for_click(after_stop) is not after_stop   # the next click starts afresh

    async def failing(*args):
        raise RuntimeError("boom")
        yield
    failed = common.StopSignal.for_click(None)
    with pytest.raises(RuntimeError):
        asyncio.run(drain(common.holding_its_signal(failing)(failed)))
    assert not failed.live                                        # however the work ends
    with pytest.raises(TypeError):
        common.holding_its_signal(lambda stop: None)

# ----------------------------------------------------------------------------- hosted mode

def test_hosted_mode_is_on_with_the_variable_or_on_spaces(monkeypatch):
    monkeypatch.delenv("SPECVIZ_HOSTED", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not common.is_hosted()
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    assert common.is_hosted()
    monkeypatch.setenv("SPECVIZ_HOSTED", "0")
    assert not common.is_hosted()
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("SPECVIZ_HOSTED", "1")
    assert common.is_hosted()


@pytest.mark.parametrize("settings, expected", [
    (dict(target="someone/big-model"), "only runs the preset models"),
    (dict(target="/tmp/model"), "only runs the preset models"),
    (dict(drafter=DRAFT_MODEL, draft_model="someone/other-draft"), "only runs the preset draft models"),
    (dict(max_new_tokens=HOSTED.max_new_tokens + 8), f"from 1 to {HOSTED.max_new_tokens}"),
    (dict(k=17), "from 1 to 16"),
    (dict(temperature=3.0), "temperature must be a number from 0 to 2"),
    (dict(prompt="word " * 1000), "at most 4000 are allowed in this hosted demo"),
])
def test_hosted_mode_limits(tiny, settings, expected):
    settings.setdefault("target", "")
    before = len(tiny.calls)
    final = views_of(tiny, HOSTED, **settings)[-1]
    assert expected in html.unescape(final.stats)
    assert len(tiny.calls) == before     # refused before anything was loaded


def test_hosted_mode_never_probes_the_filesystem(tiny, monkeypatch):
    # A path that exists and one that does not get the same answer: the allow-list alone decides.
    import pathlib

    def no_probe(self, *args, **kwargs):
        raise AssertionError(f"the filesystem was probed for {self}")
    monkeypatch.setattr(pathlib.Path, "exists", no_probe)
    monkeypatch.setattr(pathlib.Path, "is_file", no_probe)
    monkeypatch.setattr(pathlib.Path, "is_dir", no_probe)
    answers = {text(views_of(tiny, HOSTED, target=name)[-1].stats).replace(name, "NAME")
               for name in ("specviz/ui/common.py", "app.py", "no/such-thing")}
    assert len(answers) == 1 and "only runs the preset models" in answers.pop()


def test_hosted_mode_runs_the_default_and_preset_drafters(tiny):
    assert "Finished" in views_of(tiny, HOSTED, target="")[-1].stats
    assert "Finished" in views_of(tiny, HOSTED, target="", drafter=EARLY_EXIT, exit_layer=1)[-1].stats


# ----------------------------------------------------------------------------- streaming and the page

def test_streaming_forwards_views_and_stops_within_one_step():
    steps_run = []

    def work():
        for i in range(1000):
            steps_run.append(i)
            yield TICK if i % 2 else i

    async def consume():
        handler = common.streaming(work)
        stream = handler()
        seen = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        return seen

    assert asyncio.run(consume()) == [0, 2, 4]
    assert len(steps_run) == 5          # no step ran after the consumer stopped


def test_streaming_lets_the_step_in_flight_finish_before_a_cancel_lands():
    import threading
    import time
    finished = threading.Event()
    closed = threading.Event()

    def work():
        try:
            yield 1
            time.sleep(0.5)             # one decoding cycle
            finished.set()
            yield 2
            yield 3
        finally:
            closed.set()

    async def cancel_mid_step():
        handler = common.streaming(work)

        async def drain():
            async for _ in handler():
                pass
        task = asyncio.create_task(drain())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return finished.is_set(), closed.is_set()

    assert asyncio.run(cancel_mid_step()) == (True, True)


def test_presets_fill_the_controls():
    presets = [dict(name="a", target="T", draft="ngram", k=8), dict(name="b", target="T", draft="self:20", k=4),
               dict(name="c", target="T", draft="org/small", k=5)]
    assert run_tab.preset_settings("a", presets)["drafter"] == PROMPT_LOOKUP
    assert run_tab.preset_settings("b", presets) == dict(target="T", draft_model="", exit_layer=20, k=4,
                                                         drafter=EARLY_EXIT)
    assert run_tab.preset_settings("c", presets)["draft_model"] == "org/small"
    assert run_tab.preset_settings(common.CUSTOM, presets) == {}
    assert run_tab.preset_choices(presets, hosted=True) == ["a", "b", "c"]
    assert run_tab.preset_choices(presets, hosted=False)[-1] == common.CUSTOM


def test_examples_cover_every_category():
    from specviz.catalog import load_examples

    categories = {e["category"] for e in load_examples()}
    assert categories == {"chat", "code", "rewrite/edit", "summarisation", "maths", "translation"}


def test_the_demo_has_one_gpu_queue_and_stable_api_names(tiny):
    demo = build_demo(loader=tiny.loader, hosted=False)
    config = demo.get_config_file()
    ids = {c["props"].get("elem_id") for c in config["components"]}
    assert {"prompt", "run", "stop", "tokens", "charts", "stats"} <= ids
    tabs = [c for c in config["components"] if c["type"] == "tabitem"]
    assert [t["props"]["label"] for t in tabs] == ["Run", "Compare", "Load", "Teach", "Explain", "Replay", "Train"]
    public = {d["api_name"]: d for d in config["dependencies"] if d.get("api_visibility") == "public"}
    assert set(public) == {"run", "compare", "sweep", "load", "teach", "export", *tools.TOOLS}
    for name in public.keys() - {"run", "race_speculative_decoding", "read_recording"}:
        fn = demo.fns[public[name]["id"]]
        assert fn.concurrency_id == common.CONCURRENCY_ID and fn.concurrency_limit == 1
    # Every Run request starts at once (it shows its place in line); its race waits for a slot instead.
    assert demo.fns[public["run"]["id"]].concurrency_limit == run_tab.RUN_VIEWERS
    assert demo.fns[public["race_speculative_decoding"]["id"]].concurrency_id == "run"
    # As an MCP server, only the tools are public (Gradio makes a tool of every public event).
    as_mcp = build_demo(loader=tiny.loader, hosted=False, mcp=True).get_config_file()
    assert {d["api_name"] for d in as_mcp["dependencies"] if d.get("api_visibility") == "public"} == set(tools.TOOLS)
    # The Run tab's Stop signals the run's work (its last view says "Stopped"); each Run click puts its
    # signal in the session's state before its work is queued. Neither waits for the queue.
    run_fn = demo.fns[public["run"]["id"]]
    signal = run_fn.inputs[-1]
    by_name = {fn.fn.__qualname__: fn for fn in demo.fns.values() if signal in fn.inputs and fn is not run_fn}
    assert set(by_name) == {"StopSignal.for_click", "StopSignal.request"}
    pick, request = by_name["StopSignal.for_click"], by_name["StopSignal.request"]
    assert pick.outputs == [signal] and not pick.queue and not request.queue
    ids = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    assert (ids["run"], "click") in pick.targets and (ids["stop"], "click") in request.targets
    assert run_fn.trigger_after == pick._id and run_fn.trigger_mode == "once"   # see `StopSignal`
    assert demo._queue.max_size == common.QUEUE_MAX_SIZE


def test_the_ui_package_only_re_exports_and_no_submodule_imports_it():
    # Issue 17: a package face that re-exports, never imported by its own modules (a parent-child circle).
    import ast
    from pathlib import Path

    import grimp

    import specviz.ui

    folder = Path(specviz.ui.__file__).parent
    face = ast.parse((folder / "__init__.py").read_text())
    assert all(isinstance(node, (ast.Expr, ast.ImportFrom, ast.Assign)) for node in face.body)   # no definitions
    graph = grimp.build_graph("specviz")
    assert graph.find_modules_that_directly_import("specviz.ui") == set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and path.name != "__init__.py":
                assert node.module, f"{path.name}: 'from . import' goes through the package"
    from specviz.ui import build_demo as face_build_demo
    from specviz.ui.app import build_demo as app_build_demo
    assert face_build_demo is app_build_demo


def test_hosted_demo_hides_typed_ids(tiny):
    config = build_demo(loader=tiny.loader, hosted=True).get_config_file()
    target = next(c for c in config["components"] if c["props"].get("elem_id") == "target")
    assert target["props"]["visible"] is False
    limit = next(c for c in config["components"] if c["props"].get("elem_id") == "max-new-tokens")
    assert limit["props"]["maximum"] == hosted([]).max_new_tokens


def test_the_drafter_controls_make_one_draft_spec():
    assert common.draft_spec(PROMPT_LOOKUP, "", 3) == "ngram"
    assert common.draft_spec(EARLY_EXIT, "", 3.0) == "self:3"
    assert common.draft_spec(DRAFT_MODEL, " org/small ", 3) == "org/small"
    with pytest.raises(SpecvizError, match="early-exit layer"):
        common.draft_spec(EARLY_EXIT, "", "x")


def test_a_finished_run_does_not_keep_its_models_alive(tiny):
    # Runs live on in session state (Compare's export); the model cache alone decides what stays loaded.
    import gc
    import weakref

    from conftest import make_llama
    from specviz.core.drafters import PromptLookupDrafter
    from specviz.models import ModelPair
    from tiny_pair import WORDS

    model = make_llama(3, layers=1, vocab=len(WORDS))
    pair = ModelPair(target=model, tokenizer=tiny.tokenizer, draft=PromptLookupDrafter(), target_name="m",
                     draft_name="ngram", target_parameters=1, draft_parameters=0, device=model.device,
                     dtype=torch.float32, eos_token_ids=[])
    alive = weakref.ref(model)
    run = last(race(RunSettings(max_new_tokens=8), PROMPT, pair, baseline=True))
    del pair, model
    gc.collect()
    assert alive() is None and run.text


def test_hosted_dynamic_k_never_grows_past_the_limit():
    from specviz.settings import validate

    assert validate(RunSettings(k=16, dynamic_k=True), HOSTED).max_k == 16
    assert validate(RunSettings(k=4, dynamic_k=True), HOSTED).max_k == 8


def test_a_tree_drafter_runs_in_the_app_and_shows_its_branches(tiny):
    final = views_of(tiny, drafter=common.PROMPT_LOOKUP_TREE, k=4, max_new_tokens=32)[-1]
    assert "Finished" in final.stats and "identical" in final.stats
    assert 'class="sv-branches"' in final.tokens and "token tree:" in html.unescape(final.tokens)
    assert "Nodes verified per pass" in text(final.stats)
    assert final.positions.layout.title.text == "Acceptance by depth"
    assert set(verdicts(final.tokens)) <= {"accepted", "rejected", "resampled", "bonus"}


def test_a_draft_models_tree_runs_in_the_app(tiny):
    final = views_of(tiny, drafter=EARLY_EXIT, exit_layer=1, k=3, branch=2, max_new_tokens=24)[-1]
    summary = text(final.stats)
    assert "Finished" in summary and "identical" in summary and "tree (top-2, 16 nodes)" in summary
    assert 'class="sv-branches"' in final.tokens
    # The slider only counts for draft models and early exit: prompt lookup stays a chain.
    assert "Finished" in text(views_of(tiny, drafter=PROMPT_LOOKUP, branch=3, max_new_tokens=8)[-1].stats)


def test_tree_cycle_text_and_pieces_follow_the_accepted_path(tiny):
    from specviz.runs import execute
    from specviz.views import render

    settings = RunSettings(draft="ngram-tree", k=4, max_new_tokens=32, chat=False, fixed_k=True)
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=True)
    assert run.identical and any(c.is_tree and c.path and len(c.drafted) > len(c.path) for c in run.cycles)
    assert "".join(run.emitted_texts()).strip() == run.text.strip()
    for cycle, text in zip(run.cycles, run.texts):
        pieces = render.cycle_pieces(cycle, text)
        accepted = [p.text for p in pieces if p.verdict == "accepted"]
        assert accepted == [text.drafted[i] for i in cycle.accepted_nodes]


# ----------------------------------------------------------------------------- across tokenizers

def test_a_cross_tokenizer_run_shows_its_retokenization_note_and_draft_tokens_per_target_token(tiny):
    from specviz.models.pairs import CROSS_TOKENIZER_NOTE

    views = views_of(tiny, drafter=DRAFT_MODEL, draft_model="other-tokenizer", k=4, max_new_tokens=24, fixed_k=True)
    final = views[-1]
    # Every cycle has its line (closed), in the live views too; all but the last, which may have had no
    # room left to draft.
    for view in views[1:]:
        cycles, marks = view.tokens.count('class="sv-cycle"'), view.tokens.count('<details class="sv-retok"')
        assert cycles - 1 <= marks <= cycles
    assert final.tokens.count('class="sv-cycle"') >= 4
    assert "<details open" not in final.tokens and "across tokenizers: draft: `" in html.unescape(final.tokens)
    summary = text(final.stats)
    assert CROSS_TOKENIZER_NOTE in summary and summary.count(CROSS_TOKENIZER_NOTE) == 1
    assert "Draft tokens per target token" in summary and "Finished" in summary
    assert "identical" in summary          # greedy, float32: drafting across tokenizers stays lossless
    plain = text(views_of(tiny, drafter=DRAFT_MODEL, draft_model="small", k=4)[-1].stats)
    assert "across tokenizers" not in plain and "Draft tokens per target token" not in plain


def test_teach_explains_a_cross_tokenizer_cycle(tiny):
    from specviz.ui import teach_tab

    steps = [v for v in teach_tab.teach_work(LOCAL, tiny.loader)(PROMPT, DRAFT_MODEL, "other-tokenizer", 1, 4, 0.0,
                                                                 0, 24, RAW)
             if isinstance(v, teach_tab.TeachView) and not str(v.position).startswith(teach_tab.DECODING)]
    view = steps[-1]
    assert view.position.startswith("Cycle 1 of")
    assert "**Drafted across tokenizers**" in view.narrative and "was **cut**" in view.narrative
    assert '<details class="sv-retok"' in view.tokens


@pytest.mark.slow      # starts a server, ~2.5 s
def test_the_app_starts_on_a_host_too_busy_to_answer_gradios_first_localhost_check():
    """Gradio's own check gives up at once on a refused connection (and after 3 s on a slow one); the
    patient check launch_options installs asks again until the server answers (here after 2 s)."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from gradio import networking

    from specviz.engines.vllm_server import free_port
    from specviz.ui.app import launch_options

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    launch_options()
    assert networking.url_ok.specviz_patient
    wrapper = networking.url_ok
    launch_options()  # a second call keeps one wrapper, not a wrapper around a wrapper
    assert networking.url_ok is wrapper

    class Ok(BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    servers = []

    def serve_later():
        time.sleep(2.0)
        servers.append(HTTPServer(("127.0.0.1", port), Ok))
        servers[0].serve_forever()

    threading.Thread(target=serve_later, daemon=True).start()
    started = time.monotonic()
    try:
        assert networking.url_ok(url)
        assert time.monotonic() - started >= 2.0
    finally:
        while not servers:
            time.sleep(0.1)
        servers[0].shutdown()
