"""Configurations compared over a set of prompts, with how sure the answer is.

After a warm-up, the configurations alternate prompt by prompt (and round by round with `repeats`),
each prompt decoded plainly once per baseline key and shared by the configurations that can use it,
as in `runs.compare`. Each run's speedup is `metrics.measure_speed`'s (decode-only time per token,
on the run's own clock). Per configuration: the median over prompts of the per-prompt speedup (the
median over rounds first) with a 95% bootstrap interval; the winner is named only when the paired
comparison with the runner-up (median of per-prompt ratios, prompts resampled as pairs) clears 1.
`iter_prompt_set` yields after every decoding event, so a consumer that stops iterating stops the
work within one cycle. The records are `runs.prompt_set_result`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from ..catalog import BenchPrompt
from ..errors import SpecvizError
from ..models import ModelPair
from ..settings import RunSettings
from .compare import loaded_label
from .comparison import baseline_key, config_labels
from .prompt_set_result import PromptRun, PromptSetComparison
from .result import Run
from .run import Loader, follow_parted, last, load, load_stepwise, race


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
                                warm_up=warm_up and c not in first_seen, seed=shared and shared.settings.seed):
                    comparison.current = run
                    yield comparison
                first_seen.add(c)
                if shared is None:
                    baselines[key] = run
                else:
                    run.attach_baseline(shared)
                    for _ in follow_parted(run, pair):
                        yield comparison
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
