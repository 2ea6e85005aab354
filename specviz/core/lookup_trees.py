"""Drafters that propose token trees by lookup, with no model: prompt lookup as a tree (every earlier
occurrence of the last n-gram, merged into a trie) and suffix decoding (the longest suffix that
occurred before, in this request or an earlier one). Both are one-hot, so speculative sampling stays
exact (core.trees), and both propose for free next to a target pass (core.draft_policy)."""

from __future__ import annotations

import torch

from .drafters import Draft, Drafter
from .sampling import Sampler


class NgramTreeDrafter(Drafter):
    """Prompt lookup as a tree: every earlier occurrence of the last `max_ngram`..1 tokens (longest
    matches first, then the most recent) contributes its continuation; the continuations are merged
    into a trie, and the trie's most frequent branches are kept up to a node budget (default 2k).
    Candidates are one-hot, so speculative sampling stays exact (core.trees)."""

    name = "ngram-tree"
    drafts_trees = True
    free_to_propose = True

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
    free_to_propose = True            # ~0.1 ms a proposal; what it remembers changes only between requests
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

