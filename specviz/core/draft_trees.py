"""Token trees drafted by a model: EAGLE-2's dynamic tree (Li et al. 2024) over a draft model or early
exit. The draft expands, depth by depth, the `branch` most probable nodes (by the product of draft
probabilities along their path) into their `branch` most probable children, in one draft forward
per depth with a tree attention mask; then the `budget` most probable nodes of everything grown
form the tree the target verifies in one pass.

Children are the draft's top-b, chosen deterministically, so verification treats them as one-hot
candidates (accepted with probability p(x); after a rejection p loses x): the output distribution
stays exactly the target's. Each node's draft probability is kept for display. The draft's KV cache
keeps the prefix and exactly the accepted path's nodes that it fed (gathered, like the target's).
"""

from __future__ import annotations

import math

import torch

from . import trees
from .drafters import Draft, DraftModelDrafter, Drafter
from .ragged_cache import sliding_window
from .sampling import Sampler


class DraftTreeDrafter(Drafter):
    """A draft model (`DraftModelDrafter`, which owns the model and its cache) drafting trees."""

    drafts_trees = True

    def __init__(self, base: DraftModelDrafter, branch: int = 2, budget: int = 16):
        if branch < 1 or budget < 1:
            raise ValueError(f"a draft tree needs branch >= 1 and budget >= 1, got {branch} and {budget}")
        if sliding_window(base.model)[0] is not None:
            # Its tree masks would replace the sliding layers' window (the target's pass keeps it).
            raise ValueError(f"{base.name} has sliding-window attention layers: a draft tree over it is not "
                             "supported; draft a chain with it, or use an n-gram tree")
        self.base, self.branch, self.budget = base, branch, budget
        self.name = f"{base.name} (tree: top-{branch}, {budget} nodes)"
        self.parameters = base.parameters
        self.prefix = 0                       # cache length when the last tree started (the sequence so far)
        self.fed: dict[int, int] = {}         # node of the last tree -> its position in the draft cache

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.base.begin(prompt_ids)

    def rollback(self, valid_length: int) -> None:
        self.base.rollback(valid_length)

    def keep_path(self, valid_length: int, path: list[int]) -> None:
        """After a tree cycle: keep the prefix and the accepted nodes this drafter fed to its model."""
        positions = []
        for node in path:                     # fed nodes are a prefix of the path (a node is fed
            if node not in self.fed:          # only after its parent)
                break
            positions.append(self.fed[node])
        trees.keep_path(self.base.cache.cache, self.prefix, positions)

    def _distribution(self, logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
        return sampler.probs(self.base.fit_vocab(logits))

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        base, device = self.base, self.base.model.device
        cache = base.cache.cache                # a batch of one: the plain cache under it
        pending = sequence[:, cache.get_seq_length():].to(device)
        root = self._distribution(base.model(pending, cache=cache, logits_to_keep=1).logits[0, -1:], sampler)[0]
        self.prefix = cache.get_seq_length()
        tokens: list[int] = []
        parents: list[int] = []
        depth: list[int] = []
        score: list[float] = []               # log of the product of draft probabilities along the path
        prob: list[float] = []                # the node's own draft probability (for display)
        fed: dict[int, int] = {}

        def grow(parent: int, dist: torch.Tensor) -> None:
            top = torch.topk(dist, min(self.branch, dist.numel()))
            for p, token in zip(top.values.tolist(), top.indices.tolist()):
                if p <= 0.0:
                    continue
                tokens.append(token)
                parents.append(parent)
                depth.append(1 if parent < 0 else depth[parent] + 1)
                score.append((0.0 if parent < 0 else score[parent]) + math.log(p))
                prob.append(p)

        grow(-1, root)
        for level in range(1, k):
            frontier = [i for i in range(len(tokens)) if depth[i] == level]
            expand = sorted(frontier, key=lambda i: -score[i])[:self.branch]
            if not expand:
                break
            start = cache.get_seq_length()
            mask, positions = self._inputs(expand, parents, fed, start, depth)
            ids = torch.tensor([[tokens[i] for i in expand]], device=device)
            logits = base.model(ids, cache=cache, attention_mask=mask, position_ids=positions).logits[0]
            for j, node in enumerate(expand):
                fed[node] = start + j
            for node, dist in zip(expand, self._distribution(logits, sampler)):
                grow(node, dist)

        # The `budget` most probable nodes; a parent's score is at least its child's and ties go to
        # the shallower, so every chosen node's parent is chosen too. Parents come before children.
        chosen = sorted(range(len(tokens)), key=lambda i: (-score[i], depth[i], i))[:self.budget]
        chosen.sort(key=lambda i: (depth[i], -score[i], i))
        new = {old: n for n, old in enumerate(chosen)}
        self.fed = {new[old]: position for old, position in fed.items() if old in new}
        return Draft(torch.tensor([tokens[i] for i in chosen], dtype=torch.long, device=sequence.device), None,
                     [-1 if parents[i] < 0 else new[parents[i]] for i in chosen],
                     node_probs=[prob[i] for i in chosen])

    def _inputs(self, expand: list[int], parents: list[int], fed: dict[int, int], start: int,
                depth: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask and positions for feeding `expand` after a cache of `start` positions: each node sees
        the prefix, its fed ancestors and itself."""
        device, dtype = self.base.model.device, self.base.model.dtype
        seen = trees.expansion_mask(expand, parents, fed, self.prefix, start, device)
        positions = torch.tensor([[self.prefix - 1 + depth[node] for node in expand]], device=device)
        return trees.additive_mask(seen, dtype), positions
