"""A run's tokens in the terminal, as `run` prints them live and `replay` plays them back: one style
per verdict on a colour terminal, wdiff-like marks in plain text, the legend and the summary lines."""

from __future__ import annotations

from ..core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED
from ..runs.result import Run
from ..views.prose import summary_lines
from ..views.drafter_marks import cycle_writers, drafter_letter, legend_items
from ..views.render import cycle_pieces
from .common import printable, say

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
    if cycle.drafter and cycle.drafted:       # a hybrid run: the drafter's letter before its draft
        text.append("+".join(drafter_letter(name) for name in cycle_writers(cycle)) + ":", style="dim")
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
    if run.stats.drafters:
        say(console, "drafted by: " + "  ".join(f"{letter}: {word}" for letter, word, _ in
                                                 legend_items(run.stats.drafters)))
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
