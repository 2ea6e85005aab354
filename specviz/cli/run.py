"""`python -m specviz run`: one prompt decoded speculatively, printed with every cycle's verdicts
(coloured on a terminal, marked in plain text), then the summary lines of `views.prose`;
`--baseline` also runs plain decoding, interleaved, and reports the measured speedup and, for greedy
runs, whether the outputs are identical. `--plain` prints only the generated text on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED
from ..files import check_paths
from ..runs import recording
from ..runs.result import Run
from ..runs.run import execute, load
from ..settings import check_prompt
from ..views.prose import summary_lines
from ..views.render import cycle_pieces
from .common import (add_decoding_arguments, add_model_arguments, add_prompt_arguments, check_output_file,
                     make_console, printable, progress_printer, say, settings_from, write_output)

# Terminal styles per verdict: colour plus a second cue (strike-through, underline, bold) so the
# verdicts stay readable without colour.
RICH_STYLES = {ACCEPTED: "green", REJECTED: "red strike", RESAMPLED: "dark_orange underline",
               BONUS: "magenta bold underline"}
# Plain text (no terminal, or --no-color) has no styles at all: each verdict but accepted gets a
# mark around its text instead (wdiff's marks for a deletion and an insertion).
MARKS = {ACCEPTED: ("", ""), REJECTED: ("[-", "-]"), RESAMPLED: ("{+", "+}"), BONUS: ("{*", "*}")}
PLAIN_LEGEND = ("legend: accepted drafts unmarked  [-rejected draft-]  {+target's correction+}  "
                "{*bonus token*}  | cycle boundary")
PLAIN_HELP = ("print only the generated text on stdout (the summary goes to stderr); control characters "
              "other than newline and tab are shown as visible symbols")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--baseline", action="store_true",
                        help="also run plain decoding and report the measured speedup")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="write settings, prompt, text, cycles, summary and environment as JSON")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="save the run as a recording (JSON) to replay anywhere: `python -m specviz replay FILE`")
    parser.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    add_prompt_arguments(parser)


def uses_marks(console) -> bool:
    """Whether the console shows plain text, where styles (colour, strike-through) are lost."""
    return console.no_color or console.color_system is None


def cycle_rich_text(cycle, cycle_text, *, first: bool = False, marks: bool = True):
    """One cycle's tokens as rich text, one style per verdict (and with `marks`, each verdict's
    mark around its text), after a dim bar (unless `first`)."""
    from rich.text import Text

    text = Text()
    if not first:
        text.append("|", style="dim")        # appended: Text("|", style=...) would dim the whole cycle
    for piece in cycle_pieces(cycle, cycle_text):
        opening, closing = MARKS[piece.verdict] if marks else ("", "")
        text.append(opening + printable(piece.text) + closing, style=RICH_STYLES[piece.verdict])
    return text


def print_legend_and_summary(console, run: Run, *, marks: bool) -> None:
    """After a run's tokens: the verdict legend, then its summary lines (`run` and `replay`)."""
    if marks:
        say(console, PLAIN_LEGEND)
    else:
        console.print("legend: " + "  ".join(f"[{style}]{name}[/]" for name, style in RICH_STYLES.items())
                      + "  [dim]| cycle boundary[/]")
    print_summary(console, run)


def print_summary(console, run: Run) -> None:
    for line in summary_lines(run):   # model names and devices come from a recording too
        say(console, line)


def rich_text(run: Run, *, marks: bool = True):
    """The run's tokens as rich text, one style (and mark) per verdict, cycles separated by a dim bar."""
    from rich.text import Text

    text = Text()
    for i, (cycle, cycle_text) in enumerate(zip(run.cycles, run.texts)):
        text.append_text(cycle_rich_text(cycle, cycle_text, first=i == 0, marks=marks))
    return text


def main(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before a model is loaded.
    settings = settings_from(args)
    prompt = check_prompt(args.prompt)
    check_paths([], [("--json", args.json), ("--record", args.record)])
    check_output_file(args.json, "--json")
    check_output_file(args.record, "--record")

    pair = load(settings, progress_printer())
    run = execute(settings, prompt, pair, baseline=args.baseline)
    # The files first, each whole or not at all: a failed write leaves only the error line.
    if args.json:
        write_output(args.json, json.dumps(run.to_json(), indent=2, ensure_ascii=False))
    if args.record:
        write_output(args.record, recording.dumps(recording.recording([run])))

    if args.plain:
        sys.stdout.write(printable(run.output_text))      # what `replay --plain` prints of its recording
        sys.stdout.flush()
        console = make_console(args.no_color, stderr=True)
        print_summary(console, run)
    else:
        console = make_console(args.no_color)
        marks = uses_marks(console)
        # Wrapped at words on a terminal; a pipe or a file gets the text's own lines.
        console.print(rich_text(run, marks=marks), soft_wrap=not console.is_terminal)
        console.print()
        print_legend_and_summary(console, run, marks=marks)
    for path in (args.json, args.record):
        if path:
            say(console, f"wrote {path}")
    return 0
