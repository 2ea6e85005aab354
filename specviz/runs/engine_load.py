"""The load sweep on vLLM: the same question as `runs.load` (up to which batch size does speculation
pay, and with which k), measured on the engine people serve with, the way its users measure it
(`vllm bench serve`: scripts/vllm_side_by_side.py runs both on the same servers and prints both).

Batch size B is B concurrent streams in a closed loop (each sends its next prompt when its last one
ends, as `vllm bench serve --max-concurrency B` does) over `requests_per_point` requests: the prompt
set cycled, at least WAVES x B requests, so that a point is several waves of requests and not one.
Every request writes exactly `max_new_tokens` tokens (`ignore_eos`): both servers do equal work.
Servers run one at a time (`engines.SERVERS`): the plain server measures every batch size after a
warm-up at the largest batch, is stopped, and then each speculative server (one per k > 0) does the
same. Co-resident servers each claim most of a GPU's memory; on the project's shared CPU the effect
of an idle neighbour could not be told from the host's drift (scripts/vllm_side_by_side.py
--co-resident), and one at a time costs the sweep nothing it needs. The points reuse
`runs.load_result.LoadPoint` and `LoadResult` (so the crossover, the best k per batch size, the JSON and the
Load tab's charts are the own sweep's), with vLLM's figures added:

- output throughput: all requests' completion tokens / the wall time from the first request sent to
  the last one finished (prefill included: what a deployment pays for; `vllm bench serve`'s
  `output_throughput`);
- TPOT: (last token - first token) / (tokens - 1), mean over requests; ITL: the gaps between
  streamed chunks, mean; TTFT: sending to the first token, mean (what speculation may cost up front);
- the decision metric (`DECISION_METRICS`, named in the settings): a point's `speedup` is the
  speculative server's figure against the plain server's in that metric, and the best k per batch
  size, the crossover and the recommended config follow it. Its 95% range comes from the requests:
  per request, the same ratio against the same request on the plain server; the range of their
  median (`metrics.paired_ratio`, requests resampled as pairs), scaled to the point's ratio;
- acceptance as vLLM reported it per request (summed): mean acceptance length (tokens per
  speculative step, the bonus included), draft acceptance rate and the histogram of steps by
  number of drafts accepted. There are no per-token verdicts: vLLM returns no rejected drafts;
- per request its text and token count on both servers, and whether the texts are identical (over
  the fixed length: `compare --engine vllm` compares answers that end at EOS).

There is no theory line: vLLM's forward cost is not measured here. Points finish k by k; a server
that dies mid-sweep raises after the points that finished, which the consumer keeps
(`EngineProgress.result`).
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..catalog import BenchPrompt
from ..engines import SERVERS, Engine, EngineConfig, Request, Response, closed_loop, recommended_config
from ..clocks import DECODE_ONLY, WITH_PREFILL, timing
from ..errors import SpecvizError
from ..equal_work import first_divergence
from ..metrics import acceptance_figures, accepted_per_position, ratio
from ..models.host import HostLoad, client_environment, read_cpu_times
from ..settings import RunSettings
from .load_result import LoadPoint, LoadResult, batch_prompts, paired_range

WARM_UP_TOKENS = 8
WAVES = 4           # a point sends at least this many requests per stream: a steady state, not one wave
ENGINE_CLOCK = "wall time at the client"
DECISION_METRICS = {"throughput": "output throughput (tokens/s over all requests) at each concurrency",
                    "tpot": "time per output token (TPOT) at each concurrency"}


@dataclass(frozen=True)
class EnginePoint(LoadPoint):
    """A LoadPoint measured on an engine: `theory` is None, `speedup` is the decision metric's ratio
    (`throughput_ratio` or `tpot_ratio`), `spec_latency`/`plain_latency` are mean TPOTs, and vLLM's
    own acceptance figures and its other latencies come with it."""

    acceptance: dict | None = None      # mean_acceptance_length, draft_acceptance_rate, acceptance_histogram, ...
    requests: int = 0
    throughput_ratio: float = 1.0       # speculative output tokens/s over plain (with prefill)
    spec_ttft: float = 0.0              # mean seconds to the first token
    plain_ttft: float = 0.0
    spec_itl: float = 0.0               # mean seconds between streamed chunks
    plain_itl: float = 0.0


@dataclass
class EngineLoadResult(LoadResult):
    engine: dict = field(default_factory=dict)
    configs: list[EngineConfig] = field(default_factory=list)
    error: str | None = None            # why the sweep ended early (the finished points are kept)
    recommend: Callable | None = field(default=None, repr=False)    # the engine's `recommended_config`

    @property
    def metric(self) -> str:
        return self.settings.get("decision_metric", "throughput")

    @property
    def recommended_speculative_config(self) -> dict | None:
        """The config to copy, chosen by the decision metric (each point's `speedup`)."""
        if not any(p.k for p in self.points):
            return None
        return (self.recommend or recommended_config)(self.configs, self.recommended_k)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["engine"] = self.engine
        out["recommended_speculative_config"] = self.recommended_speculative_config
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class EngineProgress:
    """What `engine_sweep` yields: a line to show (`message`), a finished request or a finished point."""

    config: EngineConfig | None
    batch: int
    response: Response | None
    point: EnginePoint | None
    result: EngineLoadResult
    message: str = ""


def requests_per_point(batch: int, prompts: int, repeats: int = 1) -> int:
    """Requests a point at concurrency `batch` sends: every prompt, and at least WAVES per stream."""
    return max(prompts, WAVES * batch) * repeats


def make_requests(settings: RunSettings, prompts: Sequence[BenchPrompt], count: int,
                  max_tokens: int | None = None, *, ignore_eos: bool = False,
                  cache_salt: str | None = None) -> list[Request]:
    chosen = batch_prompts(prompts, count)
    return [Request(i, p.prompt, settings.chat, max_tokens or settings.max_new_tokens, settings.temperature,
                    settings.top_p, settings.top_k, None if settings.seed is None else settings.seed + i,
                    ignore_eos=ignore_eos, cache_salt=cache_salt)
            for i, p in enumerate(chosen)]


def point_salt(engine: Engine, config: EngineConfig, batch: int) -> str | None:
    """The prefix-cache namespace of one point on vLLM (None elsewhere). vLLM caches prompt blocks
    by default: without its own namespace a point's requests would reuse the blocks of the warm-up's
    and the earlier points' identical prompts and skip their prefill, which a server just started (as
    `vllm bench serve` is usually run on) pays (docs/vllm.md, short edit prompts)."""
    if engine.name != "vllm":
        return None
    return f"specviz-{uuid.uuid4().hex[:12]}-k{config.k}-b{batch}"



def acceptance(responses: Sequence[Response], counted: dict | None = None) -> dict | None:
    """The engine's per-request figures, summed over the requests (None when it reported none);
    `counted` (`Engine.point_acceptance`: llama.cpp's server counters over the point) gives the steps
    and the histogram where the responses do not."""
    reported = [r.spec for r in responses if r.spec]
    if not reported:
        return None
    steps = sum(s.get("num_spec_steps", 0) for s in reported)
    drafted = sum(s.get("num_draft_tokens", 0) for s in reported)
    accepted = sum(s.get("num_accepted_draft_tokens", 0) for s in reported)
    width = max(len(s.get("acceptance_histogram") or []) for s in reported)
    histogram = [0] * width
    for figures in reported:
        for i, count in enumerate(figures.get("acceptance_histogram") or []):
            histogram[i] += count
    extra = {}
    if counted:
        steps, histogram = counted["num_spec_steps"], counted["acceptance_histogram"]
        extra = {"accepted_per_position": counted["accepted_per_position"], "steps_from": "server counters"}
    # The same formulas as the own loop's (metrics.acceptance_figures), on the engine's counts.
    return {**extra, **acceptance_figures(steps, drafted, accepted, accepted_per_position(histogram)),
            "acceptance_histogram": histogram, "num_spec_steps": steps, "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted, "requests_reported": len(reported)}


def throughput(responses: Sequence[Response]) -> float:
    """Completion tokens / the wall time from the first request sent to the last one finished."""
    if not responses:
        return 0.0
    return ratio(sum(r.tokens for r in responses),
                 max(r.finished for r in responses) - min(r.sent for r in responses))


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else 0.0


def latency(responses: Sequence[Response]) -> float:
    """Mean TPOT over the requests (seconds)."""
    return _mean(r.decode_seconds_per_token for r in responses)


def time_to_first_token(responses: Sequence[Response]) -> float:
    return _mean(r.time_to_first_token for r in responses)


def inter_token_latency(responses: Sequence[Response]) -> float:
    """Mean gap between streamed chunks over all requests' chunks (as `vllm bench serve` averages)."""
    return _mean([gap for r in responses for gap in r.inter_token_latencies])


def first_differing_word(a: str, b: str) -> dict | None:
    """Where two texts part: the word index and the two words (None when equal)."""
    if a == b:
        return None
    words_a, words_b = a.split(), b.split()
    at = first_divergence(words_a, words_b)
    if at is None:      # the same words, spaced differently
        return {"word": 0, "text": a[:40], "plain_text": b[:40]}
    return {"word": at, "text": words_a[at] if at < len(words_a) else "(end)",
            "plain_text": words_b[at] if at < len(words_b) else "(end)"}


def rows(prompts: Sequence[BenchPrompt], spec: Sequence[Response], plain: Sequence[Response]) -> list[dict]:
    by_index = {r.index: r for r in plain}
    chosen = batch_prompts(prompts, len(spec))
    out = []
    for response in sorted(spec, key=lambda r: r.index):
        base = by_index[response.index]
        prompt = chosen[response.index]
        row = {"prompt": prompt.prompt, "id": prompt.id, "text": response.text, "plain_text": base.text,
               "tokens": response.tokens, "plain_tokens": base.tokens, "identical": response.text == base.text}
        if not row["identical"]:
            row["first_difference"] = first_differing_word(response.text, base.text)
        out.append(row)
    return out


def engine_point(batch: int, k: int, spec: Sequence[Response], plain: Sequence[Response],
                 prompts: Sequence[BenchPrompt], *, greedy: bool, metric: str = "throughput",
                 counted: dict | None = None) -> EnginePoint:
    """One (batch, k) point from the two servers' responses to the same requests (k = 0: `spec` is
    `plain`)."""
    by_index = {r.index: r for r in plain}
    pairs = [(r, by_index[r.index]) for r in spec if r.index in by_index]
    spec_rate, plain_rate = throughput(spec), throughput(plain)
    spec_tpot, plain_tpot = latency(spec), latency(plain)
    throughput_ratio = ratio(spec_rate, plain_rate) if k else 1.0
    tpot_ratio = ratio(plain_tpot, spec_tpot) if k else 1.0
    timed = [(a, b) for a, b in pairs if a.decode_seconds_per_token and b.decode_seconds_per_token]
    tpot_low, tpot_high = paired_range(tpot_ratio, [1 / a.decode_seconds_per_token for a, _ in timed],
                                       [1 / b.decode_seconds_per_token for _, b in timed]) if k else (1.0, 1.0)
    if metric == "tpot":
        speedup, low, high = tpot_ratio, tpot_low, tpot_high
    else:
        speedup = throughput_ratio
        low, high = paired_range(speedup, [ratio(a.tokens, a.seconds) for a, _ in pairs],
                                 [ratio(b.tokens, b.seconds) for _, b in pairs]) if k else (1.0, 1.0)
    figures = acceptance(spec, counted) if k else None
    table = rows(prompts, spec, plain)
    return EnginePoint(
        batch=batch, k=k, speedup=speedup, speedup_low=low, speedup_high=high,
        # The own loop's tokens per pass and α need every step and every rejection: no engine reports them.
        tokens_per_pass=None if k else 1.0, alpha=None if k else 0.0,
        spec_tokens_per_s=spec_rate, plain_tokens_per_s=plain_rate, spec_latency=spec_tpot,
        plain_latency=plain_tpot, theory=None,
        identical=all(r["identical"] for r in table) if greedy else None,
        passes=figures["num_spec_steps"] if figures else 0, steps=sum(r.tokens for r in plain), padding_share=0.0,
        regathers=0, rows=table, acceptance=figures, requests=len(spec), throughput_ratio=throughput_ratio,
        tpot_ratio=tpot_ratio, tpot_low=tpot_low, tpot_high=tpot_high,
        draft_acceptance_rate=figures["draft_acceptance_rate"] if figures else 0.0,
        mean_acceptance_length=figures["mean_acceptance_length"] if figures else 1.0,
        spec_ttft=time_to_first_token(spec), plain_ttft=time_to_first_token(plain),
        spec_itl=inter_token_latency(spec), plain_itl=inter_token_latency(plain))


def sweep_settings(settings: RunSettings, prompts: Sequence[BenchPrompt], batches: Sequence[int],
                   ks: Sequence[int], repeats: int, metric: str, device: str, engine: str = "vllm") -> dict:
    """What the JSON's `settings` says about a sweep on an engine: how it measured, and by what."""
    return {"target": settings.target or "SmolLM2-135M-Instruct", "draft": settings.draft,
            "batches": list(batches), "ks": list(ks), "max_new_tokens": settings.max_new_tokens,
            "repeats": repeats, "prompts": len(prompts), "temperature": settings.temperature,
            "top_k": settings.top_k, "top_p": settings.top_p, "seed": settings.seed, "dtype": settings.dtype,
            "device": device, "clock": ENGINE_CLOCK, "engine": engine,
            "concurrency": "closed loop: B streams, each sends its next request when its last one ends",
            "output_length": f"exactly {settings.max_new_tokens} tokens per request (ignore_eos): equal work",
            "requests_per_point": {str(b): requests_per_point(b, len(prompts), repeats) for b in batches},
            "warm_up": f"{max(batches)} requests of {WARM_UP_TOKENS} tokens on each server before it is measured",
            "servers": SERVERS, "decision_metric": metric, "decision_metric_text": DECISION_METRICS[metric],
            "timing": timing(ENGINE_CLOCK, speedup=DECODE_ONLY if metric == "tpot" else WITH_PREFILL,
                             tpot_ratio=DECODE_ONLY, throughput_ratio=WITH_PREFILL, spec_tokens_per_s=WITH_PREFILL,
                             plain_tokens_per_s=WITH_PREFILL)}


def check_metric(metric: str) -> None:
    if metric not in DECISION_METRICS:
        raise SpecvizError(f"No decision metric {metric!r}: use {' or '.join(DECISION_METRICS)}.")


def engine_sweep(settings: RunSettings, prompts: Sequence[BenchPrompt], engine: Engine,
                 configs: Sequence[EngineConfig], *, batches: Sequence[int], ks: Sequence[int], repeats: int = 1,
                 warm_up: bool = True, metric: str = "throughput") -> Iterator[EngineProgress]:
    """The sweep (see the module docstring). `configs` are `engines.engine_configs(...)`: the plain one
    first. One server at a time: the plain server measures every batch size, then each speculative
    server in turn; a speculative point is finished as soon as its server has measured that batch
    size. Closing the generator stops the requests and the server."""
    check_metric(metric)
    engine.check(configs)
    result = EngineLoadResult(
        settings=sweep_settings(settings, prompts, batches, ks, repeats, metric, engine.device, engine.name),
        environment=dict(engine.environment(), client=client_environment()), engine=engine.describe(configs),
        configs=list(configs), recommend=engine.recommended_config)
    greedy = settings.temperature == 0.0
    stop = threading.Event()
    started = read_cpu_times()
    plain: dict[int, list[Response]] = {}       # batch size -> the plain server's responses

    def warm(served) -> None:
        if warm_up:
            for _ in closed_loop(served.url, served.model, make_requests(settings, prompts, max(batches),
                                                                         WARM_UP_TOKENS), max(batches), stop):
                pass

    def measure(served, batch, done):
        requests = make_requests(settings, prompts, requests_per_point(batch, len(prompts), repeats), ignore_eos=True,
                                 cache_salt=point_salt(engine, served.config, batch))
        began = time.monotonic()
        for response in closed_loop(served.url, served.model, requests, batch, stop):
            done.append(response)
            yield EngineProgress(served.config, batch, response, None, result,
                                 f"{engine.title} {served.config.label}: batch {batch}, {len(done)} of {len(requests)} "
                                 f"requests, {time.monotonic() - began:.0f} s")

    try:
        for config in configs:
            yield EngineProgress(config, 0, None, None, result, f"{engine.title} {config.label}: starting the server")
            with engine.serve(config) as served:
                warm(served)
                for batch in batches:
                    done: list[Response] = []
                    before = engine.counters(served)
                    yield from measure(served, batch, done)
                    counted = engine.point_acceptance(before, engine.counters(served))
                    if config.k == 0:
                        plain[batch] = done
                        if 0 not in ks and len(configs) > 1:
                            continue
                    point = engine_point(batch, config.k, done, plain[batch], prompts, greedy=greedy, metric=metric,
                                         counted=counted)
                    result.points.append(point)
                    yield EngineProgress(config, batch, None, point, result,
                                         f"batch {batch} k {point.k}: {point.speedup:.2f}x")
    finally:
        stop.set()
        result.environment["client"]["host_load"] = HostLoad.since(started).to_dict()
        result.points.sort(key=lambda p: (p.batch, p.k))
    yield EngineProgress(None, 0, None, None, result, "finished")
