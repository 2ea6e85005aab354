"""What a speedup may compare: equal work. A speedup is a ratio of two methods' rates, and it means
something only where both wrote the same tokens: identical greedy outputs all of theirs, outputs that
parted at a near-tie the same text once plain decoding has followed the speculative one
(`core.plain.follow`), else the shared prefix; sampled outputs (different by design) equal lengths.
`equal_work` chooses the events, `work_rates` rates them; `metrics` computes every figure from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .core.events import Cycle, Followed, Step
from .metrics import ratio


@dataclass(frozen=True)
class EqualWork:
    """The events of each method that wrote the same tokens, so that a speedup compares equal work.
    Whole cycles only: `cycles` wrote `tokens` tokens, and `steps` are the plain steps that wrote those
    positions (past a near-tie parting, plain decoding's steps along the speculative text). `basis` says
    which rule chose them (`SAME_OUTPUT`, `SHARED_PREFIX`, `ALONG_NEAR_TIES` or `EQUAL_LENGTH`)."""
    cycles: Sequence[Cycle]
    steps: Sequence[Step]
    tokens: int
    basis: str
    parted_at: int | None           # greedy: the first position where the outputs differ (None: they agree)
    near_ties: tuple[tuple[int, float], ...] = ()   # ALONG_NEAR_TIES: (position, logit margin) of each


SAME_OUTPUT, SHARED_PREFIX, EQUAL_LENGTH = "same output", "shared prefix", "equal length"
ALONG_NEAR_TIES = "same text, near-ties apart"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position both sequences have where they differ (None: one is a prefix of the other).
    Unlike `first_divergence`, a sequence still being written does not differ where it stops."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def equal_work(cycles: Sequence[Cycle], steps: Sequence[Step], *, greedy: bool,
               followed: Followed | None = None) -> EqualWork:
    """What a speedup may compare: the tokens both methods wrote. Greedy outputs should be identical;
    where they part (reduced precision flips a near-tie), only the shared prefix counts, since after
    it the speculative side may write text that plain decoding never wrote (a repetition that prompt
    lookup drafts easily), unless plain decoding was `followed` along the speculative text from the
    parting (`core.plain.follow`): then the tokens up to where that found more than a near-tie count,
    plain decoding's own steps before the parting and its steps along the text after it, so that both
    sides wrote the same text, which plain decoding writes too but for near-ties (`ALONG_NEAR_TIES`).
    Sampled outputs differ by design: equal lengths count. Runs still going compare what both have
    written so far."""
    spec_tokens = [t for c in cycles for t in c.emitted]
    parted_at = first_difference(spec_tokens, [s.token for s in steps]) if greedy else None
    along = followed is not None and parted_at is not None and followed.start == parted_at
    if along:
        steps = list(steps[:parted_at]) + list(followed.steps)
    limit = min(len(spec_tokens), len(steps), len(spec_tokens) if parted_at is None or along else parted_at)
    kept, tokens = [], 0
    for cycle in cycles:        # whole cycles: a pass's time cannot be split between its tokens
        if tokens + len(cycle.emitted) > limit:
            break
        kept.append(cycle)
        tokens += len(cycle.emitted)
    along = along and tokens > parted_at        # else nothing past the parting is compared: the shared prefix
    basis = (ALONG_NEAR_TIES if along else SHARED_PREFIX) if parted_at is not None else \
        SAME_OUTPUT if greedy else EQUAL_LENGTH
    ties = tuple((at, margin) for at, margin in followed.near_ties if at < tokens) if along else ()
    return EqualWork(kept, steps[:tokens], tokens, basis, parted_at, ties)


def work_rates(work: EqualWork) -> tuple[float, float]:
    """Tokens per second of the speculative and the plain side over equal work (whole events, the
    prefill included, as a whole-generation benchmark times them)."""
    return (ratio(work.tokens, sum(c.seconds for c in work.cycles)),
            ratio(len(work.steps), sum(s.seconds for s in work.steps)))


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (None if one is a prefix
    of the other and they have the same length)."""
    at = first_difference(a, b)
    if at is not None or len(a) == len(b):
        return at
    return min(len(a), len(b))
