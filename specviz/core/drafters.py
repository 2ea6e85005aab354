"""Where drafts come from. A drafter proposes up to k tokens (with their draft distribution, or
None when the draft is one-hot) and is told, after each verification, how much of the sequence
survived. Three kinds: another causal LM, the target's own first layers (early exit), and prompt
lookup (n-gram matching against the prompt and the output so far)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from .ragged_cache import RaggedCache
from .request import Request
from .sampling import Sampler, sample_from


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor              # (n,) proposed token ids: a chain of n <= k, or a tree's nodes
    probs: torch.Tensor | None        # (n, V) draft distribution at each position; None = one-hot
    parents: list[int] | None = None  # a tree: each node's parent (-1: the last token); None: a chain
    from_earlier: list[bool] | None = None   # per token: drafted only from earlier requests (suffix)
    node_probs: list[float] | None = None    # a one-hot tree from a model: each node's draft probability (shown)
    # Drafting across tokenizers (core.cross_tokenizer): the draft model's own tokens as text, the
    # end of that text the alignment left out of the candidates, and (sampling with token-level
    # intersection) per draft token the draft's probability inside the shared vocabulary.
    draft_pieces: list[str] | None = None
    cut_text: str | None = None
    shared_mass: list[float] | None = None
    # How the drafter found it, for the cost-aware policy to learn acceptance per kind of draft
    # (prompt lookup: the size of the n-gram it matched); None when the drafter does not say.
    signal: int | None = None


def no_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long), None)


class Drafter(ABC):
    """Interface. A drafter is written for one request: `begin` once per run, then per cycle
    `propose` and `rollback` (or `keep_path` after a tree); it must say how it proposes, the rest
    has defaults for stateless ones.

    The decoding loop drafts for a batch of requests (a single request is a batch of one) through
    the batch methods below. Their defaults run the one-request methods: for the request of a batch
    of one, or for each request in turn when the drafter keeps no per-request state (`batchable`).
    A drafter that drafts every request in one forward (a draft model) overrides them."""

    name = "drafter"
    parameters = 0                    # extra parameters the drafter runs (for display)
    batchable = False                 # drafts for several requests at once (chains only)
    # The target's hidden states the loop hands it (`observe`): indices into transformers'
    # `output_hidden_states` (0 = the embeddings, -1 = the last, after the final norm), concatenated.
    hidden_layers: tuple[int, ...] = ()
    # For the cost-aware policy (core.draft_policy): proposing costs nothing next to a target pass
    # and depends only on the sequence, so a paused request still proposes and scores its proposals
    # (prompt lookup); drafts are token trees (drafted whole or not at all).
    free_to_propose = False
    drafts_trees = False

    def begin(self, prompt_ids: torch.Tensor) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Reset state for a new run over `prompt_ids` (1, T). The default does nothing: a stateless
        drafter has nothing to reset."""

    @abstractmethod
    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens to follow `sequence` (1, L)."""

    def keep_path(self, valid_length: int, path: list[int]) -> None:
        """After a tree cycle: `path` (this drafter's node indices) was accepted. A drafter with a
        cache of its tree's nodes keeps exactly those; others roll back to `valid_length`."""
        self.rollback(valid_length)

    def without_memory(self) -> Drafter:
        """This drafter as one that has seen no earlier request: itself, unless it remembers what it
        sees (suffix), then a fresh one with the same settings. For a warm-up (whose output must not
        be remembered) and for an app session (which must not draft from another's outputs)."""
        return self

    def rollback(self, valid_length: int) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Only the first `valid_length` tokens of the last sequence it saw are still valid. The
        default does nothing: a drafter that keeps no cache of the sequence has nothing to roll back."""

    def observe(self, hidden: Sequence[torch.Tensor]) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """After a pass, for a drafter with `hidden_layers`: per request, the target's hidden states of
        those layers, concatenated (n, len(hidden_layers) * H), of the positions the pass fed and kept
        (those its cache now holds past what it held before). The default does nothing."""

    def forget(self) -> None:  # noqa: B027 - an optional hook, empty on purpose
        """Drop whatever was learned from earlier requests. The default does nothing: only drafters
        that learn across requests (suffix) have anything to drop."""

    # ------------------------------------------------------------------ a batch of requests

    def begin_batch(self, prompts: Sequence[list[int]]) -> None:
        if len(prompts) == 1:
            self.begin(torch.tensor([prompts[0]]))
        elif not self.batchable:
            raise ValueError(f"{self.name} drafts for one request at a time: batched decoding drafts with a draft "
                             "model, early exit or prompt lookup (trees and suffix decoding run one request at a time)")

    def propose_batch(self, requests: Sequence[Request]) -> list[Draft]:
        """Each request's draft of at most `request.budget` tokens."""
        return [self.propose(torch.tensor([r.tokens]), r.budget, r.sampler) if r.budget > 0 else no_draft()
                for r in requests]

    def rollback_batch(self, lengths: Sequence[int]) -> bool:
        """Request r's first lengths[r] tokens are still valid; returns whether a cache was re-gathered."""
        if len(lengths) == 1:
            self.rollback(lengths[0])
        return False

    def leave(self, staying: Sequence[int]) -> bool:
        """Only the requests at these places stay (the others finished); returns whether a cache was
        re-gathered."""
        return False


# ----------------------------------------------------------------------------- draft model

class DraftModelDrafter(Drafter):
    """A smaller causal LM with the target's vocabulary, with its own KV cache (one row per request:
    every request drafts in the same forward).

    `vocab_size` is the target's: a draft whose embedding matrix is padded to another size
    (same tokenizer) has its distribution cut or zero-padded to it."""

    batchable = True

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, name: str | None = None):
        self.model = model
        self.vocab_size = vocab_size or model.config.get_text_config().vocab_size
        self.name = name or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.parameters = sum(p.numel() for p in model.parameters())
        self.cache: RaggedCache | None = None

    def begin_batch(self, prompts: Sequence[list[int]]) -> None:
        self.cache = RaggedCache(self.model, len(prompts))   # filled on the first proposal

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.begin_batch([prompt_ids[0].tolist()])

    def propose_batch(self, requests: Sequence[Request]) -> list[Draft]:
        steps = max(r.budget for r in requests)
        if steps <= 0:
            return [no_draft() for _ in requests]
        sampler = requests[0].sampler
        # Feed what the cache has not seen: the prompt the first time, then one token, or two after
        # a fully accepted cycle (the draft never saw its own last, accepted, token).
        blocks = [r.tokens[have:] for r, have in zip(requests, self.cache.lengths())]
        logits = self.cache.forward(blocks, keep=1)[0]
        tokens, rows = [], []                   # rows: greedy the logits, sampled the probabilities
        for step in range(steps):
            step_logits = self.fit_vocab(logits[:, -1])                      # (B, V)
            if sampler.greedy:   # argmax needs no probabilities: one softmax over all rows at the end
                token = step_logits.argmax(dim=-1)
                rows.append(step_logits)
            else:
                probs = sampler.probs(step_logits)
                # Each request draws from its own generator, and only within its budget: it draws
                # exactly what it would draw alone (a row past its budget is fed, never drawn for).
                token = torch.cat([sample_from(probs[row:row + 1], r.sampler.generator) if step < r.budget
                                   else probs[row:row + 1].argmax(dim=-1) for row, r in enumerate(requests)])
                rows.append(probs)
            tokens.append(token)
            if step + 1 < steps:
                logits = self.cache.forward([[] for _ in requests], keep=1, tail=token[:, None],
                                            tail_lengths=[1] * len(requests))[0]
        drafted = torch.stack(tokens, dim=1)                                     # (B, steps)
        stacked = torch.stack(rows, dim=1)                                       # (B, steps, V)
        probs = sampler.probs(stacked.flatten(0, 1)).view(stacked.shape) if sampler.greedy else stacked
        return [Draft(drafted[row, :r.budget], probs[row, :r.budget]) for row, r in enumerate(requests)]

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        request = Request(index=0, tokens=sequence[0].tolist(), sampler=sampler, max_new_tokens=k + 1, k=k, budget=k)
        return self.propose_batch([request])[0]

    def rollback_batch(self, lengths: Sequence[int]) -> bool:
        return self.cache.keep(lengths)

    def rollback(self, valid_length: int) -> None:
        self.cache.keep([valid_length])

    def leave(self, staying: Sequence[int]) -> bool:
        return self.cache.select(staying)

    def fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over this drafter's vocabulary cut or padded (with -inf) to the target's."""
        size = logits.shape[-1]
        if size > self.vocab_size:
            return logits[..., : self.vocab_size]
        if size < self.vocab_size:
            return torch.nn.functional.pad(logits, (0, self.vocab_size - size), value=float("-inf"))
        return logits


def early_exit_model(target: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A view of `target` that runs only its first `num_layers` decoder layers, then its final
    norm and LM head. Shares every weight with the target: no extra memory.

    Works for decoder-only models laid out as `model.model.layers` (Llama, Mistral, Qwen, Gemma,
    SmolLM, Phi-3, ...)."""
    base = getattr(target, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"early exit needs a decoder with `model.layers`; {type(target).__name__} has none")
    total = len(layers)
    if not 1 <= num_layers <= total - 1:
        raise ValueError(f"early exit layer must be between 1 and {total - 1} for this {total}-layer model, "
                         f"got {num_layers}")

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]

    inner = copy.copy(base)                     # shallow: parameters are shared
    inner._modules = dict(base._modules)
    inner.layers = nn.ModuleList(list(layers)[:num_layers])
    inner.config = config
    view = copy.copy(target)
    view._modules = dict(target._modules)
    view.model = inner
    view.config = config
    return view


# ----------------------------------------------------------------------------- prompt lookup

class PromptLookupDrafter(Drafter):
    """Prompt lookup decoding (as transformers' `prompt_lookup_num_tokens`): find the last
    `max_ngram`..1 tokens earlier in the sequence and propose what followed their first
    occurrence. The draft is one-hot (probability 1 on its token), so speculative sampling
    stays exact: acceptance becomes target(x), and the residual is the target minus x."""

    name = "ngram"
    batchable = True                  # keeps no state: each request drafts from its own tokens
    free_to_propose = True

    def __init__(self, max_ngram: int = 3):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        ids = sequence[0].cpu()
        length = ids.shape[0]
        for size in range(min(self.max_ngram, length - 1), 0, -1):
            windows = ids.unfold(0, size, 1)[:-1]   # every earlier window, not the suffix itself
            hits = (windows == ids[-size:]).all(dim=1).nonzero()
            for start in (hits[:, 0] + size).tolist():
                end = min(start + k, length)
                if start < end:
                    return Draft(ids[start:end].to(sequence.device), None, signal=size)
        return Draft(ids[:0].to(sequence.device), None)


class NgramTreeDrafter(Drafter):
    """Prompt lookup as a tree: every earlier occurrence of the last `max_ngram`..1 tokens (longest
    matches first, then the most recent) contributes its continuation; the continuations are merged
    into a trie, and the trie's most frequent branches are kept up to a node budget (default 2k).
    Candidates are one-hot, so speculative sampling stays exact (core.trees)."""

    name = "ngram-tree"
    drafts_trees = True

    def __init__(self, max_ngram: int = 3, budget: int | None = None, max_matches: int = 8):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram, self.budget, self.max_matches = max_ngram, budget, max_matches

    def continuations(self, ids: list[int], k: int) -> list[list[int]]:
        """Up to `max_matches` continuations of at most k tokens, longest matches first."""
        length, found, seen_ends = len(ids), [], set()
        for size in range(min(self.max_ngram, length - 1), 0, -1):
            suffix = ids[-size:]
            # `end` is where an earlier occurrence stops (never the suffix itself), most recent first.
            for end in range(length - 1, size - 1, -1):
                if end in seen_ends or ids[end - size:end] != suffix:
                    continue
                seen_ends.add(end)
                found.append(ids[end:end + k])
                if len(found) == self.max_matches:
                    return found
        return found

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        return trie_draft(self.continuations(sequence[0].tolist(), k), self.budget or 2 * k, 0, sequence.device)


def trie_draft(continuations: list[list[int]], budget: int, floor: float, device,
               earlier: list[bool] | None = None) -> Draft:
    """Continuations merged into a trie (each prefix counted by how many continuations share it), the
    most frequent branches kept up to `budget` nodes among those shared by at least `floor`, as a
    one-hot token tree. Shallow nodes win ties: a node's prefix always outranks it (its count is at
    least as large and it is shorter), so no node is kept without its parent. Parents are listed
    before children, siblings most frequent first. With `earlier` (per continuation: it comes from
    an earlier request), each node says whether only earlier requests proposed it."""
    counts: dict[tuple, int] = {}
    current: set[tuple] = set()                 # prefixes some continuation of this request shares
    for number, continuation in enumerate(continuations):
        for depth in range(1, len(continuation) + 1):
            key = tuple(continuation[:depth])
            counts[key] = counts.get(key, 0) + 1
            if earlier is not None and not earlier[number]:
                current.add(key)
    kept = [key for key in counts if counts[key] >= floor]
    chosen = sorted(kept, key=lambda key: (-counts[key], len(key), key))[:budget]
    chosen.sort(key=lambda key: (len(key), -counts[key], key))
    index = {key: i for i, key in enumerate(chosen)}
    parents = [-1 if len(key) == 1 else index[key[:-1]] for key in chosen]
    from_earlier = None if earlier is None else [key not in current for key in chosen]
    return Draft(torch.tensor([key[-1] for key in chosen], dtype=torch.long, device=device), None, parents,
                 from_earlier)


class SuffixDrafter(Drafter):
    """SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975), compact: find the longest suffix of the
    sequence (up to `max_match` tokens) that occurred before, in this request or in an earlier one
    this drafter saw, and draft a tree of what followed its occurrences, scored by frequency. The
    tree adapts to the match: at most `spec_factor` x the match length nodes (vLLM's
    max_spec_factor), only continuations shared by at least `min_token_prob` of the occurrences (the
    first `max_occurrences` of them, oldest request first).

    Memory is token arrays: each request's ids as int32 (4 bytes a token, where an index of every
    n-gram as Python tuples took ~5 KB a token), searched with vectorised comparisons on each
    proposal (~0.1 ms for 65,536 tokens). Earlier requests (prompt and output) stay while the drafter
    object lives (a command-line process, a benchmark prompt's rounds, an app session), at most
    `max_tokens` of them: beyond that the least recently used requests (drafted from or finished
    longest ago) are dropped first, and a longer request keeps its last `max_tokens`. `forget`
    clears them. Written here rather than taken from arctic-inference (vLLM's suffix decoding), which
    builds a C++ extension against vLLM's stack: a three-minute build in the first install command,
    for a drafter of ~90 lines."""

    name = "suffix"
    drafts_trees = True
    SEPARATOR = -1                              # between requests in the searched array: matches no token

    def __init__(self, max_match: int = 16, spec_factor: float = 2.0, min_token_prob: float = 0.1,
                 budget: int = 32, max_occurrences: int = 64, max_tokens: int = 65_536):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_match, self.spec_factor, self.min_token_prob = max_match, spec_factor, min_token_prob
        self.budget, self.max_occurrences, self.max_tokens = budget, max_occurrences, max_tokens
        self.forget()

    def forget(self) -> None:
        self.earlier: list[torch.Tensor] = []  # earlier requests' ids (int32, CPU), oldest first
        self.last_used: list[int] = []         # per earlier request: the clock when it was last used
        self.clock = 0
        self.current = torch.empty(0, dtype=torch.int32)   # this request's ids so far
        self._searched = torch.empty(0, dtype=torch.int32)  # the earlier requests, each followed by SEPARATOR

    @property
    def requests(self) -> int:
        """How many earlier requests it remembers."""
        return len(self.earlier)

    @property
    def tokens_kept(self) -> int:
        return sum(ids.numel() for ids in self.earlier)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        if self.current.numel():               # the previous request is remembered, within max_tokens
            self.clock += 1
            self.earlier.append(self.current[-self.max_tokens:].clone())
            self.last_used.append(self.clock)
            while self.tokens_kept > self.max_tokens:
                oldest = self.last_used.index(min(self.last_used))
                del self.earlier[oldest], self.last_used[oldest]
            separator = torch.tensor([self.SEPARATOR], dtype=torch.int32)
            self._searched = torch.cat([piece for ids in self.earlier for piece in (ids, separator)])
        self.current = prompt_ids[0].to("cpu", torch.int32, copy=True)

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        # The sequence only ever grows by accepted tokens: it is this request so far.
        ids = self.current = sequence[0].to("cpu", torch.int32, copy=True)
        memory = torch.cat([self._searched, ids])
        # `ends`: where an occurrence of the last `match` tokens ends, i.e. where its continuation
        # starts; never the suffix itself (which ends at len(memory)), never at a request's end.
        ends = torch.nonzero(memory[:-1] == ids[-1]).squeeze(1) + 1
        ends = ends[memory[ends] != self.SEPARATOR]
        match = 1 if ends.numel() else 0
        for size in range(2, min(self.max_match, ids.numel()) + 1):   # grow the match while any occurrence agrees
            starts = ends - size
            longer = ends[(starts >= 0) & (memory[starts.clamp(min=0)] == ids[-size])]
            if not longer.numel():
                break
            ends, match = longer, size
        ends = ends[: self.max_occurrences].tolist()
        found = []
        for end in ends:
            continuation = memory[end:end + k].tolist()
            if self.SEPARATOR in continuation:
                continuation = continuation[: continuation.index(self.SEPARATOR)]
            found.append((continuation, end < self._searched.numel()))
        self._mark_used([end for end in ends if end < self._searched.numel()])
        budget = min(self.budget, max(1, int(self.spec_factor * match)))
        return trie_draft([c for c, _ in found], budget, self.min_token_prob * len(found), sequence.device,
                          earlier=[earlier for _, earlier in found])

    def _mark_used(self, ends: list[int]) -> None:
        """The earlier requests these positions of the searched array fall in were used now."""
        if not ends:
            return
        self.clock += 1
        bounds = torch.tensor([ids.numel() + 1 for ids in self.earlier]).cumsum(0)
        for request in set(torch.searchsorted(bounds, torch.tensor(ends), right=True).tolist()):
            self.last_used[request] = self.clock

    def without_memory(self) -> SuffixDrafter:
        return SuffixDrafter(self.max_match, self.spec_factor, self.min_token_prob, self.budget, self.max_occurrences,
                             self.max_tokens)

