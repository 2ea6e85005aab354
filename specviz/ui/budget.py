"""What a hosted request costs, counted in tokens before any decoding, and the refusal that says so.

A decode's work is its prompt's tokens, as the model reads them (chat template included), plus the
new tokens it may write. Characters say little about it: 2,900 characters of Chinese are ~7,700
tokens. The hosted limits (`settings.hosted`):

- every prompt (and every earlier turn of a prompt in a set) at most `Limits.max_prompt_tokens`;
- a prompt-set comparison at most `Limits.max_work_tokens` over all its decodes: per round and per
  prompt, each configuration's speculative decode (and one per earlier turn), and each plain
  baseline (configurations that share a baseline, as `runs.comparison.baseline_key` says, share one).

The one-prompt requests are bounded by the prompt cap alone: a Run or Teach decodes the prompt twice
at most (2 x (1,024 + 256) = 2,560 tokens), Compare at most 4 configurations and 4 baselines
(10,240), a k sweep 8 configurations and one baseline (11,520). The warm-ups before timed runs (one
prefill and k + 2 tokens per configuration) are not counted.

The prompts are counted with each target's own tokenizer, so a hosted Compare loads its pairs (from
the model cache, as a preset pair stays loaded) before it decodes anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from ..catalog import BenchPrompt
from ..errors import SpecvizError
from ..models import encode_prompt
from ..runs import Loader, load_stepwise
from ..runs.comparison import baseline_key
from ..settings import Limits, RunSettings
from .common import TICK


def prompt_tokens(tokenizer, prompt: str, chat: bool) -> int:
    """How many tokens the model reads for `prompt` (through the chat template when `chat`)."""
    return encode_prompt(tokenizer, prompt, chat=chat).shape[1]


def check_prompt_tokens(count: int, limits: Limits, what: str = "The prompt") -> None:
    if limits.max_prompt_tokens is not None and count > limits.max_prompt_tokens:
        raise SpecvizError(f"{what} is {count:,} tokens as the model reads it (chat template included); this hosted "
                           f"demo allows {limits.max_prompt_tokens:,}. Shorten it: text in other scripts, code and "
                           "unusual characters take several tokens per word.")


def check_pair_prompt(pair, prompt: str, settings: RunSettings, limits: Limits) -> None:
    """A Run's or a Teach's prompt against the hosted cap, with the loaded pair's tokenizer."""
    if limits.max_prompt_tokens is not None:
        check_prompt_tokens(prompt_tokens(pair.tokenizer, prompt, settings.chat), limits)


def load_tokenizers(configs: Sequence[RunSettings], loader: Loader | None) -> Iterator[object]:
    """Each configuration's tokenizer by target, for counting prompts: yields TICK while a pair loads,
    then returns (as a generator's value, for `yield from`) {target: tokenizer}."""
    tokenizers = {}
    for settings in configs:
        if settings.target in tokenizers:
            continue
        for item in load_stepwise(settings, loader):
            if item is None or isinstance(item, str):
                yield TICK
            else:
                tokenizers[settings.target] = item.tokenizer
    return tokenizers


def check_comparison_prompt(tokenizers: dict, configs: Sequence[RunSettings], prompt: str, limits: Limits) -> None:
    for settings in configs:
        check_prompt_tokens(prompt_tokens(tokenizers[settings.target], prompt, settings.chat), limits)


@dataclass(frozen=True)
class Work:
    """The decodes a prompt-set comparison or a load sweep will run, counted the way it runs them
    (`set_work`, `load_work`; warm-ups not counted)."""
    speculative: int          # speculative decodes (a set: earlier turns included; all rounds)
    plain: int                # plain baselines (all rounds)
    prompt_tokens: int        # summed over every decode
    new_tokens: int           # the most each decode may write (max new tokens)
    repeats: int = 1          # rounds (a prompt set's; a sweep runs once)

    @property
    def decodes(self) -> int:
        return self.speculative + self.plain

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.decodes * self.new_tokens


def set_work(configs: Sequence[RunSettings], prompts: Sequence[BenchPrompt], repeats: int, tokenizers: dict,
             limits: Limits) -> Work:
    """Every decode `runs.iter_prompt_set` runs, its prompts checked against the per-prompt cap."""
    speculative = plain = tokens = 0
    for prompt in prompts:
        baselines = set()
        for settings in configs:
            here = settings if prompt.chat else replace(settings, chat=False)
            tokenizer = tokenizers[settings.target]
            counts = []
            for turn, text in enumerate((*prompt.earlier, prompt.prompt)):
                what = f"Prompt {prompt.id!r}" + (f" (earlier turn {turn + 1})" if turn < len(prompt.earlier) else "")
                counts.append(prompt_tokens(tokenizer, text, here.chat))
                check_prompt_tokens(counts[-1], limits, what)
            speculative += len(counts)
            tokens += sum(counts)
            if baseline_key(here) not in baselines:      # the first configuration of a key runs its baseline
                baselines.add(baseline_key(here))
                plain += 1
                tokens += counts[-1]
    return Work(speculative=speculative * repeats, plain=plain * repeats, prompt_tokens=tokens * repeats,
                   new_tokens=configs[0].max_new_tokens, repeats=repeats)


def check_set_work(work: Work, configs: Sequence[RunSettings], prompts: Sequence[BenchPrompt],
                   limits: Limits) -> None:
    """Refuse a set comparison whose work is over the hosted budget, saying what was counted and how to fit."""
    budget = limits.max_work_tokens
    if budget is None or work.total <= budget:
        return
    rounds = f"{work.repeats} round{'s' if work.repeats > 1 else ''}"
    fits = []
    per_round = work.total // work.repeats
    if work.repeats > 1 and per_round <= budget:
        fits.append(f"{budget // per_round} round{'s' if budget // per_round > 1 else ''}")
    new_tokens = (budget - work.prompt_tokens) // work.decodes // 8 * 8      # the slider's steps of 8
    if new_tokens >= 8:
        fits.append(f"at most {new_tokens} new tokens")
    fits.append("fewer configurations or a smaller set")
    raise SpecvizError(
        f"This comparison counts {work.total:,} tokens of work: {len(configs)} configuration"
        f"{'s' if len(configs) > 1 else ''} x {len(prompts)} prompts x {rounds} make {work.speculative} speculative "
        f"decodes (earlier turns included) and {work.plain} plain baselines, each its prompt's tokens "
        f"({work.prompt_tokens:,} in all) plus up to {work.new_tokens} new tokens; this hosted demo allows "
        f"{budget:,}. To fit, use {' or '.join(fits)}.")


# ----------------------------------------------------------------------------- the load sweep

# A hosted load sweep: small batches and drafts, short answers, and its whole work within
# `Limits.max_work_tokens`, all checked before any decoding.
LOAD_MAX_BATCH = 4
LOAD_MAX_K = 8
LOAD_MAX_NEW_TOKENS = 64


def check_load_caps(batches: Sequence[int], ks: Sequence[int], max_new_tokens: int, limits: Limits) -> None:
    """A hosted sweep's batch sizes, draft lengths and answer length (before anything is loaded)."""
    if not limits.hosted:
        return
    caps = (f"this hosted demo sweeps batch sizes up to {LOAD_MAX_BATCH}, k up to {LOAD_MAX_K} and at most "
            f"{LOAD_MAX_NEW_TOKENS} new tokens")
    if max(batches) > LOAD_MAX_BATCH:
        raise SpecvizError(f"Batch size {max(batches)} is too large: {caps}. Run `python -m specviz load` on your "
                           "own machine for larger batches.")
    if max(ks) > LOAD_MAX_K:
        raise SpecvizError(f"k = {max(ks)} is too long: {caps}.")
    if max_new_tokens > LOAD_MAX_NEW_TOKENS:
        raise SpecvizError(f"{max_new_tokens} new tokens are too many: {caps}.")


def load_work(prompt_counts: Sequence[int], batches: Sequence[int], ks: Sequence[int], new_tokens: int) -> Work:
    """`prompt_counts[i]`: the tokens of the sweep's i-th prompt (a batch of B takes the first B, cycled).
    Each batch size decodes its rows speculatively for each k > 0 and plainly beside each (once when
    every k is 0)."""
    drafting = sum(1 for k in ks if k > 0)
    speculative = plain = tokens = 0
    for batch in batches:
        rows = sum(prompt_counts[i % len(prompt_counts)] for i in range(batch))
        speculative += batch * drafting
        plain += batch * max(drafting, 1)
        tokens += rows * (drafting + max(drafting, 1))
    return Work(speculative=speculative, plain=plain, prompt_tokens=tokens, new_tokens=new_tokens)


def check_load_work(work: Work, limits: Limits) -> None:
    budget = limits.max_work_tokens
    if budget is None or work.total <= budget:
        return
    raise SpecvizError(
        f"This sweep counts {work.total:,} tokens of work: {work.speculative} speculative and {work.plain} plain "
        f"decodes, each its prompt's tokens ({work.prompt_tokens:,} in all) plus up to {work.new_tokens} new tokens; "
        f"this hosted demo allows {budget:,}. To fit, use fewer or smaller batch sizes, fewer k, fewer new tokens "
        "or a set of shorter prompts.")
