"""specviz's questions as API endpoints with typed parameters, which `python app.py --mcp` also serves
as MCP tools: race a configuration on a prompt, compare configurations, sweep batch sizes, read a
recording's figures. Each answers with named JSON as text (the command line's own `--json` fields), under
the page's limits (hosted: preset models, short runs), and goes through the same work as its tab:
a race joins or replays the shared race a visitor asked for (`runs.shared_race`)."""

from __future__ import annotations

import html
import json
import re

import gradio as gr

from ..catalog import bundled_recordings, preset_prompt_sets
from ..errors import SpecvizError, user_message
from ..runs import Loader, recording
from ..runs.shared_race import FINISHED, SharedRaces
from ..settings import Limits, RunSettings, check_prompt, parse_draft, validate
from ..views.export import finite_json
from .common import (CHAT, CONCURRENCY_ID, DRAFT_MODEL, EARLY_EXIT, PROMPT_LOOKUP, RAW, TICK, SessionMemories,
                     StopSignal)
from .compare_sets import ONE_PROMPT, sources
from .compare_tab import comparison_json, compare_work
from .load_engine import OWN
from .shared_run import race_stream, race_ticket, summary_json

TOOLS = ("race_speculative_decoding", "compare_configurations", "load_sweep", "read_recording")
RACE_WAIT_SECONDS = 600          # a race waits for a slot and runs within this long, or the call fails


def page_text(markup) -> str:
    """A view's HTML message as one line of text (an error for the caller)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", str(markup))).split())


def as_text(data: dict) -> str:
    """A tool's answer as JSON text: an MCP client gets text (Gradio would send a dict's Python repr)."""
    return json.dumps(finite_json(data), ensure_ascii=False)


def _drain(work, *args):
    """The last view a tab's work yields (its finished state, or its error)."""
    last = None
    for view in work(*args, stop=StopSignal()):
        if view is not TICK:
            last = view
    return last


def build_tools(*, limits: Limits, loader: Loader | None, races: SharedRaces, memories: SessionMemories) -> None:
    """The tools as `gr.api` endpoints of the Blocks being built (call inside it)."""
    stream = race_stream(limits, loader, memories)

    def race_speculative_decoding(prompt: str, draft: str = "ngram", k: int = 8, max_new_tokens: int = 128,
                                  temperature: float = 0.0, seed: int = 0, chat: bool = True,
                                  measure_again: bool = False) -> str:
        """Race speculative decoding against plain decoding of the same model (the built-in
        SmolLM2-135M-Instruct) on one prompt, and return what was measured: speedup with its 95%
        interval (speedup_low, speedup_high), the clock that timed it, the acceptance figures,
        tokens and both texts. A race someone else asked for in the last 10 minutes is returned as
        that measurement (measurement.replay true, measured_at, shown_to) unless measure_again.

        Args:
            prompt: the text the model answers (chat) or continues; hosted: at most 4,000 characters and 1,024 tokens.
            draft: the drafter: "ngram" (prompt lookup), "ngram-tree", "suffix", "self:N" (early exit after the target's first N layers) or a draft model (hosted: a preset's).
            k: the most tokens drafted per cycle, 1 to 16 hosted (64 locally).
            max_new_tokens: tokens to generate, 1 to 256 hosted.
            temperature: 0 for greedy decoding (both outputs identical), up to 2 hosted for sampling.
            seed: the sampling seed (a whole number).
            chat: true to wrap the prompt in the model's chat template, false for raw completion.
            measure_again: true to race afresh instead of returning a race measured in the last 10 minutes.
        Returns:
            settings, prompt, text, baseline_text, summary (speedup, speedup_low, speedup_high, clock, compared_basis, tokens, draft_acceptance_rate, mean_acceptance_length, ...), environment, measurement.
        """
        try:
            settings = validate(RunSettings(draft=draft, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                                            seed=seed, chat=bool(chat)), limits)
            prompt = check_prompt(prompt, limits)
            with race_ticket(races, stream, settings, prompt, None, fresh=bool(measure_again)) as ticket:
                if not ticket.race.wait_until_ended(RACE_WAIT_SECONDS):
                    raise SpecvizError(f"The race did not finish within {RACE_WAIT_SECONDS} s: try again later.")
                if ticket.race.state != FINISHED:
                    raise ticket.race.error or SpecvizError("The race was stopped.")
                return as_text(summary_json(ticket.race.result, ticket))
        except Exception as exc:  # noqa: BLE001 - the caller gets one line
            raise gr.Error(user_message(exc)) from None

    def compare_configurations(drafts: list[str], prompt: str = "", prompt_set: str = "", k: int = 4,
                               max_new_tokens: int = 96, rounds: int = 1, seed: int = 0, chat: bool = True) -> str:
        """Compare up to four drafters on one prompt, or over a preset prompt set (the median speedup
        with its 95% interval), each against plain decoding of the same model.

        Args:
            drafts: one to four drafters, each as race_speculative_decoding's draft ("ngram", "self:20", ...).
            prompt: the prompt, when prompt_set is empty.
            prompt_set: a preset set's name ("chat", "rewrite", "examples", ...) to compare over instead of one prompt.
            k: the most tokens drafted per cycle, for every drafter.
            max_new_tokens: tokens generated per prompt.
            rounds: rounds over a prompt set, 1 to 5.
            seed: the sampling seed.
            chat: true to wrap each prompt in the chat template.
        Returns:
            for one prompt: prompt, configurations (each with config, speedup, speedup_low, speedup_high, clock, ...) and winner; for a set: its summary per configuration.
        """
        rows = [[True, "", spec, k, False, 0.0, 1, False] for spec in drafts]
        source = ONE_PROMPT
        if prompt_set:
            named = {choice.removeprefix("Set: ").rsplit(" (", 1)[0]: choice for choice in sources(limits)
                     if choice.startswith("Set: ")}
            if prompt_set not in named:
                raise gr.Error(f"No prompt set {prompt_set!r}: choose one of {', '.join(named)}.")
            source = named[prompt_set]
        view = _drain(compare_work(limits, loader), prompt, rows, max_new_tokens, seed, CHAT if chat else RAW,
                      source, None, rounds, OWN)
        answer = comparison_json(view.result) if view is not None else None
        if not isinstance(answer, dict) or "__type__" in answer:
            raise gr.Error(page_text(view.status) if view is not None else "The comparison produced nothing.")
        return as_text(answer)

    def load_sweep(draft: str = "ngram", batches: str = "1,2,4", ks: str = "0,2,4", prompt_set: str = "rewrite",
                   max_new_tokens: int = 32) -> str:
        """Speculative decoding under load: tokens per second and latency at each batch size and draft
        length k (k = 0: speculation off), the speedup against k = 0, and the batch size from which
        speculation stops paying.

        Args:
            draft: "ngram" (prompt lookup), "self:N" (early exit) or a draft model with the target's tokenizer.
            batches: batch sizes, comma-separated, 1 to 64 (hosted: fewer, see the Load tab).
            ks: draft lengths k, comma-separated, 0 to 64; include 0 for the baseline.
            prompt_set: the preset prompt set the batches are drawn from.
            max_new_tokens: tokens generated per request.
        Returns:
            the sweep as `python -m specviz load --json` writes it: its points and the recommended k per batch size.
        """
        kind = parse_draft(draft).kind
        if kind == "ngram":
            drafter, model, layer = PROMPT_LOOKUP, "", 8
        elif kind == "self":
            drafter, model, layer = EARLY_EXIT, "", parse_draft(draft).layers
        else:
            drafter, model, layer = DRAFT_MODEL, draft, 8
        if prompt_set not in preset_prompt_sets():
            raise gr.Error(f"No prompt set {prompt_set!r}: choose one of {', '.join(preset_prompt_sets())}.")
        from .load_tab import load_work_fn      # the Load tab's own work

        view = _drain(load_work_fn(limits, loader), drafter, model, layer, batches, ks, prompt_set, max_new_tokens, OWN)
        if view is None or view.summary is None:
            raise gr.Error(page_text(view.status) if view is not None else "The sweep produced nothing.")
        return as_text(view.summary)

    def read_recording(name: str) -> str:
        """The figures of a recording (a finished run saved as JSON, replayable without a model): for
        each of its runs, the summary it was recorded with (speedup and its interval, clock, acceptance).

        Args:
            name: a bundled recording's file name (e.g. "prompt-lookup-rewrite.json"); locally also a path to a recording file.
        Returns:
            name, created, environment and runs (each: label, prompt, text and summary).
        """
        files = bundled_recordings()
        try:
            if name in files:
                path = files[name]
            elif limits.hosted:
                raise SpecvizError(f"No bundled recording {name!r}: choose one of {', '.join(files)}.")
            else:
                path = name
            opened = recording.load(path)
        except Exception as exc:  # noqa: BLE001
            raise gr.Error(user_message(exc)) from None
        return as_text({"name": opened.name, "created": opened.created, "environment": opened.environment,
                            "runs": [{"label": label, "prompt": run.prompt, "text": run.text, "summary": run.summary()}
                                  for label, run in zip(opened.labels, opened.runs)]})

    from .run_tab import RUN_VIEWERS

    gr.api(race_speculative_decoding, api_name="race_speculative_decoding", concurrency_limit=RUN_VIEWERS,
           concurrency_id="run")
    for tool in (compare_configurations, load_sweep):
        gr.api(tool, api_name=tool.__name__, concurrency_limit=1, concurrency_id=CONCURRENCY_ID)
    gr.api(read_recording, api_name="read_recording", concurrency_limit=4, concurrency_id="read-recording")


def only_tools_public(demo: gr.Blocks) -> None:
    """As an MCP server: the tabs' events stay callable by API clients but are no tools (Gradio makes
    a tool of every public event)."""
    for fn in demo.fns.values():
        if fn.api_visibility == "public" and fn.api_name not in TOOLS:
            fn.api_visibility = "undocumented"
