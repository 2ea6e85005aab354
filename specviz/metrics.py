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

from .events import Cycle, Step


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
    rejections = sum(1 for c in cycles if c.num_accepted < len(c.drafted))
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
    alpha = _ratio(accepted, accepted + rejections)
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


def speedup(spec: SpecStats, plain: PlainStats) -> float:
    """Measured wall-clock speedup: speculative tokens/s over plain tokens/s."""
    return _ratio(spec.tokens_per_second, plain.tokens_per_second)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (None if one is a prefix
    of the other and they have the same length)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
