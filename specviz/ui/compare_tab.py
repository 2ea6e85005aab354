"""The Compare tab: 2 to 4 configurations on one prompt against one plain baseline, or a k sweep of
the first, through `runs.compare`; and the export of the last comparison as files.

Exports go to one fresh folder each (`common.export_folder`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import gradio as gr

from ..errors import SpecvizError
from ..runs import Comparison, Loader, PromptSetComparison, Sweep, config_label, iter_comparison, iter_sweep
from ..runs.run import load
from ..settings import Limits, RunSettings, check_prompt, flag, validate, whole_number
from ..views import explain, prompt_sets, prose, render
from ..views.export import export_comparison, finite_json
from ..views.export import summary as comparison_summary
from ..views.figures import comparison_figures, sweep_figure
from ..views.prompt_sets import write_files as write_set_files
from ..views.prose import (SWEEP_HEADERS, sweep_line, sweep_rows, table_headers, table_rows, timing_note,
                           winner_parts)
from .budget import check_comparison_prompt, load_tokenizers
from .common import (CHAT, CONCURRENCY_ID, RAW, TICK, StopSignal, Throttle, click_with_stop, error_html, export_folder,
                     failure, gpu_task, slider_max_new_tokens, streaming)
from .compare_sets import (FROM_FILE, MAX_REPEATS, ONE_PROMPT, full_view, prompts_for, set_stream, sources)
from .load_engine import OWN, engine_set_stream, offered_engines
from .fields import NumberBox, NumberSlider

MAX_CONFIGS = 4
COMPARE_GPU_SECONDS = 300          # ZeroGPU time for a comparison or a sweep (several runs in one call)
CONFIG_HEADERS = ["use", "target (blank: built-in)", "draft", "k", "dynamic k", "temperature", "tree branch",
                  "fixed k"]
# The default decides something: one fast drafter against plain decoding, on a prompt whose answer is
# long enough to measure (the Run tab's opening example). The other rows wait, unticked.
DEFAULT_CONFIGS = [
    [True, "", "ngram", 4, False, 0.0, 1, False],
    [False, "", "ngram", 4, True, 0.0, 1, False],
    [False, "", "self:20", 4, False, 0.0, 1, False],
    [False, "", "self:12", 2, False, 0.0, 2, False],
]
DRAFT_HELP = ("**draft**: `ngram` (prompt lookup), `ngram-tree` (prompt lookup as a token tree), `suffix` (suffix "
              "decoding), `self:L` (the target's first L layers, early exit) or a model "
              "id / folder (one with another tokenizer drafts across tokenizers). **dynamic k**: +2 after a "
              "fully accepted cycle, \u22121 "
              "after a rejection. **fixed k**: draft k tokens every cycle (the classic algorithm); unticked, the "
              "cost-aware policy drafts 0 to k, as many as pay. **temperature** 0 is greedy. **tree branch** "
              "above 1 (draft models, `self:L`, "
              "`head`): an EAGLE-2 token tree of 16 nodes. Each configuration runs in turn on the same "
              "device against one plain-decoding baseline.")
DEFAULT_PROMPT = ("Correct the spelling mistakes in this text and return the whole corrected text:\n\n\"Our team will "
                  "meet on Monday morning to discus the new project plan. Please bring your notes, your laptop, and "
                  "any questions you have about the schedule. We will also review the budget and decide who will "
                  "write the first report. The meeting will start at nine o'clock in the main room on the second "
                  "floor, and it should finish before lunch.\"")


def parse_configs(rows, *, max_new_tokens, seed, chat: bool, limits: Limits) -> list[RunSettings]:
    """The configuration table's ticked rows as validated settings (SpecvizError names the row)."""
    if hasattr(rows, "values") and hasattr(rows, "columns"):   # a pandas DataFrame
        rows = rows.values.tolist()
    if isinstance(rows, dict):                                   # the API's {"headers": ..., "data": ...}
        rows = rows.get("data") or []
    configs = []
    for n, row in enumerate(rows or [], start=1):
        if not isinstance(row, (list, tuple)):
            raise SpecvizError(f"Row {n} of the configurations is not a row.")
        row = list(row) + [None] * (len(CONFIG_HEADERS) - len(row))
        use, target, draft, k, dynamic_k, temperature, branch, fixed_k = row[: len(CONFIG_HEADERS)]
        if not flag(use):
            continue
        # A blank k or temperature cell means the default; validate reads blank target and draft cells.
        settings = RunSettings(target=target, draft=draft, k=4 if k in (None, "") else k, dynamic_k=dynamic_k,
                               fixed_k=flag(fixed_k),
                               temperature=0.0 if temperature in (None, "") else temperature,
                               seed=seed, max_new_tokens=max_new_tokens, chat=chat,
                               branch=1 if branch in (None, "") else branch)
        try:
            configs.append(validate(settings, limits))
        except SpecvizError as exc:
            raise SpecvizError(f"Row {n}: {exc}") from None
    if not configs:
        raise SpecvizError("Tick \u201cuse\u201d on at least one configuration.")
    if len(configs) > MAX_CONFIGS:
        raise SpecvizError(f"Compare at most {MAX_CONFIGS} configurations at once ({len(configs)} are ticked).")
    return configs


# ----------------------------------------------------------------------------- views

def column_html(label: str, run) -> str:
    """One configuration's token view: its label, numbers, and every cycle's tokens."""
    s = run.stats
    status = (f"{s.tokens} tokens \u00b7 {s.tokens_per_cycle:.2f} per pass \u00b7 "
              f"{s.tokens_per_second:.1f} tokens/s \u00b7 {run.speedup or 0:.2f}\u00d7 ({run.clock})")
    if s.draft_tokens_per_target_token is not None:       # drafted across tokenizers
        status += f" \u00b7 {s.draft_tokens_per_target_token:.2f} draft tokens per target token"
    return render.panel_html(label, status, "".join(render.run_cycles_html(run)), kind="spec")


def pending_html(label: str, note: str = "waiting") -> str:
    return render.panel_html(label, note, "", kind="spec", placeholder="Runs after the configurations before it.")


class CompareView(NamedTuple):
    """What the Compare and Sweep handlers yield, in the order of their outputs."""
    status: str
    table: str
    columns: tuple          # MAX_CONFIGS column updates
    tokens_per_pass: object
    positions: object
    race: object
    sweep: object           # the sweep figure (hidden after a plain comparison)
    result: object          # (Comparison or PromptSetComparison, Sweep | None), for the export button
    last_run: object
    set_plot: object = None # per-prompt speedups (a comparison over a set of prompts only)


def compare_view(comparison: Comparison, sweep: Sweep | None = None, *, state: str = "") -> CompareView:
    figures = comparison_figures(comparison)
    why = ""
    if comparison.done:   # the answer short, in the headline; why, under it
        headline, why = winner_parts(comparison)
        headline += "" if not why or headline.endswith(".") else "."
        why = why[:1].upper() + why[1:] + "." if why else ""
    else:
        headline = f"{len(comparison.results)} of {len(comparison.configs)} done\u2026"
    swept = sweep is not None and sweep.points
    notes = [why, sweep_line(sweep) if swept else "", timing_note(comparison.results)]
    status = render.status_html(state, headline, " ".join(n for n in notes if n))
    table = render.table_html(table_headers(comparison), table_rows(comparison), label="comparison summary")
    if swept:
        table += render.table_html(SWEEP_HEADERS, sweep_rows(sweep), label="k sweep")
    columns = []
    for i in range(MAX_CONFIGS):
        if sweep is not None or i >= len(comparison.configs):
            columns.append(gr.update(visible=False))
        elif i < len(comparison.results):
            columns.append(gr.update(value=column_html(comparison.labels[i], comparison.results[i]), visible=True))
        else:
            note = "running\u2026" if i == len(comparison.results) else "waiting"
            columns.append(gr.update(value=pending_html(comparison.labels[i], note), visible=True))
    best = max(comparison.results, key=lambda r: r.speedup or 0.0, default=None)
    if best is not None:
        label = comparison.labels[comparison.results.index(best)]
        numbers = explain.run_numbers(label, best.stats, best.speedup, best.theory_at_pass_cost, best.clock,
                                      prose.calibration_text(best))
    else:
        numbers = gr.skip()
    sweep_plot = gr.update(value=sweep_figure(sweep), visible=True) if sweep is not None else gr.update(visible=False)
    shown = {name: gr.update(value=figure, visible=True) for name, figure in figures.items()}
    return CompareView(status=status, table=table, columns=tuple(columns), tokens_per_pass=shown["tokens_per_pass"],
                       positions=shown["acceptance_by_position"], race=shown["tokens_against_time"], sweep=sweep_plot,
                       result=(comparison, sweep), last_run=numbers, set_plot=gr.update(visible=False))


def _only_status(status: str) -> CompareView:
    skip = gr.skip()
    return CompareView(status=status, table=skip, columns=(skip,) * MAX_CONFIGS, tokens_per_pass=skip, positions=skip,
                       race=skip, sweep=skip, result=skip, last_run=skip, set_plot=skip)


def _set_view(status, table, plot, result) -> CompareView:
    """A view of a comparison over a set of prompts: the single-prompt columns and charts step aside."""
    skip, hidden = gr.skip(), gr.update(visible=False)
    return CompareView(status=status, table=skip if table is None else table, columns=(hidden,) * MAX_CONFIGS,
                       tokens_per_pass=hidden, positions=hidden, race=hidden, sweep=hidden,
                       result=skip if result is None else result, last_run=skip,
                       set_plot=skip if plot is None else plot)


def compare_work(limits: Limits, loader: Loader | None = None, *, sweep: bool = False):
    """The Compare (or, with `sweep`, the k sweep) button's work: a view after each finished
    configuration, a progress line in between, TICKs after every other event."""

    def work(prompt, rows, max_new_tokens, seed, prompt_format, source=ONE_PROMPT, upload=None,
             repeats=1, engine=OWN, stop: StopSignal | None = None) -> Iterator[CompareView | object]:
        stop = stop or StopSignal()
        try:
            configs = parse_configs(rows, max_new_tokens=max_new_tokens, seed=seed, chat=prompt_format != RAW,
                                    limits=limits)
            if source != ONE_PROMPT and not sweep:
                prompts = prompts_for(source, upload, limits)
                if engine != OWN:
                    yield from engine_set_stream(configs, prompts, whole_number("rounds", repeats, 1, MAX_REPEATS),
                                                 limits, _set_view, full_view, stop, engine)
                    return
                yield from set_stream(configs, prompts, repeats, limits, loader, _set_view, stop)
                return
            prompt = check_prompt(prompt, limits)
            if sweep:
                state = f"k sweep of {config_label(configs[0])}: k = 1..8 against one plain baseline"
                stream = iter_sweep(configs[0], prompt, loader=loader or load)
            else:
                state = (f"{len(configs)} configuration{'s' if len(configs) > 1 else ''}, one after another, "
                         "against one plain baseline")
                stream = iter_comparison(configs, prompt, loader=loader or load)
            yield _only_status(render.status_html(state, "Running\u2026 (the first run also loads the models)"))
            if limits.max_prompt_tokens is not None:     # counted with each target's tokenizer, before decoding
                measured = configs[:1] if sweep else configs
                tokenizers = yield from load_tokenizers(measured, loader)
                check_comparison_prompt(tokenizers, measured, prompt, limits)
            finished, throttle = 0, Throttle()
            for item in stream:
                comparison = item.comparison if sweep else item
                if stop.requested:   # the runs that finished stay; the one in progress is dropped
                    done = f"Stopped after {len(comparison.results)} of {len(comparison.configs)} configurations."
                    yield (compare_view(comparison, item if sweep else None, state=state)._replace(
                        status=render.status_html(state, done)) if comparison.results
                           else _only_status(render.status_html(state, done)))
                    return
                if len(comparison.results) > finished:
                    finished = len(comparison.results)
                    yield compare_view(comparison, item if sweep else None, state=state)
                elif comparison.current is not None and throttle.due()[0]:
                    run = comparison.current
                    label = comparison.labels[len(comparison.results)]
                    yield _only_status(render.status_html(state, f"{len(comparison.results)} of "
                                                          f"{len(comparison.configs)} done\u2026 {label}: "
                                                          f"{len(run.tokens)} tokens so far"))
                else:
                    yield TICK
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            yield _only_status(error_html(failure(exc, "comparison")))

    return work


# ----------------------------------------------------------------------------- export

def export_files(result, png=False) -> tuple[list[str], str]:
    """The last comparison's files, in a fresh folder (older export folders are removed)."""
    comparison, sweep = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
    if isinstance(comparison, PromptSetComparison) and comparison.results:
        return [str(path) for path in write_set_files(comparison, export_folder())], ""
    if not isinstance(comparison, Comparison) or not comparison.results:
        raise SpecvizError("Nothing to export yet: run a comparison or a k sweep first.")
    figures = comparison_figures(comparison)
    if sweep is not None:
        figures["k_sweep"] = sweep_figure(sweep)
    folder = export_folder()
    written, note = export_comparison(comparison, folder, figures=figures, sweep=sweep, png=bool(png))
    return [str(path) for path in written], note


def comparison_json(result) -> object:
    """The comparison so far as named JSON: `compare --export`'s summary.json for one prompt (with the
    sweep's points), `compare --prompts --json`'s summary for a set; left as it is before any result."""
    comparison, sweep = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
    if isinstance(comparison, PromptSetComparison) and comparison.results:
        return finite_json(prompt_sets.summary(comparison))
    if isinstance(comparison, Comparison) and comparison.results:
        return finite_json(comparison_summary(comparison, sweep=sweep))
    return gr.skip()


def export_work(result, with_png):
    try:
        paths, note = export_files(result, png=with_png)
    except Exception as exc:  # noqa: BLE001 - a message, not a traceback
        gr.Warning(failure(exc, "export"))
        return gr.skip()
    if note:
        gr.Info(note)
    return gr.update(value=paths, visible=True)


# ----------------------------------------------------------------------------- layout

class CompareTab(NamedTuple):
    prompt: gr.Textbox
    configs: gr.Dataframe
    compare: gr.Button
    sweep: gr.Button
    stop: gr.Button
    status: gr.HTML
    table: gr.HTML
    columns: list
    plots: list
    sweep_plot: gr.Plot
    result: gr.State
    files: gr.File
    events: list


def build_compare_tab(*, limits: Limits, loader: Loader | None = None, last_run: gr.State | None = None) -> CompareTab:
    """Compare 2 to 4 configurations on one prompt, or sweep k for the first one."""
    # The band: the prompt, and every setting in a closed panel beside it (by default one fast drafter
    # against plain decoding); under them the buttons. Results start right below.
    with gr.Row(equal_height=False, elem_classes=["sv-band"]):
        prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=3, max_lines=3, scale=3, elem_id="cmp-prompt")
        with gr.Column(scale=2, min_width=280):
            with gr.Accordion("Settings: configurations, prompts, length", open=False,
                              elem_id="cmp-settings"):
                configs = gr.Dataframe(value=DEFAULT_CONFIGS, headers=CONFIG_HEADERS,
                                       datatype=["bool", "str", "str", "number", "bool", "number", "number", "bool"],
                                       row_count=(MAX_CONFIGS, "fixed"), column_count=(len(CONFIG_HEADERS), "fixed"),
                                       type="array", interactive=True, label="Configurations (tick up to four)",
                                       elem_id="cmp-configs")
                gr.Markdown(DRAFT_HELP + " **Sweep k** runs the first ticked row at k = 1..8.")
                max_new_tokens = NumberSlider(8, slider_max_new_tokens(limits), value=96, step=8,
                                              label="Max new tokens", elem_id="cmp-max-new-tokens")
                seed = NumberBox(0, precision=0, label="Seed (sampled configurations)")
                prompt_format = gr.Radio([CHAT, RAW], value=CHAT, label="Prompt format")
                source = gr.Dropdown(sources(limits), value=ONE_PROMPT, label="Prompts",
                                     info="one prompt, or a set: the median speedup over it, with a 95% interval",
                                     elem_id="cmp-source")
                upload = gr.File(label="Prompt file (.txt: one per line; .jsonl: \"prompt\", \"category\")",
                                 file_types=[".txt", ".jsonl"], visible=False, elem_id="cmp-upload")
                repeats = NumberSlider(1, MAX_REPEATS, value=1, step=1, label="Rounds over the set",
                                       elem_id="cmp-repeats")
                engine = gr.Radio(offered_engines(limits), value=OWN, label="Engine over a prompt set (vLLM, "
                                  "llama.cpp: one server per configuration against its plain server, concurrency 1)",
                                  visible=len(offered_engines(limits)) > 1, elem_id="cmp-engine")
    with gr.Row(equal_height=False, elem_classes=["sv-actions"]):
        run = gr.Button("Compare", variant="primary", size="md", scale=2, elem_id="cmp-run")
        run_sweep = gr.Button("Sweep k = 1..8", size="md", scale=1, min_width=140, elem_id="cmp-sweep")
        stop = gr.Button("Stop", variant="stop", size="md", scale=1, min_width=90, elem_id="cmp-stop")
    status = gr.HTML('<div class="sv-stats sv-idle">Press <b>Compare</b>: each ticked configuration decodes the '
                     'prompt in turn, and all are measured against one plain-decoding run.</div>', elem_id="cmp-status")
    table = gr.HTML("", elem_id="cmp-table")
    gr.HTML(render.legend_html(), padding=False)
    with gr.Row(equal_height=False, elem_classes=["sv-compare"]):
        columns = [gr.HTML(pending_html(config_label(RunSettings(draft=row[2], k=row[3], dynamic_k=row[4]))),
                           visible=bool(row[0]), elem_id=f"cmp-column-{i}") for i, row in enumerate(DEFAULT_CONFIGS)]
    sweep_plot = gr.Plot(show_label=False, visible=False, elem_id="cmp-sweep-chart")
    set_plot = gr.Plot(show_label=False, visible=False, elem_id="cmp-set-chart")
    empty = comparison_figures(Comparison("", [], []))
    with gr.Row():
        per_pass = gr.Plot(empty["tokens_per_pass"], show_label=False, elem_id="cmp-chart-per-pass")
        positions = gr.Plot(empty["acceptance_by_position"], show_label=False, elem_id="cmp-chart-positions")
    race = gr.Plot(empty["tokens_against_time"], show_label=False, elem_id="cmp-chart-race")
    with gr.Row():
        png = gr.Checkbox(False, label="PNG charts too (slower; needs kaleido and Chrome or Chromium)")
        export = gr.Button("Export cycles, summary and charts", elem_id="cmp-export")
    files = gr.File(label="Exported files", file_count="multiple", interactive=False, visible=False,
                    elem_id="cmp-files")
    with gr.Accordion("The comparison's summary as JSON (what the API's /compare and /sweep return)", open=False):
        summary = gr.JSON(label="Summary", elem_id="cmp-summary-json")
    result = gr.State(None)
    numbers = last_run if last_run is not None else gr.State(None)

    inputs = [prompt, configs, max_new_tokens, seed, prompt_format, source, upload, repeats, engine]
    outputs = [status, table, *columns, per_pass, positions, race, sweep_plot, result, numbers, set_plot, summary]

    def flat(work):
        def flat_work(*args):
            for view in work(*args):
                yield view if view is TICK else [view.status, view.table, *view.columns, view.tokens_per_pass,
                                                 view.positions, view.race, view.sweep, view.result, view.last_run,
                                                 view.set_plot, comparison_json(view.result)]
        return flat_work

    events = []
    for button, is_sweep, name in ((run, False, "compare"), (run_sweep, True, "sweep")):
        handler = streaming(gpu_task(flat(compare_work(limits, loader, sweep=is_sweep)), duration=COMPARE_GPU_SECONDS))
        events.append(click_with_stop(button, stop, handler, inputs, outputs, concurrency_limit=1,
                                      concurrency_id=CONCURRENCY_ID, show_progress="minimal", api_name=name))
    source.change(lambda choice: gr.update(visible=choice == FROM_FILE), source, upload, queue=False,
                  api_visibility="private")
    export.click(export_work, [result, png], files, concurrency_limit=1, concurrency_id=CONCURRENCY_ID,
                 api_name="export")
    return CompareTab(prompt, configs, run, run_sweep, stop, status, table, columns, [per_pass, positions, race],
                      sweep_plot, result, files, events)

