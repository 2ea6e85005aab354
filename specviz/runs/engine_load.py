"""The load sweep on vLLM: the same question as `runs.load` (up to which batch size does speculation
pay, and with which k), measured on the engine people serve with.

Batch size B is B concurrent streams in a closed loop (each sends its next prompt when its last one
ends, as `vllm bench serve --max-concurrency B` does) over `requests_per_point` requests: the prompt
set cycled, at least 2B requests so that the streams overlap. One server per configuration: the
plain server stays up while each speculative server (one per k > 0) runs in turn, and each point's
requests go in blocks that alternate between the two, after a short warm-up of each at the largest
batch. The points reuse `runs.load.LoadPoint` and `LoadResult` (so the crossover, the best k
per batch size, the JSON and the Load tab's charts are the own sweep's), with vLLM's figures added:

- throughput: all requests' completion tokens / the wall time of their blocks (each from its first
  request sent to its last one finished; prefill included: a server's tokens per second);
- latency per token: vLLM's TPOT, (last token - first token) / (tokens - 1), mean over requests;
- the speedup's 95% range from the requests: per request, its tokens per second against the same
  request on the plain server; the range of their median (`metrics.paired_ratio`, requests
  resampled as pairs), scaled to the throughput ratio;
- acceptance as vLLM reported it per request (summed): mean acceptance length (tokens per
  speculative step, the bonus included), draft acceptance rate and the histogram of steps by
  number of drafts accepted. There are no per-token verdicts: vLLM returns no rejected drafts;
- per request its text and token count on both servers, and whether the texts are identical.

There is no theory line: vLLM's forward cost is not measured here. Points finish k by k (each k's
batch sizes in turn, the k = 0 points with the first k's); a server that dies mid-sweep raises after
the points that finished, which the consumer keeps (`EngineProgress.result`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..catalog import BenchPrompt
from ..engines import EngineConfig, Request, Response, VllmEngine, closed_loop, recommended_config
from ..metrics import first_divergence, paired_ratio, ratio
from ..models.host import HostLoad, environment, read_cpu_times
from ..settings import RunSettings
from .load import LoadPoint, LoadResult, batch_prompts

WARM_UP_TOKENS = 8
ENGINE_CLOCK = "wall time at the client"


@dataclass(frozen=True)
class EnginePoint(LoadPoint):
    """A LoadPoint measured on an engine: `theory` is None, and vLLM's own acceptance figures."""

    acceptance: dict | None = None      # mean_acceptance_length, draft_acceptance_rate, acceptance_histogram, ...
    requests: int = 0


@dataclass
class EngineLoadResult(LoadResult):
    engine: dict = field(default_factory=dict)
    configs: list[EngineConfig] = field(default_factory=list)
    error: str | None = None            # why the sweep ended early (the finished points are kept)

    @property
    def recommended_speculative_config(self) -> dict | None:
        if not any(p.k for p in self.points):
            return None
        return recommended_config(self.configs, self.recommended_k)

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
    return max(prompts, 2 * batch) * repeats


def make_requests(settings: RunSettings, prompts: Sequence[BenchPrompt], count: int,
                  max_tokens: int | None = None) -> list[Request]:
    chosen = batch_prompts(prompts, count)
    return [Request(i, p.prompt, settings.chat, max_tokens or settings.max_new_tokens, settings.temperature,
                    settings.top_p, settings.top_k, None if settings.seed is None else settings.seed + i)
            for i, p in enumerate(chosen)]


def acceptance(responses: Sequence[Response]) -> dict | None:
    """vLLM's per-request figures, summed over the requests (None when it reported none)."""
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
    return {"mean_acceptance_length": 1.0 + ratio(accepted, steps), "draft_acceptance_rate": ratio(accepted, drafted),
            "acceptance_histogram": histogram, "num_spec_steps": steps, "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted, "requests_reported": len(reported)}


def acceptance_by_position(histogram: Sequence[int]) -> list[float]:
    """From vLLM's histogram (steps that accepted exactly 0, 1, ... drafts): for each draft position,
    the share of steps whose draft was accepted at least that far."""
    steps = sum(histogram)
    return [ratio(sum(histogram[i + 1:]), steps) for i in range(max(len(histogram) - 1, 0))]


def throughput(blocks: Sequence[Sequence[Response]]) -> float:
    """Completion tokens / wall time, the wall time of each block from its first request sent to its
    last one finished (the other server's blocks in between are not counted)."""
    blocks = [b for b in blocks if b]
    return ratio(sum(r.tokens for b in blocks for r in b),
                 sum(max(r.finished for r in b) - min(r.sent for r in b) for b in blocks))


def latency(responses: Sequence[Response]) -> float:
    values = [r.decode_seconds_per_token for r in responses if r.decode_seconds_per_token is not None]
    return statistics.mean(values) if values else 0.0


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


def engine_point(batch: int, k: int, spec_blocks: Sequence[Sequence[Response]],
                 plain_blocks: Sequence[Sequence[Response]], prompts: Sequence[BenchPrompt], *,
                 greedy: bool) -> EnginePoint:
    """One (batch, k) point from the two servers' responses to the same requests, in blocks."""
    spec = [r for b in spec_blocks for r in b]
    plain = [r for b in plain_blocks for r in b]
    spec_rate, plain_rate = throughput(spec_blocks), throughput(plain_blocks)
    speedup = ratio(spec_rate, plain_rate) if k else 1.0
    if k and len(spec) > 1:
        by_index = {r.index: r for r in plain}
        middle, low, high = paired_ratio([ratio(r.tokens, r.seconds) for r in spec],
                                         [ratio(by_index[r.index].tokens, by_index[r.index].seconds) for r in spec])
        low, high = speedup * ratio(low, middle), speedup * ratio(high, middle)
    else:
        low = high = speedup
    figures = acceptance(spec) if k else None
    table = rows(prompts, spec, plain)
    return EnginePoint(
        batch=batch, k=k, speedup=speedup, speedup_low=low, speedup_high=high,
        tokens_per_pass=figures["mean_acceptance_length"] if figures else 1.0,
        spec_tokens_per_s=spec_rate, plain_tokens_per_s=plain_rate, spec_latency=latency(spec),
        plain_latency=latency(plain), theory=None,
        identical=all(r["identical"] for r in table) if greedy else None,
        alpha=figures["draft_acceptance_rate"] if figures else 0.0,
        passes=figures["num_spec_steps"] if figures else 0, steps=sum(r.tokens for r in plain), padding_share=0.0,
        regathers=0, rows=table, acceptance=figures, requests=len(spec))


BLOCKS = 2      # each point's requests run in this many blocks, alternating between the two servers


def blocks_of(requests: Sequence[Request], batch: int) -> list[list[Request]]:
    """The point's requests in BLOCKS contiguous blocks (fewer when a block would hold under B requests)."""
    count = max(1, min(BLOCKS, len(requests) // batch))
    size = -(-len(requests) // count)
    return [list(requests[i:i + size]) for i in range(0, len(requests), size)]


def engine_sweep(settings: RunSettings, prompts: Sequence[BenchPrompt], engine: VllmEngine,
                 configs: Sequence[EngineConfig], *, batches: Sequence[int], ks: Sequence[int], repeats: int = 1,
                 warm_up: bool = True) -> Iterator[EngineProgress]:
    """The sweep (see the module docstring). `configs` are `engines.engine_configs(...)`: the plain one
    first. The plain server stays up while each speculative one runs, and each point's requests go
    in blocks that alternate between the two (plain, speculative, plain, ...), so that a host whose
    load changes slows both alike, as the own sweep's interleaving does. Closing the generator stops
    the requests and the servers."""
    engine.check(configs)
    result = EngineLoadResult(
        settings={"target": settings.target or "SmolLM2-135M-Instruct", "draft": settings.draft,
                  "batches": list(batches), "ks": list(ks), "max_new_tokens": settings.max_new_tokens,
                  "repeats": repeats, "prompts": len(prompts), "temperature": settings.temperature,
                  "top_k": settings.top_k, "top_p": settings.top_p, "seed": settings.seed, "dtype": settings.dtype,
                  "device": engine.install.device if engine.install else "server", "clock": ENGINE_CLOCK,
                  "engine": "vllm", "concurrency": "closed loop, one stream per request of the batch",
                  "requests_per_point": {str(b): requests_per_point(b, len(prompts), repeats) for b in batches},
                  "alternation": f"{BLOCKS} blocks per point, plain and speculative servers in turn"},
        environment=environment("cpu"), engine=engine.describe(configs), configs=list(configs))
    greedy = settings.temperature == 0.0
    plain_config, spec_configs = configs[0], list(configs[1:])
    stop = threading.Event()
    started = read_cpu_times()

    def warm(served) -> None:
        if warm_up:
            for _ in closed_loop(served.url, served.model, make_requests(settings, prompts, max(batches),
                                                                         WARM_UP_TOKENS), max(batches), stop):
                pass

    def block(served, label, batch, requests, done):
        began = time.monotonic()
        for response in closed_loop(served.url, served.model, requests, batch, stop):
            done.append(response)
            yield EngineProgress(served.config, batch, response, None, result,
                                 f"vLLM {label}: batch {batch}, {len(done)} requests, {time.monotonic() - began:.0f} s")

    try:
        yield EngineProgress(plain_config, 0, None, None, result, "vLLM plain: starting the server")
        with engine.serve(plain_config) as plain_served:
            warm(plain_served)
            if not spec_configs:
                for batch in batches:
                    requests = make_requests(settings, prompts, requests_per_point(batch, len(prompts), repeats))
                    done: list[Response] = []
                    yield from block(plain_served, "plain", batch, requests, done)
                    point = engine_point(batch, 0, [done], [done], prompts, greedy=greedy)
                    result.points.append(point)
                    yield EngineProgress(plain_config, batch, None, point, result, f"batch {batch} k 0: plain")
            for number, config in enumerate(spec_configs):
                yield EngineProgress(config, 0, None, None, result, f"vLLM {config.label}: starting the server")
                with engine.serve(config) as spec_served:
                    warm(spec_served)
                    for batch in batches:
                        requests = make_requests(settings, prompts, requests_per_point(batch, len(prompts), repeats))
                        plain_blocks: list[list[Response]] = []
                        spec_blocks: list[list[Response]] = []
                        for part in blocks_of(requests, batch):
                            plain_blocks.append([])
                            yield from block(plain_served, "plain", batch, part, plain_blocks[-1])
                            spec_blocks.append([])
                            yield from block(spec_served, config.label, batch, part, spec_blocks[-1])
                        points = [engine_point(batch, config.k, spec_blocks, plain_blocks, prompts, greedy=greedy)]
                        if number == 0 and 0 in ks:
                            points.insert(0, engine_point(batch, 0, plain_blocks, plain_blocks, prompts,
                                                          greedy=greedy))
                        for point in points:
                            result.points.append(point)
                            yield EngineProgress(config, batch, None, point, result,
                                                 f"batch {batch} k {point.k}: {point.speedup:.2f}x")
    finally:
        stop.set()
        result.environment["host_load"] = HostLoad.since(started).to_dict()
        result.points.sort(key=lambda p: (p.batch, p.k))
    yield EngineProgress(None, 0, None, None, result, "finished")
