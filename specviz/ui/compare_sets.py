"""The Compare tab over a set of prompts: which set (one of those that ship, or an uploaded file),
the hosted limit on the work (`budget`: every decode counted in tokens before any runs), and the
views of a `runs.PromptSetComparison` as it runs (progress with the time left, then the winner or
why there is none, the tables and the chart of per-prompt speedups)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from ..catalog import BenchPrompt, preset_prompt_sets, read_prompt_file
from ..errors import SpecvizError
from ..runs import Loader, PromptSetComparison, iter_prompt_set
from ..runs.run import load
from ..settings import Limits, RunSettings, check_prompt, whole_number
from ..views import prompt_sets as views
from ..views import render
from .budget import check_set_work, load_tokenizers, set_work
from .common import TICK, Throttle

ONE_PROMPT = "This prompt"
FROM_FILE = "A file of prompts (upload)"
MAX_REPEATS = 5


def sources(limits: Limits) -> list[str]:
    """The choices of the prompt-set menu: one prompt, the sets that ship, and (locally) a file."""
    names = [f"Set: {name} ({len(prompts)} prompts)" for name, prompts in preset_prompt_sets().items()]
    return [ONE_PROMPT, *names] + ([] if limits.hosted else [FROM_FILE])


def prompts_for(source: str, upload, limits: Limits) -> list[BenchPrompt]:
    """The prompts a menu choice (and an upload) stand for; SpecvizError for anything else."""
    if source == FROM_FILE and not limits.hosted:
        path = upload if isinstance(upload, str) else getattr(upload, "name", None)
        if not path:
            raise SpecvizError("Upload a prompt file first (one prompt per line, or JSON Lines with \"prompt\").")
        prompts = read_prompt_file(Path(path))
    else:
        sets = preset_prompt_sets()
        name = source.removeprefix("Set: ").rsplit(" (", 1)[0] if isinstance(source, str) else ""
        if name not in sets:
            raise SpecvizError(f"Unknown prompt set {source!r}: choose one from the menu.")
        prompts = sets[name]
    for prompt in prompts:
        check_prompt(prompt.prompt, limits)
    return prompts


def set_stream(configs: list[RunSettings], prompts: list[BenchPrompt], repeats, limits: Limits,
               loader: Loader | None, view, stop=None) -> Iterator[object]:
    """The work of a prompt-set comparison: `view(status, table, plot, result)` after each finished
    run (progress with the time left in between, at most every few tenths of a second), TICKs otherwise."""
    repeats = whole_number("rounds", repeats, 1, MAX_REPEATS)
    if limits.max_work_tokens is not None or limits.max_prompt_tokens is not None:
        tokenizers = yield from load_tokenizers(configs, loader)
        check_set_work(set_work(configs, prompts, repeats, tokenizers, limits), configs, prompts, limits)
    state = (f"{len(configs)} configuration{'s' if len(configs) > 1 else ''} over {len(prompts)} prompts, "
             f"{repeats} round{'s' if repeats > 1 else ''}, each prompt against its own plain decoding")
    yield view(render.status_html(state, "Running\u2026 (the first run also loads the models)"), None, None, None)
    finished, throttle = 0, Throttle()
    for comparison in iter_prompt_set(configs, prompts, repeats=repeats, loader=loader or load):
        if stop is not None and stop.requested:   # the finished runs stay, and their numbers
            stopped = f"Stopped: {views.progress_line(comparison)}."
            yield (full_view(comparison, state, view, headline=stopped) if comparison.results
                   else view(render.status_html(state, stopped), None, None, None))
            return
        if len(comparison.results) > finished:
            finished = len(comparison.results)
            yield full_view(comparison, state, view)
        elif throttle.due()[0]:
            yield view(render.status_html(state, views.progress_line(comparison) + "\u2026"), None, None, None)
        else:
            yield TICK


def full_view(comparison: PromptSetComparison, state: str, view, headline: str | None = None):
    note = ""
    if headline is None and comparison.done:   # the answer first and short; who won and by how much under it
        headline, note = views.answer_line(comparison), views.winner_line(comparison)
    headline = headline or views.progress_line(comparison)
    headers, rows = views.category_rows(comparison)
    tables = (render.table_html(views.table_headers(comparison), views.table_rows(comparison), label="over the prompts")
              + render.table_html(headers, rows, label="median speedup by category"))
    if comparison.done:
        note += " " + views.timing_line(comparison)
    return view(render.status_html(state, headline, note.strip()), tables,
                gr.update(value=views.speedups_figure(comparison), visible=True), (comparison, None))
