"""`python -m specviz compare`: 2 to 4 drafters (repeat --draft) on one prompt against plain decoding,
or one drafter over k = 1..8 (`--sweep`), printed as a table with the winner (or the best k) in
words; `--export DIR` writes the cycles, the summary and the charts (`views.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import SpecvizError
from ..runs.compare import compare, sweep
from ..runs.run import load
from ..settings import check_prompt
from ..views import prose
from . import (add_decoding_arguments, add_model_arguments, add_prompt_arguments, check_output_folder,
               progress_printer, rich_table, settings_from)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, draft_repeatable=True)
    add_decoding_arguments(parser)
    parser.add_argument("--sweep", action="store_true", help="run one drafter at k = 1..8 instead (one --draft)")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR",
                        help="write cycles.jsonl, cycles.csv, summary.json and charts.html (plus one PNG per "
                             "chart when kaleido can find a Chrome) to DIR")
    parser.add_argument("--no-png", action="store_true", help="with --export: HTML charts only (PNG takes seconds)")
    add_prompt_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    # Everything the user typed is checked before a model is loaded.
    drafts = args.draft or ["ngram"]
    if args.sweep and len(drafts) > 1:
        raise SpecvizError("--sweep runs one configuration over k = 1..8: give one --draft.")
    configs = [settings_from(args, draft=draft) for draft in drafts]
    prompt = check_prompt(args.prompt)
    check_output_folder(args.export, "--export")

    # `loader=load` is passed explicitly (not left to the default) so that it is this module's name.
    progress = progress_printer()
    if args.sweep:
        result = sweep(configs[0], prompt, loader=load, progress=progress)
        comparison = result.comparison
    else:
        result, comparison = None, compare(configs, prompt, loader=load, progress=progress)
    export_note = export(args, comparison, result) if args.export else None

    console = Console(no_color=args.no_color, highlight=False)
    first = comparison.results[0]
    console.print(f"{first.target_name}, {first.prompt_tokens} prompt tokens, "
                  f"up to {first.settings.max_new_tokens} new tokens", markup=False, soft_wrap=True)
    if result is None:
        console.print(rich_table("Against plain decoding", prose.TABLE_HEADERS, prose.table_rows(comparison)))
        console.print(prose.winner_line(comparison), markup=False, soft_wrap=True)
    else:
        title = f"k sweep of {configs[0].draft} (theory at the pooled \u03b1 and median c)"
        console.print(rich_table(title, prose.SWEEP_HEADERS, prose.sweep_rows(result)))
        console.print(prose.plain_rate_line(comparison.results), markup=False, soft_wrap=True)
        console.print(prose.sweep_line(result), markup=False, soft_wrap=True)
    if prose.identity_line(comparison):
        console.print(prose.identity_line(comparison), markup=False, soft_wrap=True)
    if export_note is not None:
        console.print(export_note, markup=False, soft_wrap=True)
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
