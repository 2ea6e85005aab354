"""What a comparison is, apart from running it: configurations' labels, which of them share a
baseline, the comparison's and the k sweep's records and what they conclude. The views read these
without importing torch; `runs.compare` runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..metrics import best_k, expected_speedup, median, pooled_alpha
from ..settings import RunSettings
from .result import Run

SWEEP_KS = tuple(range(1, 9))


def config_label(settings: RunSettings, *, with_target: bool = False) -> str:
    """A short name for a configuration: 'self:24 k=4', 'ngram k=4..8 (dynamic)', '... T=0.7'."""
    if settings.dynamic_k:
        k = f"k={settings.k}..{settings.max_k or 2 * settings.k} (dynamic)"
    else:
        k = f"k={settings.k}"
    parts = [settings.draft or "ngram", k]
    if settings.branch > 1:
        parts.append(f"tree b={settings.branch}")
    if settings.temperature > 0:
        parts.append(f"T={settings.temperature:g}")
    if with_target:
        parts.insert(0, (settings.target or "default") + ":")
    return " ".join(parts)


CROSS_TOKENIZER_MARK = " (cross-tokenizer)"     # a label's end once its pair is known to draft across tokenizers


def config_labels(configs: Sequence[RunSettings]) -> list[str]:
    """Distinct labels for a list of configurations (the target named only when they differ)."""
    with_target = len({c.target for c in configs}) > 1
    labels: list[str] = []
    for config in configs:
        label = config_label(config, with_target=with_target)
        if label in labels:
            label += f" #{sum(existing.startswith(label) for existing in labels) + 1}"
        labels.append(label)
    return labels


def baseline_key(settings: RunSettings) -> tuple:
    """Configurations with equal keys can share one plain-decoding run: same model, same prompt
    encoding, same sampling rule (the baseline of a greedy run must be greedy to compare outputs)."""
    return (settings.target, settings.dtype, settings.device, settings.chat, settings.max_new_tokens,
            settings.temperature, settings.top_k, settings.top_p, settings.seed)


@dataclass
class Comparison:
    prompt: str
    configs: list[RunSettings]
    labels: list[str]
    results: list[Run] = field(default_factory=list)   # the finished runs, in order
    current: Run | None = None                           # the run in progress

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.configs)

    def pairs(self) -> list[tuple[str, Run]]:
        return list(zip(self.labels, self.results))

    def baselines(self) -> list[Run]:
        """One run per distinct baseline (the first configuration that ran it)."""
        seen, firsts = set(), []
        for run in self.results:
            if run.steps and id(run.steps) not in seen:
                seen.add(id(run.steps))
                firsts.append(run)
        return firsts


def ranked(comparison: Comparison) -> list[tuple[str, Run]]:
    """Finished configurations, fastest first (measured speedup)."""
    return sorted(comparison.pairs(), key=lambda pair: pair[1].speedup or 0.0, reverse=True)


# ----------------------------------------------------------------------------- k sweep

@dataclass
class Sweep:
    comparison: Comparison          # one configuration per k
    ks: list[int]

    @property
    def points(self) -> list[tuple[int, Run]]:
        return list(zip(self.ks, self.comparison.results))

    @property
    def alpha(self) -> float:
        return pooled_alpha([run.cycles for _, run in self.points])

    @property
    def cost_ratio(self) -> float:
        """c: the median of the runs' own measurements (each is noisy; the drafter is the same)."""
        return median([run.stats.cost_ratio for _, run in self.points])

    def theory(self, k: int) -> float:
        return expected_speedup(self.alpha, k, self.cost_ratio)

    @property
    def best_measured_k(self) -> int | None:
        points = [(run.speedup or 0.0, k) for k, run in self.points]
        return max(points)[1] if points else None

    @property
    def best_theory_k(self) -> int:
        return best_k(self.alpha, self.cost_ratio, max_k=max(self.ks))
