"""`python -m specviz load`: speculation under load. Batched speculative decoding against batched
plain decoding at each batch size and draft length (`runs.load.sweep`), printed as a table with the
crossover batch and the best k per batch size; `--json` also writes the sweep to a file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import SpecvizError
from ..files import check_paths, write_atomic
from ..models.sources import TINY_TARGET
from ..runs.load_result import DEFAULT_BATCHES, DEFAULT_KS, LoadResult
from ..settings import whole_numbers
from ..views.load_view import outputs_note
from .common import (DRAFT_HELP, TARGET_HELP, add_model_arguments, add_sampling_argument, check_output_file, load,
                     make_console, print_table,
                     progress_printer, read_prompts, rich_table, settings_from)
from .engine import SERVING, add_engine_arguments, check_engine_flags, load_main

MAX_BATCH = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, target_help=TARGET_HELP + f"; '{TINY_TARGET}': a tiny Llama pair built in-process",
                        draft_help=DRAFT_HELP.split(", 'ngram-tree'")[0] + " or 'self:L' (early exit after layer L); "
                                   "trees and suffix decoding run one request at a time")
    parser.add_argument("--batch", default=",".join(map(str, DEFAULT_BATCHES)), metavar="B,B,...",
                        help="batch sizes (default %(default)s)")
    parser.add_argument("--k", default=",".join(map(str, DEFAULT_KS)), metavar="K,K,...",
                        help="draft lengths, 0 = speculation off (default %(default)s)")
    parser.add_argument("--prompts", default="examples", metavar="SET_OR_FILE",
                        help="a prompt set (examples, chat, code, rewrite, summarisation, translation, maths) or a "
                             "file (one prompt per line, or JSON Lines); a batch of B takes the first B, cycled")
    parser.add_argument("--max-new-tokens", default=64)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each point (pooled)")
    parser.add_argument("--temperature", default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", default=0)
    parser.add_argument("--top-p", default=1.0)
    parser.add_argument("--seed", default=None,
                        help="row r of a batch draws from its own generator, seeded from (seed, r)")
    add_sampling_argument(parser)
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the sweep as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    add_engine_arguments(parser)


def main(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before a model is loaded.
    batches = whole_numbers("--batch", args.batch, 1, MAX_BATCH)
    ks = whole_numbers("--k", args.k, 0, 64)
    if args.repeats < 1:
        raise SpecvizError(f"--repeats must be at least 1, got {args.repeats}.")
    settings = settings_from(args, k=max(max(ks), 1))
    check_engine_flags(args)
    if args.engine not in SERVING:
        from ..runs.load import check_draft_spec

        check_draft_spec(settings)
    prompts = read_prompts(args.prompts)
    check_output_file(args.json, "--json")
    check_paths([args.prompts] if Path(args.prompts).is_file() else [], [("--json", args.json)])
    if args.engine in SERVING:
        return load_main(args, settings, prompts, batches, ks)

    from ..runs.load import check_drafter, sweep

    pair = load(settings, None if args.quiet else progress_printer())
    check_drafter(pair)
    say = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    say(f"{pair.target_name} + {pair.draft_name}: batch sizes {batches}, k {ks}, {len(prompts)} prompts, "
        f"{settings.max_new_tokens} new tokens, {args.repeats} repeat(s)")
    result = None
    for progress in sweep(settings, prompts, pair, batches=batches, ks=ks, repeats=args.repeats):
        result = progress.result
        if progress.point is not None:
            p = progress.point
            say(f"batch {p.batch:>3} k {p.k}: {p.speedup:.2f}x [{p.speedup_low:.2f}-{p.speedup_high:.2f}], "
                f"theory {p.theory:.2f}x, {p.tokens_per_pass:.2f} tokens per pass, "
                f"mean acceptance length {p.mean_acceptance_length:.2f}")
    if args.json:
        write_atomic(args.json, json.dumps(result.to_dict(), indent=2))
    print_result(result)
    if args.json:
        print(f"\nwrote {args.json}")
    return 0


def print_result(result: LoadResult) -> None:
    settings, env = result.settings, result.environment
    print(f"{settings['target']} + {settings['draft']}; {env['device_name']}, {settings['dtype']}; "
          f"{settings.get('output_length', str(settings['max_new_tokens']) + ' new tokens')}; "
          f"clock: {settings['clock']}")
    rows = [[str(p.batch), str(p.k), f"{p.speedup:.2f}x", f"{p.speedup_low:.2f}-{p.speedup_high:.2f}",
             "-" if p.theory is None else f"{p.theory:.2f}x", f"{p.tokens_per_pass:.2f}",
             f"{p.mean_acceptance_length:.2f}" if p.k else "-", f"{p.spec_tokens_per_s:.1f}",
             f"{p.plain_tokens_per_s:.1f}",
             f"{p.spec_latency * 1000:.0f}", f"{p.plain_latency * 1000:.0f}",
             # k = 0 is plain decoding itself: nothing to compare
             "-" if p.identical is None or not p.k else "yes" if p.identical else "NO"] for p in result.points]
    print_table(make_console(), rich_table(
        "speculation under load (decode only)",
        ["batch", "k", "speedup", "95% range", "theory", "tokens/pass", "accept len", "spec tok/s", "plain tok/s",
         "spec ms/token", "plain ms/token", "identical"], rows))
    if outputs_note(result):
        print(outputs_note(result))              # what the identical column compared
    if result.cost_curve:                        # (a sweep on vLLM times no forwards of its own)
        curve = ", ".join(f"{c['batch']}x{c['tokens_per_row']}: {c['cost']:.2f}" for c in result.cost_curve)
        print(f"theory's forward costs, timed before the runs (batch x new tokens per row; 1 = one single-row "
              f"step): {curve}")
    low, high = result.crossover_range
    crossover = result.crossover_batch
    if not any(p.k for p in result.points):
        print("crossover batch: not measured (no k above 0)")
    elif crossover is None:
        print("crossover batch: none (speculation wins at every batch size measured)")
    else:
        print(f"crossover batch: {crossover} (95% range: {low or '-'} to {high or 'beyond'})")
    print("best k per batch size (0 = off): " + json.dumps(result.recommended_k))
