"""What a target pass and drafting cost on this device, for the cost-aware policy (core.draft_policy): a
target pass's seconds by width (`PassCosts`, one table per target, device, dtype and thread count) and a
drafter's seconds per drafted token (`DraftCosts`, one per drafter), calibrated once (`calibrate`:
medians, the collector paused); `learn=False` keeps a table as calibrated (the runs' tables: `runs.run`).
A pass's cost over a plain step depends on the context it follows, so a table is timed after each of
a few fixed context lengths (`CONTEXTS`) and prices a pass between the two nearest its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .ragged_cache import RaggedCache
from .timing import interleaved_seconds

COST_SMOOTHING = 0.25       # each new pass's weight in its width's running cost
CALIBRATION_SAMPLES = 5     # timed rounds over the widths (medians), after one untimed
# The context lengths (tokens before a pass) a target's passes are timed after. Drafted tokens attend to
# every earlier one, so a pass's cost over a plain step moves with the context: in float32 on a CPU a
# pass over 1-3 drafted tokens costs 1.19 plain steps after 64 tokens, 1.45 after 800 and 1.8 after
# 1600 (SmolLM2-135M, AMD EPYC, `scripts/context_costs.py`), and in bfloat16 it falls below one step.
# A table timed after a short prompt alone misprices every pass after a long one. Fixed lengths, not a
# request's own: what a table holds never depends on which request came first.
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)


# ----------------------------------------------------------------------------- what a pass costs

class PassCosts:
    """Seconds of a target pass by how many drafted tokens it verifies (0: a plain one-token step), for
    one model on one device, dtype and thread count. Seeded by `calibrate` (or the constructor),
    refreshed by `observe`. Widths never timed are interpolated between timed ones; timed widths keep
    what they measured, even where a wider pass costs less than a narrower one: in float32 on a CPU a
    pass over 3 drafted tokens (4 rows) costs 1.04-1.08 plain steps where one over 1 or 2 costs
    1.23-1.38 (SmolLM2-135M, AMD EPYC: the math library's kernels by row count, under
    `models.cpu_linear`), and the policy drafts 3 there rather than 1. Drafting is priced apart, per
    drafter (`DraftCosts`). A table timed after several contexts (`at`) prices a pass after `context`
    tokens linearly between the two timed contexts nearest it (`relative(max_width, context)`), as the
    nearest beyond them; its own widths are those timed after `context` (None: a given table, any
    context)."""

    def __init__(self, seconds: dict[int, float] | None = None, *, learn: bool = True, context: int | None = None):
        self.context = context                  # tokens before the passes its own widths timed
        self.longer: dict[int, PassCosts] = {}  # context -> the table timed after it (other contexts than own)
        self.seconds: dict[int, float] = {}     # width -> running mean seconds
        self._relative: dict[int, list[float]] = {}     # `relative` by max width, until the next observation
        self.learn = learn                      # False: a fixed table (tests, replays of a decision)
        for width, value in (seconds or {}).items():
            self.seed(width, value)

    @property
    def known(self) -> bool:
        return 0 in self.seconds

    @property
    def step(self) -> float:
        """Seconds of a plain one-token step: the unit every cost is relative to."""
        return self.seconds[0]

    def seed(self, width: int, seconds: float) -> None:
        """Set width's cost outright (a calibration's median, or a given table)."""
        self._relative.clear()
        self.seconds[width] = seconds

    def at(self, context: int) -> PassCosts:
        """The table timed after `context` tokens (this one, if it has none timed yet or was timed there)."""
        if self.context is None and not self.seconds:
            self.context = context
        if context == self.context:
            return self
        if context not in self.longer:
            self.longer[context] = PassCosts(learn=self.learn, context=context)
        return self.longer[context]

    def timed_after(self, context: int) -> PassCosts | None:
        """The table timed after `context` tokens, if one was made (this one or a longer context's)."""
        return self if context == self.context else self.longer.get(context)

    @property
    def contexts(self) -> list[int]:
        """The contexts timed, shortest first (none for a given table)."""
        own = [self.context] if self.context is not None and self.known else []
        return sorted(own + [c for c, table in self.longer.items() if table.known])

    def observe(self, width: int, seconds: float, context: int | None = None) -> None:
        """A pass of `width` took `seconds` (after `context` tokens: it refreshes the nearest context's table)."""
        if seconds <= 0 or not self.learn:
            return
        if context is not None and self.longer:
            nearest = min(self.contexts, key=lambda c: abs(c - context))
            if nearest != self.context:
                self.longer[nearest].observe(width, seconds)
                return
        old = self.seconds.get(width)
        self._relative.clear()
        self.seconds[width] = seconds if old is None else old + COST_SMOOTHING * (seconds - old)

    def step_after(self, context: int | None = None) -> float:
        """Seconds of a plain step after `context` tokens (between the two timed contexts nearest it; None:
        this table's own): the unit `relative` prices a pass after `context` in."""
        if context is None or not self.longer:
            return self.step
        return between([(c, [self.timed_after(c).step]) for c in self.contexts], context)[0]

    def relative(self, max_width: int, context: int | None = None) -> list[float]:
        """cost[n] for n = 0..max_width: a pass over n drafted tokens / a plain step, both after `context`
        tokens (linear between the two timed contexts nearest it; None: this table's own context)."""
        own = self._own_relative(max_width)
        if context is None or not self.longer:
            return own
        return between([(c, self.timed_after(c)._own_relative(max_width)) for c in self.contexts], context) or own

    def _own_relative(self, max_width: int) -> list[float]:
        """This table's own cost[n] (computed once per table: every cycle plans with it, and a table
        changes only when observed)."""
        cached = self._relative.get(max_width)        # one lookup: another run's observe may clear it
        if cached is not None:
            return cached
        widths = sorted(self.seconds)
        raw = []
        for n in range(max_width + 1):
            below = max((w for w in widths if w <= n), default=0)
            above = min((w for w in widths if w >= n), default=below)
            if above == below:
                value = self.seconds[below]
            else:   # linear between the nearest timed widths
                t = (n - below) / (above - below)
                value = self.seconds[below] + t * (self.seconds[above] - self.seconds[below])
            raw.append(value)
        costs = [value / self.step for value in raw]
        self._relative[max_width] = costs
        return costs


class DraftCosts:
    """Seconds one drafter spends per drafted token on one target and device (a draft model, early
    exit, a head; a drafter that proposes for free, prompt lookup or suffix, has none: it proposes
    whether or not the policy drafts), after each context timed (`set`): a model's drafting reads every
    earlier position too (a head's attention over its cache, its catch-up on the target's features), so
    it costs more after a long context, and is priced after `c` tokens between the two timed contexts
    nearest `c` (`at`), as passes are. Unknown until first measured; the first observation is taken as
    it is, later ones refresh a running mean."""

    def __init__(self, per_token: float | None = None, *, learn: bool = True, context: int | None = None):
        self.per_token = per_token          # after its own context (the first timed: the shortest)
        self.context = context
        self.longer: dict[int, float] = {}  # context -> seconds per drafted token after it
        self.learn = learn

    @property
    def known(self) -> bool:
        return self.per_token is not None

    @property
    def contexts(self) -> list[int]:
        """The contexts timed, shortest first (none for a given cost)."""
        own = [self.context] if self.context is not None and self.known else []
        return sorted(own + list(self.longer))

    def set(self, context: int, per_token: float) -> None:
        """The seconds per drafted token timed after `context` tokens (the first timed is its own)."""
        if self.per_token is None or context == self.context:
            self.per_token, self.context = per_token, context
        else:
            self.longer[context] = per_token

    def at(self, context: int | None = None) -> float | None:
        """Seconds per drafted token after `context` tokens (linear between the two timed contexts nearest
        it; None: its own context's)."""
        if context is None or not self.longer:
            return self.per_token
        points = [(c, [self.per_token if c == self.context else self.longer[c]]) for c in self.contexts]
        return between(points, context)[0]

    def observe(self, drafted: int, seconds: float) -> None:
        if drafted <= 0 or seconds < 0 or not self.learn:
            return
        per_token = seconds / drafted
        self.per_token = per_token if self.per_token is None else \
            self.per_token + COST_SMOOTHING * (per_token - self.per_token)


def between(points: Sequence[tuple[int, list[float]]], context: int) -> list[float] | None:
    """Values timed after several contexts (`points`: (context, values), shortest first), after
    `context`: linear between the two nearest, as the nearest beyond them (None: nothing timed)."""
    if not points:
        return None
    if len(points) < 2 or context <= points[0][0]:
        return points[0][1]
    for (c0, low), (c1, high) in zip(points, points[1:]):
        if context <= c1:
            t = (context - c0) / (c1 - c0)
            return [a + t * (b - a) for a, b in zip(low, high)]
    return points[-1][1]


# ----------------------------------------------------------------------------- calibration

def contexts_for(prompt_length: int, max_positions: int, widest: int) -> list[int]:
    """The `CONTEXTS` a request's passes are priced between: the shortest (every table's own) and the two
    around its prompt, of those the model's positions hold. Its output's later passes are priced as the
    nearest of them (a context of its own would cost a user another calibration's seconds before the
    first token, for a difference of a few hundredths of a step over one doubling of the context)."""
    fits = [c for c in CONTEXTS if c + widest + 1 <= max_positions] or [max(1, max_positions - widest - 1)]
    below = max((c for c in fits if c <= prompt_length), default=fits[0])
    above = min((c for c in fits if c >= prompt_length), default=fits[-1])
    return sorted({fits[0], below, above})


def context_tokens(prompt: Sequence[int], context: int) -> list[int]:
    """`context` tokens to time passes after: the prompt, cycled or cut (a pass's cost does not read them)."""
    return [prompt[i % len(prompt)] for i in range(context)]


def calibration_widths(max_length: int) -> list[int]:
    """The widths `calibrate` times: 0 to 4, then doubling, and max_length itself."""
    widths = {w for w in (0, 1, 2, 3, 4) if w <= max_length} | {max_length}
    w = 8
    while w < max_length:
        widths.add(w)
        w *= 2
    return sorted(widths)


@torch.inference_mode()
def calibrate(target, prompt: Sequence[int], widths: Sequence[int], costs: PassCosts,
              clock: Callable[[], float], *, samples: int = CALIBRATION_SAMPLES) -> None:
    """Time a target pass verifying n drafted tokens (n + 1 new positions; n = 0: a plain step) at
    each width, after the prompt, in `samples` interleaved rounds after an untimed one, with the
    collector paused (`timing.interleaved_seconds`: each width's median ratio to a plain step in the
    same round, times the plain step's median), and seed `costs`. A plain step is timed too when
    `widths` lacks it, as the reference."""
    cache = RaggedCache(target, 1)
    cache.forward([list(prompt)], keep=1)
    held = len(prompt)
    last = torch.tensor([[prompt[-1]]], device=target.device)
    timed = [0] + [w for w in widths if w != 0]

    def work(width: int) -> Callable[[], object]:
        fed = last.expand(1, width + 1).contiguous()
        return lambda: cache.forward([[]], keep=width + 1, tail=fed, tail_lengths=[width + 1])

    seconds = interleaved_seconds([work(w) for w in timed], clock, samples, undo=lambda: cache.keep([held]))
    for width, value in zip(timed, seconds):
        if width in widths:
            costs.seed(width, value)
