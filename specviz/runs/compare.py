"""Several configurations on one prompt, and the k sweep.

A comparison runs 2 to 4 configurations one after another on the same device through `run.race`,
each against one plain-decoding baseline: configurations that share the target, prompt encoding and
sampling rule share one baseline (run, interleaved, by the first of them); a configuration with
another target or other sampling settings gets its own. A k sweep is a comparison of one
configuration with itself at k = 1..8. `iter_comparison` yields after every event, so a consumer
that stops iterating stops the work within one cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..errors import SpecvizError
from ..metrics import best_k, expected_speedup, median, pooled_alpha
from ..models import ModelPair
from ..settings import RunSettings
from .result import Run
from .run import Loader, last, load, load_stepwise, race

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


def loaded_label(label: str, pair: ModelPair) -> str:
    """A configuration's label once its pair is loaded: a draft with another tokenizer says so (which
    tokenizer a model has is known only once it loads), in tables, charts and exports alike."""
    return label + CROSS_TOKENIZER_MARK if isinstance(pair.draft, CrossTokenizerDrafter) else label


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


def iter_comparison(configs: Sequence[RunSettings], prompt: str, *, loader: Loader = load,
                    progress=None) -> Iterator[Comparison]:
    """Run each configuration in turn (validated settings); yield the comparison after every event."""
    configs = list(configs)
    if not configs:
        raise SpecvizError("Nothing to compare: give at least one configuration.")
    comparison = Comparison(prompt, configs, config_labels(configs))
    baselines: dict[tuple, Run] = {}
    for i, settings in enumerate(configs):
        if progress is not None:
            progress(i / len(configs), f"[{i + 1}/{len(configs)}] {comparison.labels[i]}: loading and decoding")
        pair = None
        for item in load_stepwise(settings, loader):   # yields while a long load goes on
            if item is None or isinstance(item, str):
                yield comparison
            else:
                pair = item
        comparison.labels[i] = loaded_label(comparison.labels[i], pair)
        shared = baselines.get(baseline_key(settings))
        run = None
        # Each configuration starts with no memory of earlier requests: a suffix drafter must not
        # draft this prompt's answer from another configuration's run of it.
        pair = replace(pair, draft=pair.draft.without_memory())
        for run in race(settings, prompt, pair, baseline=shared is None):
            comparison.current = run
            yield comparison
        if shared is None:
            baselines[baseline_key(settings)] = run
        else:
            run.attach_baseline(shared)
        comparison.results.append(run)
        comparison.current = None
        if progress is not None:
            progress((i + 1) / len(configs), f"[{i + 1}/{len(configs)}] {comparison.labels[i]}: "
                     f"{run.stats.tokens} tokens, {run.speedup or 0:.2f}x")
        yield comparison


def compare(configs: Sequence[RunSettings], prompt: str, **options) -> Comparison:
    return last(iter_comparison(configs, prompt, **options))


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


def iter_sweep(settings: RunSettings, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Iterator[Sweep]:
    """`settings` at each k (fixed k: dynamic k is turned off), against one shared baseline."""
    ks = list(ks)
    configs = [replace(settings, k=k, dynamic_k=False, max_k=None) for k in ks]
    for comparison in iter_comparison(configs, prompt, **options):
        yield Sweep(comparison, ks)


def sweep(settings: RunSettings, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Sweep:
    return last(iter_sweep(settings, prompt, ks, **options))
