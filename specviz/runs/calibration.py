"""The load sweep's cost curve, measured on its own: before a batch size's runs, the forwards they
will make are timed apart from them (`calibrate`), and the theory prices the runs' passes at those
costs (`predicted_speedup`), so that the measured and the predicted speedup are two independent
figures (runs.load)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..core.drafters import DraftModelDrafter, PromptLookupDrafter
from ..core.events import BatchCycle, BatchStep
from ..core.pass_costs import context_tokens
from ..core.ragged_cache import RaggedCache
from ..core.sampling import Sampler
from ..core.timing import Clock, median_seconds
from ..metrics import expected_tokens_per_pass, ratio
from ..models import ModelPair

CALIBRATION_SAMPLES = 3     # timed forwards of each shape (their median), after one untimed


@dataclass
class Calibration:
    """Median seconds of the forwards a sweep runs, timed apart from it (`calibrate`): the target's
    forward over B rows with n new tokens per row, and drafting k tokens for each of B rows."""

    target: dict[tuple[int, int], float] = field(default_factory=dict)    # (B, n) -> seconds
    draft: dict[tuple[int, int], float] = field(default_factory=dict)     # (B, k) -> seconds

    def add(self, other: Calibration) -> None:
        self.target.update(other.target)
        self.draft.update(other.draft)

    def target_seconds(self, rows: int, tokens_per_row: float) -> float:
        """A target forward over `rows` rows (live rows: fewer than a batch size once some finished),
        linear between the widths and then the batch sizes calibrated."""
        return _between(self.target, rows, tokens_per_row)

    def draft_seconds(self, rows: int, k: int) -> float:
        return _between(self.draft, rows, k)

    @property
    def unit(self) -> float:
        """Seconds of cost 1: a single-row one-token step, or (batch 1 not swept) the smallest batch's
        step per row."""
        batch = min(b for b, _ in self.target)
        return self.target[batch, 1] / batch

    def curve(self) -> list[dict]:
        return [{"batch": b, "tokens_per_row": n, "tokens": b * n, "cost": ratio(seconds, self.unit)}
                for (b, n), seconds in sorted(self.target.items())]

    def draft_curve(self) -> list[dict]:
        return [{"batch": b, "k": k, "cost": ratio(seconds, self.unit)}
                for (b, k), seconds in sorted(self.draft.items())]


def _between(seconds: dict[tuple[int, int], float], rows: int, x: float) -> float:
    """`seconds` ((batch, x) -> seconds) at (rows, x): linear in x at each batch size, then in rows."""
    batches = sorted({b for b, _ in seconds})
    at_rows = [{"tokens": b, "cost": cost_at([{"tokens": n, "cost": t} for (c, n), t in sorted(seconds.items())
                                               if c == b], x)} for b in batches]
    return cost_at(at_rows, rows)


def calibrate(pair: ModelPair, ids: Sequence[Sequence[int]], ks: Sequence[int], max_new_tokens: int, *,
              samples: int = CALIBRATION_SAMPLES) -> Calibration:
    """Time, for the batch `ids`, the forwards its runs will make: the target over every row with n
    new tokens (n = 1 and k + 1 for each k > 0 in `ks`), and drafting k tokens for every row, each at
    the context halfway through a decode of `max_new_tokens` (the prompts, left-padded as the ragged
    cache pads them, then max_new_tokens / 2 more tokens per row). Each shape runs once untimed, then
    `samples` times; the median of those, read by the clock the sweep's events are read by."""
    clock = Clock(pair.device)
    # Each row's context continues its own prompt, cycled: the tokens do not change a forward's cost.
    context = [context_tokens(row, len(row) + max_new_tokens // 2) for row in ids]
    drafted = [k for k in ks if k > 0]
    calibration = Calibration()
    with torch.inference_mode():
        cache = RaggedCache(pair.target, len(ids))
        cache.forward(context, keep=1)
        for n in sorted({1} | {k + 1 for k in drafted}):
            calibration.target[len(ids), n] = _forward_seconds(cache, n, context, clock, samples)
        if isinstance(pair.draft, DraftModelDrafter):
            # The batched draft model drafts k tokens as k one-token forwards over every row.
            draft_cache = RaggedCache(pair.draft.model, len(ids))
            draft_cache.forward(context, keep=1)
            step = _forward_seconds(draft_cache, 1, context, clock, samples)
            calibration.draft.update({(len(ids), k): k * step for k in drafted})
        else:   # prompt lookup, on the host
            for k in drafted:
                calibration.draft[len(ids), k] = _lookup_seconds(pair.draft, context, k, clock, samples)
    return calibration


def _forward_seconds(cache: RaggedCache, tokens_per_row: int, context: list[list[int]], clock: Clock,
                     samples: int) -> float:
    """A forward of `tokens_per_row` new tokens for every row over `cache`, each sample cropped off
    again (untimed) so that every one runs at the same context."""
    held = cache.lengths()
    blocks = [row[-tokens_per_row:] for row in context]
    return median_seconds(lambda: cache.forward(blocks, keep=tokens_per_row), clock, samples,
                           undo=lambda: cache.keep(held))


def _lookup_seconds(drafter: PromptLookupDrafter, context: list[list[int]], k: int, clock: Clock,
                    samples: int) -> float:
    """Prompt lookup drafting k tokens for every row, row by row as the batched loop drafts."""
    sampler, rows = Sampler(device=torch.device("cpu")), [torch.tensor([row]) for row in context]
    return median_seconds(lambda: [drafter.propose(row, k, sampler) for row in rows], clock, samples)


def predicted_speedup(k: int, passes: Sequence[BatchCycle], steps: Sequence[BatchStep], alpha: float,
                      calibration: Calibration) -> float:
    """The theory at one point: the calibrated costs priced at what the runs computed (rows live in
    each pass and step, tokens drafted), with the measured acceptance `alpha`; never a time of the
    sweep's own. A row expects (1 - a^(n+1)) / (1 - a) tokens from a pass for its n drafted; a pass
    computes one token plus its widest row's drafts for every live row, after drafting k for each."""
    expected = sum(expected_tokens_per_pass(alpha, len(c.drafted)) for e in passes for c in e.cycles)
    spec_seconds = sum(calibration.target_seconds(len(e.requests), 1 + max(len(c.drafted) for c in e.cycles))
                       + calibration.draft_seconds(len(e.requests), k) for e in passes)
    plain_seconds = sum(calibration.target_seconds(len(e.requests), 1) for e in steps)
    return ratio(ratio(expected, spec_seconds), ratio(sum(len(e.tokens) for e in steps), plain_seconds))


def cost_at(curve: Sequence[dict], tokens: float) -> float:
    """The cost curve at `tokens`, linear between measured points and beyond the ends."""
    xs, ys = [p["tokens"] for p in curve], [p["cost"] for p in curve]
    if len(xs) == 1:
        return ys[0] * tokens / xs[0]
    i = min(max(bisect_left(xs, tokens), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)
