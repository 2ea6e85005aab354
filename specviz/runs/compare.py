"""Several configurations on one prompt, and the k sweep.

A comparison runs 2 to 4 configurations one after another on the same device through `run.race`,
each against one plain-decoding baseline: configurations that share the target, prompt encoding and
sampling rule share one baseline (run, interleaved, by the first of them); a configuration with
another target or other sampling settings gets its own. A k sweep is a comparison of one
configuration with itself at k = 1..8. `iter_comparison` yields after every event, so a consumer
that stops iterating stops the work within one cycle. What a comparison is (labels, records,
conclusions) is `runs.comparison`, which the views read without torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..errors import SpecvizError
from ..models import ModelPair
from ..settings import RunSettings, parse_draft
from .comparison import CROSS_TOKENIZER_MARK, SWEEP_KS, Comparison, Sweep, baseline_key, config_labels
from .result import Run
from .run import Loader, follow_parted, last, load, load_stepwise, race


def loaded_label(label: str, pair: ModelPair) -> str:
    """A configuration's label once its pair is loaded: a draft with another tokenizer says so (which
    tokenizer a model has is known only once it loads), in tables, charts and exports alike."""
    return label + CROSS_TOKENIZER_MARK if isinstance(pair.draft, CrossTokenizerDrafter) else label


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
        for run in race(settings, prompt, pair, baseline=shared is None, seed=shared and shared.settings.seed):
            comparison.current = run
            yield comparison
        if shared is None:
            baselines[baseline_key(settings)] = run
        else:
            run.attach_baseline(shared)
            for _ in follow_parted(run, pair):
                yield comparison
        comparison.results.append(run)
        comparison.current = None
        if progress is not None:
            progress((i + 1) / len(configs), f"[{i + 1}/{len(configs)}] {comparison.labels[i]}: "
                     f"{run.stats.tokens} tokens, {run.speedup or 0:.2f}x")
        yield comparison


def compare(configs: Sequence[RunSettings], prompt: str, **options) -> Comparison:
    return last(iter_comparison(configs, prompt, **options))


def iter_sweep(settings: RunSettings, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Iterator[Sweep]:
    """`settings` at each k (fixed k: neither the cost-aware policy nor dynamic k), against one shared baseline."""
    ks = list(ks)
    if parse_draft(settings.draft).kind == "auto":
        raise SpecvizError("The k sweep drafts k tokens every cycle; 'auto' chooses its drafter and draft length "
                           "each cycle by the cost-aware policy: sweep one drafter (ngram, suffix, head).")
    configs = [replace(settings, k=k, fixed_k=True, dynamic_k=False, max_k=None) for k in ks]
    for comparison in iter_comparison(configs, prompt, **options):
        yield Sweep(comparison, ks)


def sweep(settings: RunSettings, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Sweep:
    return last(iter_sweep(settings, prompt, ks, **options))
