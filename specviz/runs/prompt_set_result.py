"""A comparison over a set of prompts, as a record read without torch: each prompt's run per
configuration, each configuration's summary (median speedup over prompts, its 95% interval) and the
winner when the paired comparison clears 1. `runs.prompt_sets` runs it; the engines' prompt-set
comparison (`runs.engine_compare`) fills it too; the views draw it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..catalog import BenchPrompt
from ..metrics import acceptance_figures, bootstrap_median, median, paired_ratio, ratio
from ..settings import RunSettings
from .result import Run


@dataclass(frozen=True)
class PromptRun:
    """One configuration on one prompt in one round: the numbers kept (not the run itself)."""
    config: int
    prompt: int
    round: int
    speedup: float | None           # decode-only, against this prompt's plain baseline
    tokens: int
    baseline_tokens: int
    passes: int
    drafted: int
    accepted: int
    seconds: float
    identical: bool | None
    draft_model_tokens: int | None = None   # drafted across tokenizers: the draft model's own tokens run
    num_drafts: int = 0             # target passes (verification steps) that had drafts

    @classmethod
    def of(cls, config: int, prompt: int, round_: int, run: Run) -> PromptRun:
        s = run.stats
        return cls(config, prompt, round_, run.speedup, s.tokens, len(run.steps), s.cycles, s.drafted, s.accepted,
                   s.seconds, run.identical, draft_model_tokens=s.draft_model_tokens, num_drafts=s.num_drafts)


@dataclass(frozen=True)
class ConfigSummary:
    label: str
    speedups: list[float]           # per prompt: the median over rounds
    speedup_median: float
    speedup_ci95: tuple[float, float]
    mean_acceptance_length: float   # 1 + accepted / num_drafts, pooled over every run (metrics)
    draft_acceptance_rate: float
    tokens_per_cycle: float | None  # the own loop's tokens per target pass, every pass (None on an engine)
    by_category: dict[str, float]   # median speedup per category
    # Drafted across tokenizers (None otherwise): the draft model's own tokens per target token
    # proposed, pooled over every run.
    draft_tokens_per_target_token: float | None = None


@dataclass
class PromptSetComparison:
    configs: list[RunSettings]
    labels: list[str]
    prompts: list[BenchPrompt]
    repeats: int
    results: list[PromptRun] = field(default_factory=list)
    current: Run | None = None
    clock: str = ""                 # the clock that timed the runs (core.decoding.Clock.name)
    started: float = field(default_factory=time.monotonic)
    last_finished: float | None = None     # when the latest run finished (time.monotonic)
    _shown_left: float | None = field(default=None, repr=False)   # the last estimate given

    @property
    def total(self) -> int:
        return len(self.configs) * len(self.prompts) * self.repeats

    @property
    def done(self) -> bool:
        return len(self.results) == self.total

    def seconds_left(self, now: float | None = None) -> float | None:
        """Wall time left (None before the first run finishes): the runs still to do at the pace of
        those finished, less the time the current run has already taken. It only falls: measured at
        each finished run, counted down between them, not raised by a finished run while it has time
        left (a run slower than the pace holds it until it finishes; only one that ran it down to 0
        starts it again from the pace measured then)."""
        if not self.results or self.last_finished is None:
            return None
        now = time.monotonic() if now is None else now
        pace = (self.last_finished - self.started) / len(self.results)
        left = max(0.0, pace * (self.total - len(self.results)) - (now - self.last_finished))
        if self._shown_left:
            left = min(left, self._shown_left)
        self._shown_left = left
        return left

    def speedups(self, config: int) -> list[float]:
        """Per prompt finished in every round so far: the median over its rounds."""
        return [speedup for speedup in self.per_prompt(config) if speedup is not None]

    def summary(self, config: int) -> ConfigSummary:
        runs = [r for r in self.results if r.config == config]
        speedups = self.speedups(config)
        middle, low, high = bootstrap_median(speedups)
        categories: dict[str, list[float]] = {}
        for p, prompt in enumerate(self.prompts):
            values = [r.speedup for r in runs if r.prompt == p and r.speedup]
            if values:
                categories.setdefault(prompt.category, []).append(median(values))
        across = [r for r in runs if r.draft_model_tokens is not None]
        figures = acceptance_figures(*(sum(getattr(r, name) for r in runs)
                                       for name in ("num_drafts", "drafted", "accepted")))
        passes = sum(r.passes for r in runs)
        return ConfigSummary(self.labels[config], speedups, middle, (low, high), figures["mean_acceptance_length"],
                             figures["draft_acceptance_rate"], ratio(sum(r.tokens for r in runs), passes) or None,
                             {name: median(values) for name, values in categories.items()},
                             draft_tokens_per_target_token=ratio(sum(r.draft_model_tokens for r in across),
                                                                 sum(r.drafted for r in across)) if across else None)

    def ranking(self) -> list[int]:
        return sorted(range(len(self.configs)), key=lambda i: self.summary(i).speedup_median, reverse=True)

    def winner(self) -> tuple[int | None, tuple[float, float, float] | None]:
        """(the winning configuration or None, the paired ratio best / runner-up with its interval).
        A winner needs the paired interval's low end above 1."""
        order = self.ranking()
        if len(order) < 2:
            return (order[0] if order and self.speedups(order[0]) else None), None
        best, runner = order[0], order[1]
        pairs = [(a, b) for a, b in zip(self.per_prompt(best), self.per_prompt(runner)) if a and b]
        if not pairs:
            return None, None
        paired = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
        return (best if paired[1] > 1.0 else None), paired

    def per_prompt(self, config: int) -> list[float | None]:
        """Per prompt, in order: the median speedup over its rounds so far (None: none finished)."""
        out = []
        for p in range(len(self.prompts)):
            values = [r.speedup for r in self.results if r.config == config and r.prompt == p and r.speedup]
            out.append(median(values) if values else None)
        return out
