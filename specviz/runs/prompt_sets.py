"""Configurations compared over a set of prompts, with how sure the answer is.

After a warm-up, the configurations alternate prompt by prompt (and round by round with `repeats`),
each prompt decoded plainly once per baseline key and shared by the configurations that can use it,
as in `runs.compare`. Each run's speedup is `metrics.measure_speed`'s (decode-only time per token,
on the run's own clock). Per configuration: the median over prompts of the per-prompt speedup (the
median over rounds first) with a 95% bootstrap interval; the winner is named only when the paired
comparison with the runner-up (median of per-prompt ratios, prompts resampled as pairs) clears 1.
`iter_prompt_set` yields after every decoding event, so a consumer that stops iterating stops the
work within one cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ..catalog import BenchPrompt
from ..errors import SpecvizError
from ..metrics import bootstrap_median, median, paired_ratio, ratio
from ..models import ModelPair
from ..settings import RunSettings
from .compare import baseline_key, config_labels, loaded_label
from .result import Run
from .run import Loader, last, load, load_stepwise, race


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

    @classmethod
    def of(cls, config: int, prompt: int, round_: int, run: Run) -> PromptRun:
        s = run.stats
        return cls(config, prompt, round_, run.speedup, s.tokens, len(run.steps), s.cycles, s.drafted, s.accepted,
                   s.seconds, run.identical, draft_model_tokens=s.draft_model_tokens)


@dataclass(frozen=True)
class ConfigSummary:
    label: str
    speedups: list[float]           # per prompt: the median over rounds
    speedup_median: float
    speedup_ci95: tuple[float, float]
    mean_acceptance_length: float   # tokens per target pass, pooled over every run
    draft_acceptance_rate: float
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
        out = []
        for p in range(len(self.prompts)):
            values = [r.speedup for r in self.results if r.config == config and r.prompt == p and r.speedup]
            if values:
                out.append(median(values))
        return out

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
        return ConfigSummary(self.labels[config], speedups, middle, (low, high),
                             ratio(sum(r.tokens for r in runs), sum(r.passes for r in runs)),
                             ratio(sum(r.accepted for r in runs), sum(r.drafted for r in runs)),
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
        pairs = [(a, b) for a, b in zip(self._per_prompt(best), self._per_prompt(runner)) if a and b]
        if not pairs:
            return None, None
        paired = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
        return (best if paired[1] > 1.0 else None), paired

    def _per_prompt(self, config: int) -> list[float | None]:
        out = []
        for p in range(len(self.prompts)):
            values = [r.speedup for r in self.results if r.config == config and r.prompt == p and r.speedup]
            out.append(median(values) if values else None)
        return out


def iter_prompt_set(configs: Sequence[RunSettings], prompts: Sequence[BenchPrompt], *, repeats: int = 1,
                    loader: Loader | None = None, warm_up: bool = True,
                    after_run: Callable[[int, int, int, Run], None] | None = None) -> Iterator[PromptSetComparison]:
    """Run every configuration on every prompt, `repeats` rounds; yield after every event.
    `after_run(config, prompt, round, run)` hears each finished run (the benchmark times
    transformers' generate on the same prompt there); `warm_up=False` when the caller warmed up."""
    configs, prompts = list(configs), list(prompts)
    if not configs or not prompts:
        raise SpecvizError("A prompt-set comparison needs at least one configuration and one prompt.")
    comparison = PromptSetComparison(configs, config_labels(configs), prompts, repeats)
    pairs: list[ModelPair] = []
    for c, settings in enumerate(configs):         # load every pair first (yielding while it loads)
        for item in load_stepwise(settings, loader or load):
            if item is None or isinstance(item, str):
                yield comparison
            else:
                pairs.append(item)
                comparison.labels[c] = loaded_label(comparison.labels[c], item)
    first_seen: set[int] = set()
    for round_ in range(repeats):
        for p, prompt in enumerate(prompts):
            baselines: dict[tuple, Run] = {}
            for c, (settings, pair) in enumerate(zip(configs, pairs)):
                settings_here = settings if prompt.chat else replace(settings, chat=False)
                key = baseline_key(settings_here)
                shared = baselines.get(key)
                run = None
                # Every prompt and every round starts afresh: a drafter that learns from earlier
                # requests (suffix) must not draft a prompt's answer from its own earlier round.
                pair.draft.forget()
                # Repeated work brings its own earlier turns: decoded first, in order, not timed.
                for turn in prompt.earlier:
                    for _ in race(settings_here, turn, pair, warm_up=False):
                        yield comparison
                # The first run of each configuration also warms up the shapes it will use.
                for run in race(settings_here, prompt.prompt, pair, baseline=shared is None,
                                warm_up=warm_up and c not in first_seen):
                    comparison.current = run
                    yield comparison
                first_seen.add(c)
                if shared is None:
                    baselines[key] = run
                else:
                    run.attach_baseline(shared)
                comparison.results.append(PromptRun.of(c, p, round_, run))
                comparison.last_finished = time.monotonic()
                comparison.clock = run.clock
                if after_run is not None:
                    after_run(c, p, round_, run)
                comparison.current = None
                yield comparison


def compare_prompt_set(configs: Sequence[RunSettings], prompts: Sequence[BenchPrompt],
                       **options) -> PromptSetComparison:
    return last(iter_prompt_set(configs, prompts, **options))
