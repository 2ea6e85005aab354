"""The decoding loops: speculative decoding and plain autoregressive decoding, both generators that
yield one event per target pass. Batch size 1. The loops know nothing about tokenization or display."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from . import trees
from .drafters import Draft, Drafter, DraftModelDrafter
from .events import BONUS, RESAMPLED, Cycle, Step
from .sampling import Sampler, top_tokens, validate_sampling, verify_greedy, verify_sampled
from .timing import Clock, timed_events


def eos_ids(target: PreTrainedModel, eos_token_id: int | Iterable[int] | None) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(target.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


def _validate(input_ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    validate_sampling(temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape (1, T), got {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: input_ids has no tokens")


def as_drafter(draft: PreTrainedModel | Drafter, target: PreTrainedModel) -> Drafter:
    if isinstance(draft, Drafter):
        return draft
    if not isinstance(draft, PreTrainedModel):
        raise ValueError(f"draft must be a causal LM or a Drafter, got {type(draft).__name__}")
    target_vocab = target.config.get_text_config().vocab_size
    draft_vocab = draft.config.get_text_config().vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"draft vocabulary ({draft_vocab} tokens) does not match the target's ({target_vocab}); "
            "if both share one tokenizer and only the embedding padding differs, pass "
            "DraftModelDrafter(draft, vocab_size=...)")
    return DraftModelDrafter(draft)


# ----------------------------------------------------------------------------- speculative

@dataclass(frozen=True)
class LoopOptions:
    """What the speculative loop is asked for (checked by `speculative_decode`)."""

    max_new_tokens: int
    k: int                      # the first cycle's draft length (a tree's depth)
    max_k: int                  # dynamic k's upper bound (k itself without dynamic k)
    dynamic_k: bool             # adapt k after each cycle (transformers' heuristic)
    eos: frozenset[int]         # tokens that end the output


def speculative_decode(target: PreTrainedModel, draft: PreTrainedModel | Drafter, input_ids: torch.Tensor,
                       max_new_tokens: int = 64, k: int = 4, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, seed: int | None = None, *, dynamic_k: bool = False,
                       max_k: int | None = None, eos_token_id: int | Iterable[int] | None = None) -> Iterator[Cycle]:
    """Speculative decoding of `target` with `draft` (a causal LM sharing the target's vocabulary,
    the target itself, or a `Drafter`). Yields one `Cycle` per target pass; the concatenated
    `emitted` tokens are the output. Greedy (temperature 0) output equals `target.generate`'s;
    sampled output follows the target's warped distribution exactly.

    dynamic_k: grow k by 2 after a fully accepted cycle and shrink it by 1 after a rejection
    (transformers' heuristic), within [1, max_k] (default 2k)."""
    _validate(input_ids, max_new_tokens, temperature, top_k, top_p)
    if k < 1:
        raise ValueError(f"k (draft length) must be >= 1, got {k}")
    max_k = max_k or (2 * k if dynamic_k else k)
    if max_k < k:
        raise ValueError(f"max_k ({max_k}) must be >= k ({k})")
    drafter = as_drafter(draft, target)
    sampler = Sampler(temperature, top_k, top_p, seed, target.device)
    options = LoopOptions(max_new_tokens=max_new_tokens, k=k, max_k=max_k, dynamic_k=dynamic_k,
                          eos=frozenset(eos_ids(target, eos_token_id)))
    return timed_events(_speculative_cycles(target, drafter, input_ids, sampler, options))


@dataclass(frozen=True)
class _Pass:
    """What every verification pass of one run works on."""

    target: PreTrainedModel
    drafter: Drafter
    sampler: Sampler
    clock: Clock
    sequence: torch.Tensor      # (1, capacity) buffer of the whole sequence; a prefix of it is valid
    # The target cache holds every token but the newest: that one opens the next verification
    # pass, so the target sees [last] + drafted in a single forward. It starts empty: the first
    # pass is the prompt's prefill and the first verification at once (one forward, not two).
    cache: DynamicCache
    eos: frozenset[int]


@torch.inference_mode()
def _speculative_cycles(target, drafter: Drafter, input_ids: torch.Tensor, sampler: Sampler,
                        options: LoopOptions) -> Iterator[Cycle]:
    length = input_ids.shape[1]
    sequence = torch.empty(1, length + options.max_new_tokens + options.max_k + 1, dtype=torch.long,
                           device=target.device)
    sequence[:, :length] = input_ids
    run = _Pass(target=target, drafter=drafter, sampler=sampler, clock=Clock(target.device), sequence=sequence,
                cache=DynamicCache(config=target.config), eos=options.eos)
    start = run.clock()
    drafter.begin(sequence[:, :length])
    draft_seconds = run.clock() - start         # the drafter's prefill counts as the first cycle's drafting
    generated, index, k = 0, 0, options.k
    while generated < options.max_new_tokens:
        # 1. Draft up to k tokens (never past the length budget: the pass adds one more).
        budget = min(k, options.max_new_tokens - generated - 1)
        start = run.clock()
        draft = drafter.propose(sequence[:, :length], budget, sampler) if budget > 0 else Draft(sequence[0, :0], None)
        draft_seconds += run.clock() - start
        # 2. Verify it in one target pass and keep the accepted tokens plus the target's own (the
        # two cycle functions below: a chain, and a tree, of which a chain is the simplest case).
        verify = _chain_cycle if draft.parents is None else _tree_cycle
        cycle = verify(run, length, draft, budget, index=index, k=k, draft_seconds=draft_seconds)
        # 3. Report it.
        yield cycle
        length += len(cycle.emitted)
        generated += len(cycle.emitted)
        if cycle.emitted[-1] in options.eos:
            return
        # 4. Dynamic k: longer after a fully accepted draft, shorter after a rejection.
        if options.dynamic_k and cycle.drafted:
            k = min(k + 2, options.max_k) if cycle.num_accepted == trees.draft_reach(cycle) else max(k - 1, 1)
        index, draft_seconds = index + 1, 0.0


def end_of_cycle(accepted: list[int], complete: bool, correction: int, correction_prob: float,
           eos: frozenset[int]) -> tuple[list[int], int | None, str | None, float | None]:
    """(emitted, correction, its kind, its probability) after `accepted`: the target's token is a
    bonus when nothing was rejected (`complete`), else a correction; an accepted EOS ends the output
    with no token after it."""
    if complete and accepted and accepted[-1] in eos:
        return accepted, None, None, None
    return accepted + [correction], correction, BONUS if complete else RESAMPLED, correction_prob


def _chain_cycle(run: _Pass, length: int, draft: Draft, budget: int, *, index: int, k: int,
                 draft_seconds: float) -> Cycle:
    """Step 2 for a chain of drafted tokens: pass, accept a prefix, roll the caches back."""
    start = run.clock()
    drafted = draft.tokens.tolist()
    # A draft never runs past an EOS token: cut it there. A one-hot draft (prompt lookup) stops
    # just before it, as transformers' prompt lookup does: the EOS it copies mostly closes an
    # earlier turn of the prompt, and leaving it out costs no pass, because when the target
    # does end there it emits the EOS itself as the bonus token of the same pass.
    stop_after = 0 if draft.probs is None else 1
    n = next((i + stop_after for i, t in enumerate(drafted) if t in run.eos), len(drafted))
    drafted, tokens = drafted[:n], draft.tokens[:n]
    draft_probs = None if draft.probs is None else draft.probs[:n]

    # One target pass over what its cache lacks: [last token] + drafted (the whole prompt
    # too, the first time): n + 1 next-token distributions.
    run.sequence[0, length:length + n] = tokens
    cached = run.cache.get_seq_length()
    logits = run.target(run.sequence[:, cached:length + n], cache=run.cache, logits_to_keep=n + 1).logits[0]

    # Accept a prefix, then add the target's own token (correction or bonus).
    sampler = run.sampler
    if sampler.greedy:
        verdict = verify_greedy(logits, tokens, draft_probs)
    else:
        verdict = verify_sampled(sampler.probs(logits), draft_probs, tokens, sampler.uniform(n, run.sequence.device),
                                 sampler.generator)
    accepted = verdict.num_accepted
    emitted, correction, kind, correction_prob = end_of_cycle(drafted[:accepted], accepted == n, verdict.correction,
                                                        verdict.correction_prob, run.eos)
    if correction is not None:
        run.sequence[0, length + accepted] = correction

    # Roll back both caches to the accepted prefix (the target cache keeps every token
    # but the newest; the drafter keeps whatever of its cache is still a prefix).
    if n > accepted:
        run.cache.crop(accepted - n)
    run.drafter.rollback(length + accepted)
    return Cycle(index=index, k=k, drafted=drafted, num_accepted=accepted, emitted=emitted, correction=correction,
                 correction_kind=kind, correction_prob=correction_prob, draft_probs=verdict.draft_probs,
                 target_probs=verdict.target_probs, uniforms=verdict.uniforms,
                 residual_top=[] if verdict.residual is None else top_tokens(verdict.residual),
                 greedy=sampler.greedy, draft_seconds=draft_seconds, verify_seconds=run.clock() - start,
                 target_top=verdict.target_top, draft_pieces=draft.draft_pieces, cut_text=draft.cut_text,
                 shared_mass=draft.shared_mass)


def _tree_cycle(run: _Pass, length: int, draft: Draft, budget: int, *, index: int, k: int,
                draft_seconds: float) -> Cycle:
    """Step 2 for a drafted tree: all its branches verified in one target pass (core.trees)."""
    start = run.clock()
    # A branch never runs past an EOS token (a one-hot candidate stops just before it, as in a
    # chain) nor deeper than the length budget allows.
    parents = list(draft.parents)
    trees.check_tree(parents)
    tokens = draft.tokens.tolist()
    one_hot = draft.probs is None
    cut = {i for i, d in enumerate(trees.depths(parents)) if d > budget}
    cut |= {i for i, t in enumerate(tokens) if t in run.eos} if one_hot else {
        c for i, t in enumerate(tokens) if t in run.eos for c in range(len(parents)) if parents[c] == i}
    kept = trees.subtree_without(parents, cut)
    parents, node_ids = trees.reindex(parents, kept), draft.tokens[kept]
    draft_probs = None if one_hot else draft.probs[kept]
    drafted = [tokens[i] for i in kept]

    # One pass over what the cache lacks ([last], the whole prompt the first time) and every node.
    cached = run.cache.get_seq_length()
    device = run.sequence.device
    mask, position_ids = trees.tree_inputs(parents, cached, length - cached, run.target.dtype, device)
    inputs = torch.cat([run.sequence[:, cached:length], node_ids[None]], dim=1)
    logits = run.target(inputs, cache=run.cache, attention_mask=mask, position_ids=position_ids,
                        logits_to_keep=len(parents) + 1).logits[0]

    # Accept a path from the root, then add the target's own token. Where the path stopped: a
    # leaf (no children on offer) gets a bonus token, else a correction.
    sampler = run.sampler
    if sampler.greedy:
        verdict = trees.verify_tree_greedy(logits, node_ids, parents, draft_probs)
    else:
        verdict = trees.verify_tree_sampled(sampler.probs(logits), draft_probs, node_ids, parents,
                                            sampler.uniform(len(parents), device), sampler.generator)
    path = verdict.path
    at_leaf = not trees.children(parents)[path[-1] + 1 if path else 0]
    emitted, correction, kind, correction_prob = end_of_cycle([drafted[i] for i in path], at_leaf, verdict.correction,
                                                        verdict.correction_prob, run.eos)

    # The target cache keeps the prefix and exactly the accepted path; the drafter its prefix.
    trees.keep_path(run.cache, length, [length + i for i in path])
    run.sequence[0, length:length + len(emitted)] = torch.tensor(emitted, device=device)
    run.drafter.keep_path(length + len(path), [kept[i] for i in path])
    return Cycle(index=index, k=k, drafted=drafted, num_accepted=len(path), emitted=emitted, correction=correction,
                 correction_kind=kind, correction_prob=correction_prob,
                 draft_probs=verdict.draft_probs if draft.node_probs is None else [draft.node_probs[i] for i in kept],
                 target_probs=verdict.target_probs, uniforms=verdict.uniforms,
                 residual_top=[] if verdict.residual is None else top_tokens(verdict.residual),
                 greedy=sampler.greedy, draft_seconds=draft_seconds, verify_seconds=run.clock() - start,
                 target_top=verdict.target_top, parents=parents, path=path, node_verdicts=verdict.node_verdicts,
                 from_earlier=None if draft.from_earlier is None else [draft.from_earlier[i] for i in kept])


# ----------------------------------------------------------------------------- plain decoding

def autoregressive_decode(target: PreTrainedModel, input_ids: torch.Tensor, max_new_tokens: int = 64,
                          temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                          seed: int | None = None, *,
                          eos_token_id: int | Iterable[int] | None = None) -> Iterator[Step]:
    """Plain decoding, one target forward per token, with the same sampling rules. The baseline
    every speedup is measured against."""
    _validate(input_ids, max_new_tokens, temperature, top_k, top_p)
    return timed_events(_steps(target, input_ids, max_new_tokens, temperature, top_k, top_p, seed,
                               eos_ids(target, eos_token_id)))


@torch.inference_mode()
def _steps(target, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos: set[int]) -> Iterator[Step]:
    device = target.device
    clock = Clock(device)
    sampler = Sampler(temperature, top_k, top_p, seed, device)
    cache = DynamicCache(config=target.config)
    pending = input_ids.to(device)
    for index in range(max_new_tokens):
        start = clock()
        logits = target(pending, cache=cache, logits_to_keep=1).logits[0, -1:]
        if sampler.greedy:
            # The argmax of the raw logits, exactly as `generate` takes it; its probability from
            # one logsumexp rather than a full softmax.
            scores = logits.float()
            token = scores.argmax(dim=-1)
            prob = (scores[0, token] - torch.logsumexp(scores[0], dim=-1)).exp()
        else:
            probs = sampler.probs(logits)
            token = sampler.sample(probs)
            prob = probs[0, token]
        token_id, prob = torch.cat([token.double(), prob.double()]).tolist()   # one device sync
        token_id = int(token_id)
        seconds = clock() - start
        yield Step(index=index, token=token_id, prob=prob, seconds=seconds)
        if token_id in eos:
            return
        pending = token[None]
