"""The Gradio app: a Run tab that races speculative decoding against plain decoding on one model,
live, cycle by cycle.

Shared pieces first, then the Run tab's handler, then the layout (`build_demo`). The pieces other
tabs reuse are plain functions:
`load_models` (pair loading with user-facing errors and the hosted-mode limits), `gpu_task` (the
ZeroGPU wrapper), `CONCURRENCY_ID` (the one queue every GPU-bound event joins), `user_message`
(exception -> text for the page) and `interleave` (the race itself).

Handlers never raise into the page: failures become a message in the summary box and a toast,
and the traceback goes to the server log.
"""

from __future__ import annotations

import html
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import gradio as gr
import torch

from . import charts, render
from .decoding import autoregressive_decode, speculative_decode
from .events import Cycle, Step
from .metrics import speedup, summarize, summarize_plain
from .models import ModelLoadError, check_context, encode_prompt, list_presets, load_pair
from .spaces import GPU

log = logging.getLogger("specviz.ui")

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CONCURRENCY_ID = "gpu"            # every event that runs a model joins this one queue
QUEUE_MAX_SIZE = 16               # users waiting beyond this are turned away
HOSTED_MAX_NEW_TOKENS = 256
MAX_NEW_TOKENS = 1024
UPDATE_SECONDS = 0.25             # during a run the token views are redrawn at most this often,
CHART_SECONDS = 1.0               # and the charts (heavier for the browser) this often
GPU_SECONDS = 120                 # ZeroGPU time asked for per run (both methods, one call)

PROMPT_LOOKUP, DRAFT_MODEL, EARLY_EXIT = "Prompt lookup (n-gram)", "Draft model", "Early exit (target's first layers)"
CHAT, RAW = "Chat template", "Raw completion"
CUSTOM = "Custom"


def gpu_task(fn: Callable | None = None, *, duration: int = GPU_SECONDS):
    """Run `fn` (a handler, generators included) inside one ZeroGPU allocation on Spaces; a
    no-op elsewhere. Use as `@gpu_task` or `gpu_task(fn)`."""
    if fn is None:
        return lambda function: GPU(function, duration=duration)
    return GPU(fn, duration=duration)


def is_hosted() -> bool:
    """Hosted mode (a public demo): presets only, capped output, no local paths. On with
    SPECVIZ_HOSTED=1, and on Hugging Face Spaces (SPACE_ID set) unless SPECVIZ_HOSTED=0."""
    flag = os.environ.get("SPECVIZ_HOSTED", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return bool(os.environ.get("SPACE_ID"))


class RunError(Exception):
    """A problem the user can fix; its text is shown in the page as it is."""


# ----------------------------------------------------------------------------- models

def presets() -> list[dict]:
    """The presets from assets/presets.json (through specviz.models), or none if unavailable."""
    try:
        return list(list_presets())
    except ModelLoadError:  # the app still works with typed ids and the built-in default
        log.warning("could not read the presets", exc_info=True)
        return []


def draft_spec(drafter: str, draft_model: str | None, exit_layer: int) -> str:
    """The UI's drafter choice as a `load_pair` draft spec."""
    if drafter == PROMPT_LOOKUP:
        return "ngram"
    if drafter == EARLY_EXIT:
        return f"self:{int(exit_layer)}"
    if drafter == DRAFT_MODEL:
        if not (draft_model or "").strip():
            raise RunError("Type a draft model id (or pick a preset), or choose prompt lookup or early exit.")
        return draft_model.strip()
    raise RunError(f"Unknown drafter {drafter!r}.")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~", "\\")) or "\\" in name or Path(name).exists() or name.endswith(".gguf")


def check_hosted(target: str | None, draft: str, presets_list: list[dict]) -> None:
    """Hosted mode: the target and a draft model must come from the presets; no local paths."""
    allowed_targets = {p.get("target") or None for p in presets_list} | {None}
    allowed_drafts = {p.get("draft") for p in presets_list if p.get("draft")}
    for name in (target, draft):
        if name and _looks_like_path(name):
            raise RunError("Local paths are not available in this hosted demo: pick a preset.")
    if target not in allowed_targets:
        raise RunError(f"This hosted demo only runs the preset models; {target!r} is not one of them.")
    if draft not in allowed_drafts and draft != "ngram" and not re.fullmatch(r"self:\d+", draft):
        raise RunError(f"This hosted demo only runs the preset draft models; {draft!r} is not one of them.")


def load_models(target: str | None, draft: str, *, hosted: bool | None = None, load: Callable | None = None,
                progress: Callable[[float, str], None] | None = None):
    """Load (or fetch from the cache) a target and its drafter, with errors the page can show
    (raises RunError). `target` None or "" is the built-in offline default. `load` replaces
    `specviz.models.load_pair` (tests pass tiny in-process models); `progress(fraction, message)`
    hears how loading goes."""
    target = (target or "").strip() or None
    hosted = is_hosted() if hosted is None else hosted
    if hosted:
        check_hosted(target, draft, presets())
    try:
        return (load or load_pair)(target, draft, progress=progress)
    except Exception as exc:
        if isinstance(exc, torch.OutOfMemoryError):
            free_accelerator_memory()
        if not isinstance(exc, (RunError, ValueError, ModelLoadError)):
            log.exception("loading %s with %s failed", target, draft)
        raise RunError(user_message(exc)) from exc


def load_in_background(target: str | None, draft: str, **options) -> Iterator[str | object]:
    """`load_models` in a worker thread: yields progress messages while it works (about twice a
    second), then the pair. A first load of the built-in model converts it and takes a while;
    this keeps the page informed meanwhile."""
    messages: list[str] = []
    outcome: dict = {}

    def work():
        try:
            outcome["pair"] = load_models(target, draft, progress=lambda _f, message: messages.append(message),
                                          **options)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="specviz-load", daemon=True)
    worker.start()
    shown = 0
    while worker.is_alive():
        worker.join(0.5)
        if len(messages) > shown:
            shown = len(messages)
            yield messages[-1]
    if "error" in outcome:
        raise outcome["error"]
    yield outcome["pair"]


def user_message(exc: BaseException) -> str:
    """The text shown in the page for a failed run (the traceback goes to the log)."""
    if isinstance(exc, RunError):
        return str(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        return ("Out of memory on the accelerator. Try fewer new tokens, a shorter prompt or a smaller "
                "model pair.")
    if isinstance(exc, (ModelLoadError, ValueError)):
        return str(exc)
    if isinstance(exc, OSError):
        return f"Could not load the model: {exc}"
    return f"Unexpected error ({type(exc).__name__}: {exc}). Details are in the server log."


def free_accelerator_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- the race

def interleave(spec: Iterator[Cycle], plain: Iterator[Step]) -> Iterator[Cycle | Step]:
    """Merge the two runs into one stream: always advance the method that has used less of its
    own time so far, so at any moment both have had the same amount of compute and the one ahead
    is the faster. Each event carries its own device-synchronised timing, so the UI work between
    events is never counted."""
    spec_seconds = plain_seconds = 0.0
    spec_live = plain_live = True
    while spec_live or plain_live:
        if spec_live and (not plain_live or spec_seconds <= plain_seconds):
            event = next(spec, None)
            if event is None:
                spec_live = False
                continue
            spec_seconds += event.seconds
        else:
            event = next(plain, None)
            if event is None:
                plain_live = False
                continue
            plain_seconds += event.seconds
        yield event


@dataclass(frozen=True)
class RunSettings:
    """One run's settings, as the Run tab's controls give them."""
    prompt: str
    target: str | None = None
    drafter: str = PROMPT_LOOKUP
    draft_model: str | None = None
    exit_layer: int = 8
    k: int = 8
    dynamic_k: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    seed: int | None = 0
    chat: bool = True


class RunView(NamedTuple):
    """What the run handler yields, in the order of its outputs."""
    tokens: str
    baseline: str
    acceptance: object
    per_pass: object
    race: object
    positions: object
    stats: str
    last_stats: str       # a copy of `stats` kept in session state, for the Stop button


class Race:
    """Everything a run has produced so far, and its rendering."""

    def __init__(self, pair, settings: RunSettings, prompt_ids: list[int]):
        self.pair, self.settings = pair, settings
        self.cycles: list[Cycle] = []
        self.steps: list[Step] = []
        self.cycle_html: list[str] = []
        self.detok = render.Detokenizer(pair.tokenizer, prompt_ids)
        self.plain_detok = render.Detokenizer(pair.tokenizer, prompt_ids)
        self.plain_text: list[str] = []
        self.spec_tokens = 0
        self.spec_done = self.plain_done = False

    def add(self, event: Cycle | Step) -> None:
        eos, limit = set(self.pair.eos_token_ids or []), self.settings.max_new_tokens
        if isinstance(event, Cycle):
            self.cycles.append(event)
            self.cycle_html.append(render.render_cycle(event.index, render.cycle_pieces(event, self.detok)))
            self.spec_tokens += len(event.emitted)
            self.spec_done = self.spec_tokens >= limit or event.emitted[-1] in eos
        else:
            self.steps.append(event)
            self.plain_text.append(self.plain_detok.push(event.token))
            self.plain_done = len(self.steps) >= limit or event.token in eos

    def describe(self) -> str:
        s, pair = self.settings, self.pair
        sampling = ("greedy" if s.temperature == 0 else
                    f"temperature {s.temperature:g}, top-p {s.top_p:g}, top-k {s.top_k}, seed {s.seed}")
        k = f"k = {s.k}" + (" (dynamic)" if s.dynamic_k else "")
        dtype = str(getattr(pair, "dtype", "")).replace("torch.", "")
        return (f"{pair.target_name} with {pair.draft_name} \u00b7 {k} \u00b7 {sampling} \u00b7 "
                f"{s.max_new_tokens} new tokens \u00b7 {dtype} on {getattr(pair, 'device', '?')}")

    def view(self, state: str, *, final: bool = False, with_charts: bool = True) -> RunView:
        spec_seconds = sum(c.seconds for c in self.cycles)
        plain_seconds = sum(s.seconds for s in self.steps)
        tokens = render.token_view_html(self.cycle_html,
                                        render.race_status(self.spec_tokens, spec_seconds, self.spec_done))
        baseline = render.baseline_html("".join(self.plain_text),
                                        render.race_status(len(self.steps), plain_seconds, self.plain_done))
        figures = charts.run_figures(self.cycles, self.steps) if with_charts else (gr.skip(),) * 4
        stats = self.summary(state, final=final)
        return RunView(tokens, baseline, *figures, stats, stats)

    def summary(self, state: str, *, final: bool) -> str:
        if not self.cycles:
            return render.idle_html()
        spec, plain = summarize(self.cycles), summarize_plain(self.steps)
        measured = speedup(spec, plain) if self.steps else None
        notes = [self.describe()]
        if final:
            spec_tokens = [t for c in self.cycles for t in c.emitted]
            decode = lambda ids: self.pair.tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
            note = render.comparison_note(spec_tokens, [s.token for s in self.steps], decode,
                                          str(getattr(self.pair, "dtype", "")), self.settings.temperature == 0,
                                          self.spec_done and self.plain_done)
            if note:
                notes.append(note)
        return render.summary_html(spec, plain, measured, state=state, notes=notes)


def run_race(settings: RunSettings, *, load: Callable | None = None, encode: Callable | None = None,
             hosted: bool | None = None) -> Iterator[RunView]:
    """The Run tab's work: load the pair, then decode the prompt by both methods, interleaved,
    yielding the page's new state as it goes. Never raises: errors end in an error view."""
    empty = RunView(render.token_view_html([]), render.baseline_html(""), *charts.run_figures([], []),
                    "", "")
    race = None
    try:
        hosted = is_hosted() if hosted is None else hosted
        if not settings.prompt.strip():
            raise RunError("Type a prompt first (or pick an example).")
        limit = HOSTED_MAX_NEW_TOKENS if hosted else MAX_NEW_TOKENS
        if not 1 <= settings.max_new_tokens <= limit:
            raise RunError(f"Max new tokens must be between 1 and {limit}{' in this hosted demo' if hosted else ''}.")
        spec = draft_spec(settings.drafter, settings.draft_model, settings.exit_layer)
        loading = render.summary_loading_html(settings.target, spec)
        yield empty._replace(stats=loading, last_stats=loading)
        for pair in load_in_background(settings.target, spec, hosted=hosted, load=load):
            if isinstance(pair, str):
                loading = render.summary_loading_html(settings.target, spec, pair)
                yield empty._replace(stats=loading, last_stats=loading)
        input_ids = (encode or encode_prompt)(pair.tokenizer, settings.prompt, chat=settings.chat)
        check_context(pair, input_ids.shape[1], settings.max_new_tokens)
        input_ids = input_ids.to(pair.target.device)
        options = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                       seed=settings.seed, eos_token_id=pair.eos_token_ids)
        # Both calls check their arguments here, before any work, and raise ValueError.
        cycles = speculative_decode(pair.target, pair.draft, input_ids, settings.max_new_tokens, k=settings.k,
                                    dynamic_k=settings.dynamic_k, **options)
        steps = autoregressive_decode(pair.target, input_ids, settings.max_new_tokens, **options)

        race = Race(pair, settings, input_ids[0].tolist())
        last_update = last_charts = 0.0
        for event in interleave(cycles, steps):
            race.add(event)
            now = time.monotonic()
            if now - last_update >= UPDATE_SECONDS:
                with_charts = now - last_charts >= CHART_SECONDS
                last_update, last_charts = now, now if with_charts else last_charts
                yield race.view("Running: speculative and plain decoding take turns on the same model\u2026",
                                with_charts=with_charts)
        race.spec_done = race.plain_done = True
        yield race.view("Finished.", final=True)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
        if isinstance(exc, torch.OutOfMemoryError):
            free_accelerator_memory()
        if not isinstance(exc, RunError):
            log.exception("run failed")
        message = user_message(exc)
        gr.Warning(html.escape(message))
        error = render.error_html(message)
        view = race.view("Stopped by an error.") if race is not None else empty
        yield view._replace(stats=error, last_stats=error)


def make_run_handler(load: Callable | None = None, encode: Callable | None = None, hosted: bool | None = None):
    """The Run button's handler (a generator over `RunView`s), taking the inputs in the order
    `build_demo` wires them. `load`/`encode` replace specviz.models' functions (for tests)."""

    def run(prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
            max_new_tokens, seed, prompt_format):
        try:
            settings = RunSettings(
                prompt=prompt or "", target=target, drafter=drafter, draft_model=draft_model,
                exit_layer=int(exit_layer), k=int(k), dynamic_k=bool(dynamic_k), temperature=float(temperature),
                top_p=float(top_p), top_k=int(top_k), max_new_tokens=int(max_new_tokens),
                seed=None if seed is None or seed == "" else int(seed), chat=prompt_format != RAW)
        except (TypeError, ValueError) as exc:
            message = f"Invalid setting: {exc}"
            gr.Warning(html.escape(message))
            yield RunView(gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(),
                          render.error_html(message), render.error_html(message))
            return
        yield from run_race(settings, load=load, encode=encode, hosted=hosted)

    return run


def stopped(last_stats: str) -> str:
    """The Stop button's summary: the last one shown, marked as stopped."""
    banner = ('<div class="sv-stopped" role="status"><b>Stopped.</b> The numbers below cover the run up to '
              'the stop.</div>')
    last_stats = re.sub(r'<div class="sv-state">.*?</div>', "", last_stats or render.idle_html(), count=1)
    return banner + last_stats


# ----------------------------------------------------------------------------- examples and presets

def load_examples(path: Path = ASSETS / "examples.json") -> list[dict]:
    """Flat list of examples: category, title, prompt, chat."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [dict(category=c["name"], **e) for c in data["categories"] for e in c["examples"]]


def preset_choices(presets_list: list[dict], hosted: bool) -> list[str]:
    names = [p["name"] for p in presets_list if p.get("name")]
    return names if hosted else names + [CUSTOM]


def preset_settings(name: str, presets_list: list[dict]) -> dict:
    """A preset's fields for the controls: target, drafter, draft model, exit layer, k."""
    preset = next((p for p in presets_list if p.get("name") == name), None)
    if preset is None:
        return {}
    draft = preset.get("draft") or "ngram"
    fields = dict(target=preset.get("target") or "", draft_model="", exit_layer=None, k=preset.get("k"))
    if draft == "ngram":
        fields["drafter"] = PROMPT_LOOKUP
    elif draft.startswith("self:"):
        fields.update(drafter=EARLY_EXIT, exit_layer=int(draft.split(":", 1)[1]))
    else:
        fields.update(drafter=DRAFT_MODEL, draft_model=draft)
    return fields


# ----------------------------------------------------------------------------- layout

APP_CSS = render.CSS + """
#sv-title h1 { margin-bottom: 0; }
#sv-toolbar { gap: 6px; }
#examples .sv-example, #examples button { font-size: var(--text-sm); }
.sv-stopped { border: 2px solid #E69F00; border-radius: 8px; padding: 6px 10px; margin-bottom: 6px; }
.sv-state { opacity: 0.8; }
.dark .js-plotly-plot .main-svg text { fill: #e4e4e7 !important; }
.dark .js-plotly-plot .main-svg .gridlayer path { stroke: rgba(200,200,200,0.2) !important; }
.dark .js-plotly-plot .hoverlayer text { fill: #222 !important; }
body.sv-large .gradio-container { zoom: 1.25; }
body.sv-large .sv-text { font-size: 1.2em; }
"""

# Plotly sizes its charts on window resize events: send one after the zoom changes.
LARGE_TEXT_JS = ("(on) => { document.body.classList.toggle('sv-large', on); "
                 "setTimeout(() => window.dispatchEvent(new Event('resize')), 50); return on; }")
DARK_JS = "() => { document.body.classList.toggle('dark'); }"


def theme() -> gr.themes.Base:
    """A plain theme with strong contrast that reads from the back of a room."""
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate", text_size="lg", radius_size="sm")


class RunTab(NamedTuple):
    """The Run tab's components that other tabs may want to wire to."""
    prompt: gr.Textbox
    run: gr.Button
    stop: gr.Button
    tokens: gr.HTML
    stats: gr.HTML
    run_event: object     # the Run click's Dependency (for `cancels=`)


def build_run_tab(*, load: Callable | None = None, encode: Callable | None = None, hosted: bool = False) -> RunTab:
    """The Run tab's components and events (call inside a `gr.Tab`)."""
    presets_list = presets()
    examples = load_examples()
    first = next((i for i, e in enumerate(examples) if e["category"].startswith("rewrite")), 0)
    choices = preset_choices(presets_list, hosted)
    initial = preset_settings(choices[0], presets_list) if choices else {}
    max_tokens = HOSTED_MAX_NEW_TOKENS if hosted else MAX_NEW_TOKENS

    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", value=examples[first]["prompt"], lines=6, max_lines=16,
                                elem_id="prompt")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="run")
                stop = gr.Button("Stop", variant="stop", elem_id="stop")
            example_table = gr.Dataset(
                label="Example prompts (click one)", components=["textbox"],
                samples=[[f"{e['category']}: {e['title']}"] for e in examples], type="index", layout="gallery",
                samples_per_page=len(examples), elem_id="examples")
        with gr.Column(scale=2):
            preset = gr.Dropdown(choices, value=choices[0] if choices else None, label="Model pair preset",
                                 elem_id="preset")
            target = gr.Textbox(label="Target model (hub id or local folder; blank = built-in SmolLM2-135M-Instruct)",
                                value=initial.get("target", ""), visible=not hosted, elem_id="target")
            drafter = gr.Radio([PROMPT_LOOKUP, DRAFT_MODEL, EARLY_EXIT], value=initial.get("drafter", PROMPT_LOOKUP),
                               label="Drafter",
                               elem_id="drafter")
            draft_model = gr.Textbox(label="Draft model (same tokenizer as the target)",
                                     value=initial.get("draft_model", ""), visible=initial.get("drafter") == DRAFT_MODEL,
                                     interactive=not hosted, elem_id="draft-model")
            exit_layer = gr.Slider(1, 63, value=initial.get("exit_layer") or 8, step=1,
                                   label="Early-exit layer (the draft runs the target's first N layers)",
                                   visible=initial.get("drafter") == EARLY_EXIT, elem_id="exit-layer")
            with gr.Row():
                k = gr.Slider(1, 16, value=initial.get("k") or 8, step=1, label="k (tokens drafted per cycle)",
                              elem_id="k")
                dynamic_k = gr.Checkbox(False, label="Dynamic k",
                                        info="+2 after a full accept, \u22121 after a rejection")
            max_new_tokens = gr.Slider(8, max_tokens, value=128, step=8, label="Max new tokens",
                                       elem_id="max-new-tokens")
            prompt_format = gr.Radio([CHAT, RAW], value=CHAT if examples[first]["chat"] else RAW, label="Prompt format")
            with gr.Accordion("Sampling (temperature 0 = greedy)", open=False):
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)")
                seed = gr.Number(0, precision=0, label="Seed")
            if hosted:
                gr.Markdown(f"Hosted demo: preset models only, at most {HOSTED_MAX_NEW_TOKENS} new tokens.")

    with gr.Row(equal_height=False):
        tokens = gr.HTML(render.token_view_html([]), elem_id="tokens")
        baseline = gr.HTML(render.baseline_html(""), elem_id="baseline")
    stats = gr.HTML(render.idle_html(), elem_id="stats")
    last_stats = gr.State("")
    with gr.Column(elem_id="charts"):
        empty = charts.run_figures([], [])
        with gr.Row():
            acceptance = gr.Plot(empty[0], show_label=False, elem_id="chart-acceptance")
            per_pass = gr.Plot(empty[1], show_label=False, elem_id="chart-per-pass")
        with gr.Row():
            race = gr.Plot(empty[2], show_label=False, elem_id="chart-race")
            positions = gr.Plot(empty[3], show_label=False, elem_id="chart-positions")

    # --- events
    def on_preset(name):
        fields = preset_settings(name, presets_list)
        if not fields:
            return [gr.skip()] * 5
        drafter_value = fields["drafter"]
        return [fields["target"], drafter_value,
                gr.update(value=fields["draft_model"], visible=drafter_value == DRAFT_MODEL),
                gr.update(value=fields["exit_layer"] or 8, visible=drafter_value == EARLY_EXIT),
                fields["k"] or gr.skip()]

    preset.change(on_preset, preset, [target, drafter, draft_model, exit_layer, k], queue=False)
    if not hosted:
        target.input(lambda: CUSTOM, None, preset, queue=False)
        draft_model.input(lambda: CUSTOM, None, preset, queue=False)
    drafter.change(lambda d: (gr.update(visible=d == DRAFT_MODEL), gr.update(visible=d == EARLY_EXIT)),
                   drafter, [draft_model, exit_layer], queue=False)

    def on_example(index):
        example = examples[index]
        return example["prompt"], CHAT if example.get("chat", True) else RAW

    example_table.click(on_example, example_table, [prompt, prompt_format], queue=False)

    handler = gpu_task(make_run_handler(load=load, encode=encode, hosted=hosted))
    inputs = [prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
              max_new_tokens, seed, prompt_format]
    outputs = [tokens, baseline, acceptance, per_pass, race, positions, stats, last_stats]
    run_event = run.click(handler, inputs, outputs, concurrency_limit=1, concurrency_id=CONCURRENCY_ID,
                          show_progress="minimal", api_name="run")
    stop.click(stopped, last_stats, stats, cancels=[run_event], queue=False)
    return RunTab(prompt, run, stop, tokens, stats, run_event)


def build_demo(*, load: Callable | None = None, encode: Callable | None = None,
               hosted: bool | None = None) -> gr.Blocks:
    """The whole app. Tabs other modules add go after "Run" (see `build_run_tab`'s pattern).
    Launch with `demo.launch(theme=theme(), css=APP_CSS)`, as app.py does."""
    hosted = is_hosted() if hosted is None else hosted
    with gr.Blocks(title="specviz: speculative decoding, live") as demo:
        with gr.Row(equal_height=True):
            gr.Markdown("# specviz: speculative decoding, live\n"
                        "A fast drafter proposes *k* tokens; the target model checks them all in one pass and "
                        "keeps the longest prefix it agrees with, plus one token of its own. The same prompt is "
                        "also decoded the plain way, one pass per token, and the two race on the same model.",
                        elem_id="sv-title")
            with gr.Column(scale=0, min_width=170, elem_id="sv-toolbar"):
                large = gr.Checkbox(False, label="Large text", elem_id="large-text")
                dark = gr.Button("Light / dark", size="sm", elem_id="dark-toggle")
        large.change(None, large, large, js=LARGE_TEXT_JS)
        dark.click(None, None, None, js=DARK_JS)
        from . import tabs   # the other tabs build on this module's shared pieces

        last_run = gr.State(None)  # the latest Compare or Teach run, for the Explain tab's numbers
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Run", id="run-tab"):
                build_run_tab(load=load, encode=encode, hosted=hosted)
            with gr.Tab("Compare", id="compare-tab"):
                tabs.build_compare_tab(hosted=hosted, last_run=last_run)
            with gr.Tab("Teach", id="teach-tab"):
                tabs.build_teach_tab(hosted=hosted, last_run=last_run)
            with gr.Tab("Explain", id="explain-tab"):
                tabs.build_explain_tab(last_run=last_run)
    demo.queue(max_size=QUEUE_MAX_SIZE)
    return demo


def launch_options() -> dict:
    """Keyword arguments for `demo.launch` (Gradio 6 takes the theme and CSS there)."""
    return dict(theme=theme(), css=APP_CSS)


def warm_up(target: str | None = None, draft: str = "ngram") -> threading.Thread:
    """Load the default pair in the background so that the first run starts at once (a run that
    comes sooner waits for the same load instead of starting another)."""
    def work():
        try:
            load_models(target, draft, hosted=False)
            log.info("default models ready")
        except Exception:  # noqa: BLE001 - the first run will report it properly
            log.warning("warming up the default models failed", exc_info=True)

    thread = threading.Thread(target=work, name="specviz-warm-up", daemon=True)
    thread.start()
    return thread
