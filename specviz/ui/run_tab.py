"""The Run tab: speculative decoding races plain decoding of the same model, live, cycle by cycle.

`run_work` is the whole of the Run button: validate the controls into `RunSettings`, load the pair
(with progress), then `runs.race`, rendering a view at most every UPDATE_SECONDS. Handlers never
raise into the page: failures become a message in the summary box and a toast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import gradio as gr

from ..catalog import load_examples
from ..errors import SpecvizError
from ..runs import Loader, recording
from ..runs.shared_race import FAILED, FINISHED, REPLAY, SharedRaces
from ..settings import INVARIANT, Limits, RunSettings, check_prompt, parse_draft, validate
from ..views import charts, render
from ..views.run_view import RunView, empty_view, stopped_view
from .common import (AUTO, CHAT, CUSTOM, DRAFT_MODEL, DRAFTERS, EARLY_EXIT, PROMPT_LOOKUP,
                     PROMPT_LOOKUP_TREE, RAW, SUFFIX, TICK, animation_buttons, animation_file,
                     SessionMemories, StopSignal, click_with_stop, draft_spec, error_html, failure, presets,
                     recording_button, sampling_choice, slider_max_new_tokens, streaming)
from .fields import NumberBox, NumberSlider
from .playback import play
from .shared_run import (live_views, measured_label, race_slots, race_stream, race_ticket, summary_json,
                         waiting_views)

# What the Run button's work yields, in the order of its outputs: the run's views (`RunView`'s
# fields), then the Download recording button (offered once the run has finished or stopped), then
# the finished run's summary as JSON (`shared_run.summary_json`).
RunPage = NamedTuple("RunPage", [*RunView.__annotations__.items(), ("record", object), ("summary", object)])


RUN_VIEWERS = 128                 # Run requests served at once (most of them wait for a race or watch one)
FIGURES = ("acceptance", "per_pass", "race", "positions", "timeline")
NO_RECORDING = None


def no_recording_yet() -> dict:
    """The Download recording button emptied and disabled, as a run's first view leaves it; later views
    leave the button as it is (an update, even gr.skip(), makes Gradio rebuild the component and its
    API schema, for every viewer at every view). A new dict each time: Gradio edits updates in place."""
    return gr.update(value=None, interactive=False)


def shown(view: RunView) -> RunView:
    """A view as a page's outputs: a figure not redrawn this time is left as it is."""
    return view._replace(**{name: gr.skip() for name in FIGURES if getattr(view, name) is None})


def page(view: RunView, record: object = NO_RECORDING, summary: dict | None = None) -> RunPage:
    """The Run tab's outputs: the view, the download button's update (`record`; left as it is while
    there is nothing to record, see `first_page_clears_the_recording`) and the summary (left as it is
    until the run has one)."""
    # A dict of its own for each page: Gradio pops an update's value in place as it sends it, and a
    # shared race's finished update is made once for all its viewers (`LiveViews.final`).
    record = gr.skip() if record is NO_RECORDING else dict(record) if isinstance(record, dict) else record
    return RunPage(*shown(view), record, gr.skip() if summary is None else summary)


def first_page_clears_the_recording(pages: Iterator[RunPage | object]) -> Iterator[RunPage | object]:
    """`pages` with the download button cleared by the first page (unless that page offers a file)."""
    cleared = False
    for item in pages:
        if not cleared and isinstance(item, RunPage):
            cleared = True
            if item.record == gr.skip():
                item = item._replace(record=no_recording_yet())
        yield item


def settings_from_controls(target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
                           max_new_tokens, seed, prompt_format, limits: Limits, branch=1, fixed_k=False,
                           sampling=INVARIANT) -> RunSettings:
    tree = drafter in (DRAFT_MODEL, EARLY_EXIT)     # the branch slider only shows for these
    return validate(RunSettings(target=target, draft=draft_spec(drafter, draft_model, exit_layer), k=k,
                                fixed_k=fixed_k, dynamic_k=dynamic_k, temperature=temperature, top_p=top_p, top_k=top_k,
                                max_new_tokens=max_new_tokens, seed=seed, sampling=sampling,
                                chat=prompt_format != RAW, branch=branch if tree else 1), limits)


def run_work(limits: Limits, loader: Loader | None = None, memories: SessionMemories | None = None,
             races: SharedRaces | None = None):
    """The Run button's work (see `common.streaming`), taking the controls in wiring order. Gradio
    fills in `session` (the request, by its annotation), whose suffix drafter `memories` keeps. Runs
    go through `races` (`runs.shared_race`): a request for a race already waiting or running joins it,
    one measured within the last minutes is replayed unless `fresh` ("Measure again")."""
    memories = SessionMemories() if memories is None else memories
    races = SharedRaces(slots=race_slots()) if races is None else races
    stream = race_stream(limits, loader, memories)

    def work(prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
             max_new_tokens, seed, prompt_format, branch=1, fixed_k=False, sampling=INVARIANT, fresh=False,
             session: gr.Request | None = None, stop: StopSignal | None = None) -> Iterator[RunPage | object]:
        signal = stop or StopSignal()

        def pages():
            ticket = None
            try:
                settings = settings_from_controls(target, drafter, draft_model, exit_layer, k, dynamic_k,
                                                  temperature, top_p, top_k, max_new_tokens, seed, prompt_format,
                                                  limits, branch, fixed_k, sampling)
                checked = check_prompt(prompt, limits)
                if signal.requested:   # stopped while it waited for the queue
                    yield page(stopped_view())
                    return
                ticket = race_ticket(races, stream, settings, checked, getattr(session, "session_hash", None),
                                     fresh=bool(fresh), stopped=lambda: signal.requested)
                yield from watch(ticket, checked, signal)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
                yield page(empty_view(error_html(failure(exc))))
            finally:
                if ticket is not None:
                    ticket.leave()

        yield from first_page_clears_the_recording(pages())

    return work


def watch(ticket, prompt: str, stop: StopSignal) -> Iterator[RunPage | object]:
    """One viewer's race: the place in line and the example's recording while it waits, then the race
    live (shared views), or its replay; a failure ends with the run so far and the message."""
    shared = ticket.race
    if ticket.kind == REPLAY:
        yield from replayed(ticket, stop)
        return
    for view in waiting_views(ticket, prompt, stop):
        yield view if view is TICK else page(view)
    live, seen = live_views(shared), -1
    while not stop.requested:
        if shared.ended and not shared.events or shared.state == FAILED:
            break
        view = live.view(measured_label(ticket))
        if view is not None and view is not seen:
            yield page(view)
            seen = view
        else:
            yield TICK
        if shared.ended:
            break
        # Until the next drawing is due (not at every event: a class of viewers woken at every token
        # took the CPU its race runs on), or the end.
        shared.wait_until_ended(timeout=live.interval())
    if stop.requested:
        ticket.leave()
        if shared.stop_requested:            # the last viewer: the race stops within one event
            shared.wait_until_ended(30)
        view = live.stopped(measured_label(ticket))
        yield page(view if view is not None else stopped_view())
    elif shared.state == FAILED:
        view = live.stopped(measured_label(ticket)) if shared.events else None
        yield page((view or empty_view())._replace(stats=error_html(failure(shared.error))))
    elif shared.state == FINISHED:
        label = measured_label(ticket)
        view, run, record = live.final(label, recording_button)
        yield page(view, record, summary_json(run, ticket))


def replayed(ticket, stop: StopSignal) -> Iterator[RunPage | object]:
    """A race measured minutes ago, played at its recorded pace under a label that says so."""
    label = measured_label(ticket)
    run = None
    for step in play(ticket.race.result, 1.0, stop, label, f"Finished: {label}"):
        if step is TICK:
            yield TICK
            continue
        view, run = step
        yield page(view)
    if run is not None and not stop.requested:
        yield page(view, recording_button(ticket.race.result),
                   summary_json(ticket.race.result, ticket))


def _recorded_run(path: str | None):
    if not path:
        raise SpecvizError("Run first: the animation is made from the finished run.")
    return recording.load(path).runs[0]


# ----------------------------------------------------------------------------- presets and examples

def preset_choices(presets_list: list[dict], hosted: bool) -> list[str]:
    names = [p["name"] for p in presets_list if p.get("name")]
    return names if hosted else names + [CUSTOM]


def preset_settings(name: str, presets_list: list[dict]) -> dict:
    """A preset's fields for the controls: target, drafter, draft model, exit layer, k."""
    preset = next((p for p in presets_list if p.get("name") == name), None)
    if preset is None:
        return {}
    draft = parse_draft(preset.get("draft"))
    fields = dict(target=preset.get("target") or "", draft_model="", exit_layer=None, k=preset.get("k"))
    if draft.kind == "ngram":
        fields["drafter"] = PROMPT_LOOKUP
    elif draft.kind == "ngram-tree":
        fields["drafter"] = PROMPT_LOOKUP_TREE
    elif draft.kind == "suffix":
        fields["drafter"] = SUFFIX
    elif draft.kind == "auto":
        fields["drafter"] = AUTO
    elif draft.kind == "self":
        fields.update(drafter=EARLY_EXIT, exit_layer=draft.layers)
    else:
        fields.update(drafter=DRAFT_MODEL, draft_model=draft.text)
    return fields


def default_example(examples: list[dict]) -> int:
    """The example the tab opens with: the first rewrite (prompt lookup shines there, and its
    answer is long enough to measure)."""
    return next((i for i, e in enumerate(examples) if e["category"].startswith("rewrite")), 0)


# ----------------------------------------------------------------------------- layout

class RunTab(NamedTuple):
    prompt: gr.Textbox
    run: gr.Button
    stop: gr.Button
    tokens: gr.HTML
    stats: gr.HTML
    run_event: object     # the Run click's Dependency (its work, after the click picks its stop signal)
    pair: tuple           # (target, drafter, draft model, k): what another tab fills in to race a pair here


class RunViews(NamedTuple):
    """The components a run is drawn in (`views.run_view.RunView`'s fields): the Run tab's, and the
    Replay tab's, which draws recorded runs the same way."""
    tokens: gr.HTML
    baseline: gr.HTML
    acceptance: gr.Plot
    per_pass: gr.Plot
    race: gr.Plot
    positions: gr.Plot
    timeline: gr.Plot
    stats: gr.HTML


def build_run_views(prefix: str = "", *, action: str = "Run",
                    under_summary: Callable[[], None] | None = None) -> RunViews:
    """Token views side by side (stacked on a phone) at a fixed height, the summary under them (its
    speedup large), then the charts (before data: "`action` to see ..."): two rows of two, and the
    timeline under them across the width; element ids `prefix`
    + tokens, baseline, stats, charts, chart-acceptance, ..."""
    with gr.Row(equal_height=True, elem_classes=["sv-race"]):
        tokens = gr.HTML(render.token_view_html([]), padding=False, elem_id=prefix + "tokens")
        baseline = gr.HTML(render.baseline_html(""), padding=False, elem_id=prefix + "baseline")
    stats = gr.HTML(render.idle_html(), padding=False, elem_id=prefix + "stats")
    if under_summary is not None:     # what the tab puts between the summary and the charts
        under_summary()
    with gr.Column(elem_id=prefix + "charts"):
        empty = charts.run_figures(action=action)
        with gr.Row():
            acceptance = gr.Plot(empty[0], show_label=False, elem_id=prefix + "chart-acceptance")
            per_pass = gr.Plot(empty[1], show_label=False, elem_id=prefix + "chart-per-pass")
        with gr.Row():
            race_plot = gr.Plot(empty[2], show_label=False, elem_id=prefix + "chart-race")
            positions = gr.Plot(empty[3], show_label=False, elem_id=prefix + "chart-positions")
        timeline = gr.Plot(empty[4], show_label=False, elem_id=prefix + "chart-timeline")
    return RunViews(tokens, baseline, acceptance, per_pass, race_plot, positions, timeline, stats)


def build_run_tab(*, limits: Limits, loader: Loader | None = None, memories: SessionMemories | None = None,
                  races: SharedRaces | None = None) -> RunTab:
    """The Run tab's components and events (call inside a `gr.Tab`); `memories` holds each session's
    suffix drafter (the page frees a session's when it ends). The first screen is the demo: prompt,
    preset and Run in one band, the race under it; every other setting waits in a closed panel."""
    presets_list = presets()
    examples = load_examples()
    first = default_example(examples)
    choices = preset_choices(presets_list, limits.hosted)
    initial = preset_settings(choices[0], presets_list) if choices else {}

    # The band: the prompt, with every setting in a closed panel beside it; under them the pair, an
    # example to load, Run, Stop and the recording's place (kept from the start, so nothing moves).
    with gr.Row(equal_height=False, elem_classes=["sv-band"]):
        prompt = gr.Textbox(label="Prompt", value=examples[first]["prompt"], lines=3, max_lines=3, scale=3,
                            elem_id="prompt")
        with gr.Column(scale=2, min_width=280):
            with gr.Accordion("Settings: drafter, k, length, sampling", open=False, elem_id="settings"):
                target = gr.Textbox(label="Target model (hub id or local folder; blank = built-in "
                                    "SmolLM2-135M-Instruct)", value=initial.get("target", ""),
                                    visible=not limits.hosted, elem_id="target")
                drafter = gr.Radio(DRAFTERS, value=initial.get("drafter", PROMPT_LOOKUP), label="Drafter",
                                   elem_id="drafter")
                draft_model = gr.Textbox(label="Draft model (any tokenizer: one unlike the target's is drafted "
                                         "across tokenizers)",
                                         value=initial.get("draft_model", ""),
                                         visible=initial.get("drafter") == DRAFT_MODEL,
                                         interactive=not limits.hosted, elem_id="draft-model")
                exit_layer = NumberSlider(1, 63, value=initial.get("exit_layer") or 8, step=1,
                                          label="Early-exit layer (the draft runs the target's first N layers)",
                                          visible=initial.get("drafter") == EARLY_EXIT, elem_id="exit-layer")
                branch = NumberSlider(1, 4, value=1, step=1, label="Tree branch (1 = a chain; b > 1: the draft "
                                      "grows a token tree from its b most probable children, EAGLE-2 style, 16 "
                                      "nodes per pass)", visible=initial.get("drafter") in (DRAFT_MODEL, EARLY_EXIT),
                                      elem_id="branch")
                with gr.Row():
                    k = NumberSlider(1, 16, value=initial.get("k") or 8, step=1,
                                     label="k (most tokens drafted per cycle)", elem_id="k")
                    fixed_k = gr.Checkbox(False, label="Fixed k", elem_id="fixed-k",
                                          info="k every cycle (the classic algorithm); off: as many as pay, 0 to k")
                    dynamic_k = gr.Checkbox(False, label="Dynamic k",
                                            info="+2 after a full accept, \u22121 after a rejection")
                max_new_tokens = NumberSlider(8, slider_max_new_tokens(limits), value=128, step=8,
                                              label="Max new tokens", elem_id="max-new-tokens")
                prompt_format = gr.Radio([CHAT, RAW], value=CHAT if examples[first]["chat"] else RAW,
                                         label="Prompt format")
                with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
                    temperature = NumberSlider(0.0, 2.0, value=0.0, step=0.05, label="Temperature")
                    top_p = NumberSlider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                    top_k = NumberSlider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                    seed = NumberBox(0, precision=0, label="Seed")
                    sampling = sampling_choice()
                if limits.hosted:
                    gr.Markdown(f"Hosted demo: preset models only, at most {limits.max_new_tokens} new tokens.")
    with gr.Row(equal_height=False, elem_classes=["sv-actions"]):
        preset = gr.Dropdown(choices, value=choices[0] if choices else None, label="Model pair preset",
                             show_label=False, container=False, scale=3, min_width=220, elem_id="preset")
        example_names = [f"Example: {e['category']}: {e['title']}" for e in examples]
        example_table = gr.Dropdown([(name, i) for i, name in enumerate(example_names)], value=first, type="value",
                                    label="Example prompt", show_label=False, container=False, scale=3,
                                    min_width=220, elem_id="examples")
        run = gr.Button("Run", variant="primary", size="md", scale=1, min_width=90, elem_id="run")
        stop = gr.Button("Stop", variant="stop", size="md", scale=1, min_width=90, elem_id="stop")
        # Offered once a run has finished or stopped: replay it in the Replay tab or with
        # `python -m specviz replay`, anywhere, without the models.
        record = gr.DownloadButton("Download recording", value=None, interactive=False, size="sm", scale=1,
                                   min_width=170,
                                   elem_id="record")
        # A race asked for minutes ago is replayed (and says so); this measures it afresh instead.
        fresh = gr.Checkbox(False, label="Measure again", container=False, scale=0, min_width=160,
                            elem_id="fresh")

    made = []
    views = build_run_views(under_summary=lambda: made.extend(animation_buttons()))
    make_animation, animation = made
    with gr.Accordion("The run's summary as JSON (what the API's /run returns)", open=False):
        summary = gr.JSON(label="Summary", elem_id="summary-json")

    # --- events
    def on_preset(name):
        fields = preset_settings(name, presets_list)
        if not fields:
            return [gr.skip()] * 5
        chosen = fields["drafter"]
        return [fields["target"], chosen, gr.update(value=fields["draft_model"], visible=chosen == DRAFT_MODEL),
                gr.update(value=fields["exit_layer"] or 8, visible=chosen == EARLY_EXIT), fields["k"] or gr.skip()]

    private = dict(queue=False, api_visibility="private")
    preset.change(on_preset, preset, [target, drafter, draft_model, exit_layer, k], **private)
    if not limits.hosted:   # a hand-changed pair is no preset any more (`.input`: the user's changes only)
        for control in (target, drafter, draft_model, exit_layer, k):
            control.input(lambda: CUSTOM, None, preset, **private)
    drafter.change(lambda d: (gr.update(visible=d == DRAFT_MODEL), gr.update(visible=d == EARLY_EXIT),
                              gr.update(visible=d in (DRAFT_MODEL, EARLY_EXIT))),
                   drafter, [draft_model, exit_layer, branch], **private)

    def on_example(index):
        if not isinstance(index, int) or not 0 <= index < len(examples):
            return gr.skip(), gr.skip()
        example = examples[index]
        return example["prompt"], CHAT if example.get("chat", True) else RAW

    example_table.input(on_example, example_table, [prompt, prompt_format], **private)

    handler = streaming(run_work(limits, loader, memories, races))
    inputs = [prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
              max_new_tokens, seed, prompt_format, branch, fixed_k, sampling, fresh]
    # Stop is a signal the work reads, not a cancel: see `StopSignal`. (A closed page still cancels.)
    # Every visitor's work starts at once (their place in line is the first thing it shows); the races
    # themselves wait for one of `races`' slots (`runs.shared_race`).
    run_event = click_with_stop(run, stop, handler, inputs, [*views, record, summary],
                                concurrency_limit=RUN_VIEWERS, concurrency_id="run", show_progress="minimal",
                                api_name="run")
    # The animation is made from the run's recording (the Download recording button's file), as
    # `replay --animation` makes it; a new run takes the last one's away.
    make_animation.click(lambda path: animation_file(lambda: _recorded_run(path)), record, animation,
                         concurrency_limit=1, concurrency_id="animation", api_visibility="private")
    run.click(lambda: gr.update(value=None, interactive=False), None, animation, **private)
    return RunTab(prompt, run, stop, views.tokens, views.stats, run_event, (target, drafter, draft_model, k))
