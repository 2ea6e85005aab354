"""Drafting with a trained draft head (`core.eagle3.Eagle3Head`: EAGLE-3, what specviz trains and
writes, in the speculators format vLLM serves; it reads the target's hidden states at three layers,
fused): chains (`HeadDrafter`, alone and batched) and EAGLE-2 token trees (`HeadTreeDrafter`).

At position i a head reads (the target's feature of position i, the embedding of token i+1, the
target's own embedding matrix, shared); drafting further it reads its own output of the step before in
place of the target's feature. It is cheap (one layer where the target has many; a few thousand output
rows where the target has its whole vocabulary) and agrees with the target because the target's hidden
states already hold most of what decides the next tokens.

The drafter needs the target's hidden states of the accepted positions: the decoding loop hands them
over after each verification (`Drafter.observe`, the layers named by `Drafter.hidden_layers`). The very
first cycle has none yet (the prompt has not been through the target), so it drafts nothing.

A window on long prompts: the head's first read of a request covers the last `WINDOW` positions before
its newest token, not the whole prompt, and it attends over those and what follows (its positions keep
their true numbers). Reading an ~800-token prompt whole cost the built-in model's head 0.67-0.85 of a
plain step in fp32 on a CPU, once per request, whenever it first drafted (or was scored): more than its
drafts there gave back. A drafter on a window of the context is what MagicDec (Chen et al. 2024) drafts
with for long contexts; the target verifies every draft, so outputs are unchanged.

Exactness: a sampled draft token is drawn from the head's warped distribution over the draft
vocabulary, scattered into the target's vocabulary (zero elsewhere), with the noise of its
position (core.sampling); that is the distribution it was drawn from, so verification stays exact.
Trees: depth by depth the most probable nodes grow their most probable children, one head forward
per depth under a tree mask; verified as one-hot candidates, so exact too."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import trees
from .drafters import Draft, Drafter, no_draft
from .eagle3 import Eagle3Head, int8_copy
from .request import Request
from .sampling import Sampler

# The most earlier positions a head's first read of a request takes (`HeadDrafter(window=...)`).
WINDOW = 256


# ----------------------------------------------------------------------------- the drafter

class _HeadState:
    """One request's: the target's features of its positions so far, and the head's keys and values.
    The target's hidden states are fused into features only when the head next reads them (`feature`),
    all that came since in one matmul: a head that seldom drafts (fp32 on a CPU) then costs a pass
    nothing but keeping them."""

    def __init__(self, fuse):
        self.fuse = fuse                          # the head's fc: hidden states (n, 3 * target_hidden) -> (n, H)
        self.features: list[torch.Tensor] = []    # (n, H) blocks, in position order
        self.unfused: list[torch.Tensor] = []     # the target's hidden states of the positions after them
        self.count = 0                            # positions with a target feature (fused or not)
        self.keys: torch.Tensor | None = None     # (1, nh, P, d) the head's keys and values of positions
        self.values: torch.Tensor | None = None   # start.., of which those before `true` came from true features
        self.true = 0
        self.start = 0                            # the first position the head's keys and values hold

    def add(self, hidden: torch.Tensor) -> None:
        self.unfused.append(hidden)
        self.count += hidden.shape[0]

    @torch.inference_mode()
    def _fuse_pending(self) -> None:
        if self.unfused:
            block = torch.cat(self.unfused) if len(self.unfused) > 1 else self.unfused[0]
            self.features.append(self.fuse(block))
            self.unfused = []

    def crop_features(self, length: int) -> None:
        if self.count > length:
            self._fuse_pending()
            stacked = torch.cat(self.features)[:length]
            self.features, self.count = [stacked], length

    def feature(self, start: int, end: int) -> torch.Tensor:
        self._fuse_pending()
        stacked = torch.cat(self.features) if len(self.features) > 1 else self.features[0]
        self.features = [stacked]
        return stacked[start:end]


class HeadDrafter(Drafter):
    """Drafts a chain with a trained head from the target's features (module docstring). Keeps
    per request its features and head cache; a batch drafts each request in turn (the head's
    forward is small: batching its rows would save little on a CPU)."""

    batchable = True

    def __init__(self, head: Eagle3Head, name: str = "head", *, int8: bool = False, window: int | None = WINDOW):
        """int8: draft with `eagle3.int8_copy` of `head` where this torch can (`weights` says which);
        window: the most earlier positions its first read of a request takes (None: all)."""
        if window is not None and window < 1:
            raise ValueError(f"a head's window must be at least 1 position, got {window}")
        self.window = window
        drafting = int8_copy(head) if int8 else None
        self.head = (drafting or head).eval()
        self.weights = "int8" if drafting is not None else str(head.dtype).removeprefix("torch.")
        self.name = name
        self.hidden_layers = head.hidden_layers
        self.parameters = sum(p.numel() for p in head.parameters())
        self.states: list[_HeadState] = []
        self._target_vocab = head.target_vocab_size

    def begin_batch(self, prompts: Sequence[list[int]]) -> None:
        self.states = [_HeadState(self.head.fuse) for _ in prompts]

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.begin_batch([prompt_ids[0].tolist()])

    @torch.inference_mode()
    def observe(self, hidden: Sequence[torch.Tensor]) -> None:
        for state, block in zip(self.states, hidden):
            if block.shape[0]:
                state.add(block)

    def rollback_batch(self, lengths: Sequence[int]) -> bool:
        for state, length in zip(self.states, lengths):
            state.crop_features(length)
        return False

    def rollback(self, valid_length: int) -> None:
        self.rollback_batch([valid_length])

    def leave(self, staying: Sequence[int]) -> bool:
        self.states = [self.states[row] for row in staying]
        return False

    def propose_batch(self, requests: Sequence[Request]) -> list[Draft]:
        return [self._draft(state, r.tokens, r.budget, r.sampler) for state, r in zip(self.states, requests)]

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        return self._draft(self.states[0], sequence[0].tolist(), k, sampler)

    def prime(self, state: _HeadState, tokens: list[int]):
        """Feed the head what it lacks of the request's true features, up to the newest token: returns
        the predicted feature of the newest token's position (1, 1, H) and the head's keys and values,
        or None while the target has given no features yet (the first cycle)."""
        length = len(tokens)
        # The target's features cover positions 0..count-1; the newest token (length-1) has none yet.
        if length < 2 or state.count < length - 1 or state.count == 0:
            return None
        head = self.head
        # Head position i reads (f_i, token i+1): the cache holds positions computed from true features;
        # the ones it lacks (those accepted since; at least the last, whose output drafts) are fed now.
        have = min(state.true, length - 2)
        if have > state.start:
            cache = (state.keys[:, :, :have - state.start], state.values[:, :, :have - state.start])
        else:
            # A first read (or all it held rolled back): the last `window` positions only (module docstring).
            have = state.start = max(0, length - 1 - self.window) if self.window else 0
            cache = None
        features = state.feature(have, length - 1)[None]
        ids = torch.tensor([tokens[have + 1:length]], device=head.device)
        out, (keys, values) = head(features, ids, start=have, cache=cache)
        state.keys, state.values, state.true = keys, values, length - 1
        return out[:, -1:], keys, values

    @torch.inference_mode()
    def _draft(self, state: _HeadState, tokens: list[int], k: int, sampler: Sampler) -> Draft:
        primed = self.prime(state, tokens) if k > 0 else None
        if primed is None:
            return no_draft()
        head = self.head
        device = head.device
        feature, keys, values = primed
        position = len(tokens) - 1
        drafted, rows = [], []
        for step in range(k):
            logits = head.logits(feature[0, 0]).float()                  # (draft_vocab,)
            if sampler.greedy:
                token = head.vocab[logits.argmax()]
                rows.append(logits)
            else:
                probs = sampler.probs(logits[None])[0]
                # Drawn in the target's vocabulary, with the noise of the position drafted (core.sampling).
                full = torch.zeros(1, self._target_vocab, device=device).index_copy_(1, head.vocab, probs[None])
                token = sampler.draft(full, [len(tokens) + step])[0]
                rows.append(probs)
            drafted.append(token)
            if step + 1 < k:
                # The next step reads the head's own predicted feature (no target feature exists yet).
                feature, (keys, values) = head(feature, token.view(1, 1), start=position, cache=(keys, values))
                position += 1
        stacked = torch.stack(rows)
        probs = torch.softmax(stacked, dim=-1) if sampler.greedy else stacked
        full = torch.zeros(k, self._target_vocab, device=device)
        full[:, head.vocab] = probs
        return Draft(torch.stack(drafted), full)


@torch.inference_mode()
def teacher_forced_first_drafts(head: Eagle3Head, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The head's greedy first draft at every position of a sequence the target has read whole, through
    training's own pass (`Eagle3Head.unrolled`, its first step): `tokens` (n,) the sequence, `hidden`
    (n, len(hidden_layers) * H) the target's hidden states of the head's layers. Entry i is read from
    the target's feature of position i and token i + 1, and guesses token i + 2: what the loop drafts
    first in a cycle whose newest token is i + 1. (n - 1,) target ids."""
    (out,) = head.unrolled(head.fuse(hidden)[:-1][None], tokens[1:][None].to(hidden.device), 1)
    return head.vocab[head.logits(out[0]).float().argmax(-1)]


class HeadTreeDrafter(Drafter):
    """A trained head drafting EAGLE-2 trees (core.draft_trees explains the tree): depth by depth it
    expands the `branch` most probable nodes into their `branch` most probable children, in one head
    forward per depth (each node reads its parent's predicted feature and its own token, and sees the
    prefix and its ancestors); the `budget` most probable nodes form the tree. Children are chosen
    deterministically, so verification treats them as one-hot candidates and stays exact. One request
    at a time (trees are a single request's extension)."""

    drafts_trees = True

    def __init__(self, base: HeadDrafter, branch: int = 2, budget: int = 16):
        if branch < 1 or budget < 1:
            raise ValueError(f"a draft tree needs branch >= 1 and budget >= 1, got {branch} and {budget}")
        self.base, self.branch, self.budget = base, branch, budget
        self.name = f"{base.name} (tree: top-{branch}, {budget} nodes)"
        self.parameters = base.parameters
        self.hidden_layers = base.hidden_layers

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.base.begin(prompt_ids)

    def observe(self, hidden: Sequence[torch.Tensor]) -> None:
        self.base.observe(hidden)

    def rollback(self, valid_length: int) -> None:
        self.base.rollback(valid_length)

    @torch.inference_mode()
    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        tokens = sequence[0].tolist()
        primed = self.base.prime(self.base.states[0], tokens) if k > 0 else None
        if primed is None:
            return no_draft()
        head = self.base.head
        device = head.device
        root_feature, keys, values = primed
        prefix, length = keys.shape[2], len(tokens)       # the head's slots from true features (its window on)
        ids, parents, depth, score, prob = [], [], [], [], []
        predicted: dict[int, torch.Tensor] = {}           # node -> its predicted feature (H,)
        slot: dict[int, int] = {}                         # node -> its place in the head's keys and values

        def grow(parent: int, feature: torch.Tensor) -> None:
            dist = sampler.probs(head.logits(feature)[None])[0]
            top = torch.topk(dist, min(self.branch, dist.numel()))
            for p, index in zip(top.values.tolist(), top.indices.tolist()):
                if p <= 0.0:
                    continue
                ids.append(int(head.vocab[index]))
                parents.append(parent)
                depth.append(1 if parent < 0 else depth[parent] + 1)
                score.append((0.0 if parent < 0 else score[parent]) + math.log(p))
                prob.append(p)

        grow(-1, root_feature[0, 0])
        for level in range(1, k):
            frontier = [i for i in range(len(ids)) if depth[i] == level]
            expand = sorted(frontier, key=lambda i: -score[i])[:self.branch]
            if not expand:
                break
            start = keys.shape[2]
            seen = trees.expansion_mask(expand, parents, slot, prefix, start, device)
            features = torch.stack([root_feature[0, 0] if parents[i] < 0 else predicted[parents[i]] for i in expand])
            out, (keys, values) = head(features[None], torch.tensor([[ids[i] for i in expand]], device=device),
                                       cache=(keys, values), mask=seen,
                                       positions=torch.tensor([length - 2 + depth[i] for i in expand], device=device))
            for row, node in enumerate(expand):
                slot[node], predicted[node] = start + row, out[0, row]
                grow(node, out[0, row])

        # The `budget` most probable nodes; a parent's score is at least its child's and ties go to
        # the shallower, so every chosen node's parent is chosen too. Parents come before children.
        chosen = sorted(range(len(ids)), key=lambda i: (-score[i], depth[i], i))[:self.budget]
        chosen.sort(key=lambda i: (depth[i], -score[i], i))
        new = {old: n for n, old in enumerate(chosen)}
        return Draft(torch.tensor([ids[i] for i in chosen], dtype=torch.long, device=sequence.device), None,
                     [-1 if parents[i] < 0 else new[parents[i]] for i in chosen],
                     node_probs=[prob[i] for i in chosen])
