"""`python -m specviz run`: one prompt decoded speculatively, printed with every cycle's verdicts
coloured (rich), then the summary lines of `views.prose`; `--baseline` also runs plain decoding,
interleaved, and reports the measured speedup and, for greedy runs, whether the outputs are identical."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..runs import recording
from ..runs.result import Run
from ..runs.run import execute, load
from ..settings import check_prompt
from ..views.prose import summary_lines
from ..views.render import cycle_pieces
from . import (add_decoding_arguments, add_model_arguments, add_prompt_arguments, check_output_file,
               progress_printer, settings_from)

# Terminal styles per verdict: colour plus a second cue (strike-through, underline, bold) so the
# verdicts stay readable without colour.
RICH_STYLES = {"accepted": "green", "rejected": "red strike", "resampled": "dark_orange underline",
               "bonus": "magenta bold underline"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--baseline", action="store_true", help="also run plain decoding and report the measured speedup")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write settings, prompt, text, cycles, summary and environment as JSON")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="save the run as a recording (JSON) to replay anywhere: `python -m specviz replay FILE`")
    add_prompt_arguments(parser)


def cycle_rich_text(cycle, cycle_text, *, first: bool = False):
    """One cycle's tokens as rich text, one style per verdict, after a dim bar (unless `first`)."""
    from rich.text import Text

    text = Text() if first else Text("|", style="dim")
    for piece in cycle_pieces(cycle, cycle_text):
        text.append(piece.text, style=RICH_STYLES[piece.verdict])
    return text


def print_legend_and_summary(console, run: Run) -> None:
    """After a run's tokens: the verdict legend, then its summary lines (`run` and `replay`)."""
    console.print("legend: " + "  ".join(f"[{style}]{name}[/]" for name, style in RICH_STYLES.items())
                  + "  [dim]| cycle boundary[/]")
    for line in summary_lines(run):
        console.print(line, markup=False, soft_wrap=True)


def rich_text(run: Run):
    """The run's tokens as rich text, one style per verdict, cycles separated by a dim bar."""
    from rich.text import Text

    text = Text()
    for i, (cycle, cycle_text) in enumerate(zip(run.cycles, run.texts)):
        text.append_text(cycle_rich_text(cycle, cycle_text, first=i == 0))
    return text


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    # Everything the user typed is checked before a model is loaded.
    settings = settings_from(args)
    prompt = check_prompt(args.prompt)
    check_output_file(args.json, "--json")
    check_output_file(args.record, "--record")

    pair = load(settings, progress_printer())
    run = execute(settings, prompt, pair, baseline=args.baseline)
    if args.json:   # written before anything is printed: a failed write leaves only the error line
        args.json.write_text(json.dumps(run.to_json(), indent=2, ensure_ascii=False), encoding="utf-8")
    if args.record:
        recording.save(args.record, [run])

    console = Console(no_color=args.no_color, highlight=False)
    console.print(rich_text(run))
    console.print()
    print_legend_and_summary(console, run)
    for path in (args.json, args.record):
        if path:
            console.print(f"wrote {path}", markup=False, soft_wrap=True)
    return 0
