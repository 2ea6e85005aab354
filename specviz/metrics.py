"""Statistics of a run, computed from its events, and the theory they are compared against.

Names follow vLLM's speculative-decoding metrics where it has one:
- `draft_acceptance_rate`: accepted drafted tokens / drafted tokens.
- `mean_acceptance_length`: tokens emitted per target pass (accepted + the one the target adds).
- `acceptance_histogram`: number of cycles that accepted 0, 1, ..., max_k drafted tokens.
- per-position acceptance: for position i, the fraction of drafts whose i-th token was accepted.

The theory (Leviathan et al. 2023) assumes each drafted token is accepted independently with
probability a. Then one target pass yields (1 - a^(k+1)) / (1 - a) tokens in expectation, and with
c = (time of one draft step) / (time of one target pass) the expected speedup over plain decoding
is (1 - a^(k+1)) / ((1 - a)(k c + 1)). We estimate a as accepted / (accepted + rejections): each
verified token is one Bernoulli trial, and tokens after a rejection are never tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import random
from itertools import accumulate
import statistics

from .core.events import Cycle, Step


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
    drafted: int
    accepted: int
    draft_acceptance_rate: float         # accepted / drafted (vLLM's name)
    alpha: float                         # per-token acceptance estimate used by the theory
    mean_acceptance_length: float        # tokens per target pass (vLLM's name)
    acceptance_histogram: list[int]
    acceptance_by_position: list[float]
    mean_k: float
    draft_seconds: float
    verify_seconds: float
    seconds: float
    tokens_per_second: float
    cost_ratio: float                    # c: one draft step's time / one target pass's time
    expected_tokens_per_pass: float      # theory at measured alpha and the draft lengths proposed
    expected_speedup: float              # theory at measured alpha, those lengths and c
    best_k: int                          # k that maximises the theoretical speedup

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def cost_ratio(cycles: Sequence[Cycle]) -> float:
    """c from timings. The first cycle carries the prompt prefill, so it is left out when there
    are others."""
    steady = cycles[1:] if len(cycles) > 1 else cycles
    drafted = sum(len(c.drafted) for c in steady)
    per_draft_token = _ratio(sum(c.draft_seconds for c in steady), drafted)
    per_pass = _ratio(sum(c.verify_seconds for c in steady), len(steady))
    return _ratio(per_draft_token, per_pass)


def summarize(cycles: Sequence[Cycle]) -> SpecStats:
    cycles = list(cycles)
    drafted = sum(len(c.drafted) for c in cycles)
    accepted = sum(c.num_accepted for c in cycles)
    rejected = rejections(cycles)
    tokens = sum(len(c.emitted) for c in cycles)
    longest = max([len(c.drafted) for c in cycles] + [c.k for c in cycles] + [0])
    histogram = [0] * (longest + 1)
    for c in cycles:
        histogram[c.num_accepted] += 1
    by_position = []
    for i in range(longest):
        reached = [c for c in cycles if len(c.drafted) > i]
        by_position.append(_ratio(sum(c.num_accepted > i for c in reached), len(reached)))
    draft_seconds = sum(c.draft_seconds for c in cycles)
    verify_seconds = sum(c.verify_seconds for c in cycles)
    seconds = draft_seconds + verify_seconds
    alpha = _ratio(accepted, accepted + rejected)
    mean_k = _ratio(sum(c.k for c in cycles), len(cycles))
    c = cost_ratio(cycles)
    # The theory is evaluated at the draft lengths actually proposed: prompt lookup often finds
    # fewer than k tokens (or none), and a cycle that drafted n tokens can yield at most n + 1.
    lengths = [len(cy.drafted) for cy in cycles] or [0]
    tokens_per_pass = sum(expected_tokens_per_pass(alpha, n) for n in lengths) / len(lengths)
    mean_drafted = sum(lengths) / len(lengths)
    return SpecStats(
        cycles=len(cycles), tokens=tokens, drafted=drafted, accepted=accepted,
        draft_acceptance_rate=_ratio(accepted, drafted), alpha=alpha,
        mean_acceptance_length=_ratio(tokens, len(cycles)), acceptance_histogram=histogram,
        acceptance_by_position=by_position, mean_k=mean_k, draft_seconds=draft_seconds,
        verify_seconds=verify_seconds, seconds=seconds, tokens_per_second=_ratio(tokens, seconds),
        cost_ratio=c, expected_tokens_per_pass=tokens_per_pass,
        expected_speedup=tokens_per_pass / (mean_drafted * c + 1.0), best_k=best_k(alpha, c))


@dataclass(frozen=True)
class PlainStats:
    tokens: int
    seconds: float
    tokens_per_second: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize_plain(steps: Sequence[Step]) -> PlainStats:
    seconds = sum(s.seconds for s in steps)
    return PlainStats(tokens=len(steps), seconds=seconds, tokens_per_second=_ratio(len(steps), seconds))


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def rejections(cycles: Sequence[Cycle]) -> int:
    return sum(1 for c in cycles if c.num_accepted < len(c.drafted))


def pooled_alpha(runs: Sequence[Sequence[Cycle]]) -> float:
    """The theory's per-token acceptance over several runs' cycles: accepted / (accepted + rejections)."""
    accepted = sum(c.num_accepted for cycles in runs for c in cycles)
    return _ratio(accepted, accepted + sum(rejections(cycles) for cycles in runs))


# ----------------------------------------------------------------------------- speedup, measured

MIN_PASSES = 8              # fewer decode passes (or steps) than this: too short to measure reliably
BOOTSTRAP_SAMPLES = 400


@dataclass(frozen=True)
class Speed:
    """Speculative against plain decoding, compared like with like: decode-only time per token. The
    first event of each method carries the prompt's prefill, so it is reported apart and left out
    of the ratio; this also keeps the comparison fair when the two wrote different numbers of tokens
    (sampling, or an EOS). `low`..`high` is a 95% bootstrap interval over passes and steps."""
    speedup: float                  # plain seconds per token / speculative seconds per token (decode only)
    low: float
    high: float
    reliable: bool                  # enough passes and steps for the interval to mean something
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


def _per_token(samples: Sequence[tuple[float, int]]) -> float:
    return _ratio(sum(s for s, _ in samples), sum(n for _, n in samples))


def measure_speed(cycles: Sequence[Cycle], steps: Sequence[Step], *, seed: int = 0) -> Speed | None:
    """None until both methods have at least one decode event past their prefill."""
    if len(cycles) < 2 or len(steps) < 2:
        return None
    passes = [(c.seconds, len(c.emitted)) for c in cycles[1:]]
    plain = [(s.seconds, 1) for s in steps[1:]]
    ratio = _ratio(_per_token(plain), _per_token(passes))
    # Bootstrap: resample passes and steps (each with replacement), recompute the ratio.
    rng = random.Random(seed)
    ratios = sorted(_ratio(_per_token(rng.choices(plain, k=len(plain))), _per_token(rng.choices(passes, k=len(passes))))
                    for _ in range(BOOTSTRAP_SAMPLES))
    low, high = ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]
    pass_cost = _ratio(median([c.verify_seconds for c in cycles[1:]]), median([s.seconds for s in steps[1:]]))
    spec_tokens = sum(len(c.emitted) for c in cycles)
    return Speed(speedup=ratio, low=low, high=high,
                 reliable=len(passes) >= MIN_PASSES and len(plain) >= MIN_PASSES and high <= 1.5 * low,
                 spec_tokens=spec_tokens, plain_tokens=len(steps),
                 spec_prefill_seconds=cycles[0].seconds, plain_prefill_seconds=steps[0].seconds,
                 spec_decode_seconds=sum(s for s, _ in passes), plain_decode_seconds=sum(s for s, _ in plain),
                 spec_decode_tokens=sum(n for _, n in passes), plain_decode_tokens=len(plain),
                 pass_cost=pass_cost, same_length=spec_tokens == len(steps))


def running_speedup(cycles: Sequence[Cycle], steps: Sequence[Step]) -> tuple[list[float], list[float | None]]:
    """At the end of each cycle: speculative tokens/s over plain tokens/s, each over its own
    time so far (the baseline up to the same amount of its own time, at least one step)."""
    spec_time = list(accumulate(c.seconds for c in cycles))
    spec_tokens = list(accumulate(len(c.emitted) for c in cycles))
    plain_time = list(accumulate(s.seconds for s in steps))
    out, j = [], 0
    for t, n in zip(spec_time, spec_tokens):
        while j < len(plain_time) and plain_time[j] <= t:
            j += 1
        done = max(j, 1) if plain_time else 0
        if not done or not t or not plain_time[done - 1]:
            out.append(None)
            continue
        out.append((n / t) / (done / plain_time[done - 1]))
    return spec_time, out



def theory_at_pass_cost(spec: SpecStats, speed: Speed | None) -> float | None:
    """The theory priced at this machine's measured cost of a verification pass (in plain steps):
    the ideal assumes a pass over k + 1 tokens costs one step, which a GPU approaches and a CPU does not."""
    if speed is None or not speed.pass_cost:
        return None
    return spec.expected_speedup / speed.pass_cost


def speedup(spec: SpecStats, plain: PlainStats) -> float:
    """Whole-run throughput ratio: speculative tokens/s over plain tokens/s (prefill included)."""
    return _ratio(spec.tokens_per_second, plain.tokens_per_second)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (None if one is a prefix
    of the other and they have the same length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
