"""Configurations compared over a set of prompts on vLLM, at concurrency 1, against the plain server.

One server at a time (`engines.SERVERS`; on a GPU two would each claim most of its memory): the
plain server answers every prompt of every round, then each configuration's server in turn does the
same (each after a short warm-up). Answers end at EOS, as users get them, so that the texts compared
are whole answers. A prompt's speedup is decode-only, as in
`runs.prompt_sets`: the plain server's time per token after the first (vLLM's TPOT) over the
configuration's. The result is a `runs.prompt_sets.PromptSetComparison`, so the medians, the 95%
intervals, the paired winner, the tables, the chart and the JSON are the own comparison's; vLLM's
acceptance figures and the identical-output check per prompt (with the first differing word) come
with it in `EngineComparison`.

vLLM does not promise equal outputs across batch shapes in bf16 (a draft-model config changed one
word of a greedy answer here): a mismatch is reported, never hidden.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..catalog import BenchPrompt
from ..engines import Engine, EngineConfig, Response, closed_loop
from ..metrics import ratio
from ..settings import RunSettings
from .engine_load import ENGINE_CLOCK, WARM_UP_TOKENS, acceptance, first_differing_word, make_requests
from .prompt_set_result import PromptRun, PromptSetComparison


@dataclass
class EngineComparison:
    comparison: PromptSetComparison
    engine: dict
    acceptance: dict[str, dict | None] = field(default_factory=dict)    # per configuration label, vLLM's figures
    mismatches: list[dict] = field(default_factory=list)                 # {config, prompt_id, round, first_difference}

    def engine_fields(self) -> dict:
        """What the own comparison's JSON (`views.prompt_sets.summary`) gains on vLLM."""
        return {"engine": self.engine, "vllm_acceptance": self.acceptance, "mismatches": self.mismatches}


def _speedup(spec: Response, plain: Response) -> float | None:
    a, b = spec.decode_seconds_per_token, plain.decode_seconds_per_token
    return ratio(b, a) if a and b else None


def engine_compare(settings: RunSettings, prompts: Sequence[BenchPrompt], engine: Engine,
                   configs: Sequence[EngineConfig], *, repeats: int = 1,
                   warm_up: bool = True) -> Iterator[EngineComparison]:
    """Yields the comparison after each finished request. `configs[0]` is the plain server."""
    plain_config, spec_configs = configs[0], list(configs[1:])
    engine.check(configs)
    comparison = PromptSetComparison(
        configs=[RunSettings(target=settings.target, draft=settings.draft, k=c.k,
                             max_new_tokens=settings.max_new_tokens, dtype=settings.dtype) for c in spec_configs],
        labels=[c.label for c in spec_configs], prompts=list(prompts), repeats=repeats, clock=ENGINE_CLOCK)
    out = EngineComparison(comparison, engine.describe(configs))
    requests = make_requests(settings, prompts, len(prompts) * repeats)
    stop = threading.Event()

    def one(served, request):
        return next(iter(closed_loop(served.url, served.model, [request], 1, stop)))

    def warm(served):
        if warm_up:
            one(served, make_requests(settings, prompts, 1, WARM_UP_TOKENS)[0])

    try:
        with engine.serve(plain_config) as plain_served:
            warm(plain_served)
            baseline = []
            for request in requests:
                baseline.append(one(plain_served, request))
                yield out           # nothing to show yet; a consumer may stop here
        for number, config in enumerate(spec_configs):
            with engine.serve(config) as served:
                warm(served)
                responses = []
                first = before = engine.counters(served)       # llama.cpp's steps are server counters
                for request, base in zip(requests, baseline):
                    response = one(served, request)
                    responses.append(response)
                    prompt, round_ = request.index % len(prompts), request.index // len(prompts)
                    after = engine.counters(served)
                    figures = dict(response.spec or {}, **(engine.point_acceptance(before, after) or {}))
                    before = after
                    identical = response.text == base.text
                    comparison.results.append(PromptRun(
                        config=number, prompt=prompt, round=round_, speedup=_speedup(response, base),
                        tokens=response.tokens, baseline_tokens=base.tokens,
                        passes=0, num_drafts=figures.get("num_spec_steps", 0),     # an engine's every step: unknown
                        drafted=figures.get("num_draft_tokens", 0),
                        accepted=figures.get("num_accepted_draft_tokens", 0), seconds=response.seconds,
                        identical=identical if settings.temperature == 0.0 else None))
                    if not identical and settings.temperature == 0.0:
                        out.mismatches.append({"config": config.label, "prompt_id": prompts[prompt].id,
                                               "round": round_,
                                               "first_difference": first_differing_word(response.text, base.text)})
                    yield out
                out.acceptance[config.label] = acceptance(responses, engine.point_acceptance(first, before))
    finally:
        stop.set()
