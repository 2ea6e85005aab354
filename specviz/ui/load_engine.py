"""The Load tab on vLLM or llama.cpp: the same sweep run by `runs.engine_load.engine_sweep`, one
server per configuration, with the own tab's charts and decision plus the engine's acceptance by
draft position and the config to copy (vLLM's --speculative-config, llama-server's flags). Stop ends
the requests and the server in use (the finished points stay); a server that fails to start shows
its log's last lines. llama.cpp runs the model's GGUF with xllamacpp (`specviz[llamacpp]`), every
core, one slot per request of the largest batch; hosted, it is off unless SPECVIZ_HOSTED_LLAMACPP=1.

Where vLLM lives is the operator's choice, not a visitor's: SPECVIZ_VLLM_PYTHON names its
interpreter and SPECVIZ_VLLM_ARGS the arguments every server gets (none by default: on a CPU the
engine adds `--enforce-eager --max-model-len 1024` itself, on a GPU nothing, see
`engines.vllm_server.DEVICE_DEFAULTS`). In hosted mode the engine choice is off unless the
operator sets SPECVIZ_HOSTED_VLLM=1; the hosted caps on batch sizes, k and tokens apply to it too.
SPECVIZ_VLLM_URLS ("0=http://host:8000,4=http://host:8001") points the app at vLLM servers already
running, by draft length, as `--engine-url` does on the command line: those configurations are
measured there and no server is started for them.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from ..catalog import preset_prompt_sets
from ..engines import LlamaCppEngine, VllmEngine, engine_configs, llamacpp, model_location
from ..engines.configs import parse_server_urls, speculative_config
from ..errors import SpecvizError
from ..runs.engine_load import EngineProgress, engine_sweep
from ..settings import Limits, RunSettings, validate, whole_numbers
from ..views import render
from ..views.engine_view import acceptance_figure, config_to_copy, engine_html
from ..views.export import finite_json
from ..views.load_view import decision, load_figures
from .budget import check_load_caps
from .common import StopSignal, draft_spec, error_html, failure

OWN, VLLM = "specviz's own loop (every token's verdict)", "vLLM (the serving engine)"
LLAMACPP = "llama.cpp (the server on your machine)"


def operator_args() -> list[str]:
    """SPECVIZ_VLLM_ARGS: what every server the app starts gets (the device's defaults come on top)."""
    return shlex.split(os.environ.get("SPECVIZ_VLLM_ARGS", ""))


def operator_urls() -> dict[int, str]:
    """SPECVIZ_VLLM_URLS: running vLLM servers by draft length, which the app uses instead of starting its own."""
    text = os.environ.get("SPECVIZ_VLLM_URLS", "").strip()
    return parse_server_urls([item for item in text.split(",") if item.strip()], "SPECVIZ_VLLM_URLS")


@dataclass
class Outcome:
    """How one engine's run ended, for a caller that runs several (the Load tab's "all three"): the
    finished sweep (None when it failed before one) and the message of a failure."""

    result: object = None
    error: str | None = None


def vllm_offered(limits: Limits) -> bool:
    """Whether the tab offers vLLM: always on one's own machine; hosted only if the operator enables it."""
    return not limits.hosted or os.environ.get("SPECVIZ_HOSTED_VLLM", "").strip() == "1"


def llamacpp_offered(limits: Limits) -> bool:
    """Whether the tab offers llama.cpp: on one's own machine; hosted only if the operator enables it."""
    return not limits.hosted or os.environ.get("SPECVIZ_HOSTED_LLAMACPP", "").strip() == "1"


def offered_engines(limits: Limits) -> list[str]:
    return [OWN] + [VLLM] * vllm_offered(limits) + [LLAMACPP] * llamacpp_offered(limits)


def make_engine(choice: str, settings: RunSettings, parallel: int, stop: StopSignal, say=None):
    """The engine `choice` names for `settings`' target: llama.cpp on its GGUF with `parallel` slots,
    or vLLM with the operator's arguments; on a GPU each in its own serving dtype (`engines.gpu`)."""
    if choice == LLAMACPP:
        return LlamaCppEngine(model=llamacpp.gguf_location(settings.target), parallel=parallel, say=say,
                              stopped=lambda: stop.requested, requested_device=settings.device)
    # On a GPU vLLM serves in its own choice ("auto"): the dtype given (the own loop's, in "all three")
    # is for a CPU, where both then do the same arithmetic; vLLM's GPU attention refuses float32.
    return VllmEngine(model=model_location(settings.target), dtype=settings.dtype, gpu_dtype="auto",
                      engine_args=operator_args(), urls=operator_urls(), say=say, stopped=lambda: stop.requested,
                      requested_device=settings.device)


def engine_title(choice: str) -> str:
    """How messages write the engine a choice names."""
    return "llama.cpp" if choice == LLAMACPP else "vLLM"


def refuse_unoffered(choice: str, limits: Limits) -> str:
    """The engine's name in messages; a message when this (hosted) app does not offer it."""
    title = engine_title(choice)
    if choice not in offered_engines(limits):
        raise SpecvizError(f"This hosted demo does not run {title} (its operator can enable it with "
                           f"SPECVIZ_HOSTED_{'LLAMACPP' if choice == LLAMACPP else 'VLLM'}=1).")
    return title


def _decision(result) -> str:
    text = decision(result)
    copy = config_to_copy(result)
    where = ("llama.cpp's server flags" if result.settings.get("engine") == "llamacpp"
             else "vLLM's `--speculative-config`")
    return text + (f"\n\n{where} for this traffic: `{copy}`" if text and copy else "")


def engine_view(view_type, result, state: str, headline: str, message: str):
    speedup, throughput, latency = load_figures(result)
    return view_type(status=render.status_html(state, headline), rows=engine_html(result, message), speedup=speedup,
                     throughput=throughput, latency=latency, decision=_decision(result) or gr.skip(),
                     acceptance=acceptance_figure(result), summary=finite_json(result.to_dict()))


def engine_work(view_type, limits: Limits, drafter, draft_model, batches_text, ks_text, set_name, max_new_tokens,
                stop: StopSignal, choice: str = VLLM, outcome: Outcome | None = None, dtype: str = "auto") -> Iterator:
    """The Run button's work on vLLM or llama.cpp (`choice`; `view_type` is the tab's LoadView); how it
    ended goes to `outcome` when given."""
    outcome = outcome if outcome is not None else Outcome()
    skip = gr.skip()

    def status_only(html: str):
        return view_type(status=html, rows=skip, speedup=skip, throughput=skip, latency=skip, decision=skip,
                         acceptance=skip)

    stream = None
    title = engine_title(choice)
    try:
        refuse_unoffered(choice, limits)
        batches = whole_numbers("Batch sizes", batches_text, 1, 64)
        ks = whole_numbers("Draft lengths k", ks_text, 0, 64)
        settings = validate(RunSettings(draft=draft_spec(drafter, draft_model, 8), k=max(max(ks), 1),
                                        max_new_tokens=max_new_tokens, temperature=0.0, dtype=dtype), limits)
        check_load_caps(batches, ks, settings.max_new_tokens, limits)
        sets = preset_prompt_sets()
        if set_name not in sets:
            raise SpecvizError(f"No prompt set {set_name!r}: choose one of {', '.join(sets)}.")
        prompts = sets[set_name]
        configs = (llamacpp.engine_configs(settings.draft, ks) if choice == LLAMACPP
                   else engine_configs(settings.draft, ks, target=settings.target))
        state = (f"{title}: batch sizes {', '.join(map(str, batches))}; k {', '.join(map(str, ks))}; the {set_name!r} "
                 f"set; {settings.max_new_tokens} new tokens")
        yield status_only(render.status_html(state, f"Finding {title}\u2026"))
        lines: list[str] = []
        engine = make_engine(choice, settings, max(batches), stop, lines.append)
        stream = engine_sweep(settings, prompts, engine, configs, batches=batches, ks=ks)
        progress: EngineProgress | None = None
        for progress in stream:
            outcome.result = progress.result
            if stop.requested:     # the finished points stay; the servers stop as the sweep closes
                stream.close()
                yield engine_view(view_type, progress.result, state,
                                  f"Stopped after {len(progress.result.points)} points; the {title} servers are "
                                  "stopped.", "stopped")
                return
            message = progress.message or (lines[-1] if lines else "")
            headline = f"{len(progress.result.points)} points measured\u2026 {message}"
            yield engine_view(view_type, progress.result, state, headline, message)
        yield engine_view(view_type, progress.result, state, "Finished.", "finished")
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message in the page
        if stop.requested:
            yield status_only(render.status_html(title, f"Stopped; the {title} servers are stopped."))
        else:
            outcome.error = failure(exc, f"load sweep on {title}")
            yield status_only(error_html(outcome.error))
    finally:
        if stream is not None:
            stream.close()


# ----------------------------------------------------------------------------- the Compare tab over a prompt set

def engine_set_stream(configs: list[RunSettings], prompts, repeats: int, limits: Limits, view, full_view,
                      stop: StopSignal, choice: str = VLLM) -> Iterator:
    """The Compare tab's prompt-set comparison on vLLM or llama.cpp (`choice`; `runs.engine_compare`):
    each configuration's server against the plain one at concurrency 1; `full_view` is compare_sets'
    own view of a `PromptSetComparison`, with the engine's acceptance and every mismatch added to its
    status."""
    from ..engines.configs import EngineConfig
    from ..runs.engine_compare import engine_compare

    title = refuse_unoffered(choice, limits)
    first = configs[0]
    if any((c.target, c.temperature, c.chat) != (first.target, first.temperature, first.chat) for c in configs):
        raise SpecvizError(f"On {title} every configuration runs against one plain server: give every row the "
                           "same target and temperature.")
    def spec(c):    # vLLM's 'head' is the head shipped for the row's target, refused for another target
        return (llamacpp.speculative_config(c.draft, c.k) if choice == LLAMACPP
                else speculative_config(c.draft, c.k, target=c.target))

    engine_list = [EngineConfig(0, None)] + [EngineConfig(c.k, spec(c)) for c in configs]
    engine = make_engine(choice, first, 1, stop)
    state = (f"{title}: {len(configs)} configuration{'s' if len(configs) > 1 else ''} over {len(prompts)} prompts, "
             f"{repeats} round{'s' if repeats > 1 else ''}, each against the plain server at concurrency 1")
    yield view(render.status_html(state, f"Starting {title}'s servers\u2026"), None, None, None)
    finished, out = 0, None
    stream = engine_compare(first, prompts, engine, engine_list, repeats=repeats)
    try:
        for out in stream:
            if stop.requested:
                yield (full_view(out.comparison, state, view, headline=f"Stopped; the {title} servers are stopped.")
                       if out.comparison.results else view(render.status_html(state, "Stopped."), None, None, None))
                return
            if len(out.comparison.results) > finished:
                finished = len(out.comparison.results)
                yield full_view(out.comparison, state, view)
    finally:
        stream.close()
    if out is not None:
        yield full_view(out.comparison, state + "; " + engine_note(out, title), view)


def engine_note(out, title: str = "vLLM") -> str:
    """The engine's acceptance per configuration and the outputs that differ from the plain server's."""
    parts = [f"{label}: {title}'s mean acceptance length {f['mean_acceptance_length']:.2f}, "
             f"{f['draft_acceptance_rate']:.0%} of drafts accepted" for label, f in out.acceptance.items() if f]
    for m in out.mismatches:
        d = m["first_difference"]
        parts.append(f"{m['config']} on {m['prompt_id']} differs from plain at word {d['word']} "
                     f"({d['text']!r} vs {d['plain_text']!r})")
    return "; ".join(parts) or f"{title} reported no acceptance figures"
