"""Where drafts come from. A drafter proposes up to k tokens (with their draft distribution, or
None when the draft is one-hot) and is told, after each verification, how much of the sequence
survived. Three kinds: another causal LM, the target's own first layers (early exit), and prompt
lookup (n-gram matching against the prompt and the output so far)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from .sampling import Sampler


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor              # (n,) proposed token ids: a chain of n <= k, or a tree's nodes
    probs: torch.Tensor | None        # (n, V) draft distribution at each position; None = one-hot
    parents: list[int] | None = None  # a tree: each node's parent (-1: the last token); None: a chain


class Drafter:
    """Interface: `begin` once per run, then per cycle `propose` and `rollback`."""

    name = "drafter"
    parameters = 0                    # extra parameters the drafter runs (for display)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """Reset state for a new run over `prompt_ids` (1, T)."""

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        """Propose up to k tokens to follow `sequence` (1, L)."""
        raise NotImplementedError

    def rollback(self, valid_length: int) -> None:
        """Only the first `valid_length` tokens of the last sequence it saw are still valid."""


# ----------------------------------------------------------------------------- draft model

class DraftModelDrafter(Drafter):
    """A smaller causal LM with the target's vocabulary, with its own KV cache.

    `vocab_size` is the target's: a draft whose embedding matrix is padded to another size
    (same tokenizer) has its distribution cut or zero-padded to it."""

    def __init__(self, model: PreTrainedModel, vocab_size: int | None = None, name: str | None = None):
        self.model = model
        self.vocab_size = vocab_size or model.config.get_text_config().vocab_size
        self.name = name or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.parameters = sum(p.numel() for p in model.parameters())
        self.cache: DynamicCache | None = None

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.cache = DynamicCache(config=self.model.config)
        if prompt_ids.shape[1] > 1:  # the cache holds every token but the last
            self.model(prompt_ids[:, :-1].to(self.model.device), cache=self.cache, logits_to_keep=1)

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        # Feed what the cache has not seen: usually one token; two after a fully accepted
        # cycle, because the draft never saw its own last (accepted) token.
        pending = sequence[:, self.cache.get_seq_length():].to(self.model.device)
        tokens, rows = [], []
        for _ in range(k):
            logits = self._fit_vocab(self.model(pending, cache=self.cache, logits_to_keep=1).logits[0, -1:])
            if sampler.greedy:   # argmax needs no probabilities: one softmax over all rows at the end
                token = logits.argmax(dim=-1)
                rows.append(logits)
            else:
                probs = sampler.probs(logits)
                token = sampler.sample(probs)
                rows.append(probs)
            tokens.append(token)
            pending = token[None]
        probs = torch.cat(rows)
        if sampler.greedy:
            probs = sampler.probs(probs)
        return Draft(torch.cat(tokens).to(sequence.device), probs.to(sequence.device))

    def rollback(self, valid_length: int) -> None:
        excess = self.cache.get_seq_length() - valid_length
        if excess > 0:
            self.cache.crop(-excess)

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
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
        raise ValueError(f"early exit layer must be between 1 and {total - 1} for this {total}-layer model, got {num_layers}")

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
                    return Draft(ids[start:end].to(sequence.device), None)
        return Draft(ids[:0].to(sequence.device), None)


class NgramTreeDrafter(Drafter):
    """Prompt lookup as a tree: every earlier occurrence of the last `max_ngram`..1 tokens (longest
    matches first, then the most recent) contributes its continuation; the continuations are merged
    into a trie, and the trie's most frequent branches are kept up to a node budget (default 2k).
    Candidates are one-hot, so speculative sampling stays exact (core.trees)."""

    name = "ngram-tree"

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
        counts: dict[tuple, int] = {}          # the trie: each prefix of a continuation, and how many share it
        for continuation in self.continuations(sequence[0].tolist(), k):
            for depth in range(1, len(continuation) + 1):
                key = tuple(continuation[:depth])
                counts[key] = counts.get(key, 0) + 1
        # Spend the budget on the most frequent branches, shallow first on ties: a node's prefix
        # always outranks it (its count is at least as large and it is shorter), so no node is
        # kept without its parent. Then list parents before children, siblings most frequent first.
        chosen = sorted(counts, key=lambda key: (-counts[key], len(key), key))[: self.budget or 2 * k]
        chosen.sort(key=lambda key: (len(key), -counts[key], key))
        index = {key: i for i, key in enumerate(chosen)}
        parents = [-1 if len(key) == 1 else index[key[:-1]] for key in chosen]
        tokens = torch.tensor([key[-1] for key in chosen], dtype=torch.long, device=sequence.device)
        return Draft(tokens, None, parents)
