"""`python -m specviz replay FILE` plays a recording back in the terminal (each cycle's verdicts
coloured, at the recorded speed, `--speed` times faster, or all at once with `--fast`), then its
summary; `python -m specviz report FILE... -o report.html` writes the recordings as one standalone
HTML page. Neither loads a model."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import SpecvizError
from ..runs import recording
from ..views.report import report_html
from . import check_output_file
from .run import cycle_rich_text, print_legend_and_summary


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a recording (JSON) written by `run --record` or the app")
    parser.add_argument("--fast", action="store_true", help="print everything at once")
    parser.add_argument("--speed", type=float, default=1.0, help="play this many times faster (default 1)")
    parser.add_argument("--no-color", action="store_true", help="plain text")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="recordings to put side by side")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="HTML", help="the report to write")
    parser.add_argument("--title", default="specviz report")


def replay_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    if not args.speed > 0 or args.speed == float("inf"):
        raise SpecvizError(f"--speed must be a positive number, got {args.speed}.")
    recorded = recording.load(args.file)
    console = Console(no_color=args.no_color, highlight=False)
    for label, run in zip(recorded.labels, recorded.runs):
        if len(recorded.runs) > 1:
            console.print(f"== {label}", markup=False, style="bold")
        start, shown = time.monotonic(), 0
        for seconds, played in recording.replay(run):
            if not args.fast:
                time.sleep(max(0.0, start + seconds / args.speed - time.monotonic()))
            for cycle, text in zip(played.cycles[shown:], played.texts[shown:]):
                console.print(cycle_rich_text(cycle, text, first=shown == 0), end="")
                shown += 1
        console.print()
        print_legend_and_summary(console, run)
        console.print()
    return 0


def report_main(args: argparse.Namespace) -> int:
    check_output_file(args.output, "-o")
    recordings = [recording.load(path) for path in args.files]
    page = report_html(recordings, title=args.title)
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output} ({len(page.encode()) / 1e6:.1f} MB, {sum(len(r.runs) for r in recordings)} runs)")
    return 0
