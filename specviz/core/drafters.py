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
from .sampling import Sampler


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
    # A hybrid's tree holding two drafters' branches (core.hybrid): per node, the drafter that wrote it
    # (a node both proposed: the first drafter's); None when one drafter wrote the whole draft.
    drafted_by: list[str] | None = None


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
    # For the cost-aware policy (core.draft_policy): proposing costs nothing next to a target pass and
    # changes nothing the next proposal depends on, so a paused request still proposes and scores its
    # proposals (prompt lookup, its trees, suffix decoding); drafts are token trees.
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
                # Each request draws with its own noise of the position drafted (core.sampling: the
                # target's own under invariant sampling), and only within its budget: it draws exactly
                # what it would draw alone (a row past its budget is fed, never drawn for).
                token = torch.cat([r.sampler.draft(probs[row:row + 1], [len(r.tokens) + step]) if step < r.budget
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
