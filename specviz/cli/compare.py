"""`python -m specviz compare`: up to 4 drafters (repeat --draft) on one prompt against plain decoding,
or one drafter over k = 1..8 (`--sweep`), printed as a table with the winner (or the best k) in
words; `--export DIR` writes the cycles, the summary and the charts (`views.export`).

With `--prompts SET` (a shipped set: 'examples' or a benchmark category such as 'rewrite'; or a
file: one prompt per line, or JSON Lines with "prompt" and "category") the drafters run over every
prompt, `--repeats` rounds, and the answer comes with 95% intervals (`runs.prompt_sets`); `--json
FILE` and `--export DIR` then write the per-prompt rows and the summary."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SpecvizError
from ..files import check_paths
from ..runs import recording
from ..settings import check_prompt
from ..views import prose
from .common import (add_decoding_arguments, add_model_arguments, check_output_file, check_output_folder, fail,
                     load, make_console, print_table, printable, progress_printer, rich_table, say, settings_from,
                     write_output)
from .engine import SERVING, add_engine_arguments, check_engine_flags, compare_main

# What --export writes into its folder (`views.export`, `views.prompt_sets.write_files`), so that no
# other output or input of the command is one of them.
EXPORT_FILES = ("cycles.jsonl", "cycles.csv", "summary.json", "recording.json", "charts.html")
PROMPT_SET_EXPORT_FILES = ("rows.csv", "summary.json", "charts.html")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, draft_repeatable=True)
    add_decoding_arguments(parser)
    parser.add_argument("--sweep", action="store_true", help="run one drafter at k = 1..8 instead (one --draft)")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR",
                        help="write cycles.jsonl, cycles.csv, summary.json and charts.html (plus one PNG per "
                             "chart when kaleido can find a Chrome) to DIR")
    parser.add_argument("--no-png", action="store_true", help="with --export: HTML charts only (PNG takes seconds)")
    parser.add_argument("--prompts", default=None, metavar="SET_OR_FILE",
                        help="compare over a set of prompts instead of one: 'examples', a benchmark category "
                             "(chat, code, rewrite, summarisation, translation, maths) or a file (one prompt per "
                             "line, or JSON Lines with \"prompt\" and optional \"category\")")
    parser.add_argument("--repeats", type=int, default=1, help="with --prompts: rounds over the set (default 1)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="with --prompts: write the summary and the per-prompt rows as JSON")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="save every configuration's run as one recording (JSON): `python -m specviz replay "
                             "FILE`, `python -m specviz report FILE -o report.html` (one prompt only)")
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("prompt", nargs="?", default=None, help="the prompt (not with --prompts)")
    add_engine_arguments(parser)


def main(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before a model is loaded.
    drafts = args.draft or ["ngram"]
    if args.sweep and len(drafts) > 1:
        raise SpecvizError("--sweep runs one configuration over k = 1..8: give one --draft.")
    check_engine_flags(args)
    if args.engine in SERVING:
        if args.prompts is None or args.sweep or args.export or args.record:
            raise SpecvizError(f"compare --engine {args.engine} runs over a prompt set: give --prompts (and "
                               "--json); --sweep, --export and --record are the own loop's.")
        check_output_file(args.json, "--json")
        chosen = [settings_from(args, draft=draft) for draft in drafts]      # each draft parsed once, here
        return compare_main(args, [c.draft for c in chosen], chosen[0], prompt_set_from(args.prompts))
    configs = [settings_from(args, draft=draft) for draft in drafts]
    exported = PROMPT_SET_EXPORT_FILES if args.prompts is not None else EXPORT_FILES
    check_paths([prompt_file(args.prompts)],
                [("--json", args.json), ("--record", args.record)]
                + [("--export", args.export / name) for name in exported if args.export is not None])
    check_output_folder(args.export, "--export")
    check_output_file(args.record, "--record")
    if args.prompts is not None:
        if args.record is not None:
            raise SpecvizError("--record saves the runs on one prompt; with --prompts use --json or --export.")
        return over_prompts(args, configs)
    if args.json is not None or args.repeats != 1:
        raise SpecvizError("--json and --repeats go with --prompts (a set of prompts).")
    prompt = check_prompt(args.prompt if args.prompt is not None else "")

    from ..runs.compare import compare, sweep

    # `loader=load` is passed explicitly (not left to the default) so that it is this module's name.
    progress = progress_printer()
    if args.sweep:
        result = sweep(configs[0], prompt, loader=load, progress=progress)
        comparison = result.comparison
    else:
        result, comparison = None, compare(configs, prompt, loader=load, progress=progress)
    export_note = export(args, comparison, result) if args.export else None
    if args.record:
        write_output(args.record, recording.dumps(recording.recording(comparison.results, comparison.labels,
                                                                      kind="compare")))
        export_note = "; ".join(filter(None, [export_note, f"wrote {args.record}"]))

    console = make_console(args.no_color)
    first = comparison.results[0]
    say(console, f"{first.target_name}, {first.prompt_tokens} prompt tokens, "
                 f"up to {first.settings.max_new_tokens} new tokens")
    if result is None:
        print_table(console, rich_table("Against plain decoding", prose.table_headers(comparison),
                                        prose.table_rows(comparison)))
        say(console, prose.winner_line(comparison))
    else:
        title = printable(f"k sweep of {configs[0].draft} (theory at the pooled \u03b1 and median c)")
        print_table(console, rich_table(title, prose.SWEEP_HEADERS, prose.sweep_rows(result)))
        say(console, prose.plain_rate_line(comparison.results))
        say(console, prose.sweep_line(result))
    say(console, prose.timing_note(comparison.results))
    if prose.identity_line(comparison):
        say(console, prose.identity_line(comparison))
    if export_note is not None:
        say(console, export_note)
    return 0


def export(args: argparse.Namespace, comparison, result) -> str:
    """Write the files; returns the line that says what was written."""
    from ..views.export import export_comparison
    from ..views.figures import comparison_figures, sweep_figure

    figures = comparison_figures(comparison)
    if result is not None:
        figures["k_sweep"] = sweep_figure(result)
    written, note = export_comparison(comparison, args.export, figures=figures, sweep=result, png=not args.no_png)
    return f"wrote {len(written)} files to {args.export}" + (f" ({note})" if note else "")


def prompt_file(name: str | None) -> Path | None:
    """The file `--prompts` names, or None (no --prompts, or a shipped set: its name wins over a file's)."""
    from ..catalog import preset_prompt_sets

    return None if name is None or name in preset_prompt_sets() else Path(name)


def prompt_set_from(name: str):
    """A shipped set by name, else a file."""
    from ..catalog import preset_prompt_sets, read_prompt_file

    path = prompt_file(name)
    if path is None:
        return preset_prompt_sets()[name]
    if not path.exists():
        raise SpecvizError(f"--prompts {name!r}: no such prompt set ({', '.join(preset_prompt_sets())}) "
                           "and no such file.")
    return read_prompt_file(path)


def over_prompts(args: argparse.Namespace, configs) -> int:
    """`--prompts`: every configuration over a set of prompts, with intervals."""
    import time

    from ..runs.prompt_sets import iter_prompt_set
    from ..views import prompt_sets as views

    if args.prompt is not None:
        raise SpecvizError("Give either a prompt or --prompts, not both.")
    if args.sweep:
        raise SpecvizError("--sweep runs on one prompt; it does not take --prompts.")
    if not 1 <= args.repeats <= 100:
        raise SpecvizError(f"--repeats must be from 1 to 100, got {args.repeats}.")
    check_output_file(args.json, "--json")
    prompts = prompt_set_from(args.prompts)
    for item in prompts:
        check_prompt(item.prompt)
    started, finished, comparison = time.monotonic(), 0, None
    try:
        for comparison in iter_prompt_set(configs, prompts, repeats=args.repeats, loader=load):
            if len(comparison.results) > finished:
                finished = len(comparison.results)
                last = comparison.results[-1]
                print(printable(f"[{views.progress_line(comparison)}] {comparison.labels[last.config]} on "
                                f"{comparison.prompts[last.prompt].id}: {last.speedup or 0:.2f}x"), file=sys.stderr)
    except KeyboardInterrupt:
        # Ctrl-C keeps what is finished: the runs done so far are written as a smaller comparison.
        if comparison is None or not comparison.results:
            raise
        written = write_prompt_set(args, comparison)
        kept = (f"the finished runs are in {' and '.join(written)}" if written
                else "nothing was written (--json or --export keep the finished runs)")
        return fail(f"cancelled after {len(comparison.results)} of {comparison.total} runs; {kept}.", 130)
    note = [f"wrote {where}" for where in write_prompt_set(args, comparison)]
    console = make_console(args.no_color)
    say(console, f"{len(prompts)} prompts x {len(configs)} configurations x {args.repeats} round(s) in "
                 f"{time.monotonic() - started:.0f} s; speedup: decode-only time per token against plain decoding "
                 "of the same prompt")
    print_table(console, rich_table("Over the prompts", views.table_headers(comparison), views.table_rows(comparison)))
    headers, rows = views.category_rows(comparison)
    print_table(console, rich_table("Median speedup by category", [printable(h) for h in headers], rows))
    say(console, views.winner_line(comparison))
    say(console, views.timing_line(comparison))
    for line in note:
        say(console, line)
    return 0


def write_prompt_set(args: argparse.Namespace, comparison) -> list[str]:
    """--json and --export of a prompt-set comparison; returns where each went, in words."""
    from ..views import prompt_sets as views

    written = []
    if args.json:
        write_output(args.json, views.json_text(comparison))
        written.append(str(args.json))
    if args.export:
        written.append(f"{len(views.write_files(comparison, args.export))} files in {args.export}")
    return written
