"""The Teach tab: decode a short answer once, then step through it one cycle at a time, or one test
at a time (a chain's drafts in order, a tree's nodes as the target tried them), with every number
that decided each verdict (views from `views.teach`). Decoding goes through `runs.race`,
cycle by cycle, so Stop ends it within one cycle, keeping the cycles decoded so far."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import gradio as gr

from ..runs import Loader, config_label, load_stepwise, race
from ..settings import CLASSIC, Limits, RunSettings, check_prompt, validate
from ..views import explain, prose, render, teach
from ..views.export import finite_json
from .budget import check_pair_prompt
from .common import (AUTO, CHAT, CONCURRENCY_ID, DRAFT_MODEL, DRAFTERS, EARLY_EXIT, RAW, TICK, StopSignal, Throttle,
                     click_with_stop, draft_spec, error_html, failure, gpu_task, recording_button, streaming)
from .fields import NumberBox, NumberSlider

TEACH_PROMPT = "Write a short poem about the sea."
TEACH_MAX_NEW_TOKENS = 128
STOPPED = "Stopped before the first cycle."
DECODING = "Decoding\u2026"
DECODE_FIRST = "**Nothing to step through yet:** press \u201cDecode, then step through\u201d first."


class TeachView(NamedTuple):
    run: object             # teach.TeachRun in session state
    index: int
    test: int | None        # stepping test by test: the test shown (None: the whole cycle)
    tokens: str
    narrative: str
    table: str
    verification: object
    residual: object
    position: str
    last_run: object
    record: object          # the Download recording button (offered once the run is decoded)
    summary: object = None  # the decoded run as `run --json` writes it, less its cycles (None: left as it is)


def teach_view(run: teach.TeachRun, index: int, numbers=None, record=None, test: int | None = None) -> TeachView:
    view = teach.step_view(run, index, test)
    index = max(0, min(index, len(run.cycles) - 1))
    return TeachView(run, index, test, view.tokens, view.narrative, view.table, view.verification, view.residual,
                     view.position, gr.skip() if numbers is None else numbers, gr.skip() if record is None else record)


def teach_work(limits: Limits, loader: Loader | None = None):
    """The Teach tab's decode button: decode once (a TICK per cycle), keep the run in state, show its
    first cycle. Stopped (see `StopSignal`), it keeps the cycles decoded so far to step through."""

    def work(prompt, drafter, draft_model, exit_layer, k, temperature, seed, max_new_tokens,
             prompt_format, stop: StopSignal | None = None) -> Iterator[TeachView | object]:
        stop = stop or StopSignal()
        skip = gr.skip()
        try:
            # The classic algorithm, k drafted every cycle: the tab steps through each cycle's tests (the
            # cost-aware policy's plain steps would have none; the Run tab shows the policy), sampled by
            # rejection sampling, whose uniforms and residual it teaches.
            settings = validate(RunSettings(draft=draft_spec(drafter, draft_model, exit_layer), k=k, fixed_k=True,
                                            temperature=temperature, seed=seed, sampling=CLASSIC,
                                            max_new_tokens=max_new_tokens, chat=prompt_format != RAW), limits)
            prompt = check_prompt(prompt, limits)
            stopped = TeachView(None, 0, None, "", "", "", None, None, STOPPED, skip, skip)   # no earlier run's cycles
            if stop.requested:   # stopped while it waited for the queue
                yield stopped
                return
            for pair in load_stepwise(settings, loader):  # noqa: B007 - drained: its last item is the pair, a TICK per tick
                if stop.requested:   # the load goes on in the background, into the model cache
                    yield stopped
                    return
                yield TICK
            check_pair_prompt(pair, prompt, settings, limits)     # hosted: in tokens, before any decoding
            run, cut = None, False
            progress = DecodeProgress()
            for run in race(settings, prompt, pair, baseline=False, warm_up=False):
                if stop.requested:
                    cut = True
                    break
                yield progress.view(run)
            if run is None or not run.cycles:
                yield stopped
                return
            label = config_label(settings)
            view = teach_view(teach.teach_run(run, pair.tokenizer, label=label), 0,
                              explain.run_numbers(label, run.stats, calibration=prose.calibration_text(run)),
                              recording_button(run, "teach-stopped" if cut else "teach"))
            if cut:   # a Stop pressed after the last cycle leaves the run complete
                view = view._replace(position=f"Stopped after {len(run.cycles)} cycle"
                                              f"{'s' if len(run.cycles) != 1 else ''}. {view.position}")
            yield view._replace(summary=finite_json(run.to_json(cycles=False)))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            yield TeachView(skip, skip, skip, skip, error_html(failure(exc, "teach run")), skip, skip, skip, skip, skip,
                            skip)

    return work


class DecodeProgress:
    """While Teach decodes: the tokens so far and a count, at most every UPDATE_SECONDS (TICK between)."""

    def __init__(self):
        self.throttle = Throttle()
        self.cycle_html: list[str] = []

    def view(self, run) -> TeachView | object:
        if not run.cycles or not self.throttle.due()[0]:
            return TICK
        for cycle, text in zip(run.cycles[len(self.cycle_html):], run.texts[len(self.cycle_html):]):
            self.cycle_html.append(render.cycle_html(cycle, text))
        count = f"{len(run.cycles)} cycles, {run.stats.tokens} tokens"
        skip = gr.skip()
        return TeachView(skip, skip, skip, render.token_view_html(self.cycle_html, f"decoding: {count}"), skip, skip,
                         skip, skip, f"{DECODING} {count} so far; stepping starts when it is done.", skip, skip)


def step(run: teach.TeachRun | None, index: int, delta: int) -> TeachView | None:
    """Next (+1) or previous (-1) cycle of the run in state, whole; None when there is no run."""
    if not isinstance(run, teach.TeachRun) or not run.cycles:
        return None
    return teach_view(run, int(index) + delta)


def step_test(run: teach.TeachRun | None, index: int, test: int | None, delta: int) -> TeachView | None:
    """Next (+1) or previous (-1) test of the run in state (`teach.next_test`); None when there is no run."""
    if not isinstance(run, teach.TeachRun) or not run.cycles:
        return None
    index, test = teach.next_test(run, int(index), None if test is None else int(test), delta)
    return teach_view(run, index, test=test)


class TeachTab(NamedTuple):
    run: gr.Button
    previous: gr.Button
    next: gr.Button
    previous_test: gr.Button
    next_test: gr.Button
    stop: gr.Button
    state: gr.State
    index: gr.State
    tokens: gr.HTML
    narrative: gr.Markdown
    table: gr.HTML
    verification: gr.Plot
    residual: gr.Plot
    position: gr.Markdown
    run_event: object


def build_teach_tab(*, limits: Limits, loader: Loader | None = None, last_run: gr.State | None = None) -> TeachTab:
    """Step mode: decode once, then walk through the cycles one at a time."""
    gr.Markdown("Decode a short answer once, then step through it **one cycle** or **one test at a time**: each "
                "draft with its draft and target probabilities, the acceptance test and its verdict, and after a "
                "rejection the distribution the correction was drawn from (temperature 0: greedy verification).",
                elem_classes=["sv-intro"])
    with gr.Row(equal_height=False, elem_classes=["sv-band"]):
        prompt = gr.Textbox(TEACH_PROMPT, label="Prompt", lines=2, max_lines=3, scale=3, elem_id="teach-prompt")
        with gr.Column(scale=2, min_width=280):
            with gr.Accordion("Settings: drafter, k, temperature, length", open=False, elem_id="teach-settings"):
                # Teach drafts k every cycle: not 'auto', which chooses by the cost-aware policy.
                drafter = gr.Radio([d for d in DRAFTERS if d != AUTO], value=EARLY_EXIT, label="Drafter",
                                   elem_id="teach-drafter")
                draft_model = gr.Textbox(label="Draft model (any tokenizer: one unlike the target's is drafted "
                                         "across tokenizers)", visible=False,
                                         interactive=not limits.hosted)
                exit_layer = NumberSlider(1, 63, value=24, step=1, label="Early-exit layer", elem_id="teach-exit-layer")
                with gr.Row():
                    k = NumberSlider(1, 8, value=4, step=1, label="k", elem_id="teach-k")
                    temperature = NumberSlider(0.0, 2.0, value=0.8, step=0.05, label="Temperature",
                                               elem_id="teach-temperature")
                with gr.Row():
                    max_new_tokens = NumberSlider(8, min(TEACH_MAX_NEW_TOKENS, limits.max_new_tokens), value=48,
                                                  step=8, label="Max new tokens", elem_id="teach-max-new-tokens")
                    seed = NumberBox(0, precision=0, label="Seed")
                prompt_format = gr.Radio([CHAT, RAW], value=CHAT, label="Prompt format")
    with gr.Row(equal_height=False, elem_classes=["sv-actions"]):
        run = gr.Button("Decode, then step through", variant="primary", size="md", scale=2, elem_id="teach-run")
        stop = gr.Button("Stop", variant="stop", size="md", scale=1, min_width=90, elem_id="teach-stop")
        # Its place is kept from the start (offered once the run is decoded), so nothing moves.
        record = gr.DownloadButton("Download recording", value=None, interactive=False, size="sm", scale=1,
                                   min_width=170, elem_id="teach-record")
    with gr.Row(equal_height=False, elem_classes=["sv-actions"]):
        previous = gr.Button("\u25c0 Previous cycle", size="md", scale=1, min_width=120, elem_id="teach-previous")
        next_ = gr.Button("Next cycle \u25b6", variant="primary", size="md", scale=1, min_width=120,
                          elem_id="teach-next")
        previous_test = gr.Button("\u25c0 Previous test", size="md", scale=1, min_width=110,
                                  elem_id="teach-previous-test")
        next_test = gr.Button("Next test \u25b6", size="md", scale=1, min_width=110, elem_id="teach-next-test")
    position = gr.Markdown("No run yet: press \u201cDecode, then step through\u201d.", elem_id="teach-position")
    with gr.Row(elem_classes=["sv-race"]):
        tokens = gr.HTML(render.token_view_html([]), padding=False, elem_id="teach-tokens")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            narrative = gr.Markdown("", latex_delimiters=explain.LATEX_DELIMITERS, elem_id="teach-narrative")
        with gr.Column(scale=3):
            table = gr.HTML("", elem_id="teach-table")
    with gr.Row():
        verification = gr.Plot(show_label=False, elem_id="teach-verification")
        residual = gr.Plot(show_label=False, elem_id="teach-residual")
    state = gr.State(None)
    index = gr.State(0)
    test = gr.State(None)
    numbers = last_run if last_run is not None else gr.State(None)

    private = dict(queue=False, api_visibility="private")
    drafter.change(lambda d: (gr.update(visible=d == DRAFT_MODEL), gr.update(visible=d == EARLY_EXIT)),
                   drafter, [draft_model, exit_layer], **private)
    view_outputs = [state, index, test, tokens, narrative, table, verification, residual, position]
    with gr.Accordion("The run's summary as JSON (what the API's /teach returns)", open=False):
        summary = gr.JSON(label="Summary", elem_id="teach-summary-json")

    def with_summary(*args):
        for view in teach_work(limits, loader)(*args):
            yield view if view is TICK else [*view[:-1], gr.skip() if view.summary is None else view.summary]

    run_event = click_with_stop(run, stop, streaming(gpu_task(with_summary)),
                                [prompt, drafter, draft_model, exit_layer, k, temperature, seed, max_new_tokens,
                                 prompt_format], view_outputs + [numbers, record, summary], concurrency_limit=1,
                                concurrency_id=CONCURRENCY_ID, show_progress="minimal", api_name="teach")

    def stepper(by_test: bool, delta: int):
        def on_click(run_value, index_value, test_value):
            view = (step_test(run_value, index_value, test_value, delta) if by_test
                    else step(run_value, index_value, delta))
            if view is None:   # said in the page: a toast needs the queue, which stepping skips
                return [gr.skip()] * (len(view_outputs) - 1) + [DECODE_FIRST]
            return list(view)[: len(view_outputs)]
        return on_click

    for button, by_test, delta in ((next_, False, +1), (previous, False, -1), (next_test, True, +1),
                                   (previous_test, True, -1)):
        button.click(stepper(by_test, delta), [state, index, test], view_outputs, **private)
    return TeachTab(run, previous, next_, previous_test, next_test, stop, state, index, tokens, narrative, table,
                    verification, residual, position, run_event)
