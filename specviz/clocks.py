"""What a figure is timed on: its clock (`core.timing.Clock.name`, or an engine's) and its basis,
named in every view and JSON file (docs/figures.md). No torch here: the engine commands use it too."""

from __future__ import annotations


# Every timed figure names its clock (`core.timing.Clock.name`) and its basis: decode only (each
# method's first event, which carries the prompt's prefill, left out) or with the prefill.
DECODE_ONLY, WITH_PREFILL = "decode only", "with prefill"


def moved_by_load(clock: str) -> bool:
    """Whether other programs on the machine can move a figure timed by `clock`: the wall clock on a
    CPU (more than one torch thread, an engine's client) can; one thread's CPU time and a device's
    synchronised clock cannot."""
    return clock.startswith("wall") and "device-synchronised" not in clock


def clock_text(clock: str) -> str:
    return clock + (" (other programs on this machine can move it)" if moved_by_load(clock) else "")


def timing(clock: str, **bases: str) -> dict:
    """A figure's clock and basis for JSON: `timing(clock, speedup=DECODE_ONLY, ...)`."""
    return {"clock": clock, "moved_by_load": moved_by_load(clock), "basis": bases}
