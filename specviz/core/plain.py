"""Plain autoregressive decoding, one target forward per token, for one request or a batch of
requests of different lengths (a single request is a batch of one: the same step). The baseline every
speedup is measured against; each request's tokens are drawn with the same rules as speculative
decoding's (core.decoding): sampled, the token at position t is the exponential race under the
request's noise of position t (`Sampler.noise`), so speculative decoding with drafter-invariant
sampling writes exactly this text with the same seed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from transformers import PreTrainedModel

from .events import BatchStep, Followed, Step
from .ragged_cache import RaggedCache
from .request import Request, check_settings, eos_ids, make_samplers, prompt_lists, single_prompt
from .sampling import to_host
from .timing import Clock, collector_paused, timed_events


def autoregressive_decode(target: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int = 64,
                          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                          seed: int | None = None, *,
                          eos_token_id: int | Iterable[int] | None = None) -> Iterator[Step]:
    """Plain decoding, one target forward per token, with the same sampling rules. The baseline
    every speedup is measured against."""
    prompts = single_prompt(input_ids)
    check_settings(target, max_new_tokens, temperature, top_k, top_p)
    samplers = make_samplers(1, temperature, top_k, top_p, seed, target.device, single=True)
    requests = [Request(0, prompts[0], samplers[0], max_new_tokens, k=0)]
    steps = _steps(target, requests, frozenset(eos_ids(target, eos_token_id)))
    return timed_events(Step(index=s.index, token=s.tokens[0], prob=s.probs[0], seconds=s.seconds) for s in steps)


def batched_autoregressive_decode(target: PreTrainedModel, prompts: Sequence[torch.Tensor | Sequence[int]],
                                  max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                                  top_p: float = 1.0, seed: int | None = None, *,
                                  eos_token_id: int | Iterable[int] | None = None) -> Iterator[BatchStep]:
    """Plain decoding of every prompt together, one target forward per step over the live requests
    (left padded, requests leave at EOS): the baseline batched speculation is measured against.
    Request r equals `autoregressive_decode` of its prompt alone (sampled: with seed `row_seed(seed, r)`)."""
    lists = prompt_lists(prompts)
    check_settings(target, max_new_tokens, temperature, top_k, top_p)
    samplers = make_samplers(len(lists), temperature, top_k, top_p, seed, target.device, single=False)
    requests = [Request(row, ids, sampler, max_new_tokens, k=0)
                for row, (ids, sampler) in enumerate(zip(lists, samplers))]
    return timed_events(_steps(target, requests, frozenset(eos_ids(target, eos_token_id))))


def greedy_choice(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's greedy token in `scores` (float logits, one row per request): the argmax of the raw
    logits, as `generate` takes it, and its probability from one logsumexp."""
    token = scores.argmax(dim=-1)
    return token, (scores.gather(1, token[:, None])[:, 0] - torch.logsumexp(scores, dim=-1)).exp()


# A near-tie: plain decoding's own argmax beat the followed token by at most this many units of the
# dtype's rounding at the top logit's size (bf16, eps 2^-7: 0.36 at a logit of 23, where one bf16 step is
# 0.125; fp32: 3e-6, so that an fp32 parting, which should not happen, is never passed over).
NEAR_TIE_ROUNDINGS = 2.0


def near_tie(margin: float, top: float, dtype: torch.dtype) -> bool:
    """Whether a logit `margin` below the top logit `top` is within a near-tie in `dtype` (NEAR_TIE_ROUNDINGS)."""
    return margin <= NEAR_TIE_ROUNDINGS * torch.finfo(dtype).eps * max(1.0, abs(top))


def follow(target: PreTrainedModel, input_ids: torch.Tensor, tokens: Sequence[int], start: int) -> Followed:
    """Plain greedy decoding's steps along `tokens` (another method's greedy output for the prompt
    `input_ids`) from position `start` on: step i reads the prompt and `tokens[:i]`, one token at a time
    as plain decoding does, and is timed as a plain step is, its argmax and that token's probability
    included. The steps before `start` are plain decoding's own (its text is `tokens[:start]` there) and
    are replayed untimed, so that the cache holds what plain decoding's did, bit for bit: a cache filled
    by one multi-token pass rounds differently in reduced precision. Where a step's own argmax is not
    `tokens[i]` it is checked for a near-tie (`near_tie`); the first that is not one stops the steps
    there (`Followed.stopped_at`). `following` drained."""
    *_, followed = following(target, input_ids, tokens, start)
    return followed


@torch.inference_mode()
def following(target: PreTrainedModel, input_ids: torch.Tensor, tokens: Sequence[int], start: int, *,
              every: int = 8) -> Iterator[Followed]:
    """`follow` as it goes (a consumer that stops iterating stops it): what has been followed so far
    after every `every` steps, untimed ones included, and the whole at the end."""
    prompt = single_prompt(input_ids)[0]
    tokens = [int(t) for t in tokens]
    clock, dtype = Clock(target.device), next(target.parameters()).dtype
    cache = RaggedCache(target, 1)
    steps, ties = [], []
    block = prompt
    for index in range(start):          # plain decoding's own steps, untimed: its prefill, then a token a step
        cache.forward([block], keep=1)
        block = [tokens[index]]
        if (index + 1) % every == 0:
            yield Followed(start, ())
    for index in range(start, len(tokens)):
        with collector_paused():
            began = clock()
            logits, _, _ = cache.forward([block], keep=1)
            scores = logits[:, -1].float()
            token, prob = greedy_choice(scores)
            (wrote,), (own,) = to_host(token, prob)     # the step's one device sync, as plain decoding's
            seconds = clock() - began
        wrote, followed = int(wrote), tokens[index]
        if wrote != followed:
            top, margin = float(scores[0, wrote]), float(scores[0, wrote] - scores[0, followed])
            if not near_tie(margin, top, dtype):
                yield Followed(start, tuple(steps), tuple(ties), stopped_at=index)
                return
            ties.append((index, margin))
            own = float((scores[0, followed] - torch.logsumexp(scores[0], dim=-1)).exp())
        steps.append(Step(index=index, token=followed, prob=own, seconds=seconds))
        block = [followed]
        if len(steps) % every == 0:
            yield Followed(start, tuple(steps), tuple(ties))
    yield Followed(start, tuple(steps), tuple(ties))


@torch.inference_mode()
def _steps(target, requests: list[Request], eos: frozenset[int]) -> Iterator[BatchStep]:
    clock = Clock(target.device)
    cache = RaggedCache(target, len(requests))
    live = list(requests)
    blocks = [list(r.tokens) for r in live]     # what each request's cache lacks: the prompt, then one token
    for index in range(requests[0].max_new_tokens):
        start = clock()
        logits, slots, padded = cache.forward(blocks, keep=1)
        scores = logits[:, -1].float()
        if live[0].sampler.greedy:
            token, prob = greedy_choice(scores)
        else:
            probs = live[0].sampler.probs(logits[:, -1])
            # Request r's token at position t: the race under its noise of t (core.sampling).
            token = torch.cat([r.sampler.race(probs[row:row + 1], [len(r.tokens) + index])
                               for row, r in enumerate(live)])
            prob = probs.gather(1, token[:, None])[:, 0]
        token_ids, probs = to_host(token, prob)    # one device sync
        token_ids = [int(t) for t in token_ids]
        last = index + 1 == requests[0].max_new_tokens
        staying = [] if last else [row for row, t in enumerate(token_ids) if t not in eos]
        if staying and len(staying) < len(live):
            cache.select(staying)
        seconds = clock() - start
        yield BatchStep(index=index, requests=[r.index for r in live], tokens=token_ids, probs=probs, seconds=seconds,
                        slots=slots, padded_slots=padded)
        blocks = [[token_ids[row]] for row in staying]
        live = [live[row] for row in staying]
        if not live:
            return

