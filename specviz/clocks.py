"""What a figure is timed on: its clock (`core.timing.Clock.name`, or an engine's) and its basis,
named in every view and JSON file (docs/figures.md). No torch here: the engine commands use it too."""

from __future__ import annotations


# Every timed figure names its clock (`core.timing.Clock.name`) and its basis: decode only (each
# method's first event, which carries the prompt's prefill, left out), with the prefill, or the
# prefill alone.
DECODE_ONLY, WITH_PREFILL, PREFILL_ONLY = "decode only", "with prefill", "prefill only"

# How long a run took as a person waits for it: always the wall clock, whatever timed its figures
# (JSON `elapsed_wall_seconds`). On one thread's CPU time a race's figures leave out the rendering
# between events and whatever else the machine did; this says what the race cost in real time.
WALL_CLOCK = "wall clock"


def moved_by_load(clock: str) -> bool:
    """Whether other programs on the machine can move a figure timed by `clock`. Every wall clock can:
    on a CPU with more than one torch thread, at an engine's client, and on a GPU too (synchronised
    with the device, it still counts the host thread's launches, which a busy CPU delays, and waits
    for the card, which another program may share). One thread's CPU time counts only that thread."""
    return clock.startswith("wall")


def clock_text(clock: str) -> str:
    return clock + (" (other programs on this machine can move it)" if moved_by_load(clock) else "")


def timed(figure: str, clock: str) -> str:
    """A figure with its clock, as every view writes it: '2.51\u00d7 (thread CPU time)', '2.06 s (wall clock)'."""
    return f"{figure} ({clock})"


def elapsed_text(seconds: float) -> str:
    """A run's elapsed time, on the wall clock: '6.3 s elapsed (wall clock)'."""
    return timed(f"{seconds:.1f} s elapsed", WALL_CLOCK)


# A run's seconds that no method's clock timed: each on the wall clock, whatever the run's clock is.
WALL_CLOCK_FIELDS = ("elapsed_wall_seconds", "calibration_seconds", "first_token_wall_seconds")


def timing(clock: str, **bases: str) -> dict:
    """The clock and basis of a JSON object's timed fields: `timing(clock, speedup=DECODE_ONLY, ...)`.
    Every field named in `bases` is timed by `clock`; those in `wall_clock` (`WALL_CLOCK_FIELDS`) by
    the wall clock."""
    return {"clock": clock, "moved_by_load": moved_by_load(clock), "basis": bases,
            "wall_clock": list(WALL_CLOCK_FIELDS)}
