"""`--engine vllm` and `--engine llamacpp` for `load` and `compare`: the flags that say where the
engine lives and what it runs, and the load sweep on it (`runs.engine_load.engine_sweep`), printed
with the own sweep's table and written as the own sweep's JSON plus the engine's figures."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..engines import (TITLES, LlamaCppEngine, VllmEngine, engine_configs, llamacpp, model_location,
                       parse_speculative_config, vllm_dtype)
from ..engines.configs import HYBRID_ON_ENGINES, parse_server_urls
from ..engines.vllm_install import VLLM_ENV
from ..engines.vllm_server import START_TIMEOUT
from ..errors import SpecvizError
from ..files import write_atomic
from ..runs.engine_load import DECISION_METRICS
from ..settings import DraftSpec, RunSettings

ENGINES = ("specviz", "vllm", "llamacpp")
SERVING = ("vllm", "llamacpp")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (--engine vllm or llamacpp)")
    group.add_argument("--engine", choices=ENGINES, default="specviz",
                       help="specviz: specviz's own loop (every token's verdict); vllm: vLLM's OpenAI server, one "
                            "per configuration; llamacpp: llama.cpp's server (xllamacpp or --llama-server), the same")
    group.add_argument("--vllm-python", default=None, metavar="PATH",
                       help=f"the interpreter of vLLM's own environment (default: ${VLLM_ENV})")
    group.add_argument("--llama-server", default=None, metavar="PATH",
                       help="a llama-server binary to run (default: llama.cpp's server from xllamacpp)")
    group.add_argument("--speculative-config", default=None, metavar="JSON",
                       help="vLLM's speculative config for any method (suffix, eagle3, mtp, ...), or llama.cpp's "
                            "type and sizes ('{\"type\": \"ngram-mod\", \"n_match\": 8}'); the draft length is "
                            "set to each k measured")
    group.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                       help="passed to every server started, e.g. --engine-arg=--tensor-parallel-size=2 or "
                            "--engine-arg=-tp=2 (repeat; write it with '=')")
    group.add_argument("--engine-url", action="append", default=[], metavar="K=URL",
                       help="an already-running server for draft length K (0 = the plain one), running the config "
                            "--draft/--speculative-config describe at K; nothing is started for that K")
    group.add_argument("--engine-log-dir", type=Path, default=None, metavar="DIR",
                       help="where the servers' logs go (default: a new temporary folder)")
    group.add_argument("--start-timeout", type=float, default=START_TIMEOUT, metavar="S",
                       help="seconds a server may take to start (default %(default)s)")
    group.add_argument("--metric", choices=list(DECISION_METRICS), default="throughput",
                       help="what the load sweep's decision and recommended config follow: " + "; ".join(
                           f"{name}: {text}" for name, text in DECISION_METRICS.items()) + " (default %(default)s)")


def check_engine_flags(args: argparse.Namespace) -> None:
    """The engine flags make sense only with a serving engine (--vllm-python with vLLM's,
    --llama-server with llama.cpp's)."""
    if args.engine not in SERVING:
        given = [flag for flag, value in (("--speculative-config", args.speculative_config),
                                          ("--engine-arg", args.engine_arg), ("--engine-url", args.engine_url),
                                          ("--vllm-python", args.vllm_python), ("--llama-server", args.llama_server),
                                          ("--metric", getattr(args, "metric", "throughput") != "throughput"))
                 if value]
        if given:
            raise SpecvizError(f"{', '.join(given)} go with --engine vllm or --engine llamacpp.")
    if args.engine == "llamacpp" and args.vllm_python:
        raise SpecvizError("--vllm-python goes with --engine vllm.")
    if args.engine == "vllm" and args.llama_server:
        raise SpecvizError("--llama-server goes with --engine llamacpp.")


def make_engine(args: argparse.Namespace, settings: RunSettings, say, parallel: int = 1):
    if args.start_timeout <= 0:
        raise SpecvizError(f"--start-timeout must be above 0, got {args.start_timeout}.")
    urls = parse_server_urls(args.engine_url, "--engine-url")
    if args.engine == "llamacpp":
        return LlamaCppEngine(model=llamacpp.gguf_location(settings.target), server=args.llama_server,
                              threads=getattr(args, "threads", None) or os.cpu_count() or 1, parallel=parallel,
                              engine_args=list(args.engine_arg), urls=urls, log_dir=args.engine_log_dir,
                              start_timeout=args.start_timeout, say=say, requested_device=settings.device)
    vllm_dtype(settings.dtype)          # an unknown dtype is refused before vLLM is looked for
    if getattr(args, "threads", None) is not None:
        say("note: --threads sets specviz's torch threads; vLLM's CPU build picks its own (VLLM_CPU_OMP_THREADS_BIND)")
    return VllmEngine(model=model_location(settings.target), vllm_python=args.vllm_python, dtype=settings.dtype,
                      engine_args=list(args.engine_arg), urls=urls, log_dir=args.engine_log_dir,
                      start_timeout=args.start_timeout, say=say, requested_device=settings.device)


def engine_draft_configs(args: argparse.Namespace, draft: DraftSpec, ks, target: str | None = None):
    """The servers' configs for the drafter `settings_from` parsed (a DraftSpec, passed down as it is), for
    the model string `target` (--target; None: the built-in)."""
    if draft is not None and draft.kind == "auto" and args.speculative_config is None:
        raise SpecvizError(HYBRID_ON_ENGINES.format(engine="llama.cpp" if args.engine == "llamacpp" else "vLLM"))
    if args.engine == "llamacpp":
        return llamacpp.engine_configs(draft, ks, llamacpp.parse_speculative_config(args.speculative_config))
    given = parse_speculative_config(args.speculative_config)
    if given is None and draft.kind in ("self", "ngram-tree"):
        raise SpecvizError(f"vLLM has no drafter like {str(draft)!r} (early exit and trees are specviz's own): use "
                           "ngram, suffix, a draft model, or --speculative-config.")
    return engine_configs(draft, ks, given, target=target)


def load_main(args: argparse.Namespace, settings: RunSettings, prompts, batches, ks) -> int:
    """`load --engine vllm|llamacpp`: the sweep on that engine. Ctrl-C or a failure keeps the finished
    points: they are printed and written to --json with the error."""
    from ..runs.engine_load import engine_sweep

    say = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    configs = engine_draft_configs(args, settings.draft, ks, settings.target)
    engine = make_engine(args, settings, say, parallel=max(batches))
    engine.check(configs)
    say(f"{engine.title} {engine.install.version if engine.install else '(given servers)'}: {engine.model}, "
        f"{len(configs)} configurations ({', '.join(c.label for c in configs)}); batch sizes {batches}, "
        f"{len(prompts)} prompts, {settings.max_new_tokens} new tokens")
    result, failure = None, None
    try:
        for progress in engine_sweep(settings, prompts, engine, configs, batches=batches, ks=ks,
                                     repeats=args.repeats, metric=args.metric):
            result = progress.result
            if progress.point is not None:
                p = progress.point
                figures = p.acceptance or {}
                say(f"batch {p.batch:>3} k {p.k}: {p.speedup:.2f}x [{p.speedup_low:.2f}-{p.speedup_high:.2f}] "
                    f"({args.metric}), {p.spec_tokens_per_s:.1f} vs {p.plain_tokens_per_s:.1f} output tokens/s, "
                    f"TPOT {p.spec_latency * 1000:.0f} vs {p.plain_latency * 1000:.0f} ms"
                    + (f", mean acceptance length {figures['mean_acceptance_length']:.2f}" if figures else ""))
            elif progress.response is None and progress.message:
                say(progress.message)
    except (SpecvizError, KeyboardInterrupt) as error:
        failure = error
        if result is None:
            raise
        result.error = "cancelled (Ctrl-C)" if isinstance(error, KeyboardInterrupt) else str(error)
    if args.json:
        write_atomic(args.json, json.dumps(result.to_dict(), indent=2))
    if result.points:
        print_engine_result(result)
    if args.json:
        print(f"\nwrote {args.json}" + (" (the points that finished)" if failure else ""))
    if failure is not None:
        if isinstance(failure, KeyboardInterrupt):
            raise failure
        raise SpecvizError(f"{failure} The {len(result.points)} points that finished are kept above"
                           + (f" and in {args.json}." if args.json else "."))
    return 0


def print_engine_result(result) -> None:
    """The sweep on a serving engine: the decision metric's ratio with the engine's other figures
    beside it, the decision sentence, and the config to copy."""
    from ..views.load_view import decision, outputs_note
    from .common import make_console, print_table, rich_table

    settings, env = result.settings, result.environment
    title = TITLES[settings.get("engine", "vllm")]
    where = f"{env['device_name']} ({env['device']})" if env.get("device_name") else env.get("device")
    print(f"{settings['target']} + {settings['draft']}; {title} {result.engine.get('version') or '(version not said)'} "
          f"on {where}, dtype {result.engine.get('dtype')}; {settings['output_length']}; servers {settings['servers']}")
    rows = [[str(p.batch), str(p.k), f"{p.speedup:.2f}x", f"{p.speedup_low:.2f}-{p.speedup_high:.2f}",
             f"{p.spec_tokens_per_s:.1f} / {p.plain_tokens_per_s:.1f}",
             f"{p.spec_latency * 1000:.0f} / {p.plain_latency * 1000:.0f}",
             f"{p.spec_itl * 1000:.0f} / {p.plain_itl * 1000:.0f}",
             f"{p.spec_ttft * 1000:.0f} / {p.plain_ttft * 1000:.0f}",
             f"{p.mean_acceptance_length:.2f}" if p.k else "-", str(p.requests),
             "-" if p.identical is None or not p.k else "yes" if p.identical else "NO"] for p in result.points]
    print_table(make_console(), rich_table(
        f"speculation under load on {title}: speedup = {settings['decision_metric_text']}, speculative / plain",
        ["batch", "k", "speedup", "95% range", "output tok/s spec / plain", "TPOT ms", "ITL ms", "TTFT ms",
         "accept len", "requests", "identical"], rows))
    if outputs_note(result):
        print(outputs_note(result))
    print(decision(result))
    print("best k per batch size (0 = off): " + json.dumps(result.recommended_k))
    for p in result.points:
        if p.acceptance and "accepted_per_position" in p.acceptance:
            print(f"batch {p.batch} k {p.k}: {p.acceptance['num_accepted_draft_tokens']} of "
                  f"{p.acceptance['num_draft_tokens']} drafts accepted over {p.acceptance['num_spec_steps']} steps; "
                  f"accepted at each position {p.acceptance['accepted_per_position']}")
    copy = result.recommended_speculative_config
    if settings.get("engine") == "llamacpp":
        print("llama.cpp's server for this traffic: " + (json.dumps(copy) if copy else "no speculation (it paid at "
                                                                                        "no batch size measured)"))
    else:
        print("vLLM's speculative config for this traffic: " + json.dumps(copy))


def compare_main(args: argparse.Namespace, drafts: list[DraftSpec], settings: RunSettings, prompts) -> int:
    """`compare --engine vllm|llamacpp --prompts SET`: each --draft (or --speculative-config) at --k on
    the engine against the plain server, concurrency 1, with the own comparison's tables and JSON plus vLLM's
    figures and every output that differs from the plain server's (with its first differing word)."""
    from ..engines import EngineConfig
    from ..runs.engine_compare import engine_compare
    from ..views import prompt_sets as views
    from .common import make_console, print_table, printable, rich_table
    from .common import say as say_line

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    title = TITLES[args.engine]
    spec_configs = []
    if args.speculative_config:
        spec_configs = engine_draft_configs(args, None, [settings.k], settings.target)[1:]
    for draft in ([] if spec_configs else drafts):
        spec_configs += engine_draft_configs(args, draft, [settings.k], settings.target)[1:]
    configs = [EngineConfig(0, None)] + spec_configs
    engine = make_engine(args, settings, say)
    if set(engine.urls) - {0}:
        raise SpecvizError(f"compare --engine {args.engine} takes --engine-url 0=URL (a running plain server) "
                           "only: each speculative configuration gets a server of its own.")
    engine.check(configs)
    out, shown = None, 0
    try:
        for out in engine_compare(settings, prompts, engine, configs, repeats=args.repeats):
            if len(out.comparison.results) > shown:
                shown = len(out.comparison.results)
                last = out.comparison.results[-1]
                say(printable(f"[{len(out.comparison.results)} of {out.comparison.total}] "
                              f"{out.comparison.labels[last.config]} on {prompts[last.prompt].id}: "
                              f"{last.speedup or 0:.2f}x" + ("" if last.identical in (True, None) else ", DIFFERS")))
    except KeyboardInterrupt:
        if out is None or not out.comparison.results:
            raise
        say(f"cancelled after {len(out.comparison.results)} of {out.comparison.total} runs; the finished runs follow")
    comparison = out.comparison
    if args.json:
        write_atomic(args.json, json.dumps(dict(views.summary(comparison), rows=views.rows(comparison),
                                                **out.engine_fields()), indent=2, ensure_ascii=False))
    console = make_console(args.no_color)
    print_table(console, rich_table(f"On {title}, over the prompts (concurrency 1)", views.table_headers(comparison),
                                    views.table_rows(comparison)))
    say_line(console, views.winner_line(comparison))
    say_line(console, views.timing_line(comparison))
    for label, figures in out.acceptance.items():
        if figures:
            say_line(console, f"{title} reported for {label}: mean acceptance length "
                              f"{figures['mean_acceptance_length']:.2f}, draft acceptance rate "
                              f"{figures['draft_acceptance_rate']:.1%}, histogram {figures['acceptance_histogram']}")
    if out.mismatches:
        for m in out.mismatches:
            d = m["first_difference"]
            say_line(console, printable(f"{m['config']} on {m['prompt_id']}: the output differs from the plain "
                                        f"server's at word {d['word']} ({d['text']!r} vs {d['plain_text']!r})"))
    elif settings.temperature == 0.0:
        say_line(console, "Every greedy output is identical to the plain server's.")
    if args.json:
        say_line(console, f"wrote {args.json}")
    return 0
