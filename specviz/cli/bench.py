"""`python -m specviz bench`: the prompt set against plain decoding and transformers' assisted
generation (`runs.bench`), one configuration per --draft, printed as a markdown table; `--json` and
`--markdown` also write it to files. The clock is the one every event is timed with
(`core.timing.Clock`): on a CPU this thread's CPU time with one torch thread (the default), the wall
clock with `--threads N` above 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..catalog import BENCH_PROMPTS_FILE, SPEC_BENCH, SPEC_BENCH_CATEGORIES, load_bench_prompts, load_spec_bench
from ..clocks import WITH_PREFILL, timing
from ..errors import SpecvizError
from ..files import check_paths
from ..runs.bench import (DEFAULT_K, TINY_TARGET, Setup, default_draft, default_k, describe, run_bench,
                          summarize_rows)
from ..runs.run import load
from ..views.bench_table import leaderboard, leaderboard_csv, leaderboard_markdown, markdown_table
from .common import (DRAFT_HELP, TARGET_HELP, add_model_arguments, check_output_file, printable, progress_printer,
                     settings_from, write_output)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(
        parser, draft_repeatable=True,
        target_help=TARGET_HELP + f"; '{TINY_TARGET}': a tiny Llama pair built in-process (no model files)",
        draft_help=DRAFT_HELP + f"; with --target {TINY_TARGET}: 'tiny' (its 2-layer draft model, the default), "
                                "'ngram' or 'self:L'")
    parser.add_argument("--k", default=None,
                        help=f"draft length, at most (default per drafter: ngram and auto {DEFAULT_K['ngram']}, "
                             f"self:L {DEFAULT_K['self']}, draft model {DEFAULT_K['model']})")
    parser.add_argument("--fixed-k", action="store_true",
                        help="draft k tokens every cycle (the classic algorithm, and what transformers does here); by "
                             "default the cost-aware policy drafts 0 to k, as many as pay")
    parser.add_argument("--max-new-tokens", default=128)
    parser.add_argument("--branch", default=None, help="with a draft model, self:L or a head: draft EAGLE-2 "
                                                       "token trees (see `run --help`); transformers stays a chain")
    parser.add_argument("--tree-budget", default=None, help="with --branch: nodes per pass (default 16)")
    parser.add_argument("--category", action="append", default=None,
                        help="only this category (repeat or comma-separate): chat, code, rewrite, summarisation, "
                             "translation, maths (the default six), or repeated (repeated and structured work: "
                             "each prompt's earlier turns are decoded first, untimed, with the same drafter)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    parser.add_argument("--sample-seed", type=int, default=None, metavar="S",
                        help="with --limit: draw that many prompts per category at random (seed S) instead of "
                             "taking the first ones")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the prompt set (medians are reported)")
    parser.add_argument("--prompts", default=str(BENCH_PROMPTS_FILE),
                        help=f"prompt set: a JSON file in the bundled set's format, or '{SPEC_BENCH}' (Spec-Bench's "
                             f"480 prompts, bundled; categories {', '.join(SPEC_BENCH_CATEGORIES)}; use --limit on a "
                             "CPU)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write meta, rows and summary as JSON")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                        help="also write the markdown tables here (the figures, then Spec-Bench's leaderboard)")
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE",
                        help="write Spec-Bench's leaderboard as CSV: a row per method, per category its speedup "
                             "and mean accepted tokens")
    parser.add_argument("--no-transformers", dest="transformers", action="store_false",
                        help="do not run transformers' assisted generation beside specviz (about a third of a "
                             "CPU bench's time with prompt lookup); its columns stay empty")
    parser.add_argument("--quiet", action="store_true", help="no per-prompt progress lines")


def main(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before a model is loaded.
    for flag, value in (("--limit", args.limit), ("--repeats", args.repeats)):
        if value is not None and value < 1:
            raise SpecvizError(f"{flag} must be at least 1, got {value}.")
    # --draft repeated or comma-separated (ngram,suffix,head,auto): one configuration each.
    drafts = [d.strip() for arg in (args.draft or [default_draft(args.target)]) for d in arg.split(",") if d.strip()]
    configs = [settings_from(args, draft=draft, k=args.k if args.k is not None else default_k(draft),
                             temperature=0.0) for draft in drafts]
    categories = [c.strip() for arg in (args.category or []) for c in arg.split(",") if c.strip()]
    if args.sample_seed is not None and args.limit is None:
        raise SpecvizError("--sample-seed draws --limit prompts per category: give --limit too.")
    if args.prompts == SPEC_BENCH:
        check_paths([], [("--json", args.json), ("--markdown", args.markdown), ("--csv", args.csv)])
        prompts = load_spec_bench(categories or None, args.limit, args.sample_seed)
    else:
        check_paths([Path(args.prompts)], [("--json", args.json), ("--markdown", args.markdown), ("--csv", args.csv)])
        prompts = load_bench_prompts(Path(args.prompts), categories or None, args.limit)
    check_output_file(args.json, "--json")
    check_output_file(args.markdown, "--markdown")
    check_output_file(args.csv, "--csv")

    say = (lambda message: None) if args.quiet else (lambda message: print(printable(message), file=sys.stderr,
                                                                           flush=True))
    results = []
    for settings in configs:
        setup = Setup(settings, load(settings, None if args.quiet else progress_printer()), args.transformers)
        meta = describe(setup)
        say(f"{meta['target']} + {meta['draft']} (k={meta['k']}, {meta['draft_policy']}) on {meta['hardware']}, "
            f"{meta['dtype']}, "
            f"{len(prompts)} prompts, {settings.max_new_tokens} new tokens, timed by {meta['clock']}; "
            f"transformers: {meta['transformers_settings']}")
        rows = run_bench(setup, prompts, repeats=args.repeats, progress=say)
        results.append({"meta": meta, "rows": rows, "summary": summarize_rows(rows)})

    summary = [entry for result in results for entry in result["summary"]]
    table = markdown_table(summary)
    board = leaderboard(summary)
    tables = (f"{table}\n\nSpec-Bench's leaderboard: speedup (mean accepted tokens: new tokens per target pass), "
              f"medians per category\n{leaderboard_markdown(board)}")
    # The files first, each whole or not at all: a failed write leaves only the error line.
    if args.markdown:
        write_output(args.markdown, tables + "\n")
    if args.csv:
        write_output(args.csv, leaderboard_csv(board))
    if args.json:
        # Whole generations (transformers' generate is timed as one call): every rate and speedup with prefill.
        rated = ("specviz_speedup", "transformers_speedup", "specviz_tokens_per_s", "transformers_tokens_per_s",
                 "baseline_tokens_per_s")
        write_output(args.json, json.dumps({"meta": [r["meta"] for r in results],
                                            "rows": [row for r in results for row in r["rows"]],
                                            "summary": summary, "leaderboard": board,
                                            "timing": timing(results[0]["meta"]["clock"],
                                                             **dict.fromkeys(rated, WITH_PREFILL))}, indent=2))
    meta = results[0]["meta"]
    print(printable(f"hardware: {meta['hardware']}; device {meta['device']}, {meta['dtype']}; torch {meta['torch']}, "
                    f"transformers {meta['transformers']}; {meta['max_new_tokens']} new tokens, greedy; "
                    f"clock: {meta['clock']}"))
    for result in results:
        print(printable(f"transformers for {result['meta']['draft']}: {result['meta']['transformers_settings']}"))
    print()
    print(printable(tables))
    for path in (args.json, args.csv):
        if path:
            print(f"\nwrote {path}")
    return 0
