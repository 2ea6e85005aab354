"""The decoding loops: speculative decoding and plain autoregressive decoding, generators that yield one
event per target pass, for one request or for a batch of requests of different lengths. A single
request is a batch of one: both run the same cycle (`_chain_pass`) and the same step. The loops know
nothing about tokenization or display.

Each request is decoded exactly as it would be decoded alone: the same drafting, the same
verification rule, the same EOS handling, and its own `Sampler` (its own seed; in a batch `row_seed(seed,
place)`), whose draws are keyed by position (core.sampling). So a request's output never depends on
the others: greedy, it equals that prompt decoded alone (in fp32); sampled with seed s, it equals the
prompt decoded alone with seed `row_seed(s, place)`. With drafter-invariant sampling (the default)
a sampled output equals plain decoding's with that seed (core.plain), whatever the drafter and k.
Requests accept their own number of tokens; one that ends (EOS, or its max_new_tokens) leaves the
batch and costs nothing after.

What only a single request does (its batch-1 extensions, here and nowhere else): token trees
(EAGLE-2 trees, n-gram trees, suffix decoding: `_tree_pass`) and drafters that keep state for one
request (suffix, cross-tokenizer). Dynamic k is per request, in a batch too.

Host crossings per pass: the drafted tokens and the draft's distributions stay on the device; the
target's verdicts for every request cross in one copy (`sampling.verify_chains`), and what the views
need of a rejected sampled draft (the residual's top tokens) in one more.

Timing: an event's draft and verification seconds cover all the loop's work for it, as a plain
step's seconds cover all of plain decoding's (core.plain): the views' reads, and the caches' rows
dropped when requests leave the batch, included, so a speedup compares the same kinds of work."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from . import tree_shape, trees
from .draft_policy import CostAwarePolicy, planned_fields
from .drafters import Draft, Drafter, DraftModelDrafter
from .events import BONUS, RESAMPLED, BatchCycle, Cycle
from .ragged_cache import RaggedCache, hidden_features, hidden_request
from .request import Request, check_settings, eos_ids, make_samplers, prompt_lists, single_prompt
from .sampling import INVARIANT, position_draws, to_host, verify_chains
from .timing import Clock, timed_events


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
    """What the speculative loop is asked for (checked by the entry points)."""

    max_k: int                  # dynamic k's upper bound (k itself without dynamic k)
    dynamic_k: bool             # adapt each request's k after each cycle (transformers' heuristic)
    eos: frozenset[int]         # tokens that end a request's output
    policy: CostAwarePolicy | None = None   # choose each cycle's draft length by expected gain (up to k)


def _k_options(k: int, dynamic_k: bool, max_k: int | None) -> int:
    if k < 1:
        raise ValueError(f"k (draft length) must be >= 1, got {k}")
    max_k = max_k or (2 * k if dynamic_k else k)
    if max_k < k:
        raise ValueError(f"max_k ({max_k}) must be >= k ({k})")
    return max_k


def speculative_decode(target: PreTrainedModel, draft: PreTrainedModel | Drafter, input_ids: torch.Tensor,
                       max_new_tokens: int = 64, k: int = 4, temperature: float = 0.0, top_k: int = 0,
                       top_p: float = 1.0, seed: int | None = None, *, dynamic_k: bool = False,
                       max_k: int | None = None, eos_token_id: int | Iterable[int] | None = None,
                       policy: CostAwarePolicy | None = None, sampling: str = INVARIANT) -> Iterator[Cycle]:
    """Speculative decoding of `target` with `draft` (a causal LM sharing the target's vocabulary,
    the target itself, or a `Drafter`). Yields one `Cycle` per target pass; the concatenated
    `emitted` tokens are the output. Greedy (temperature 0) output equals `target.generate`'s;
    sampled output follows the target's warped distribution exactly.

    dynamic_k: grow k by 2 after a fully accepted cycle and shrink it by 1 after a rejection
    (transformers' heuristic), within [1, max_k] (default 2k). policy: a `CostAwarePolicy` chooses
    each cycle's draft length, from 0 (a plain step) to k, by its expected gain (core.draft_policy);
    None drafts k every cycle (the classic algorithm). sampling: INVARIANT (drafter-invariant: the
    text is plain sampling's with the same seed, whatever the drafter, k or policy) or CLASSIC
    (Leviathan et al.'s rejection sampling); core.sampling explains both."""
    prompts = single_prompt(input_ids)
    check_settings(target, max_new_tokens, temperature, top_k, top_p)
    max_k = _k_options(k, dynamic_k, max_k)
    if policy is not None and dynamic_k:
        raise ValueError("dynamic k and the cost-aware policy both choose the draft length: pick one")
    drafter = as_drafter(draft, target)
    samplers = make_samplers(1, temperature, top_k, top_p, seed, target.device, single=True, rule=sampling)
    requests = [Request(0, prompts[0], samplers[0], max_new_tokens, k)]
    options = LoopOptions(max_k=max_k, dynamic_k=dynamic_k, eos=frozenset(eos_ids(target, eos_token_id)),
                          policy=policy)
    return timed_events(event.cycles[0] for event in _cycles(target, drafter, requests, options))


def batched_speculative_decode(target: PreTrainedModel, draft, prompts: Sequence[torch.Tensor | Sequence[int]],
                               max_new_tokens: int = 64, k: int = 4, temperature: float = 0.0, top_k: int = 0,
                               top_p: float = 1.0, seed: int | None = None, *, dynamic_k: bool = False,
                               max_k: int | None = None, eos_token_id: int | Iterable[int] | None = None,
                               sampling: str = INVARIANT) -> Iterator[BatchCycle]:
    """Speculative decoding of every prompt (token ids, any lengths) together; `draft` is a causal LM
    with the target's vocabulary, a `DraftModelDrafter` (early exit included), a
    `PromptLookupDrafter`, or any drafter for a single prompt. Yields one `BatchCycle` per target
    pass; request r's output is the concatenated `emitted` of its cycles."""
    lists = prompt_lists(prompts)
    check_settings(target, max_new_tokens, temperature, top_k, top_p)
    max_k = _k_options(k, dynamic_k, max_k)
    drafter = as_drafter(draft, target)
    if len(lists) > 1 and not drafter.batchable:
        raise ValueError(f"batched decoding drafts with a draft model, early exit or prompt lookup, not "
                         f"{type(drafter).__name__} (trees and suffix decoding run one request at a time)")
    samplers = make_samplers(len(lists), temperature, top_k, top_p, seed, target.device, single=False,
                             rule=sampling)
    requests = [Request(row, ids, sampler, max_new_tokens, k)
                for row, (ids, sampler) in enumerate(zip(lists, samplers))]
    options = LoopOptions(max_k=max_k, dynamic_k=dynamic_k, eos=frozenset(eos_ids(target, eos_token_id)))
    return timed_events(_cycles(target, drafter, requests, options))


@torch.inference_mode()
def _cycles(target, drafter: Drafter, requests: list[Request], options: LoopOptions) -> Iterator[BatchCycle]:
    clock = Clock(target.device)
    cache = RaggedCache(target, len(requests))
    start = clock()
    drafter.begin_batch([r.tokens for r in requests])
    draft_seconds = clock() - start             # the drafter's set-up counts as the first cycle's drafting
    live, index = list(requests), 0
    policy = options.policy
    free = drafter.free_to_propose
    while live:
        # 1. Draft up to k tokens per request (never past its length budget: the pass adds one more);
        # with the policy, as many as are expected to pay (a drafter that proposes for free proposes
        # its most, and its proposal is cut to that after being noted for scoring; a hybrid's policy
        # also chooses which of its drafters drafts: core.hybrid), its planning (and
        # its learning from the cycle before) timed as drafting.
        plans = {}
        for request in live:
            request.budget = request.draft_budget()
        start = clock()
        drafts = drafter.propose_batch(live) if policy is None else policy.draft(drafter, live, plans)
        draft_seconds += clock() - start
        # 2. Verify every draft in one target pass, accept a prefix of each, roll the caches back (a
        # tree: a single request's extension).
        if len(live) == 1 and drafts[0].parents is not None:
            passed = _tree_pass(target, cache, drafter, live[0], drafts[0], options.eos, clock)
        else:
            passed = _chain_pass(target, cache, drafter, live, drafts, options.eos, clock)
        # 3. Requests take their tokens; those that ended leave the batch, and both caches drop their
        # rows (timed, as plain decoding times its own cache's select within its step).
        staying = []
        for row, (request, fields) in enumerate(zip(live, passed.cycles)):
            request.tokens.extend(fields["emitted"])
            request.generated += len(fields["emitted"])
            if request.generated < request.max_new_tokens and fields["emitted"][-1] not in options.eos:
                staying.append(row)
        verify_seconds, regathered = passed.verify_seconds, passed.regathered
        if staying and len(staying) < len(live):
            start = clock()
            regathered |= cache.select(staying)
            left = clock()
            regathered |= drafter.leave(staying)
            verify_seconds += left - start
            draft_seconds += clock() - left
        cycles = [Cycle(index=index, k=request.k, greedy=request.sampler.greedy, invariant=request.sampler.invariant,
                        draft_seconds=draft_seconds,
                        verify_seconds=verify_seconds, **planned_fields(plans.get(request.index)), **fields)
                  for request, fields in zip(live, passed.cycles)]
        learning = 0.0
        if policy is not None:      # what it learns from this cycle is timed as the next cycle's drafting
            start = clock()
            policy.learn(live, cycles, index, free)
            learning = clock() - start
        # Dynamic k: longer after a fully accepted draft, shorter after a rejection.
        if options.dynamic_k:
            for request, cycle in zip(live, cycles):
                if cycle.drafted:
                    full = cycle.num_accepted == tree_shape.draft_reach(cycle)
                    request.k = min(request.k + 2, options.max_k) if full else max(request.k - 1, 1)
        # 4. Report.
        yield BatchCycle(index=index, requests=[r.index for r in live], cycles=cycles, draft_seconds=draft_seconds,
                         verify_seconds=verify_seconds, tokens=passed.tokens, slots=passed.slots,
                         padded_slots=passed.padded_slots, regathered=regathered)
        live = [live[row] for row in staying]
        index, draft_seconds = index + 1, learning


@dataclass(frozen=True)
class _Passed:
    """What one verification pass did: per request the fields of its `Cycle`, and the pass's costs."""

    cycles: list[dict]
    verify_seconds: float
    tokens: int
    slots: int
    padded_slots: int
    regathered: bool


def end_of_cycle(accepted: list[int], complete: bool, correction: int, correction_prob: float,
                 eos: frozenset[int]) -> tuple[list[int], int | None, str | None, float | None]:
    """(emitted, correction, its kind, its probability) after `accepted`: the target's token is a
    bonus when nothing was rejected (`complete`), else a correction; an accepted EOS ends the output
    with no token after it."""
    if complete and accepted and accepted[-1] in eos:
        return accepted, None, None, None
    return accepted + [correction], correction, BONUS if complete else RESAMPLED, correction_prob


def _cut_one_hot(draft: Draft, eos: frozenset[int]) -> Draft:
    # A one-hot draft (prompt lookup) stops just before an EOS token, as transformers' prompt lookup
    # does: the EOS it copies mostly closes an earlier turn of the prompt, and leaving it out costs no
    # pass, because when the target does end there it emits the EOS itself as the pass's own token.
    if draft.probs is not None or not draft.tokens.numel():
        return draft
    drafted = draft.tokens.tolist()             # a one-hot draft is built on the host
    n = next((i for i, t in enumerate(drafted) if t in eos), len(drafted))
    return draft if n == len(drafted) else Draft(draft.tokens[:n], None, draft_pieces=draft.draft_pieces,
                                                 cut_text=draft.cut_text, shared_mass=draft.shared_mass)


def _pack(drafts: list[Draft], width: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, width) drafted ids and (B, width, V) draft distributions, zero-padded; None when every
    draft is one-hot. When any row has a distribution, every row gets one (a one-hot draft its
    one-hot rows, an empty draft none): each row is then verified by its own rule, min(1, target /
    draft), whatever the first row drafted."""
    if len(drafts) == 1 and drafts[0].tokens.shape[0] == width:
        draft = drafts[0]
        return draft.tokens.to(device)[None], None if draft.probs is None else draft.probs.to(device)[None]
    # Stacked where the drafts are (a draft model's: the device; prompt lookup's: the host), then
    # sent in one copy.
    home = next((d.tokens.device for d in drafts if d.tokens.numel()), device)
    nothing = torch.zeros(0, dtype=torch.long, device=home)
    tokens = torch.stack([F.pad(d.tokens.to(home) if d.tokens.numel() else nothing, (0, width - d.tokens.shape[0]))
                          for d in drafts]).to(device)
    vocab = next((d.probs.shape[-1] for d in drafts if d.probs is not None and d.probs.numel()), None)
    if vocab is None:
        return tokens, None
    probs = torch.zeros(len(drafts), width, vocab, device=device)
    for row, draft in enumerate(drafts):
        n = draft.tokens.shape[0]
        if draft.probs is not None and draft.probs.numel():
            probs[row, :n] = draft.probs.to(device)
        elif n:     # a one-hot draft beside distributions: probability 1 on each drafted token
            probs[row, :n] = F.one_hot(draft.tokens.to(device), vocab).to(probs.dtype)
    return tokens, probs


def _chain_pass(target, cache: RaggedCache, drafter: Drafter, live: list[Request], drafts: list[Draft],
                eos: frozenset[int], clock: Clock) -> _Passed:
    """The chain cycle's step 2, for every live request at once: one target pass over each request's
    [what its cache lacks] + drafted, verification, the caches rolled back to what was accepted."""
    start = clock()
    drafts = [_cut_one_hot(d, eos) for d in drafts]
    lengths = [d.tokens.shape[0] for d in drafts]
    width = max(lengths)
    device = target.device
    tokens, draft_probs = _pack(drafts, width, device)

    # One target pass over what each cache lacks: [last token] + drafted (the whole prompt too, the
    # first time), right-aligned: row r's n_r + 1 next-token distributions are its last n_r + 1.
    held = cache.lengths()
    blocks = [r.tokens[have:] for r, have in zip(live, held)]
    hidden = drafter.hidden_layers
    logits, slots, padded = cache.forward(blocks, keep=width + 1, tail=tokens, tail_lengths=lengths,
                                          hidden_layers=hidden)
    if len(set(lengths)) > 1:
        shift = torch.tensor([width - n for n in lengths], device=device)
        rows = (shift[:, None] + torch.arange(width + 1, device=device)[None]).clamp_(max=width)
        logits = logits.gather(1, rows[..., None].expand(-1, -1, logits.shape[-1]))

    # Accept a prefix of each draft, then add the target's own token (correction or bonus), all
    # requests at once (one copy to the host).
    # Sampled: the draws of each request's positions (drafted token i of request r sits at len(r.tokens) + i).
    samplers = [r.sampler for r in live]
    uniforms, noise = (None, None) if samplers[0].greedy else position_draws(
        samplers, [len(r.tokens) for r in live], lengths, width, logits.shape[-1], device)
    verdicts = verify_chains(logits, tokens, lengths, draft_probs, samplers, uniforms, noise)

    cycles, keep = [], []
    for request, draft, verdict in zip(live, drafts, verdicts):
        drafted, accepted = verdict.drafted, verdict.num_accepted
        # A model's draft never runs past an EOS token: it is verified whole (it stays on the device)
        # and cut just after its first EOS here; what followed an accepted EOS is never emitted.
        n = next((i + 1 for i, t in enumerate(drafted) if t in eos), len(drafted))
        accepted = min(accepted, n)
        emitted, correction, kind, correction_prob = end_of_cycle(drafted[:accepted], accepted == n,
                                                                  verdict.correction, verdict.correction_prob, eos)
        keep.append(len(request.tokens) + accepted)
        cycles.append(dict(
            drafted=drafted[:n], num_accepted=accepted, emitted=emitted, correction=correction, correction_kind=kind,
            correction_prob=correction_prob, draft_probs=verdict.draft_probs[:n], target_probs=verdict.target_probs[:n],
            uniforms=verdict.uniforms[:min(accepted + 1, n)], target_top=verdict.target_top[:accepted + 1],
            residual_top=verdict.residual if accepted < n else None, draft_pieces=draft.draft_pieces,
            cut_text=draft.cut_text, shared_mass=draft.shared_mass))
    # Roll back both caches to the accepted prefixes (the target's keeps every token but the newest;
    # the drafter's whatever of it is still a prefix).
    regathered = cache.keep(keep) | drafter.rollback_batch(keep)
    if hidden:   # a drafter that drafts from the target's features gets those of every position now kept
        drafter.observe(cache.fed_hidden([kept - have for kept, have in zip(keep, held)]))
    _residual_tops(cycles)
    seconds = clock() - start
    return _Passed(cycles=cycles, verify_seconds=seconds, tokens=sum(len(b) for b in blocks) + sum(lengths),
                   slots=slots, padded_slots=padded, regathered=regathered)


def _residual_tops(cycles: list[dict], n: int = 10) -> None:
    """Each rejected sampled cycle's residual distribution (a device row) as its top n tokens, all in one copy."""
    rows = [c for c in cycles if c["residual_top"] is not None]
    for c in cycles:
        if c["residual_top"] is None:
            c["residual_top"] = []
    if not rows:
        return
    stacked = torch.stack([c["residual_top"] for c in rows])
    n = min(n, stacked.shape[-1])
    values, indices = stacked.topk(n, dim=-1)
    ids, probs = to_host(indices.flatten(), values.flatten())
    for i, c in enumerate(rows):
        c["residual_top"] = [(int(t), p) for t, p in zip(ids[i * n:(i + 1) * n], probs[i * n:(i + 1) * n]) if p > 0]


def _tree_pass(target, cache: RaggedCache, drafter: Drafter, request: Request, draft: Draft,
               eos: frozenset[int], clock: Clock) -> _Passed:
    """Step 2 for a drafted tree (one request): all its branches verified in one target pass (core.trees)."""
    start = clock()
    length = len(request.tokens)
    # A branch never runs past an EOS token (a one-hot candidate stops just before it, as in a
    # chain) nor deeper than the length budget allows.
    parents = list(draft.parents)
    tree_shape.check_tree(parents)
    tokens = draft.tokens.tolist()
    one_hot = draft.probs is None
    cut = {i for i, d in enumerate(tree_shape.depths(parents)) if d > request.budget}
    cut |= {i for i, t in enumerate(tokens) if t in eos} if one_hot else {
        c for i, t in enumerate(tokens) if t in eos for c in range(len(parents)) if parents[c] == i}
    kept = tree_shape.subtree_without(parents, cut)
    device = target.device
    parents, node_ids = trees.reindex(parents, kept), draft.tokens[kept].to(device)
    draft_probs = None if one_hot else draft.probs[kept].to(device)
    drafted = [tokens[i] for i in kept]

    # One pass over what the cache lacks ([last], the whole prompt the first time) and every node.
    plain = cache.cache                          # a batch of one: the plain cache under it
    cached = plain.get_seq_length()
    masks, position_ids = trees.tree_attention(target, parents, cached, length - cached)
    inputs = torch.cat([torch.tensor([request.tokens[cached:]], device=device), node_ids[None]], dim=1)
    wanted = hidden_request(drafter.hidden_layers)
    out = target(inputs, cache=plain, attention_mask=masks, position_ids=position_ids,
                 logits_to_keep=len(parents) + 1, **wanted)
    logits = out.logits[0]

    # Accept a path from the root, then add the target's own token. Where the path stopped: a
    # leaf (no children on offer) gets a bonus token, else a correction.
    sampler = request.sampler
    if sampler.greedy:
        verdict = trees.verify_tree_greedy(logits, node_ids, parents, draft_probs)
    else:
        verdict = trees.verify_tree_sampled(sampler.probs(logits), draft_probs, node_ids, parents,
                                            *trees.tree_draws(sampler, parents, length, logits.shape[-1], device),
                                            invariant=sampler.invariant)
    path = verdict.path
    at_leaf = not tree_shape.children(parents)[path[-1] + 1 if path else 0]
    emitted, correction, kind, correction_prob = end_of_cycle([drafted[i] for i in path], at_leaf, verdict.correction,
                                                              verdict.correction_prob, eos)

    # The target cache keeps the prefix and exactly the accepted path; the drafter its prefix.
    trees.keep_path(plain, length, [length + i for i in path])
    drafter.keep_path(length + len(path), [kept[i] for i in path])
    if wanted:   # the target's features of what it was fed before the tree, then of the accepted path
        pending = inputs.shape[1] - len(parents)
        rows = list(range(pending)) + [pending + i for i in path]
        drafter.observe([hidden_features(out, drafter.hidden_layers)[0, rows]])
    fields = dict(
        drafted=drafted, num_accepted=len(path), emitted=emitted, correction=correction, correction_kind=kind,
        correction_prob=correction_prob,
        draft_probs=verdict.draft_probs if draft.node_probs is None else [draft.node_probs[i] for i in kept],
        target_probs=verdict.target_probs, uniforms=verdict.uniforms, residual_top=verdict.residual,
        target_top=verdict.target_top, parents=parents, path=path, node_verdicts=verdict.node_verdicts,
        from_earlier=None if draft.from_earlier is None else [draft.from_earlier[i] for i in kept],
        drafted_by=None if draft.drafted_by is None else [draft.drafted_by[i] for i in kept])
    _residual_tops([fields])
    seconds = clock() - start
    return _Passed(cycles=[fields], verify_seconds=seconds, tokens=inputs.shape[1], slots=cached + inputs.shape[1],
                   padded_slots=0, regathered=False)
