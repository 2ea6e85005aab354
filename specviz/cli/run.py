"""`python -m specviz run`: one prompt decoded speculatively, printed with every cycle's verdicts
(coloured on a terminal, marked in plain text), then the summary lines of `views.prose`;
`--baseline` also runs plain decoding, interleaved, and reports the measured speedup and, for greedy
runs and sampled ones with drafter-invariant sampling (one seed for both), whether the outputs are
identical. `--plain` prints only the generated text on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..files import check_paths
from ..runs import recording
from ..runs.run import execute, load
from ..settings import check_prompt
from .common import (add_decoding_arguments, add_model_arguments, add_prompt_arguments, check_output_file,
                     make_console, printable, progress_printer, say, settings_from, write_output)
from .terminal import PLAIN_HELP, print_legend_and_summary, print_summary, rich_text, uses_marks


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


def main(args: argparse.Namespace) -> int:
    # Everything the user typed is checked before a model is loaded.
    settings = settings_from(args)
    prompt = check_prompt(args.prompt)
    check_paths([], [("--json", args.json), ("--record", args.record)])
    check_output_file(args.json, "--json")
    check_output_file(args.record, "--record")

    pair = load(settings, progress_printer())
    run = execute(settings, prompt, pair, baseline=args.baseline, progress=progress_printer())
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
