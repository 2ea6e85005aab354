"""The Load tab: speculation under load. Batched speculative decoding against batched plain decoding
at each batch size and draft length (`runs.load.sweep`), on a shipped prompt set: the batch in
progress streams as one small token view per request, and the charts grow as each point finishes.

Everything the user chose is checked before any work: the lists, the drafter (batched decoding drafts
with prompt lookup, a draft model or early exit; trees and suffix decoding are refused with the
library's message) and, hosted, the caps of `budget.check_load_caps`; the total work, in tokens, as
soon as the pair's tokenizer is loaded and before anything is decoded.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import NamedTuple

import gradio as gr

from ..catalog import preset_prompt_sets
from ..core.events import BatchCycle
from ..errors import SpecvizError
from ..models.tokens import Detokenizer
from ..runs import Loader, load_stepwise
from ..runs.load import LoadProgress, check_draft_spec, check_drafter, sweep
from ..runs.load_result import batch_prompts
from ..runs.run import cycle_text, encode
from ..settings import Limits, RunSettings, validate, whole_numbers
from ..views import render
from ..views.engine_view import acceptance_figure
from ..views.export import finite_json
from ..views.engines_side_by_side import (EngineRun, acceptance_length_figure, lesson, side_by_side_html,
                                          speedup_by_engine_figure, step_cost_figure)
from ..views.load_view import decision, load_figures, outputs_note, rows_html
from ..views.render import cycle_html
from .budget import check_load_caps, check_load_work, check_prompt_tokens, load_work, prompt_tokens
from .common import (CONCURRENCY_ID, DRAFT_MODEL, EARLY_EXIT, PROMPT_LOOKUP, TICK, StopSignal, Throttle,
                     click_with_stop, draft_spec, error_html, failure, gpu_task, slider_max_new_tokens, streaming)
from .fields import NumberSlider
from .load_engine import LLAMACPP, OWN, VLLM, Outcome, engine_work, offered_engines

DRAFTERS = [PROMPT_LOOKUP, DRAFT_MODEL, EARLY_EXIT]     # the drafters batched decoding drafts with
DEFAULT_BATCHES, DEFAULT_KS = "1,2,4", "0,2,4"         # small enough for a CPU
DEFAULT_SET = "rewrite"                                 # prompt lookup's best case: the answer copies the prompt
DEFAULT_NEW_TOKENS = 32
MAX_BATCH, MAX_K = 64, 64                               # as the command line allows
LOAD_GPU_SECONDS = 300                                  # ZeroGPU time for one sweep
NO_DECISION = "The decision appears here once a batch size is measured."


class LoadView(NamedTuple):
    """What the Run button's work yields, in the order of its outputs."""
    status: str
    rows: object
    speedup: object
    throughput: object
    latency: object
    decision: object
    acceptance: object = None     # vLLM's acceptance by draft position (the own loop leaves it as it is)
    summary: object = None        # the sweep so far as `load --json` writes it (None: left as it is)


def _only_status(status: str) -> LoadView:
    skip = gr.skip()
    return LoadView(status=status, rows=skip, speedup=skip, throughput=skip, latency=skip, decision=skip,
                    acceptance=skip)


def result_view(progress: LoadProgress, state: str, headline: str, rows: object) -> LoadView:
    """The charts and the decision of the sweep so far."""
    speedup, throughput, latency = load_figures(progress.result)
    return LoadView(status=render.status_html(state, headline), rows=rows, speedup=speedup, throughput=throughput,
                    latency=latency,
                    decision="\n\n".join(filter(None, [decision(progress.result) or NO_DECISION,
                                                         outputs_note(progress.result)])),
                    acceptance=gr.skip(), summary=finite_json(progress.result.to_dict()))


def _points(progress: LoadProgress) -> str:
    count = len(progress.result.points)
    return f"{count} point{'s' if count != 1 else ''}"


class BatchRows:
    """The token views of the batch in progress: each speculative row's cycles as HTML, its text
    decoded in context by its own Detokenizer. A new (batch, k, repeat) starts afresh."""

    def __init__(self, tokenizer, ids: list[list[int]]):
        self.tokenizer, self.ids = tokenizer, ids
        self.key = None

    def add(self, progress: LoadProgress) -> None:
        event = progress.event
        if event is None:    # a finished point: the rows stay as its last forward left them
            return
        key = (progress.batch, progress.k, progress.repeat)
        if key != self.key:
            self.key = key
            rows = [self.ids[i % len(self.ids)] for i in range(progress.batch)]
            self.detoks = [Detokenizer(self.tokenizer, ids) for ids in rows]
            self.cycles = [[] for _ in rows]
            self.tokens = [0] * len(rows)
            self.plain = [0] * len(rows)
        if isinstance(event, BatchCycle):
            for row, cycle in zip(event.requests, event.cycles):
                self.cycles[row].append(cycle_html(cycle, cycle_text(cycle, self.detoks[row])))
                self.tokens[row] += len(cycle.emitted)
        else:
            for row in event.requests:
                self.plain[row] += 1

    def html(self) -> str:
        batch, k, _ = self.key
        title = (f"Batch {batch}, k = {k}: each request's speculative tokens as they are verified (plain decoding of "
                 "the same batch takes turns with it)" if k else f"Batch {batch}: plain decoding only (k = 0)")
        statuses = [f"{t} tokens \u00b7 {len(c)} passes \u00b7 plain {p}"
                    for t, c, p in zip(self.tokens, self.cycles, self.plain)]
        return rows_html(title, self.cycles, statuses)


ALL = "All three, one after the other (the same drafter, prompts and batch sizes on each)"
ALL_ENGINES = ((OWN, "specviz's loop"), (VLLM, "vLLM"), (LLAMACPP, "llama.cpp"))


def engine_choices(limits: Limits) -> list[str]:
    """The Load tab's engine choices: the offered engines, and all three together when all are offered."""
    engines = offered_engines(limits)
    return engines + [ALL] * (len(engines) == len(ALL_ENGINES))


def all_engines_work(run_one, drafter: str, limits: Limits, stop: StopSignal) -> Iterator[LoadView | object]:
    """The same sweep on each engine in turn (`run_one(choice, outcome, dtype)` is the tab's own work for
    one engine), each engine's own views while it runs, then the three side by side
    (`views.engines_side_by_side`). Each engine runs in its serving dtype, which the table says: on a CPU
    vLLM gets the dtype the own loop chose ("auto" there: float32), so both do the same arithmetic; on a
    GPU vLLM serves in its own "auto" (`load_engine.make_engine`); llama.cpp runs the GGUF as stored. An
    engine that fails leaves its reason in the table; the others run."""
    if drafter not in (PROMPT_LOOKUP, DRAFT_MODEL):
        yield _only_status(error_html("All three engines draft with prompt lookup or a draft model: early exit "
                                      "runs only in specviz's own loop."))
        return
    if ALL not in engine_choices(limits):
        yield _only_status(error_html("This app does not offer all three engines (vLLM or llama.cpp is off here)."))
        return
    runs: list[EngineRun] = []
    dtype = "auto"
    for number, (choice, title) in enumerate(ALL_ENGINES, 1):
        outcome = Outcome()
        step = f"<div class='sv-engines-step'>Engine {number} of {len(ALL_ENGINES)}: {html.escape(title)}</div>"
        for view in run_one(choice, outcome, dtype):
            yield view if view is TICK else view._replace(status=step + view.status)
        if choice == OWN and not limits.hosted and getattr(outcome.result, "settings", None):   # hosted: auto
            dtype = outcome.result.settings.get("dtype") or dtype
        runs.append(EngineRun(title, outcome.result if getattr(outcome.result, "points", None) else None,
                              outcome.error))
        if stop.requested:
            break
    finished = f"Stopped after {len(runs)} of 3 engines." if stop.requested else "Finished: three engines."
    yield LoadView(status=render.status_html("One drafter on three engines", finished),
                   rows=side_by_side_html(runs), speedup=speedup_by_engine_figure(runs),
                   throughput=step_cost_figure(runs), latency=acceptance_length_figure(runs),
                   decision=lesson(runs) or "No engine measured a speculative point.", acceptance=gr.skip())


def load_work_fn(limits: Limits, loader: Loader | None = None):
    """The Run button's work (see `common.streaming`): a view after each finished point, the batch's
    rows at most every UPDATE_SECONDS in between, TICKs after every other forward."""

    def work(drafter, draft_model, exit_layer, batches_text, ks_text, set_name, max_new_tokens, engine=OWN,
             stop: StopSignal | None = None, outcome: Outcome | None = None,
             dtype: str = "auto") -> Iterator[LoadView | object]:
        stop = stop or StopSignal()
        outcome = outcome if outcome is not None else Outcome()
        if engine == ALL:
            yield from all_engines_work(
                lambda choice, ended, dtype: work(drafter, draft_model, exit_layer, batches_text, ks_text, set_name,
                                                  max_new_tokens, choice, stop, ended, dtype), drafter, limits, stop)
            return
        if engine in (VLLM, LLAMACPP):
            yield from engine_work(LoadView, limits, drafter, draft_model, batches_text, ks_text, set_name,
                                   max_new_tokens, stop, engine, outcome, dtype)
            return
        stream = None
        try:
            batches = whole_numbers("Batch sizes", batches_text, 1, MAX_BATCH)
            ks = whole_numbers("Draft lengths k", ks_text, 0, MAX_K)
            settings = validate(RunSettings(draft=draft_spec(drafter, draft_model, exit_layer), k=max(max(ks), 1),
                                            max_new_tokens=max_new_tokens, temperature=0.0, dtype=dtype), limits)
            check_draft_spec(settings)
            check_load_caps(batches, ks, settings.max_new_tokens, limits)
            sets = preset_prompt_sets()
            if set_name not in sets:
                raise SpecvizError(f"No prompt set {set_name!r}: choose one of {', '.join(sets)}.")
            prompts = sets[set_name]
            state = (f"Batch sizes {', '.join(map(str, batches))}; k {', '.join(map(str, ks))}; the {set_name!r} set; "
                     f"{settings.max_new_tokens} new tokens")
            yield _only_status(render.status_html(state, "Loading the models\u2026"))
            pair = None
            for item in load_stepwise(settings, loader):
                if stop.requested:
                    yield _only_status(render.status_html(state, "Stopped before the sweep began."))
                    return
                if item is None or isinstance(item, str):
                    yield TICK
                else:
                    pair = item
            check_drafter(pair)
            chosen = batch_prompts(prompts, max(batches))
            counts = [prompt_tokens(pair.tokenizer, p.prompt, settings.chat) for p in chosen]
            for prompt, count in zip(chosen, counts):
                check_prompt_tokens(count, limits, f"Prompt {prompt.id!r}")
            check_load_work(load_work(counts, batches, ks, settings.max_new_tokens), limits)
            rows = BatchRows(pair.tokenizer, [encode(settings, p.prompt, pair)[0].tolist() for p in prompts])
            throttle = Throttle()
            stream = sweep(settings, prompts, pair, batches=batches, ks=ks)
            progress = None
            for progress in stream:
                outcome.result = progress.result
                if stop.requested:   # the points that finished stay; the one in progress is dropped
                    yield result_view(progress, state, f"Stopped after {_points(progress)}.",
                                      gr.skip())
                    return
                rows.add(progress)
                if progress.point is not None:
                    yield result_view(progress, state, f"{_points(progress)} measured\u2026", rows.html())
                elif progress.event is not None and throttle.due()[0]:
                    yield _only_status(render.status_html(state, f"Measuring batch {progress.batch}, k = "
                                                                 f"{progress.k}\u2026"))._replace(rows=rows.html())
                elif progress.event is not None:
                    yield TICK
            yield result_view(progress, state, "Finished.", gr.skip())
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            outcome.error = failure(exc, "load sweep")
            yield _only_status(error_html(outcome.error))
        finally:
            if stream is not None:   # a Stop ends the sweep within the forward in flight
                stream.close()

    return work


# ----------------------------------------------------------------------------- layout

class LoadTab(NamedTuple):
    run: gr.Button
    stop: gr.Button
    status: gr.HTML
    rows: gr.HTML
    plots: list
    decision: gr.Markdown
    event: object
    settings: tuple = ()       # drafter, draft model, batch sizes, k, engine: what another tab may fill in


def build_load_tab(*, limits: Limits, loader: Loader | None = None) -> LoadTab:
    """Speculation under load: the sweep's settings in a closed panel, Run and Stop, then the batch in
    progress, the decision and the three charts."""
    sets = list(preset_prompt_sets())
    with gr.Row(equal_height=False, elem_classes=["sv-band"]):
        gr.Markdown("Does speculation still pay when several requests share the model? Each batch size decodes "
                    "the first requests of a prompt set together, speculatively and plainly, taking turns on the "
                    "same clock.", elem_id="load-intro")
        with gr.Column(scale=1, min_width=280):
            with gr.Accordion("Settings: drafter, batch sizes, k, prompts", open=False, elem_id="load-settings"):
                drafter = gr.Radio(DRAFTERS, value=PROMPT_LOOKUP, label="Drafter", elem_id="load-drafter")
                draft_model = gr.Textbox(label="Draft model (with the target's tokenizer: the sweep does not draft "
                                               "across tokenizers)", visible=False, elem_id="load-draft-model")
                exit_layer = NumberSlider(1, 63, value=8, step=1, label="Early-exit layer", visible=False,
                                          elem_id="load-exit-layer")
                batches = gr.Textbox(DEFAULT_BATCHES, label="Batch sizes" + (
                    " (hosted: at most 4)" if limits.hosted else ""), elem_id="load-batches")
                ks = gr.Textbox(DEFAULT_KS, label="Draft lengths k (0 = speculation off)" + (
                    ", hosted: at most 8" if limits.hosted else ""), elem_id="load-ks")
                prompt_set = gr.Dropdown(sets, value=DEFAULT_SET if DEFAULT_SET in sets else sets[0],
                                         label="Prompt set (a batch of B takes its first B, cycled)",
                                         elem_id="load-set")
                top = min(slider_max_new_tokens(limits), 64 if limits.hosted else 256)
                max_new_tokens = NumberSlider(8, top, value=DEFAULT_NEW_TOKENS, step=8, label="Max new tokens",
                                              elem_id="load-max-new-tokens")
                engines = engine_choices(limits)
                engine = gr.Radio(engines, value=OWN, label="Engine (vLLM, llama.cpp: one server per configuration; "
                                  "SPECVIZ_VLLM_PYTHON names vLLM's environment)", visible=len(engines) > 1,
                                  elem_id="load-engine")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="load-run")
                stop = gr.Button("Stop", variant="stop", elem_id="load-stop")
    status = gr.HTML("", elem_id="load-status")
    verdict = gr.Markdown(NO_DECISION, elem_id="load-decision")
    rows = gr.HTML("", elem_id="load-rows")
    speedup_figure, throughput_figure, latency_figure = load_figures(None)
    speedup = gr.Plot(speedup_figure, show_label=False, elem_id="load-chart-speedup")
    with gr.Row():
        throughput = gr.Plot(throughput_figure, show_label=False, elem_id="load-chart-throughput")
        latency = gr.Plot(latency_figure, show_label=False, elem_id="load-chart-latency")
    acceptance = gr.Plot(acceptance_figure(None), show_label=False, visible=False, elem_id="load-chart-acceptance")

    drafter.change(lambda d: (gr.update(visible=d == DRAFT_MODEL), gr.update(visible=d == EARLY_EXIT)), drafter,
                   [draft_model, exit_layer], queue=False, api_visibility="private")
    # A serving engine drafts with prompt lookup or a draft model; its acceptance chart replaces nothing, it is added.
    engine.change(lambda e: gr.update(visible=e in (VLLM, LLAMACPP)), engine, acceptance, queue=False,
                  api_visibility="private")
    inputs = [drafter, draft_model, exit_layer, batches, ks, prompt_set, max_new_tokens, engine]
    with gr.Accordion("The sweep as JSON (what the API's /load returns)", open=False):
        summary = gr.JSON(label="Sweep", elem_id="load-summary-json")
    outputs = [status, rows, speedup, throughput, latency, verdict, acceptance, summary]

    def flat_work(*args):
        views = load_work_fn(limits, loader)(*args)
        try:
            for view in views:
                yield view if view is TICK else [*view[:-1], gr.skip() if view.summary is None else view.summary]
        finally:
            views.close()   # a Stop or a closed page closes the sweep too

    handler = streaming(gpu_task(flat_work, duration=LOAD_GPU_SECONDS))
    event = click_with_stop(run, stop, handler, inputs, outputs, concurrency_limit=1, concurrency_id=CONCURRENCY_ID,
                            show_progress="minimal", api_name="load")
    return LoadTab(run, stop, status, rows, [speedup, throughput, latency, acceptance], verdict, event,
                   (drafter, draft_model, batches, ks, engine))
