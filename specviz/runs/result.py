"""A run's result: everything a race has produced so far (`Run`), and how each token of a cycle reads
(`CycleText`). `run.race` grows a `Run` event by event; `recording.load` rebuilds finished ones from a
file. Every number is computed by `metrics` from the recorded events; nothing here runs a model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.events import Cycle, Followed, Step
from ..clocks import DECODE_ONLY, PREFILL_ONLY, WITH_PREFILL, timing
from ..equal_work import EqualWork, equal_work, first_divergence
from ..metrics import (PlainStats, SpecStats, Speed, ideal_speedup, measure_speed, summarize, summarize_plain,
                       theory_at_pass_cost)
from ..models.host import HostLoad, environment
from ..settings import RunSettings


# Every seconds field of a run's summary, with its basis (all on the run's clock).
SECONDS_BASES = {"seconds": WITH_PREFILL, "draft_seconds": WITH_PREFILL, "verify_seconds": WITH_PREFILL,
                 "baseline_seconds": WITH_PREFILL, "spec_prefill_seconds": PREFILL_ONLY,
                 "baseline_prefill_seconds": PREFILL_ONLY, "spec_decode_seconds": DECODE_ONLY,
                 "baseline_decode_seconds": DECODE_ONLY}


@dataclass
class CycleText:
    """How each token of a cycle reads, as the tokenizer decoded it in context."""
    drafted: list[str]
    correction: str | None


def cycle_output_text(cycle: Cycle, text: CycleText, eos_token_ids: list[int]) -> str:
    """What one cycle adds to the generated text: its accepted drafts and the target's token, as they
    read, less an end-of-sequence token (it ends the text, it is no part of it: the tokenizer's
    skip_special_tokens leaves it out of `Run.text` too; the token views still show it). `run --plain`
    and `replay --plain` both print this, so a run and its recording print the same text."""
    tokens = [cycle.drafted[i] for i in cycle.accepted_nodes]
    texts = [text.drafted[i] for i in cycle.accepted_nodes]
    if cycle.correction is not None:
        tokens.append(cycle.correction)
        texts.append(text.correction)
    return "".join(piece for token, piece in zip(tokens, texts) if token not in eos_token_ids)


@dataclass
class Run:
    """Everything a run has produced so far, and the numbers computed from it."""
    settings: RunSettings
    prompt: str
    target_name: str
    draft_name: str
    target_parameters: int
    draft_parameters: int
    dtype: str
    device: str
    clock: str                      # which clock timed the events (Clock.name)
    prompt_tokens: int
    eos_token_ids: list[int]
    baseline: bool                  # whether plain decoding runs (or was attached) for comparison
    note: str = ""                  # the pair's one-line note (`ModelPair.note`: drafting across tokenizers)
    cycles: list[Cycle] = field(default_factory=list)
    texts: list[CycleText] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    step_texts: list[str] = field(default_factory=list)
    spec_done: bool = False
    plain_done: bool = False
    host_load: HostLoad | None = None   # how busy the machine was over the race (None: not measured)
    # The cost-aware policy's calibration before the race (wall seconds; 0: its tables were measured
    # earlier in this process), what it timed, and the wall seconds from the start of the race (its
    # warm-up and calibration included) to the first speculative token: what a user waited.
    calibration_seconds: float = 0.0
    calibrated: list[str] = field(default_factory=list)
    # The costs the policy decided from (fixed for the process once calibrated): a plain step's seconds
    # on the run's clock, a pass verifying n = 0..widest drafted tokens in plain steps (a list by n; the table as the
    # policy reads it: timed widths as measured, others interpolated; after the shortest context timed, and the same
    # after each context timed by its length in `pass_steps_by_context`), and each drafter's drafting
    # per token in plain steps (a drafter that proposes for free has none). Empty without the policy.
    decided_on: dict = field(default_factory=dict)
    first_token_wall_seconds: float | None = None
    status: str = ""                # what the race is doing before its first event (calibrating), or ""
    elapsed_wall_seconds: float | None = None   # the race's wall time so far, its rendering too (whatever `clock` is)
    # Greedy outputs that parted: plain decoding's steps along the speculative text from the parting,
    # timed after the race (`core.plain.follow`), so that the speedup compares the same text.
    followed: Followed | None = None
    _stats: tuple = (-1, None)
    _speed: tuple = ((-1, -1), None, None)
    _decode: Callable[[list[int]], str] | None = None   # holds the tokenizer only, never the models

    # --- what was produced
    @property
    def tokens(self) -> list[int]:
        return [t for c in self.cycles for t in c.emitted]

    @property
    def baseline_tokens(self) -> list[int]:
        return [s.token for s in self.steps]

    @property
    def text(self) -> str:
        return self._decode(self.tokens) if self._decode else self.output_text

    @property
    def output_text(self) -> str:
        """The generated text cycle by cycle, as `--plain` prints it (`cycle_output_text`)."""
        return "".join(cycle_output_text(c, t, self.eos_token_ids) for c, t in zip(self.cycles, self.texts))

    def emitted_texts(self) -> list[str]:
        out = []
        for cycle, text in zip(self.cycles, self.texts):
            out += [text.drafted[i] for i in cycle.accepted_nodes]
            out += [text.correction] if text.correction is not None else []
        return out

    @property
    def done(self) -> bool:
        return self.spec_done and (self.plain_done or not self.baseline)

    # --- numbers (metrics computes them all; the speculative stats are cached per cycle count)
    @property
    def stats(self) -> SpecStats:
        if self._stats[0] != len(self.cycles):
            self._stats = (len(self.cycles), summarize(self.cycles))
        return self._stats[1]

    @property
    def plain(self) -> PlainStats | None:
        return summarize_plain(self.steps) if self.steps else None

    @property
    def compared(self) -> EqualWork:
        """The events the speedup compares: the tokens both methods wrote (`equal_work.equal_work`)."""
        self._measure()
        return self._speed[1]

    @property
    def speed(self) -> Speed | None:
        """Speculative against plain decoding over equal work (`compared`)."""
        self._measure()
        return self._speed[2]

    def _measure(self) -> None:
        key = (len(self.cycles), len(self.steps), id(self.followed))
        if self._speed[0] != key:
            work = equal_work(self.cycles, self.steps, greedy=self.settings.same_output, followed=self.followed)
            self._speed = (key, work, measure_speed(work.cycles, work.steps))

    @property
    def speedup(self) -> float | None:
        speed = self.speed
        return speed.speedup if speed else None

    @property
    def theory_at_pass_cost(self) -> float | None:
        return theory_at_pass_cost(self.stats, self.speed)

    @property
    def divergence(self) -> int | None:
        return first_divergence(self.tokens, self.baseline_tokens) if self.steps else None

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.steps else None

    def attach_baseline(self, other: Run) -> None:
        """Share another run's plain decoding (same target, prompt and sampling rule)."""
        self.baseline, self.steps, self.step_texts, self.plain_done = True, other.steps, other.step_texts, True
        self.followed = None        # `runs.run.follow_parted` follows this run's text where it parts from those

    def summary(self) -> dict:
        summary = {"target": self.target_name, "draft": self.draft_name, "target_parameters": self.target_parameters,
                   "draft_parameters": self.draft_parameters, "prompt_tokens": self.prompt_tokens, "dtype": self.dtype,
                   "device": self.device, "clock": self.clock,
                   "draft_policy": ("dynamic k" if self.settings.dynamic_k else "fixed k" if self.settings.fixed_k
                                    else "cost-aware"),
                   "sampling": "greedy" if self.settings.temperature == 0 else self.settings.sampling,
                   "timing": timing(self.clock, speedup=DECODE_ONLY, tokens_per_second=WITH_PREFILL,
                                    baseline_tokens_per_second=WITH_PREFILL, **SECONDS_BASES),
                   **self.stats.to_dict()}
        if self.note:
            summary["note"] = self.note
        summary.update(calibration_seconds=self.calibration_seconds, calibrated=self.calibrated,
                       decided_on=self.decided_on, first_token_wall_seconds=self.first_token_wall_seconds)
        if self.host_load is not None:
            summary.update(self.host_load.to_dict())
        if self.elapsed_wall_seconds is not None:
            summary["elapsed_wall_seconds"] = self.elapsed_wall_seconds
        speed = self.speed
        if self.steps:
            summary.update(baseline_tokens=len(self.steps), baseline_seconds=self.plain.seconds,
                           baseline_tokens_per_second=self.plain.tokens_per_second,
                           identical=self.identical, first_divergence=self.divergence)
        if speed is not None:
            summary.update(speedup=speed.speedup, speedup_low=speed.low, speedup_high=speed.high,
                           speedup_reliable=speed.reliable, compared="decode-only seconds per token",
                           compared_tokens=self.compared.tokens, compared_basis=self.compared.basis,
                           compared_near_ties=[list(tie) for tie in self.compared.near_ties],
                           spec_prefill_seconds=speed.spec_prefill_seconds,
                           spec_decode_seconds=speed.spec_decode_seconds,
                           baseline_prefill_seconds=speed.plain_prefill_seconds,
                           baseline_decode_seconds=speed.plain_decode_seconds,
                           verify_pass_cost=speed.pass_cost,
                           expected_speedup_at_pass_cost=theory_at_pass_cost(self.stats, speed),
                           expected_speedup_ideal=ideal_speedup(self.stats, speed))
        return summary

    def cycle_records(self) -> list[dict]:
        """Every cycle's fields and its token texts (for `--json` and recordings)."""
        return [{**c.to_dict(), "drafted_text": t.drafted, "correction_text": t.correction}
                for c, t in zip(self.cycles, self.texts)]

    def to_json(self, *, cycles: bool = True) -> dict:
        """The run as `run --json` writes it; without `cycles`, its summary and texts only (the app's API)."""
        data = {"settings": self.settings.to_dict(), "prompt": self.prompt, "text": self.text,
                "cycles": self.cycle_records(), "summary": self.summary(), "environment": environment(self.device)}
        if not cycles:
            del data["cycles"]
            data["baseline_text"] = "".join(self.step_texts)
        return data

