"""The load sweep's records, read without torch: a point (one batch size and k), the sweep's result and
what it concludes (the crossover batch, the best k per batch size), the JSON both are written as, and
which prompts a batch takes. specviz's own sweep (`runs.load`) and the engines' (`runs.engine_load`)
fill them; the views draw them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..catalog import BenchPrompt
from ..metrics import paired_ratio, ratio

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_KS = (0, 1, 2, 4, 8)


@dataclass(frozen=True)
class LoadPoint:
    """One (batch size, k) of the sweep. k = 0 is plain decoding itself: speedup 1 by definition."""

    batch: int
    k: int
    speedup: float                  # spec throughput / plain throughput, decode only
    speedup_low: float              # 95% range of the timing noise
    speedup_high: float
    tokens_per_pass: float | None   # the own loop's: tokens a row gains per pass, every pass (1 for k = 0;
                                    # None on an engine, which counts only the steps that had drafts)
    spec_tokens_per_s: float        # all rows' tokens per second of speculative decoding
    plain_tokens_per_s: float
    spec_latency: float             # seconds per token a request waits, mean over rows
    plain_latency: float
    theory: float                   # speedup the cost curve and the measured acceptance predict
    identical: bool | None          # greedy: every row's output equal in both methods (None: sampled)
    alpha: float | None             # the own loop's α, accepted / (accepted + rejections) (None on an engine:
                                    # no engine reports its rejections)
    passes: int                     # speculative passes timed (all repeats, decode only)
    steps: int                      # plain steps timed
    padding_share: float            # key slots of the speculative passes that were padding or holes
    regathers: int                  # cache re-gathers over the speculative runs
    rows: list[dict] = field(default_factory=list)   # per prompt: both methods' texts and token counts
    # One definition on every engine (docs/figures.md): the basis the engines are compared on is decode-only
    # time per output token (TPOT) per request, and vLLM's acceptance figures (metrics.acceptance_figures).
    tpot_ratio: float = 1.0         # plain mean TPOT / speculative mean TPOT (above 1: speculation is faster)
    tpot_low: float = 1.0           # its 95% range, requests (rows) resampled as pairs
    tpot_high: float = 1.0
    draft_acceptance_rate: float = 0.0
    mean_acceptance_length: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoadResult:
    """The sweep so far: its settings, the machine, the points finished and the cost curve."""

    settings: dict
    environment: dict
    points: list[LoadPoint] = field(default_factory=list)
    # Calibrated before the runs (cost 1 = one single-row one-token step, see `Calibration.unit`):
    cost_curve: list[dict] = field(default_factory=list)    # [{"batch", "tokens_per_row", "tokens", "cost"}]
    draft_costs: list[dict] = field(default_factory=list)   # [{"batch", "k", "cost"}]: drafting k for every row

    def best(self, batch: int) -> LoadPoint | None:
        """The fastest k > 0 at `batch` (None when none was measured)."""
        candidates = [p for p in self.points if p.batch == batch and p.k > 0]
        return max(candidates, key=lambda p: p.speedup, default=None)

    @property
    def batches(self) -> list[int]:
        return sorted({p.batch for p in self.points})

    @property
    def crossover_batch(self) -> int | None:
        """The smallest batch size at which speculation (its best k) is no faster; None when it wins at
        every size measured."""
        return self._first(lambda best: best.speedup <= 1.0)

    @property
    def crossover_range(self) -> tuple[int | None, int | None]:
        """Where the crossover may lie given the 95% ranges: (the smallest batch size whose best k's
        range reaches down to 1x, the smallest whose whole range is at or below 1x)."""
        return self._first(lambda best: best.speedup_low <= 1.0), self._first(lambda best: best.speedup_high <= 1.0)

    def _first(self, condition) -> int | None:
        for batch in self.batches:
            best = self.best(batch)
            if best is not None and condition(best):
                return batch
        return None

    @property
    def recommended_k(self) -> dict[int, int]:
        """Each batch size's fastest k; 0 (off) where no k beat plain decoding."""
        out = {}
        for batch in self.batches:
            best = self.best(batch)
            out[batch] = best.k if best is not None and best.speedup > 1.0 else 0
        return out

    def to_dict(self) -> dict:
        low, high = self.crossover_range
        return {"settings": self.settings, "environment": self.environment, "cost_curve": self.cost_curve,
                "draft_costs": self.draft_costs,
                "points": [p.to_dict() for p in self.points], "crossover_batch": self.crossover_batch,
                "crossover_range": [low, high],
                "recommended_k": {str(batch): k for batch, k in self.recommended_k.items()}}


def batch_prompts(prompts: Sequence[BenchPrompt], batch: int) -> list[BenchPrompt]:
    """The first `batch` prompts, the set cycled when it is smaller."""
    return [prompts[i % len(prompts)] for i in range(batch)]


def paired_range(estimate: float, spec_values: Sequence[float], plain_values: Sequence[float]) -> tuple[float, float]:
    """The 95% range of the median per-request (per-row) ratio spec / plain, resampled as pairs
    (`metrics.paired_ratio`), scaled to `estimate` (the point's own ratio); every engine's the same way."""
    if len(spec_values) < 2:
        return estimate, estimate
    middle, low, high = paired_ratio(spec_values, plain_values)
    return estimate * ratio(low, middle), estimate * ratio(high, middle)
