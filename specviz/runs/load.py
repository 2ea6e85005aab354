"""The load sweep: speculation under load. For each batch size B and draft length k (0 = off), the
first B prompts of a set (cycled when the set is smaller) are decoded by batched speculative
decoding and by batched plain decoding at the same B, interleaved event by event by `run.interleave`
(the single-request race's rule: whichever method has used less of its own time goes next) and timed
by the same clock (`core.timing.Clock`, per event). `sweep` is a generator of `LoadProgress` (one
per target forward, and one per finished point), each carrying the growing `LoadResult` (its records
are `runs.load_result`): a consumer
that stops iterating stops the work within one forward. `run_sweep` drains it.

What a point reports (decode only: the first forward of each method carries the prompts' prefill and
is left out, as in `metrics.measure_speed`):
- throughput of both methods (all rows' tokens / the method's time) and the speedup, with a 95% range
  from resampling the forwards' durations (each method's forwards as the cost a least-squares line
  predicts for the tokens in them, plus a resampled residual, as `metrics.measure_speed` does);
- per-token latency: for each row, the time of the forwards it was live in / its tokens (mean of rows);
- tokens per pass: tokens a row gains per speculative pass (accepted + the target's own);
- the theory: what the forward costs and the measured acceptance predict, with no time of the sweep's
  own in it. Before each batch size's runs, `calibrate` times the forwards they will run (each shape
  a few times, its median, by the same clock): the target over the batch with n new tokens per row
  (n = 1, a plain step; n = k + 1, a pass verifying k drafted tokens) at the context halfway through
  the decode, and drafting k tokens for every row. Each pass and step of the runs is priced at those
  costs for the rows live in it and its width (one token plus its widest row's drafts; between the
  shapes calibrated, linearly), and a row expects (1 - a^(n+1)) / (1 - a) tokens from a pass for its n
  drafted. Measured and predicted speedups are two independent figures: what the theory leaves out
  (verification's host work, the ragged cache's holes) is the gap between them;
- whether every row's greedy output is identical between the two methods.
Equal work: every request writes exactly `max_new_tokens` tokens in both methods (EOS ignored, as
`vllm bench serve --ignore-eos` does), so a point's two throughputs count the same tokens; with
`fixed_length=False` requests stop at EOS, and a greedy output that parts may then write a different
number of tokens (the point says so: `identical` false, per row both counts).
Across points: the crossover batch (the smallest B at which no k > 0 is faster than plain decoding;
with the range given by the best k's 95% range) and the best k per batch size (0 = off) as a
{batch size: draft length} map, the shape in which vLLM now takes a draft length per batch size.

Absolute times on a shared host are inflated (see `models.host`); the ratios stay fair because both
methods are interleaved and pay alike.
"""

from __future__ import annotations

import functools
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


from ..catalog import BenchPrompt
from ..core.plain import batched_autoregressive_decode
from ..core.decoding import batched_speculative_decode
from ..core.events import row_outputs
from ..core.events import BatchCycle, BatchStep, interleave
from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..core.drafters import DraftModelDrafter, PromptLookupDrafter
from ..core.head import HeadDrafter
from ..core.timing import Clock
from ..errors import SpecvizError
from ..clocks import DECODE_ONLY, timing
from ..metrics import BOOTSTRAP_SAMPLES, acceptance_figures, linear_fit, pooled_alpha, ratio
from ..models import ModelPair, default_threads
from ..models.host import HostLoad, environment, read_cpu_times
from ..settings import RunSettings
from .calibration import Calibration, calibrate, predicted_speedup
from .load_result import DEFAULT_BATCHES, DEFAULT_KS, LoadPoint, LoadResult, batch_prompts, paired_range
from .run import encode, last

WARM_UP_TOKENS = 4


@dataclass(frozen=True)
class LoadProgress:
    """What `sweep` yields: after each timed forward (`event` set), after each point (`point` set), and
    after each untimed warm-up forward and at the end (neither set)."""

    batch: int
    k: int
    repeat: int
    event: BatchCycle | BatchStep | None
    point: LoadPoint | None
    result: LoadResult


# ----------------------------------------------------------------------------- the sweep

BATCHED_DRAFTS = ("model", "self", "ngram", "head")     # the kinds of drafter batched decoding drafts with


def _refuse(name: str, why: str = "trees and suffix decoding run one request at a time") -> SpecvizError:
    return SpecvizError(f"The load sweep drafts with a draft model, self:L, ngram or a head, not {name}: "
                        f"{why} (use `run` or `bench`).")


def check_draft_spec(settings: RunSettings) -> None:
    """Refuse, before anything is loaded, a drafter batched decoding cannot draft with (`settings`
    validated: its draft is parsed)."""
    if settings.draft.kind not in BATCHED_DRAFTS or settings.branch > 1:
        raise _refuse(settings.draft if settings.branch <= 1 else "a tree")


def check_drafter(pair: ModelPair) -> None:
    if isinstance(pair.draft, CrossTokenizerDrafter):
        raise _refuse(f"{pair.draft_name} (its tokenizer differs from the target's)",
                      "drafting across tokenizers runs one request at a time")
    if not isinstance(pair.draft, (DraftModelDrafter, PromptLookupDrafter, HeadDrafter)):
        raise _refuse(pair.draft_name)


def sweep(settings: RunSettings, prompts: Sequence[BenchPrompt], pair: ModelPair, *,
          batches: Sequence[int] = DEFAULT_BATCHES, ks: Sequence[int] = DEFAULT_KS, repeats: int = 1,
          warm_up: bool = True, fixed_length: bool = True) -> Iterator[LoadProgress]:
    """The sweep (see the module docstring). `settings` must have passed `settings.validate`; its k
    is ignored (`ks` are swept); every prompt is encoded and checked before any work. `fixed_length`:
    every request writes `settings.max_new_tokens` tokens in both methods (EOS ignored: equal work)."""
    check_drafter(pair)
    default_threads(pair.device)
    if not prompts:
        raise SpecvizError("The load sweep needs at least one prompt.")
    encoded = {p.prompt: encode(settings, p.prompt, pair)[0].tolist() for p in prompts}
    eos = [] if fixed_length else list(pair.eos_token_ids or [])
    options = {"temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p,
               "seed": settings.seed, "eos_token_id": eos}
    result = LoadResult(
        settings={"target": pair.target_name, "draft": pair.draft_name, "batches": list(batches), "ks": list(ks),
                  "max_new_tokens": settings.max_new_tokens, "repeats": repeats, "prompts": len(prompts),
                  "output_length": (f"fixed: every request writes {settings.max_new_tokens} tokens (EOS ignored)"
                                    if fixed_length else "up to max_new_tokens, ending at EOS"),
                  "temperature": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p,
                  "seed": settings.seed, "dtype": str(pair.dtype).removeprefix("torch."),
                  "device": str(pair.device), "clock": Clock(pair.device).name,
                  "timing": timing(Clock(pair.device).name, speedup=DECODE_ONLY, tpot_ratio=DECODE_ONLY,
                                   spec_tokens_per_s=DECODE_ONLY, plain_tokens_per_s=DECODE_ONLY)},
        environment=environment(pair.device))
    decode = functools.partial(pair.tokenizer.decode, skip_special_tokens=True)
    calibration = Calibration()
    started = read_cpu_times()
    try:
        for batch in batches:
            chosen = batch_prompts(prompts, batch)
            ids = [encoded[p.prompt] for p in chosen]
            if warm_up:
                for _ in _warm_up(pair, ids, max(ks), options):
                    # Untimed, neither an event nor a point: a consumer's Stop lands between two forwards.
                    yield LoadProgress(batch=batch, k=max(ks), repeat=0, event=None, point=None, result=result)
            calibration.add(calibrate(pair, ids, ks, settings.max_new_tokens))
            result.cost_curve, result.draft_costs = calibration.curve(), calibration.draft_curve()
            plain_runs: list[list[BatchStep]] = []
            for k in [k for k in ks if k > 0] or [0]:
                spec_runs: list[list[BatchCycle]] = []
                for repeat in range(repeats):
                    spec = (batched_speculative_decode(pair.target, pair.draft, ids, settings.max_new_tokens, k=k,
                                                       sampling=settings.sampling, **options) if k else None)
                    plain = batched_autoregressive_decode(pair.target, ids, settings.max_new_tokens, **options)
                    cycles, steps = [], []
                    for event in interleave(spec or plain, plain if spec else None):
                        (cycles if isinstance(event, BatchCycle) else steps).append(event)
                        yield LoadProgress(batch=batch, k=k, repeat=repeat, event=event, point=None, result=result)
                    spec_runs.append(cycles)
                    plain_runs.append(steps)
                if k:
                    point = spec_point(batch, k, spec_runs, plain_runs[-repeats:], chosen, calibration,
                                       greedy=settings.same_output, decode=decode)
                    result.points.append(point)
                    yield LoadProgress(batch=batch, k=k, repeat=repeats - 1, event=None, point=point, result=result)
            if 0 in ks:
                point = plain_point(batch, plain_runs, chosen, decode)
                result.points.append(point)
                yield LoadProgress(batch=batch, k=0, repeat=repeats - 1, event=None, point=point, result=result)
    finally:
        result.environment["host_load"] = HostLoad.since(started).to_dict()
    result.points.sort(key=lambda p: (p.batch, p.k))
    yield LoadProgress(batch=batches[-1], k=ks[-1], repeat=repeats - 1, event=None, point=None, result=result)


def run_sweep(settings: RunSettings, prompts: Sequence[BenchPrompt], pair: ModelPair, **options) -> LoadResult:
    """`sweep` drained: the finished result."""
    return last(sweep(settings, prompts, pair, **options)).result


def _warm_up(pair: ModelPair, ids: list[list[int]], k: int, options: dict) -> Iterator[None]:
    """The shapes the timed runs use at this batch size, once (allocator growth, kernel selection).
    Yields after each forward: at batch 16 the warm-up is several seconds a Stop should not wait for."""
    warm = dict(options, temperature=0.0, top_k=0, top_p=1.0)
    if k:
        for _ in batched_speculative_decode(pair.target, pair.draft, ids, WARM_UP_TOKENS, k=k, **warm):
            yield
    for _ in batched_autoregressive_decode(pair.target, ids, WARM_UP_TOKENS, **warm):
        yield


# ----------------------------------------------------------------------------- statistics

def _bootstrap(spec: list[tuple[float, float, int]], plain: list[tuple[float, float, int]], *,
               seed: int = 0) -> tuple[float, float]:
    """95% range of (spec tokens / spec time) / (plain tokens / plain time). Each entry is (size,
    seconds, tokens emitted) of one forward; a forward's seconds are resampled as the cost a
    least-squares line on its size predicts plus a residual drawn with replacement."""
    rng = random.Random(seed)

    def parts(forwards):
        predicted = linear_fit([f[0] for f in forwards], [f[1] for f in forwards])
        return sum(predicted), [f[1] - p for f, p in zip(forwards, predicted)], sum(f[2] for f in forwards)

    spec_fit, spec_residuals, spec_tokens = parts(spec)
    plain_fit, plain_residuals, plain_tokens = parts(plain)
    samples = sorted(
        ratio(spec_tokens, spec_fit + sum(rng.choices(spec_residuals, k=len(spec_residuals))))
        / ratio(plain_tokens, plain_fit + sum(rng.choices(plain_residuals, k=len(plain_residuals))))
        for _ in range(BOOTSTRAP_SAMPLES))
    return samples[int(0.025 * BOOTSTRAP_SAMPLES)], samples[int(0.975 * BOOTSTRAP_SAMPLES) - 1]


def _row_tpots(runs: Sequence[Sequence[BatchCycle | BatchStep]]) -> list[float]:
    """Each row's time per output token, decode only (the engines' TPOT): the forwards it was live in
    after the first (the prefill) / the tokens it gained in them; in order of run, then row."""
    per_row = []
    for events in runs:
        seconds: dict[int, float] = {}
        tokens: dict[int, int] = {}
        for event in events[1:]:
            counts = ([len(c.emitted) for c in event.cycles] if isinstance(event, BatchCycle)
                      else [1] * len(event.requests))
            for row, count in zip(event.requests, counts):
                seconds[row] = seconds.get(row, 0.0) + event.seconds
                tokens[row] = tokens.get(row, 0) + count
        per_row += [ratio(seconds[row], tokens[row]) for row in sorted(seconds)]
    return per_row


def _latency(runs: Sequence[Sequence[BatchCycle | BatchStep]]) -> float:
    """Mean TPOT over rows and runs (seconds per token a request waits, decode only)."""
    per_row = _row_tpots(runs)
    return statistics.mean(per_row) if per_row else 0.0


def _rows(prompts: Sequence[BenchPrompt], spec: dict[int, list[int]], plain: dict[int, list[int]],
          decode: Callable[[list[int]], str]) -> list[dict]:
    """Per prompt, as the engines' rows: both methods' texts (as a reader checks them) and token counts."""
    return [{"prompt": p.prompt, "id": p.id, "text": decode(spec.get(i, [])), "plain_text": decode(plain.get(i, [])),
             "tokens": len(spec.get(i, [])), "plain_tokens": len(plain.get(i, []))}
            for i, p in enumerate(prompts)]


def _plain_forwards(runs: Sequence[Sequence[BatchStep]]) -> list[tuple[float, float, int]]:
    return [(len(e.requests), e.seconds, len(e.tokens)) for steps in runs for e in steps[1:]]


def spec_point(batch: int, k: int, spec_runs: Sequence[Sequence[BatchCycle]], plain_runs: Sequence[Sequence[BatchStep]],
               prompts: Sequence[BenchPrompt], calibration: Calibration, *, greedy: bool,
               decode: Callable[[list[int]], str]) -> LoadPoint:
    spec = [(e.tokens, e.seconds, e.emitted) for cycles in spec_runs for e in cycles[1:]]
    plain = _plain_forwards(plain_runs)
    spec_rate = ratio(sum(f[2] for f in spec), sum(f[1] for f in spec))
    plain_rate = ratio(sum(f[2] for f in plain), sum(f[1] for f in plain))
    low, high = _bootstrap(spec, plain) if spec and plain else (0.0, 0.0)
    row_cycles = [c for cycles in spec_runs for e in cycles for c in e.cycles]
    alpha = pooled_alpha([row_cycles])
    decoding = [e for cycles in spec_runs for e in cycles[1:]]
    plain_steps = [e for steps in plain_runs for e in steps[1:]]
    theory = predicted_speedup(k, decoding, plain_steps, alpha, calibration)
    spec_out, plain_out = row_outputs(spec_runs[-1]), row_outputs(plain_runs[-1])
    slots = sum(e.slots for cycles in spec_runs for e in cycles)
    drafting = [c for c in row_cycles if c.drafted]
    figures = acceptance_figures(len(drafting), sum(len(c.drafted) for c in drafting),
                                 sum(c.num_accepted for c in drafting))
    spec_tpots, plain_tpots = _row_tpots(spec_runs), _row_tpots(plain_runs)
    tpot_ratio = ratio(_latency(plain_runs), _latency(spec_runs))
    if len(spec_tpots) >= 2 and len(spec_tpots) == len(plain_tpots):     # requests (rows) resampled as pairs
        tpot_low, tpot_high = paired_range(tpot_ratio, [ratio(1.0, t) for t in spec_tpots],
                                           [ratio(1.0, t) for t in plain_tpots])
    else:           # one row: its TPOT ratio is the throughput ratio; its range, the forwards' timing noise
        throughput_ratio = ratio(spec_rate, plain_rate)
        tpot_low, tpot_high = tpot_ratio * ratio(low, throughput_ratio), tpot_ratio * ratio(high, throughput_ratio)
    return LoadPoint(
        batch=batch, k=k, speedup=ratio(spec_rate, plain_rate), speedup_low=low, speedup_high=high,
        tokens_per_pass=ratio(sum(len(c.emitted) for e in decoding for c in e.cycles),
                              sum(len(e.cycles) for e in decoding)),
        spec_tokens_per_s=spec_rate, plain_tokens_per_s=plain_rate, spec_latency=_latency(spec_runs),
        plain_latency=_latency(plain_runs), theory=theory,
        identical=all(row_outputs(s) == row_outputs(p) for s, p in zip(spec_runs, plain_runs)) if greedy else None,
        alpha=alpha, passes=len(spec), steps=len(plain),
        padding_share=ratio(sum(e.padded_slots for cycles in spec_runs for e in cycles), slots),
        regathers=sum(e.regathered for cycles in spec_runs for e in cycles),
        rows=_rows(prompts, spec_out, plain_out, decode), tpot_ratio=tpot_ratio, tpot_low=tpot_low,
        tpot_high=tpot_high,
        draft_acceptance_rate=figures["draft_acceptance_rate"],
        mean_acceptance_length=figures["mean_acceptance_length"])


def plain_point(batch: int, plain_runs: Sequence[Sequence[BatchStep]], prompts: Sequence[BenchPrompt],
                decode: Callable[[list[int]], str]) -> LoadPoint:
    """k = 0: plain decoding at this batch size (speedup 1 by definition), over every plain run of it."""
    plain = _plain_forwards(plain_runs)
    rate = ratio(sum(f[2] for f in plain), sum(f[1] for f in plain))
    out = row_outputs(plain_runs[-1])
    latency = _latency(plain_runs)
    return LoadPoint(batch=batch, k=0, speedup=1.0, speedup_low=1.0, speedup_high=1.0, tokens_per_pass=1.0,
                     spec_tokens_per_s=rate, plain_tokens_per_s=rate, spec_latency=latency, plain_latency=latency,
                     theory=1.0, identical=True, alpha=0.0, passes=0, steps=len(plain), padding_share=0.0,
                     regathers=0, rows=_rows(prompts, out, out, decode))
