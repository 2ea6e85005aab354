"""The Compare, Teach and Explain tabs. Each `build_*_tab` declares its components and wires its
events when called inside an open `gr.Blocks()` / `gr.Tab()`:

    with gr.Tab("Compare"):
        compare_tab = build_compare_tab(last_run=last_run)

Handlers are made by `make_*_handler` functions (tests call them directly, with tiny models
passed as `load`, which stands in for `specviz.models.load_pair` as in `ui.load_models`). Events
that run a model join the app's one GPU queue (`ui.CONCURRENCY_ID`, one at a time) and can be
stopped. `last_run` is an optional `gr.State` shared between tabs: the Compare and Teach tabs put
their latest run's numbers in it (`teach.run_numbers`), and the Explain tab fills its formulas from
it whenever it changes.
"""

from __future__ import annotations

import html
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import gradio as gr
import torch

from . import render, teach, ui
from .compare import (SWEEP_HEADERS, TABLE_HEADERS, Comparison, Sweep, config_label, iter_comparison, iter_sweep,
                      table_rows, winner_line)
from .figures_compare import comparison_figures, sweep_figure
from .runs import RunConfig, RunFailed, execute

log = logging.getLogger("specviz.tabs")

MAX_CONFIGS = 4
COMPARE_GPU_SECONDS = 300          # ZeroGPU time for a comparison or a sweep (several runs in one call)
CONFIG_HEADERS = ["use", "target (blank: built-in)", "draft", "k", "dynamic k", "temperature"]
DEFAULT_CONFIGS = [
    [True, "", "ngram", 4, False, 0.0],
    [True, "", "self:20", 4, False, 0.0],
    [True, "", "ngram", 4, True, 0.0],
    [False, "", "self:12", 2, False, 0.0],
]
DRAFT_HELP = ("**draft**: `ngram` (prompt lookup), `self:L` (the target's first L layers, early exit) or a model "
              "id / folder sharing the target's tokenizer. **dynamic k**: +2 after a fully accepted cycle, \u22121 "
              "after a rejection. **temperature** 0 is greedy. Each configuration runs in turn on the same "
              "device against one plain-decoding baseline.")
DEFAULT_PROMPT = ("Rewrite this sentence in the passive voice, keeping every other word: The committee approved "
                  "the new budget after a long debate, and the mayor signed the new budget the next morning.")

TAB_CSS = """
.sv-teach table { font-size: 0.95em; }
.sv-teach code, .sv-compare code { font-family: var(--font-mono, ui-monospace, monospace); }
.sv-id { opacity: 0.6; font-size: 0.85em; }
.sv-cycle.sv-current { outline: 2px solid #0072B2; outline-offset: 2px; border-radius: 3px; }
.sv-prompt { opacity: 0.7; }
.sv-explain ol { margin: 8px 0 0 1.2em; }
.sv-winner { font-size: 1.15em; font-weight: 600; }
.sv-compare .sv-text { max-height: 22em; }
"""


def _style() -> None:
    # The tabs' own rules, in the page itself, so the tabs need nothing from `launch(css=...)`.
    gr.HTML(f"<style>{TAB_CSS}</style>", padding=False, container=False)


def _loader(load: Callable | None, hosted: bool) -> Callable[[RunConfig], object]:
    """config -> pair, through `ui.load_models` (user-facing errors, hosted-mode limits)."""
    return lambda config: ui.load_models(config.target, config.draft or "ngram", hosted=hosted, load=load)


def _message(exc: BaseException) -> str:
    if isinstance(exc, RunFailed):
        return str(exc)
    if not isinstance(exc, ui.RunError):
        log.exception("run failed")
    return ui.user_message(exc)


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "y", "x", "\u2713")
    return bool(value)


# ----------------------------------------------------------------------------- Compare

def parse_configs(rows: Sequence[Sequence], *, max_new_tokens: int, seed: int | None, chat: bool,
                  limit: int = MAX_CONFIGS, max_tokens_allowed: int = ui.MAX_NEW_TOKENS) -> list[RunConfig]:
    """The configuration table's used rows as RunConfigs (raises ui.RunError with a message)."""
    if hasattr(rows, "values") and hasattr(rows, "columns"):   # a pandas DataFrame
        rows = rows.values.tolist()
    if not 1 <= max_new_tokens <= max_tokens_allowed:
        raise ui.RunError(f"Max new tokens must be between 1 and {max_tokens_allowed}.")
    configs = []
    for n, row in enumerate(rows or [], start=1):
        row = list(row) + [None] * (len(CONFIG_HEADERS) - len(row))
        use, target, draft, k, dynamic_k, temperature = row[: len(CONFIG_HEADERS)]
        if not _truthy(use):
            continue
        try:
            k = int(float(k if k not in (None, "") else 4))
            temperature = float(temperature if temperature not in (None, "") else 0.0)
        except (TypeError, ValueError):
            raise ui.RunError(f"Row {n}: k must be a whole number and temperature a number.") from None
        if not 1 <= k <= 16:
            raise ui.RunError(f"Row {n}: k must be between 1 and 16, got {k}.")
        if not 0 <= temperature <= 2:
            raise ui.RunError(f"Row {n}: temperature must be between 0 and 2, got {temperature:g}.")
        configs.append(RunConfig(target=(str(target or "").strip() or None), draft=str(draft or "").strip() or "ngram",
                                 k=k, dynamic_k=_truthy(dynamic_k), temperature=temperature,
                                 seed=seed, max_new_tokens=max_new_tokens, chat=chat))
    if not configs:
        raise ui.RunError("Tick \u201cuse\u201d on at least one configuration.")
    if len(configs) > limit:
        raise ui.RunError(f"Compare at most {limit} configurations at once ({len(configs)} are ticked).")
    return configs


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]], *, label: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="{"sv-num" if i else ""}">{html.escape(cell)}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return (f'<div class="sv-stats"><table aria-label="{html.escape(label)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def column_html(label: str, result) -> str:
    """One configuration's token view: its label, numbers, and every cycle's tokens."""
    s = result.stats
    status = (f"{s.tokens} tokens \u00b7 {s.mean_acceptance_length:.2f} per pass \u00b7 "
              f"{s.tokens_per_second:.1f} tokens/s \u00b7 {result.speedup:.2f}\u00d7")
    return render.panel_html(label, status, "".join(teach.cycle_html(result)), kind="spec")


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
    result: object          # (Comparison, Sweep | None), for the export button
    last_run: object


def compare_view(comparison: Comparison, sweep: Sweep | None = None, *, state: str = "") -> CompareView:
    figures = comparison_figures(comparison)
    rows = table_rows(comparison)
    done = comparison.done
    if done:
        headline = winner_line(comparison)
    else:
        headline = f"{len(comparison.results)} of {len(comparison.configs)} done\u2026"
    status = f'<div class="sv-stats"><div class="sv-state">{html.escape(state)}</div>' \
             f'<div class="sv-winner" role="status">{html.escape(headline)}</div>'
    if sweep is not None and sweep.points:
        status += f'<p class="sv-note">{html.escape(sweep.line())}</p>'
    status += "</div>"
    table = table_html(TABLE_HEADERS, rows, label="comparison summary")
    if sweep is not None and sweep.points:
        table += table_html(SWEEP_HEADERS, sweep.rows(), label="k sweep")
    columns = []
    for i in range(MAX_CONFIGS):
        if sweep is not None or i >= len(comparison.configs):
            columns.append(gr.update(visible=False))
        elif i < len(comparison.results):
            columns.append(gr.update(value=column_html(comparison.labels[i], comparison.results[i]), visible=True))
        else:
            columns.append(gr.update(value=pending_html(comparison.labels[i]), visible=True))
    best = max(comparison.results, key=lambda r: r.speedup or 0.0, default=None)
    if best is not None:
        label = comparison.labels[comparison.results.index(best)]
        numbers = teach.run_numbers(label, best.stats, best.speedup)
    else:
        numbers = gr.skip()
    sweep_plot = gr.update(value=sweep_figure(sweep), visible=True) if sweep is not None else gr.update(visible=False)
    return CompareView(status, table, tuple(columns), figures["tokens_per_pass"], figures["acceptance_by_position"],
                       figures["tokens_against_time"], sweep_plot, (comparison, sweep), numbers)


def running_view(state: str) -> CompareView:
    """Before the first configuration finishes (the first load can take a while)."""
    skip = gr.skip()
    status = (f'<div class="sv-stats" role="status"><div class="sv-state">{html.escape(state)}</div>'
              '<div class="sv-winner">Running\u2026 (the first run also loads the models)</div></div>')
    return CompareView(status, skip, (skip,) * MAX_CONFIGS, skip, skip, skip, skip, skip, skip)


def _error_view(message: str) -> CompareView:
    gr.Warning(html.escape(message))
    skip = gr.skip()
    return CompareView(render.error_html(message), skip, (skip,) * MAX_CONFIGS, skip, skip, skip, skip, skip, skip)


def make_compare_handler(load: Callable | None = None, hosted: bool = False, *, sweep: bool = False):
    """The Compare button's handler (or, with `sweep`, the k-sweep button's): a generator over
    CompareViews, one after each finished configuration."""

    def handler(prompt, rows, max_new_tokens, seed, prompt_format) -> Iterator[CompareView]:
        try:
            limit = ui.HOSTED_MAX_NEW_TOKENS if hosted else ui.MAX_NEW_TOKENS
            configs = parse_configs(rows, max_new_tokens=int(max_new_tokens),
                                    seed=None if seed in (None, "") else int(seed), chat=prompt_format != ui.RAW,
                                    max_tokens_allowed=limit)
            if not (prompt or "").strip():
                raise ui.RunError("The prompt is empty: type a question, or text for the model to continue.")
            if sweep:
                state = f"k sweep of {config_label(configs[0])}: k = 1..8 against one plain baseline"
                yield running_view(state)
                for partial in iter_sweep(configs[0], prompt, load=_loader(load, hosted)):
                    yield compare_view(partial.comparison, partial, state=state)
            else:
                state = f"{len(configs)} configuration{'s' if len(configs) > 1 else ''}, one after another, " \
                        "against one plain baseline"
                yield running_view(state)
                for partial in iter_comparison(configs, prompt, load=_loader(load, hosted)):
                    yield compare_view(partial, state=state)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            if isinstance(exc, torch.OutOfMemoryError):
                ui.free_accelerator_memory()
            yield _error_view(_message(exc))

    return handler


def export_files(result, png: bool = False) -> tuple[list[str], str]:
    """The Export button: write the last comparison's files to a fresh temporary folder."""
    from .export import export_comparison

    comparison, sweep = result if result else (None, None)
    if comparison is None or not comparison.results:
        raise ui.RunError("Nothing to export yet: run a comparison or a k sweep first.")
    figures = comparison_figures(comparison)
    if sweep is not None:
        figures["k_sweep"] = sweep_figure(sweep)
    folder = tempfile.mkdtemp(prefix="specviz-export-")
    written, note = export_comparison(comparison, folder, figures=figures, sweep=sweep, png=png)
    return [str(path) for path in written], note


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


def build_compare_tab(*, load: Callable | None = None, hosted: bool | None = None,
                      last_run: gr.State | None = None) -> CompareTab:
    """Compare 2 to 4 configurations on one prompt, or sweep k for the first one."""
    hosted = ui.is_hosted() if hosted is None else hosted
    limit = ui.HOSTED_MAX_NEW_TOKENS if hosted else ui.MAX_NEW_TOKENS
    _style()
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=4, max_lines=12, elem_id="cmp-prompt")
            configs = gr.Dataframe(value=DEFAULT_CONFIGS, headers=CONFIG_HEADERS,
                                   datatype=["bool", "str", "str", "number", "bool", "number"],
                                   row_count=(MAX_CONFIGS, "fixed"), column_count=(len(CONFIG_HEADERS), "fixed"),
                                   type="array", interactive=True, label="Configurations (tick up to four)",
                                   elem_id="cmp-configs")
            gr.Markdown(DRAFT_HELP + " **Sweep k** runs the first ticked row at k = 1..8.")
        with gr.Column(scale=1, min_width=240):
            max_new_tokens = gr.Slider(8, limit, value=96, step=8, label="Max new tokens", elem_id="cmp-max-new-tokens")
            seed = gr.Number(0, precision=0, label="Seed (sampled configurations)")
            prompt_format = gr.Radio([ui.CHAT, ui.RAW], value=ui.CHAT, label="Prompt format")
            run = gr.Button("Compare", variant="primary", elem_id="cmp-run")
            run_sweep = gr.Button("Sweep k = 1..8", elem_id="cmp-sweep")
            stop = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
    status = gr.HTML('<div class="sv-stats sv-idle">Press <b>Compare</b>: each ticked configuration decodes the '
                     'prompt in turn, and all are measured against one plain-decoding run.</div>', elem_id="cmp-status")
    table = gr.HTML("", elem_id="cmp-table")
    gr.HTML(render.legend_html(), padding=False)
    with gr.Row(equal_height=False, elem_classes=["sv-compare"]):
        columns = [gr.HTML(pending_html(config_label(RunConfig(draft=row[2], k=row[3], dynamic_k=row[4]))),
                           visible=bool(row[0]), elem_id=f"cmp-column-{i}") for i, row in enumerate(DEFAULT_CONFIGS)]
    sweep_plot = gr.Plot(show_label=False, visible=False, elem_id="cmp-sweep-chart")
    empty = comparison_figures(Comparison("", [], [], []))
    with gr.Row():
        per_pass = gr.Plot(empty["tokens_per_pass"], show_label=False, elem_id="cmp-chart-per-pass")
        positions = gr.Plot(empty["acceptance_by_position"], show_label=False, elem_id="cmp-chart-positions")
    race = gr.Plot(empty["tokens_against_time"], show_label=False, elem_id="cmp-chart-race")
    with gr.Row():
        png = gr.Checkbox(False, label="PNG charts too (slower; needs kaleido and Chrome or Chromium)")
        export = gr.Button("Export cycles, summary and charts", elem_id="cmp-export")
    files = gr.File(label="Exported files", file_count="multiple", interactive=False, visible=False,
                    elem_id="cmp-files")
    result = gr.State(None)
    numbers = last_run if last_run is not None else gr.State(None)

    inputs = [prompt, configs, max_new_tokens, seed, prompt_format]
    outputs = [status, table, *columns, per_pass, positions, race, sweep_plot, result, numbers]

    def flat(handler):
        def run_flat(*args):
            for view in handler(*args):
                yield [view.status, view.table, *view.columns, view.tokens_per_pass, view.positions, view.race,
                       view.sweep, view.result, view.last_run]
        return run_flat

    events = []
    for button, is_sweep in ((run, False), (run_sweep, True)):
        handler = ui.gpu_task(flat(make_compare_handler(load, hosted, sweep=is_sweep)), duration=COMPARE_GPU_SECONDS)
        events.append(button.click(handler, inputs, outputs, concurrency_limit=1, concurrency_id=ui.CONCURRENCY_ID,
                                   show_progress="minimal"))
    stop.click(lambda: gr.Info("Stopped after the configuration that was running."), None, None,
               cancels=events, queue=False)

    def on_export(result_value, with_png):
        try:
            paths, note = export_files(result_value, png=bool(with_png))
        except ui.RunError as exc:
            gr.Warning(str(exc))
            return gr.skip()
        if note:
            gr.Info(note)
        return gr.update(value=paths, visible=True)

    export.click(on_export, [result, png], files)
    return CompareTab(prompt, configs, run, run_sweep, stop, status, table, columns, [per_pass, positions, race],
                      sweep_plot, result, files)


# ----------------------------------------------------------------------------- Teach

class TeachView(NamedTuple):
    run: object             # teach.TeachRun in session state
    index: int
    tokens: str
    narrative: str
    table: str
    verification: object
    residual: object
    position: str
    last_run: object


def teach_view(run: teach.TeachRun, index: int, numbers=None) -> TeachView:
    view = teach.step_view(run, index)
    index = max(0, min(index, len(run.cycles) - 1))
    return TeachView(run, index, view.tokens, view.narrative, view.table, view.verification, view.residual,
                     view.position, gr.skip() if numbers is None else numbers)


def make_teach_handler(load: Callable | None = None, hosted: bool = False):
    """The Teach tab's run button: decode once, keep the run in state, show its first cycle."""

    def handler(prompt, drafter, draft_model, exit_layer, k, temperature, seed, max_new_tokens, prompt_format):
        skip = gr.skip()
        try:
            limit = ui.HOSTED_MAX_NEW_TOKENS if hosted else ui.MAX_NEW_TOKENS
            if not 1 <= int(max_new_tokens) <= limit:
                raise ui.RunError(f"Max new tokens must be between 1 and {limit}.")
            config = RunConfig(draft=ui.draft_spec(drafter, draft_model, int(exit_layer)), k=int(k),
                               temperature=float(temperature), seed=None if seed in (None, "") else int(seed),
                               max_new_tokens=int(max_new_tokens), chat=prompt_format != ui.RAW)
            pair = _loader(load, hosted)(config)
            result = execute(config, prompt or "", pair=pair)
            label = config_label(config)
            run = teach.teach_run(result, pair.tokenizer, label=label)
            return teach_view(run, 0, teach.run_numbers(label, result.stats))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
            if isinstance(exc, torch.OutOfMemoryError):
                ui.free_accelerator_memory()
            message = _message(exc)
            gr.Warning(html.escape(message))
            return TeachView(skip, skip, skip, render.error_html(message), skip, skip, skip, skip, skip)

    return handler


def step(run: teach.TeachRun | None, index: int, delta: int) -> TeachView | None:
    """Next (+1) or previous (-1) cycle of the run in state; None when there is no run."""
    if run is None or not run.cycles:
        return None
    return teach_view(run, int(index) + delta)


class TeachTab(NamedTuple):
    run: gr.Button
    previous: gr.Button
    next: gr.Button
    stop: gr.Button
    state: gr.State
    index: gr.State
    tokens: gr.HTML
    narrative: gr.Markdown
    table: gr.HTML
    verification: gr.Plot
    residual: gr.Plot
    position: gr.Markdown


TEACH_PROMPT = "Write a short poem about the sea."


def build_teach_tab(*, load: Callable | None = None, hosted: bool | None = None,
                    last_run: gr.State | None = None) -> TeachTab:
    """Step mode: decode once, then walk through the cycles one at a time."""
    hosted = ui.is_hosted() if hosted is None else hosted
    _style()
    gr.Markdown("Decode a short answer once, then step through it **one cycle at a time**: every drafted token "
                "with its draft and target probabilities, the acceptance test and its verdict, and after a rejection "
                "the distribution the correction was drawn from. A temperature above 0 shows speculative "
                "sampling (with its uniform draws); 0 shows greedy verification.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(TEACH_PROMPT, label="Prompt", lines=3, elem_id="teach-prompt")
            with gr.Row():
                run = gr.Button("Decode, then step through", variant="primary", elem_id="teach-run")
                stop = gr.Button("Stop", variant="stop", elem_id="teach-stop")
            with gr.Row():
                previous = gr.Button("\u25c0 Previous cycle", elem_id="teach-previous")
                position = gr.Markdown("No run yet.", elem_id="teach-position")
                next_ = gr.Button("Next cycle \u25b6", variant="primary", elem_id="teach-next")
        with gr.Column(scale=2):
            drafter = gr.Radio([ui.PROMPT_LOOKUP, ui.DRAFT_MODEL, ui.EARLY_EXIT], value=ui.EARLY_EXIT,
                               label="Drafter", elem_id="teach-drafter")
            draft_model = gr.Textbox(label="Draft model (same tokenizer as the target)", visible=False)
            exit_layer = gr.Slider(1, 63, value=24, step=1, label="Early-exit layer", elem_id="teach-exit-layer")
            with gr.Row():
                k = gr.Slider(1, 8, value=4, step=1, label="k", elem_id="teach-k")
                temperature = gr.Slider(0.0, 2.0, value=0.8, step=0.05, label="Temperature",
                                        elem_id="teach-temperature")
            with gr.Row():
                max_new_tokens = gr.Slider(8, 128, value=48, step=8, label="Max new tokens")
                seed = gr.Number(0, precision=0, label="Seed")
            prompt_format = gr.Radio([ui.CHAT, ui.RAW], value=ui.CHAT, label="Prompt format")
    tokens = gr.HTML(render.token_view_html([]), elem_id="teach-tokens")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2):
            narrative = gr.Markdown("", latex_delimiters=teach.LATEX_DELIMITERS, elem_id="teach-narrative")
        with gr.Column(scale=3):
            table = gr.HTML("", elem_id="teach-table")
    with gr.Row():
        verification = gr.Plot(show_label=False, elem_id="teach-verification")
        residual = gr.Plot(show_label=False, elem_id="teach-residual")
    state = gr.State(None)
    index = gr.State(0)
    numbers = last_run if last_run is not None else gr.State(None)

    drafter.change(lambda d: (gr.update(visible=d == ui.DRAFT_MODEL), gr.update(visible=d == ui.EARLY_EXIT)),
                   drafter, [draft_model, exit_layer], queue=False)
    view_outputs = [state, index, tokens, narrative, table, verification, residual, position]
    handler = ui.gpu_task(make_teach_handler(load, hosted))
    run_event = run.click(lambda *args: list(handler(*args)),
                          [prompt, drafter, draft_model, exit_layer, k, temperature, seed, max_new_tokens,
                           prompt_format],
                          view_outputs + [numbers], concurrency_limit=1, concurrency_id=ui.CONCURRENCY_ID,
                          show_progress="minimal")
    stop.click(None, None, None, cancels=[run_event], queue=False)

    def stepper(delta: int):
        def on_click(run_value, index_value):
            view = step(run_value, index_value, delta)
            if view is None:
                gr.Warning("Decode first: press \u201cDecode, then step through\u201d.")
                return [gr.skip()] * len(view_outputs)
            return list(view)[: len(view_outputs)]
        return on_click

    next_.click(stepper(+1), [state, index], view_outputs, queue=False)
    previous.click(stepper(-1), [state, index], view_outputs, queue=False)
    return TeachTab(run, previous, next_, stop, state, index, tokens, narrative, table, verification, residual,
                    position)


# ----------------------------------------------------------------------------- Explain

EXPLAIN_INTRO = r"""
## Speculative decoding

A language model writes one token per forward pass, and at batch size one each pass is limited by
reading the weights from memory, not by arithmetic: a pass over five tokens costs little more than a
pass over one. Speculative decoding spends that slack. A cheap **drafter** guesses the next $k$
tokens; the **target** model scores all of them in one pass; the longest prefix the target agrees
with is kept, and the same pass supplies one more token of the target's own. Every pass yields at
least one token, and as many as $k + 1$.

The drafters here: **prompt lookup** (`ngram`) copies what followed the last few tokens where they
occurred before in the prompt or the output (free, and very good at rewrites and edits);
**early exit** (`self:L`) runs only the target's first $L$ layers and its output head; a **draft model**
is a smaller model with the same tokenizer.

### Greedy verification (temperature 0)

A drafted token $x_i$ is accepted when it is the target's most likely token at its position:

$$x_i = \arg\max_x \; p_\text{target}(x \mid \text{prefix}, x_1, \dots, x_{i-1})$$

At the first mismatch the target's argmax replaces it. The output is exactly the plain greedy output.

### Speculative sampling (temperature above 0)

Each drafted token is accepted with probability

$$P(\text{accept } x_i) = \min\left(1,\ \frac{p_\text{target}(x_i)}{p_\text{draft}(x_i)}\right)$$

which is done by drawing $u_i \sim U[0, 1)$ and accepting while $u_i < p_\text{target}(x_i) / p_\text{draft}(x_i)$.
At the first rejection, the replacement is drawn from the **residual**

$$p_\text{residual}(x) = \frac{\max\left(0,\ p_\text{target}(x) - p_\text{draft}(x)\right)}{\sum_y \max\left(0,\ p_\text{target}(y) - p_\text{draft}(y)\right)}$$

and when every draft passes, a bonus token comes from $p_\text{target}$ at the next position. Tokens
the draft over-proposes are thinned out by the test; tokens it under-proposes are topped up by the
residual; together the output is distributed **exactly** as the target's own samples (Leviathan et
al. 2023; Chen et al. 2023, where $p_\text{target}$ is $p$ and $p_\text{draft}$ is $q$).

### How fast

If each drafted token is accepted independently with probability $\alpha$, one target pass yields

$$E = \frac{1 - \alpha^{k+1}}{1 - \alpha}$$

tokens on average. With $c$ the time of one draft step over the time of one target pass, a cycle
costs $k c + 1$ target passes, so the expected speedup over plain decoding is

$$S = \frac{1 - \alpha^{k+1}}{(1 - \alpha)(k c + 1)}$$

Longer drafts pay while $\alpha$ is high and $c$ is small. Measured speedups fall short of $S$ when a
pass over $k + 1$ tokens costs more than one over a single token (on CPUs, and in float32).
"""


class ExplainTab(NamedTuple):
    formulas: gr.Markdown
    figure: gr.Plot
    alpha: gr.Slider
    k: gr.Slider
    c: gr.Slider


def explain_outputs(numbers: dict | None):
    """Formulas, figure, and the sliders' α, k and c for a `teach.run_numbers` payload (None:
    example numbers)."""
    if not numbers:
        example = teach.EXAMPLE_NUMBERS
        figure = teach.theory_figure(example["alpha"], example["c"], label="example")
        return teach.explain_markdown(None), figure, example["alpha"], example["k"], example["c"]
    stats = numbers["stats"]
    k = max(1, round(stats["mean_k"]))
    measured = (k, numbers["speedup"]) if numbers.get("speedup") else None
    figure = teach.theory_figure(stats["alpha"], stats["cost_ratio"], measured=measured)
    return (teach.explain_markdown(numbers), figure, round(stats["alpha"], 2), k,
            round(min(stats["cost_ratio"], 1.0), 3))


def build_explain_tab(last_run: gr.State | None = None) -> ExplainTab:
    """The explanation, its formulas filled with the last run's numbers (from `last_run`, when
    given) or with numbers typed into the sliders."""
    _style()
    gr.Markdown("## One cycle, drawn")
    gr.HTML(teach.illustration_html(), elem_id="explain-illustration")
    gr.Markdown(EXPLAIN_INTRO, latex_delimiters=teach.LATEX_DELIMITERS, elem_id="explain-text")
    gr.Markdown("## The formulas, with numbers")
    text, figure, *_ = explain_outputs(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            formulas = gr.Markdown(text, latex_delimiters=teach.LATEX_DELIMITERS, elem_id="explain-formulas")
        with gr.Column(scale=2):
            plot = gr.Plot(figure, show_label=False, elem_id="explain-chart")
    with gr.Row():
        alpha = gr.Slider(0.0, 0.99, value=teach.EXAMPLE_NUMBERS["alpha"], step=0.01, label="\u03b1 (acceptance)")
        k = gr.Slider(1, 16, value=teach.EXAMPLE_NUMBERS["k"], step=1, label="k")
        c = gr.Slider(0.0, 1.0, value=teach.EXAMPLE_NUMBERS["c"], step=0.005, label="c (draft cost / target pass)")

    def on_numbers(a, k_value, c_value):
        return (teach.formulas_markdown(alpha=float(a), k=int(k_value), c=float(c_value)),
                teach.theory_figure(float(a), float(c_value), label="these numbers"))

    for slider in (alpha, k, c):
        slider.release(on_numbers, [alpha, k, c], [formulas, plot], queue=False)
    if last_run is not None:
        last_run.change(explain_outputs, last_run, [formulas, plot, alpha, k, c], queue=False)
    return ExplainTab(formulas, plot, alpha, k, c)
