"""Every figure of a run, computed from its events, and the theory it is compared against: one
definition each (docs/figures.md), with vLLM's names where it has one (`acceptance_figures`: draft
acceptance rate, mean acceptance length, acceptance rate per position); the own loop's other figures
(`alpha`, the theory's a; `tokens_per_cycle`; `acceptance_when_reached`) have other names. The measured
speedup (`measure_speed`) is decode only; how each figure is timed: `clocks`.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import accumulate

from .core import tree_shape
from .core.events import RESAMPLED, Cycle, Step, drafter_counts


def expected_tokens_per_pass(a: float, k: int) -> float:
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(a: float, k: int, c: float) -> float:
    return expected_tokens_per_pass(a, k) / (k * c + 1.0)


def best_k(a: float, c: float, max_k: int = 16) -> int:
    return max(range(1, max_k + 1), key=lambda k: expected_speedup(a, k, c))


@dataclass(frozen=True)
class SpecStats:
    cycles: int
    tokens: int                          # emitted tokens
    drafted: int                         # vLLM's num_draft_tokens
    accepted: int                        # vLLM's num_accepted_tokens
    num_drafts: int                      # target passes that verified at least one drafted token
    draft_acceptance_rate: float         # accepted / drafted
    alpha: float                         # accepted / (accepted + rejections): the theory's a
    mean_acceptance_length: float        # 1 + accepted / num_drafts (vLLM's, bonus included)
    tokens_per_cycle: float              # tokens / cycles: every pass, those without drafts too
    acceptance_histogram: list[int]
    acceptance_rate_per_position: list[float]   # [i]: accepted at position i / num_drafts (vLLM's)
    acceptance_when_reached: list[float]        # [i]: accepted at position i / drafts reaching it
    mean_k: float                        # mean draft length asked for (Cycle.k); drafted: `drafted / cycles`
    draft_seconds: float
    verify_seconds: float
    seconds: float
    tokens_per_second: float
    cost_ratio: float                    # c: one draft step's time / one target pass's time
    expected_tokens_per_pass: float      # theory at measured alpha and the draft lengths proposed
    expected_speedup: float              # theory at measured alpha, those lengths and c
    best_k: int                          # k that maximises the theoretical speedup
    mean_nodes_per_pass: float = 0.0     # drafted tokens verified per pass (a tree's nodes; a chain's length)
    # Suffix decoding: drafted / accepted tokens that only earlier requests' text proposed (None:
    # the drafter keeps no memory of earlier requests)
    drafted_from_earlier: int | None = None
    accepted_from_earlier: int | None = None
    # Drafting across tokenizers (None otherwise): the draft model's own tokens run, per target
    # token it proposed (re-tokenization's overhead: the cut tokens count too), and under
    # token-level intersection sampling the mean share of the draft's probability in the shared vocabulary.
    draft_model_tokens: int | None = None
    draft_tokens_per_target_token: float | None = None
    shared_mass: float | None = None
    # The cost-aware policy (None without it): cycles that drafted, and cycles where it paused
    # speculation (chose a plain step); the rest found nothing to propose.
    cycles_drafted: int | None = None
    cycles_paused: int | None = None
    drafters: dict[str, dict] | None = None     # a hybrid run's counts and figures per drafter (`policy_counts`)

    def to_dict(self) -> dict:
        return asdict(self)


def ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def acceptance_figures(num_drafts: int, num_draft_tokens: int, num_accepted_tokens: int,
                       accepted_per_position: Sequence[int] = ()) -> dict:
    """vLLM's figures from vLLM's counts, the one formula of each for every engine: the own loop's
    cycles (`summarize`), vLLM's per-request metrics and llama.cpp's draft_n / draft_n_accepted."""
    return {"draft_acceptance_rate": ratio(num_accepted_tokens, num_draft_tokens),
            "mean_acceptance_length": 1.0 + ratio(num_accepted_tokens, num_drafts),
            "acceptance_rate_per_position": [ratio(a, num_drafts) for a in accepted_per_position]}


def accepted_per_position(histogram: Sequence[int]) -> list[int]:
    """Per draft position, the drafting steps of a histogram (exactly 0, 1, ... accepted) that accepted it."""
    return [sum(histogram[i + 1:]) for i in range(max(len(histogram) - 1, 0))]


def acceptance_rate_per_position(histogram: Sequence[int]) -> list[float]:
    """vLLM's per-position acceptance rate from an acceptance histogram of drafting steps."""
    return [ratio(accepted, sum(histogram)) for accepted in accepted_per_position(histogram)]


def cost_ratio(cycles: Sequence[Cycle]) -> float:
    """c from timings, leaving out the first cycle (it carries the prompt's prefill) when there are others."""
    steady = cycles[1:] if len(cycles) > 1 else cycles
    drafted = sum(len(c.drafted) for c in steady)
    per_draft_token = ratio(sum(c.draft_seconds for c in steady), drafted)
    per_pass = ratio(sum(c.verify_seconds for c in steady), len(steady))
    return ratio(per_draft_token, per_pass)


def summarize(cycles: Sequence[Cycle]) -> SpecStats:
    cycles = list(cycles)
    drafted = sum(len(c.drafted) for c in cycles)
    accepted = sum(c.num_accepted for c in cycles)
    rejected = rejections(cycles)
    tokens = sum(len(c.emitted) for c in cycles)
    # A chain reaches as deep as it drafted; a tree as deep as its deepest node. Acceptance by
    # position is by depth: of the cycles whose draft reached depth i, the share that accepted it.
    # Counted from how many cycles stop reaching (and accepting) at each depth, so the cost is one
    # pass over the cycles and one over the depths, not one over the cycles per depth.
    reach = [tree_shape.draft_reach(c) for c in cycles]
    longest = max(reach + [c.k for c in cycles] + [0])
    histogram = [0] * (longest + 1)
    reached_last = [0] * (longest + 1)        # [d]: cycles whose draft reached depth d and no deeper
    accepted_last = [0] * (longest + 1)       # [d]: ... that accepted d tokens of what they reached
    for c, r in zip(cycles, reach):
        histogram[c.num_accepted] += 1
        reached_last[r] += 1
        accepted_last[min(c.num_accepted, r)] += 1
    when_reached, per_position = [], []
    reached = accepted_past = len(cycles)     # cycles reaching past depth i, and accepting past it
    for i in range(longest):
        reached -= reached_last[i]
        accepted_past -= accepted_last[i]
        when_reached.append(ratio(accepted_past, reached))
        per_position.append(accepted_past)
    num_drafts = sum(1 for r in reach if r > 0)
    draft_seconds = sum(c.draft_seconds for c in cycles)
    verify_seconds = sum(c.verify_seconds for c in cycles)
    seconds = draft_seconds + verify_seconds
    alpha = ratio(accepted, accepted + rejected)
    mean_k = ratio(sum(c.k for c in cycles), len(cycles))
    c = cost_ratio(cycles)
    # The theory is evaluated at the draft lengths actually proposed: prompt lookup often finds
    # fewer than k tokens (or none), and a cycle that drafted n tokens can yield at most n + 1.
    lengths = reach or [0]
    tokens_per_pass = sum(expected_tokens_per_pass(alpha, n) for n in lengths) / len(lengths)
    mean_drafted = sum(lengths) / len(lengths)
    return SpecStats(
        cycles=len(cycles), tokens=tokens, drafted=drafted, accepted=accepted, num_drafts=num_drafts,
        **acceptance_figures(num_drafts, drafted, accepted, per_position), alpha=alpha,
        tokens_per_cycle=ratio(tokens, len(cycles)), acceptance_histogram=histogram,
        acceptance_when_reached=when_reached, mean_k=mean_k, draft_seconds=draft_seconds,
        verify_seconds=verify_seconds, seconds=seconds, tokens_per_second=ratio(tokens, seconds),
        cost_ratio=c, expected_tokens_per_pass=tokens_per_pass,
        expected_speedup=tokens_per_pass / (mean_drafted * c + 1.0), best_k=best_k(alpha, c),
        mean_nodes_per_pass=ratio(drafted, len(cycles)), **from_earlier(cycles), **across_tokenizers(cycles),
        **policy_counts(cycles))


def policy_counts(cycles: Sequence[Cycle]) -> dict:
    """Cycles that drafted and cycles the cost-aware policy paused (None for a run without it); a hybrid run's
    vLLM counts per drafter (`core.events.drafter_counts`) with vLLM's figures from them (None otherwise)."""
    counts = drafter_counts(cycles)
    drafters = counts and {name: {**c, **acceptance_figures(**c)} for name, c in counts.items()}
    if not any(c.planned is not None for c in cycles):
        return {"cycles_drafted": None, "cycles_paused": None, "drafters": drafters}
    return {"cycles_drafted": sum(1 for c in cycles if c.drafted),
            "cycles_paused": sum(1 for c in cycles if c.planned == 0), "drafters": drafters}


def from_earlier(cycles: Sequence[Cycle]) -> dict:
    """How many drafted and accepted tokens came only from earlier requests (suffix decoding)."""
    told = [c for c in cycles if c.from_earlier is not None]
    if not told:
        return {}
    return dict(drafted_from_earlier=sum(sum(c.from_earlier) for c in told),
                accepted_from_earlier=sum(c.from_earlier[i] for c in told for i in c.accepted_nodes))


def across_tokenizers(cycles: Sequence[Cycle]) -> dict:
    """How many of its own tokens a cross-tokenizer draft ran, per target token proposed, and the
    mean share of its probability inside the shared vocabulary (token-level intersection)."""
    told = [c for c in cycles if c.draft_pieces is not None]
    if not told:
        return {}
    run = sum(len(c.draft_pieces) for c in told)
    masses = [m for c in told for m in (c.shared_mass or [])]
    return dict(draft_model_tokens=run, draft_tokens_per_target_token=ratio(run, sum(len(c.drafted) for c in told)),
                shared_mass=sum(masses) / len(masses) if masses else None)


@dataclass(frozen=True)
class PlainStats:
    tokens: int
    seconds: float
    tokens_per_second: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_plain(steps: Sequence[Step]) -> PlainStats:
    seconds = sum(s.seconds for s in steps)
    return PlainStats(tokens=len(steps), seconds=seconds, tokens_per_second=ratio(len(steps), seconds))


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def rejections(cycles: Sequence[Cycle]) -> int:
    """Cycles that ended on a rejection (a tree: its path stopped where a child was on offer)."""
    return sum(1 for c in cycles if (c.correction_kind == RESAMPLED if c.is_tree else c.num_accepted < len(c.drafted)))


def pooled_alpha(runs: Sequence[Sequence[Cycle]]) -> float:
    """The theory's per-token acceptance over several runs' cycles: accepted / (accepted + rejections)."""
    accepted = sum(c.num_accepted for cycles in runs for c in cycles)
    return ratio(accepted, accepted + sum(rejections(cycles) for cycles in runs))


# ----------------------------------------------------------------------------- speedup, measured

MIN_PASSES = 8              # fewer decode passes (or steps) than this: too short to measure reliably
MAX_SPREAD = 1.25           # a 95% range wider than this ratio (high / low): not measured reliably
BOOTSTRAP_SAMPLES = 400


@dataclass(frozen=True)
class Speed:
    """Speculative against plain decoding, compared like with like: decode-only time per token. The
    first event of each method carries the prompt's prefill, so it is reported apart and left out
    of the ratio; this also keeps the comparison fair when the two wrote different numbers of tokens
    (sampling, or an EOS). `low`..`high` is a 95% bootstrap range of the timing noise: the run's
    token counts and draft lengths are what they are; the steps' durations and the passes' deviations
    from the cost their draft length predicts are resampled."""
    speedup: float                  # plain seconds per token / speculative seconds per token (decode only)
    low: float
    high: float
    reliable: bool                  # enough passes and steps, and a range narrower than MAX_SPREAD
    spec_tokens: int
    plain_tokens: int
    spec_prefill_seconds: float     # the first cycle: prefill plus the first verification
    plain_prefill_seconds: float    # the first step: prefill plus the first token
    spec_decode_seconds: float
    plain_decode_seconds: float
    spec_decode_tokens: int
    plain_decode_tokens: int
    pass_cost: float                # median verification pass / median plain step (decode only)
    same_length: bool

    def to_dict(self) -> dict:
        return asdict(self)


def linear_fit(x: Sequence[float], y: Sequence[float]) -> list[float]:
    """Least-squares line through (x, y), evaluated at each x (the mean when x does not vary)."""
    mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
    spread = sum((a - mean_x) ** 2 for a in x)
    slope = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y)) / spread if spread else 0.0
    return [mean_y + slope * (a - mean_x) for a in x]


def measure_speed(cycles: Sequence[Cycle], steps: Sequence[Step], *, seed: int = 0) -> Speed | None:
    """None until both methods have at least one decode event past their prefill."""
    if len(cycles) < 2 or len(steps) < 2:
        return None
    pass_seconds = [c.seconds for c in cycles[1:]]
    step_seconds = [s.seconds for s in steps[1:]]
    spec_tokens = sum(len(c.emitted) for c in cycles[1:])
    plain_tokens = len(step_seconds)

    def speedup_of(spec_seconds: float, plain_seconds: float) -> float:
        return ratio(plain_seconds / plain_tokens, ratio(spec_seconds, spec_tokens))

    # Bootstrap the timing noise. A pass's duration depends on how many tokens it drafted and
    # verified, so passes are resampled as (the cost a least-squares line predicts for their draft
    # length) + (a residual drawn with replacement); steps, all alike, are drawn with replacement.
    predicted = linear_fit([len(c.drafted) for c in cycles[1:]], pass_seconds)
    residuals = [t - f for t, f in zip(pass_seconds, predicted)]
    spec_fit = sum(predicted)
    rng = random.Random(seed)
    samples = sorted(speedup_of(spec_fit + sum(rng.choices(residuals, k=len(residuals))),
                           sum(rng.choices(step_seconds, k=len(step_seconds)))) for _ in range(BOOTSTRAP_SAMPLES))
    low, high = samples[int(0.025 * BOOTSTRAP_SAMPLES)], samples[int(0.975 * BOOTSTRAP_SAMPLES) - 1]
    emitted = sum(len(c.emitted) for c in cycles)
    return Speed(speedup=speedup_of(sum(pass_seconds), sum(step_seconds)), low=low, high=high,
                 reliable=(len(pass_seconds) >= MIN_PASSES and plain_tokens >= MIN_PASSES
                           and high <= MAX_SPREAD * low),
                 spec_tokens=emitted, plain_tokens=len(steps),
                 spec_prefill_seconds=cycles[0].seconds, plain_prefill_seconds=steps[0].seconds,
                 spec_decode_seconds=sum(pass_seconds), plain_decode_seconds=sum(step_seconds),
                 spec_decode_tokens=spec_tokens, plain_decode_tokens=plain_tokens,
                 pass_cost=ratio(median([c.verify_seconds for c in cycles[1:]]), median(step_seconds)),
                 same_length=emitted == len(steps))


def running_speedup(cycles: Sequence[Cycle], steps: Sequence[Step]) -> tuple[list[float], list[float | None]]:
    """At the end of each cycle (x: the speculative run's own time so far): the speedup as
    `measure_speed` computes it, decode-only time per token, against the baseline up to the same
    amount of its own time (at least one step past its prefill)."""
    spec_time = list(accumulate(c.seconds for c in cycles))
    plain_time = list(accumulate(s.seconds for s in steps))
    out, j = [], 0
    for i, t in enumerate(spec_time):
        while j < len(plain_time) and plain_time[j] <= t:
            j += 1
        done = max(j, 2)
        if i == 0 or done > len(steps):
            out.append(None)
            continue
        spec_per_token = ratio(t - spec_time[0], sum(len(c.emitted) for c in cycles[1:i + 1]))
        plain_per_token = ratio(plain_time[done - 1] - plain_time[0], done - 1)
        out.append(ratio(plain_per_token, spec_per_token) or None)
    return spec_time, out


def draft_cost(stats: SpecStats) -> float:
    """Drafting time per cycle in target passes: n c, the term the theory divides by (1 + n c). c is
    per drafted token, so n is the tokens drafted per cycle, not the k asked for (prompt lookup
    often drafts fewer, or none)."""
    return drafted_per_cycle(stats) * stats.cost_ratio


def pass_seconds(cycles: Sequence[Cycle]) -> float:
    """Mean time of one verification pass, leaving out the first (it carries the prompt's prefill)."""
    steady = cycles[1:] or cycles
    return ratio(sum(c.verify_seconds for c in steady), len(steady))


def drafted_per_cycle(stats: SpecStats) -> float:
    return ratio(stats.drafted, stats.cycles)


def ideal_speedup(spec: SpecStats, speed: Speed | None) -> float:
    """The theory if a verification pass cost one plain step (what a GPU approaches), drafting
    keeping its measured cost: E / (n c P + 1), c being measured against a pass of cost P steps."""
    pass_cost = speed.pass_cost if speed is not None and speed.pass_cost else 1.0
    return ratio(spec.expected_tokens_per_pass, drafted_per_cycle(spec) * spec.cost_ratio * pass_cost + 1.0)


def theory_at_pass_cost(spec: SpecStats, speed: Speed | None) -> float | None:
    """The theory priced at this machine's measured cost of a verification pass (in plain steps):
    the ideal assumes a pass over k + 1 tokens costs one step, which a GPU approaches and a CPU does not."""
    if speed is None or not speed.pass_cost:
        return None
    return spec.expected_speedup / speed.pass_cost


# ----------------------------------------------------------------------------- over a set of prompts

def bootstrap_median(values: Sequence[float], *, samples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` and its 95% percentile-bootstrap interval."""
    if not values:
        return 0.0, 0.0, 0.0
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(samples))
    return statistics.median(values), medians[int(0.025 * samples)], medians[int(0.975 * samples) - 1]


def paired_ratio(first: Sequence[float], second: Sequence[float], **options) -> tuple[float, float, float]:
    """How much faster `first` is than `second` on the same prompts: the median of the per-prompt
    ratios first / second and its 95% bootstrap interval (prompts resampled as pairs)."""
    return bootstrap_median([ratio(a, b) for a, b in zip(first, second)], **options)
