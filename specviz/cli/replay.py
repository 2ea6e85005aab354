"""`python -m specviz replay FILE` plays a recording back in the terminal (each cycle's verdicts
coloured or marked, at the recorded speed, `--speed` times faster, or all at once with `--fast`),
then its summary; `python -m specviz report FILE... -o report.html` writes the recordings as one
standalone HTML page; `replay FILE --animation OUT.gif|OUT.mp4` writes the race as an animation
(`views.animation`). None loads a model. Every recorded text reaches the terminal through
`common.printable`: a recording is someone else's file."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from ..errors import SpecvizError
from ..files import check_paths, write_atomic
from ..runs import recording
from ..runs.result import cycle_output_text
from .common import check_output_file, make_console, printable, read_recording, say, write_output
from .terminal import PLAIN_HELP, cycle_rich_text, print_legend_and_summary, print_summary, uses_marks

# The terminal keeps the recorded pacing (the app compresses it to recording.MAX_PLAYBACK_SECONDS
# instead): past an hour of waiting, a replay is not what anyone asked for, so it needs --fast or --speed.
MAX_TERMINAL_WAIT_SECONDS = 3600.0


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="a recording (JSON) written by `run --record` or the app")
    parser.add_argument("--fast", action="store_true", help="print everything at once")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="play this many times faster (default 1; 0.5 or 0.25 for slow motion)")
    parser.add_argument("--no-color", action="store_true", help="plain text")
    parser.add_argument("--plain", action="store_true", help=PLAIN_HELP)
    parser.add_argument("--animation", type=Path, metavar="OUT", help="write the race as an animation instead of "
                        "playing it: OUT.gif or OUT.mp4 (the format from the extension), paced by --speed")
    parser.add_argument("--size", default="1280x720", metavar="WxH", help="the animation's size (default 1280x720)")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="recordings to put side by side")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="HTML", help="the report to write")
    parser.add_argument("--title", default="specviz report")


def check_playback_time(recorded: recording.Recording, speed: float) -> None:
    """Refuse, before printing anything, a replay that would wait longer than MAX_TERMINAL_WAIT_SECONDS."""
    seconds = sum(max((t for t, _ in recording.timeline(run)), default=0.0) for run in recorded.runs) / speed
    if seconds > MAX_TERMINAL_WAIT_SECONDS:
        length = f"{seconds:.3g} s" if math.isfinite(seconds) else "longer than any clock counts"
        raise SpecvizError(f"{recorded.name}: played at --speed {speed:g} it would take {length} (its events "
                           f"claim that long). Add --fast to print it at once, or a higher --speed.")


def replay_main(args: argparse.Namespace) -> int:
    if not args.speed > 0 or args.speed == float("inf"):
        raise SpecvizError(f"--speed must be a positive number, got {args.speed}.")
    if args.animation is not None:
        return animation_main(args)
    recorded = read_recording(args.file)
    if not args.fast:
        check_playback_time(recorded, args.speed)
    # With --plain, stdout carries the generated text only; labels and summaries go to stderr.
    console = make_console(args.no_color, stderr=args.plain)
    marks = uses_marks(console)
    several = len(recorded.runs) > 1
    for label, run in zip(recorded.labels, recorded.runs):
        if several:
            say(console, f"== {label}", style="bold")
        start, shown = time.monotonic(), 0
        for seconds, played in recording.replay(run):
            if not args.fast:
                time.sleep(max(0.0, start + seconds / args.speed - time.monotonic()))
            for cycle, text in zip(played.cycles[shown:], played.texts[shown:]):
                if args.plain:
                    sys.stdout.write(printable(cycle_output_text(cycle, text, run.eos_token_ids)))
                    sys.stdout.flush()
                else:
                    console.print(cycle_rich_text(cycle, text, first=shown == 0, marks=marks), end="", soft_wrap=True)
                shown += 1
        if args.plain:
            if several:
                sys.stdout.write("\n")       # one run's text per paragraph
            print_summary(console, run)
        else:
            console.print()
            print_legend_and_summary(console, run, marks=marks)
            console.print()
    return 0


def animation_main(args: argparse.Namespace) -> int:
    """`replay FILE --animation OUT`: every check before the file is read, and OUT written whole or
    not at all (an animation is made in memory, then `files.write_atomic`)."""
    from ..views import animation     # Pillow, and ffmpeg for an MP4: only an animation draws pixels

    if args.fast:
        raise SpecvizError("--animation keeps the recorded pacing (scaled by --speed); leave out --fast.")
    size = animation.parse_size(args.size)
    suffix = animation.check_format(args.animation, size)
    check_paths([args.file], [("--animation", args.animation)])
    check_output_file(args.animation, "--animation")
    recorded = read_recording(args.file)
    run, label = recorded.runs[0], recorded.labels[0]
    started = time.monotonic()
    data, frames, seconds = animation.animation_bytes(run, suffix, speed=args.speed, size=size,
                                                      caption=f"played at {args.speed:g}\u00d7")
    write_atomic(args.animation, data)
    which = f" (run 1 of {len(recorded.runs)}: {label})" if len(recorded.runs) > 1 else ""
    print(printable(f"wrote {args.animation}{which}: {size[0]}x{size[1]}, {frames} frames, {seconds:.1f} s, "
                    f"{len(data) / 1e6:.2f} MB, made in {time.monotonic() - started:.1f} s"))
    return 0


def report_main(args: argparse.Namespace) -> int:
    check_paths(args.files, [("-o", args.output)])
    check_output_file(args.output, "-o")
    recordings = [read_recording(path) for path in args.files]
    from ..views.report import report_html     # plotly: only the report draws charts

    page = report_html(recordings, title=args.title)
    write_output(args.output, page)
    print(printable(f"wrote {args.output} ({len(page.encode()) / 1e6:.1f} MB, "
                    f"{sum(len(r.runs) for r in recordings)} runs)"))
    return 0
