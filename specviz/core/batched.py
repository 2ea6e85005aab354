"""Batched decoding: B prompts of different lengths decoded together, speculatively (one target
forward per cycle over every live row's draft) or plainly (one forward per step over the live rows).
Both are generators that yield one event per target forward.

Each row is decoded exactly as `decoding.speculative_decode` / `decoding.autoregressive_decode` would
decode it alone: the same drafting, the same verification rule, the same EOS handling, and its own
`Sampler` (its own torch.Generator, seeded from (seed, row) by `row_seed`), drawn from in the same
order as the single-request loop draws. So a row's output never depends on the other rows: greedy, it
equals that prompt decoded alone (in fp32); sampled with seed s, it equals the prompt decoded alone
with seed `row_seed(s, row)`. Rows accept their own number of tokens; a row that ends (EOS, or its
max_new_tokens) leaves the batch and costs nothing after.

Drafters: a draft model (a causal LM with the target's vocabulary, or early exit, both as a
`DraftModelDrafter`), drafted for all rows at once with one batched cache; and prompt lookup
(`PromptLookupDrafter`), per row. Trees (EAGLE-2 trees, n-gram trees, suffix decoding) and dynamic k
stay batch 1: `decoding.speculative_decode`.

Ragged caches: `ragged_cache.RaggedCache` (what it costs is said there)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .decoding import end_of_cycle, eos_ids
from .drafters import Draft, DraftModelDrafter, PromptLookupDrafter
from .events import Cycle
from .ragged_cache import RaggedCache
from .sampling import Sampler, top_tokens, validate_sampling, verify_greedy, verify_sampled
from .timing import Clock, timed_events



def row_seed(seed: int | None, row: int) -> int | None:
    """The seed of row `row`'s own generator in a batch seeded with `seed` (None: unseeded)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1        # below 2**63: any generator takes it


# ----------------------------------------------------------------------------- drafters

class _BatchedDraftModel:
    """A draft model drafting for every live row at once, with one ragged cache. Each row's tokens and
    probabilities are made as `DraftModelDrafter.propose` makes them, from that row's sampler."""

    def __init__(self, drafter: DraftModelDrafter, batch: int):
        self.drafter = drafter
        self.cache = RaggedCache(drafter.model, batch)

    def propose(self, sequences: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Draft]:
        held = self.cache.lengths()
        # Feed what the cache has not seen: the prompt the first time, then one token, or two after
        # a fully accepted cycle (the draft never saw its own last, accepted, token).
        blocks = [seq[have:] if budget else [] for seq, have, budget in zip(sequences, held, budgets)]
        tokens = [[] for _ in sequences]
        rows = [[] for _ in sequences]          # greedy: logits; sampled: probabilities
        for step in range(max(budgets)):
            logits, _, _ = self.cache.forward(blocks, keep=1)
            blocks = [[] for _ in sequences]
            for row, sampler in enumerate(samplers):
                if step >= budgets[row]:
                    continue
                row_logits = self.drafter.fit_vocab(logits[row, -1:])
                if sampler.greedy:
                    token = row_logits.argmax(dim=-1)
                    rows[row].append(row_logits)
                else:
                    probs = sampler.probs(row_logits)
                    token = sampler.sample(probs)
                    rows[row].append(probs)
                tokens[row].append(token)
                if step + 1 < budgets[row]:
                    blocks[row] = [int(token)]
        drafts = []
        for row, sampler in enumerate(samplers):
            if not tokens[row]:
                drafts.append(Draft(torch.empty(0, dtype=torch.long), None))
                continue
            stacked = torch.cat(rows[row])
            probs = sampler.probs(stacked) if sampler.greedy else stacked
            drafts.append(Draft(torch.cat(tokens[row]).cpu(), probs.cpu()))
        return drafts

    def rollback(self, lengths: list[int]) -> bool:
        return self.cache.keep(lengths)

    def select(self, rows: list[int]) -> bool:
        return self.cache.select(rows)


class _RowLookup:
    """Prompt lookup, row by row (it keeps no state: each row's draft comes from its own sequence)."""

    def __init__(self, drafter: PromptLookupDrafter):
        self.drafter = drafter

    def propose(self, sequences: list[list[int]], budgets: list[int], samplers: list[Sampler]) -> list[Draft]:
        return [self.drafter.propose(torch.tensor([seq]), budget, sampler) if budget
                else Draft(torch.empty(0, dtype=torch.long), None)
                for seq, budget, sampler in zip(sequences, budgets, samplers)]

    def rollback(self, lengths: list[int]) -> bool:
        return False

    def select(self, rows: list[int]) -> bool:
        return False


def _batch_drafter(draft, batch: int):
    if isinstance(draft, PreTrainedModel):
        draft = DraftModelDrafter(draft)
    if isinstance(draft, DraftModelDrafter):
        return _BatchedDraftModel(draft, batch)
    if isinstance(draft, PromptLookupDrafter):
        return _RowLookup(draft)
    raise ValueError(f"batched decoding drafts with a draft model, early exit or prompt lookup, not "
                     f"{type(draft).__name__} (trees and suffix decoding run one request at a time)")


# ----------------------------------------------------------------------------- events

@dataclass(frozen=True)
class BatchCycle:
    """One target forward of batched speculative decoding: every live row's cycle. A row's `Cycle`
    is what `speculative_decode` reports for that prompt alone, except that its draft and verify
    seconds are the whole batch's (the row waited for all of it)."""

    index: int
    rows: list[int]                 # the prompts (indices into the batch) live in this pass
    cycles: list[Cycle]             # one per live row, in the order of `rows`
    draft_seconds: float
    verify_seconds: float
    tokens: int                     # real tokens the target pass computed: every row's pending + drafted
    slots: int                      # key slots of the pass: rows x (cached + new) columns
    padded_slots: int               # of those, padding and holes (what the ragged layout wastes)
    regathered: bool                # a cache was re-gathered after this pass

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds

    @property
    def emitted(self) -> int:
        return sum(len(c.emitted) for c in self.cycles)

    @property
    def drafted(self) -> int:
        return sum(len(c.drafted) for c in self.cycles)


@dataclass(frozen=True)
class BatchStep:
    """One target forward of batched plain decoding: one token for every live row."""

    index: int
    rows: list[int]
    tokens: list[int]               # one per live row
    probs: list[float]              # each token's probability under its row's (warped) distribution
    seconds: float
    slots: int
    padded_slots: int

    @property
    def emitted(self) -> int:
        return len(self.tokens)


def row_outputs(events: Iterable[BatchCycle | BatchStep]) -> dict[int, list[int]]:
    """Each row's output (by its index in the batch) from batched events, cycles or steps."""
    out: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, BatchCycle):
            for row, cycle in zip(event.rows, event.cycles):
                out.setdefault(row, []).extend(cycle.emitted)
        else:
            for row, token in zip(event.rows, event.tokens):
                out.setdefault(row, []).append(token)
    return out


# ----------------------------------------------------------------------------- speculative

def _prompt_lists(prompts: Sequence[torch.Tensor | Sequence[int]]) -> list[list[int]]:
    if not prompts:
        raise ValueError("no prompts: a batch needs at least one")
    lists = []
    for i, prompt in enumerate(prompts):
        ids = prompt.reshape(-1).tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"prompt {i} is empty: it has no tokens")
        lists.append([int(t) for t in ids])
    return lists


def _check(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    validate_sampling(temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def batched_speculative_decode(target: PreTrainedModel, draft, prompts: Sequence[torch.Tensor | Sequence[int]],
                               max_new_tokens: int = 64, k: int = 4, temperature: float = 0.0, top_k: int = 0,
                               top_p: float = 1.0, seed: int | None = None, *,
                               eos_token_id: int | Iterable[int] | None = None) -> Iterator[BatchCycle]:
    """Speculative decoding of every prompt (token ids, any lengths) together; `draft` is a causal LM
    with the target's vocabulary, a `DraftModelDrafter` (early exit included) or a
    `PromptLookupDrafter`. Yields one `BatchCycle` per target pass; row r's output is the concatenated
    `emitted` of its cycles."""
    sequences = _prompt_lists(prompts)
    _check(max_new_tokens, temperature, top_k, top_p)
    if k < 1:
        raise ValueError(f"k (draft length) must be >= 1, got {k}")
    drafter = _batch_drafter(draft, len(sequences))
    samplers = [Sampler(temperature, top_k, top_p, row_seed(seed, row), target.device) for row in range(len(sequences))]
    return timed_events(_batched_cycles(target, drafter, sequences, samplers, max_new_tokens, k,
                                        frozenset(eos_ids(target, eos_token_id))))


@torch.inference_mode()
def _batched_cycles(target, drafter, sequences: list[list[int]], samplers: list[Sampler], max_new_tokens: int,
                    k: int, eos: frozenset[int]) -> Iterator[BatchCycle]:
    clock = Clock(target.device)
    cache = RaggedCache(target, len(sequences))
    live = list(range(len(sequences)))          # prompt index of each row of the caches
    generated = [0] * len(sequences)
    index = 0
    while live:
        # 1. Draft up to k tokens per row (never past a row's own budget: the pass adds one more).
        rows = [sequences[p] for p in live]
        row_samplers = [samplers[p] for p in live]
        budgets = [min(k, max_new_tokens - generated[p] - 1) for p in live]
        start = clock()
        drafts = drafter.propose(rows, budgets, row_samplers)
        draft_seconds = clock() - start

        # 2. One target pass over every row's [what its cache lacks] + drafted.
        start = clock()
        cut = [_cut_at_eos(d, eos) for d in drafts]
        held = cache.lengths()
        blocks = [seq[have:] + tokens.tolist() for seq, have, (tokens, _) in zip(rows, held, cut)]
        keep = max(len(tokens) for tokens, _ in cut) + 1
        logits, slots, padded = cache.forward(blocks, keep)

        # 3. Each row accepts its own prefix (the single-request rule), then the caches roll back.
        results, lengths = [], []
        for row, (tokens, draft_probs) in enumerate(cut):
            n = len(tokens)
            row_logits = logits[row, keep - n - 1:]
            results.append(_verify_row(row_logits, tokens, draft_probs, row_samplers[row], eos))
            lengths.append(len(rows[row]) + results[-1][0].num_accepted)
        regathered = cache.keep(lengths) | drafter.rollback(lengths)
        verify_seconds = clock() - start

        # 4. Report, and let finished rows leave the batch.
        cycles = []
        for row, (verdict, emitted, correction, kind, correction_prob) in enumerate(results):
            tokens = cut[row][0].tolist()
            cycles.append(Cycle(
                index=index, k=k, drafted=tokens, num_accepted=verdict.num_accepted, emitted=emitted,
                correction=correction, correction_kind=kind, correction_prob=correction_prob,
                draft_probs=verdict.draft_probs, target_probs=verdict.target_probs, uniforms=verdict.uniforms,
                residual_top=[] if verdict.residual is None else top_tokens(verdict.residual),
                greedy=row_samplers[row].greedy, draft_seconds=draft_seconds, verify_seconds=verify_seconds,
                target_top=verdict.target_top))
        staying = []
        for row, (p, cycle) in enumerate(zip(live, cycles)):
            rows[row].extend(cycle.emitted)
            generated[p] += len(cycle.emitted)
            if generated[p] < max_new_tokens and cycle.emitted[-1] not in eos:
                staying.append(row)
        if len(staying) < len(live) and staying:
            regathered = cache.select(staying) | drafter.select(staying) | regathered
        yield BatchCycle(index=index, rows=list(live), cycles=cycles, draft_seconds=draft_seconds,
                         verify_seconds=verify_seconds, tokens=sum(len(b) for b in blocks), slots=slots,
                         padded_slots=padded, regathered=regathered)
        live = [live[row] for row in staying]
        index += 1


def _cut_at_eos(draft: Draft, eos: frozenset[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A draft never runs past an EOS token (as in `decoding._chain_cycle`: a one-hot draft stops
    just before it, a model's draft just after it)."""
    drafted = draft.tokens.tolist()
    stop_after = 0 if draft.probs is None else 1
    n = next((i + stop_after for i, t in enumerate(drafted) if t in eos), len(drafted))
    return draft.tokens[:n].cpu(), None if draft.probs is None else draft.probs[:n]


def _verify_row(logits: torch.Tensor, tokens: torch.Tensor, draft_probs: torch.Tensor | None, sampler: Sampler,
                eos: frozenset[int]):
    """One row's verification, as `decoding._chain_cycle` verifies: (verdict, emitted, correction,
    its kind, its probability)."""
    n = tokens.shape[0]
    tokens = tokens.to(logits.device)
    if draft_probs is not None:
        draft_probs = draft_probs.to(logits.device)
    if sampler.greedy:
        verdict = verify_greedy(logits, tokens, draft_probs)
    else:
        verdict = verify_sampled(sampler.probs(logits), draft_probs, tokens, sampler.uniform(n, logits.device),
                                 sampler.generator)
    accepted = verdict.num_accepted
    emitted, correction, kind, correction_prob = end_of_cycle(tokens[:accepted].tolist(), accepted == n,
                                                        verdict.correction, verdict.correction_prob, eos)
    return verdict, emitted, correction, kind, correction_prob


# ----------------------------------------------------------------------------- plain decoding

def batched_autoregressive_decode(target: PreTrainedModel, prompts: Sequence[torch.Tensor | Sequence[int]],
                                  max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                                  top_p: float = 1.0, seed: int | None = None, *,
                                  eos_token_id: int | Iterable[int] | None = None) -> Iterator[BatchStep]:
    """Plain decoding of every prompt together, one target forward per step over the live rows (left
    padded, rows leave at EOS): the baseline batched speculation is measured against. Row r equals
    `autoregressive_decode` of its prompt alone (sampled: with seed `row_seed(seed, r)`)."""
    sequences = _prompt_lists(prompts)
    _check(max_new_tokens, temperature, top_k, top_p)
    samplers = [Sampler(temperature, top_k, top_p, row_seed(seed, row), target.device) for row in range(len(sequences))]
    return timed_events(_batched_steps(target, sequences, samplers, max_new_tokens,
                                       frozenset(eos_ids(target, eos_token_id))))


@torch.inference_mode()
def _batched_steps(target, sequences: list[list[int]], samplers: list[Sampler], max_new_tokens: int,
                   eos: frozenset[int]) -> Iterator[BatchStep]:
    clock = Clock(target.device)
    cache = RaggedCache(target, len(sequences))
    live = list(range(len(sequences)))
    blocks = [list(seq) for seq in sequences]   # what each row's cache lacks: the prompt, then one token
    for index in range(max_new_tokens):
        start = clock()
        logits, slots, padded = cache.forward(blocks, keep=1)
        scores = logits[:, -1].float()
        if samplers[live[0]].greedy:
            # The argmax of the raw logits, as `generate` takes it; its probability from one logsumexp.
            token = scores.argmax(dim=-1)
            prob = (scores.gather(1, token[:, None])[:, 0] - torch.logsumexp(scores, dim=-1)).exp()
        else:
            picks = []
            for row, p in enumerate(live):
                probs = samplers[p].probs(logits[row, -1:])
                drawn = samplers[p].sample(probs)
                picks.append((drawn[0], probs[0, drawn[0]]))
            token = torch.stack([t for t, _ in picks])
            prob = torch.stack([q for _, q in picks])
        token_ids, probs = torch.stack([token.double(), prob.double()]).tolist()   # one device sync
        token_ids = [int(t) for t in token_ids]
        staying = [row for row, t in enumerate(token_ids) if t not in eos] if index + 1 < max_new_tokens else []
        if staying and len(staying) < len(live):
            cache.select(staying)
        seconds = clock() - start
        yield BatchStep(index=index, rows=list(live), tokens=token_ids, probs=probs, seconds=seconds, slots=slots,
                        padded_slots=padded)
        blocks = [[token_ids[row]] for row in staying]
        live = [live[row] for row in staying]
        if not live:
            return
