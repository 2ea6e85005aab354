"""Token trees: several drafted continuations verified in one target pass (SpecInfer, Medusa, EAGLE-2).

A tree is its node tokens and `parents` (parent index of each node, -1 for a child of the last
token), parents listed before their children. The target scores [last token] + every node in one
forward: a 4D attention mask lets each node see the cached prefix and its own ancestors only, and
its position id is the prefix length plus its depth. Row 0 of the logits predicts the root's
children; row 1 + i predicts node i's children.

Verification walks down from the root:
- greedy: follow the child that equals the target's argmax, as far as it goes; the target's argmax
  where no child matches is the correction (a bonus after an accepted leaf);
- drafter-invariant sampling (core.sampling): as greedy, the target's token at each row being its
  race under the noise of that row's position (prefix length + depth), not its argmax;
- classic sampling (SpecInfer's multi-candidate rule; with one child per node it is Leviathan et al.'s):
  try a node's children in order against the current target distribution p. A child x whose
  draft distribution is q is accepted with probability min(1, p(x) / q(x)); after a rejection p
  becomes the normalised residual max(0, p - q). A one-hot candidate (q = 1 on x) is accepted with
  probability p(x), and a rejection just removes x from p. When no child is accepted, the
  correction is drawn from what is left of p. The output follows the target's distribution exactly.

The target's KV cache then keeps exactly the accepted path (its entries moved to just after the
prefix, the rest cropped: the prefix is never copied).

A tree is verified as a chain is (core.sampling): the acceptance data for every node is computed on
the device and crosses to the host in one copy, the walk runs on the host, then the correction is
drawn (one more copy). A chain given as a tree (each node the child of the one before) verifies
exactly as the chain does, draw for draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .events import ACCEPTED, NOT_REACHED, REJECTED
from .ragged_cache import attention_masks, sliding_window
from .tree_shape import children, depths
from .sampling import Sampler, draw, greedy_reads, residual, to_host


def reindex(parents: list[int], kept: list[int]) -> list[int]:
    """Parents of the kept nodes, renumbered (every kept node's parent is kept too)."""
    new_index = {old: new for new, old in enumerate(kept)}
    return [-1 if parents[old] < 0 else new_index[parents[old]] for old in kept]


# ----------------------------------------------------------------------------- the target pass

def tree_inputs(parents: list[int], cached: int, prefix: int, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask (1, 1, prefix + n, cached + prefix + n), position ids (1, prefix + n)) for a
    pass over `prefix` new sequence tokens (causal; the last of them is the root) and n tree nodes."""
    n = len(parents)
    total = cached + prefix + n
    seen = torch.zeros(prefix + n, total, dtype=torch.bool, device=device)
    seen[:, :cached] = True
    seen[:prefix, cached:cached + prefix] = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()
    seen[prefix:, cached:cached + prefix] = True           # every node sees the whole prefix
    for node, parent in enumerate(parents):               # ... its ancestors, and itself
        row = prefix + node
        if parent >= 0:
            seen[row] |= seen[prefix + parent]
        seen[row, cached + prefix + node] = True
    last = cached + prefix - 1
    positions = list(range(cached, cached + prefix)) + [last + d for d in depths(parents)]
    return additive_mask(seen, dtype), torch.tensor([positions], device=device)


def tree_attention(model, parents: list[int], cached: int, prefix: int) -> tuple[torch.Tensor | dict, torch.Tensor]:
    """`tree_inputs` as `model`'s layers take them: with sliding-window layers, one mask per layer type
    (a node's window counts back from its own position, prefix + depth)."""
    mask, positions = tree_inputs(parents, cached, prefix, model.dtype, model.device)
    if sliding_window(model)[0] is None:
        return mask, positions
    key_positions = torch.cat([torch.arange(cached, device=positions.device), positions[0]])[None]
    return attention_masks(model, mask[0] == 0, positions, key_positions), positions


def expansion_mask(expand: list[int], parents: list[int], slot: dict[int, int], prefix: int, start: int,
                   device: torch.device) -> torch.Tensor:
    """Which positions each node of `expand` sees when a drafter feeds them after `start` cached
    positions (a draft tree's next depth): the first `prefix` (the sequence), its ancestors (at their
    `slot`s in the drafter's cache) and itself. (len(expand), start + len(expand)) booleans."""
    seen = torch.zeros(len(expand), start + len(expand), dtype=torch.bool, device=device)
    seen[:, :prefix] = True
    for row, node in enumerate(expand):
        ancestor = parents[node]
        while ancestor >= 0:
            seen[row, slot[ancestor]] = True
            ancestor = parents[ancestor]
        seen[row, start + row] = True
    return seen


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A (rows, columns) "may attend" matrix as the (1, 1, rows, columns) float mask transformers adds
    to attention scores: 0 where seen, the dtype's minimum elsewhere."""
    mask = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, torch.finfo(dtype).min)
    return mask[None, None]


def keep_path(cache, keep: int, path_positions: list[int]) -> None:
    """Keep the first `keep` positions of every layer of a DynamicCache, then the given positions
    (the accepted path's nodes), in order; drop everything else. Only the path's entries move (to
    just after the prefix), never the prefix: a path that already sits there (a chain-shaped tree's,
    as suffix decoding drafts on repeated text) moves nothing, and the rest is cropped."""
    end = keep + len(path_positions)
    moved = [(slot, position) for slot, position in enumerate(path_positions, start=keep) if slot != position]
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True) or layer.keys is None:
            continue
        if moved:
            slots, positions = (torch.tensor(column, device=layer.keys.device) for column in zip(*moved))
            layer.keys[..., slots, :] = layer.keys[..., positions, :]
            layer.values[..., slots, :] = layer.values[..., positions, :]
        layer.keys, layer.values = layer.keys[..., :end, :], layer.values[..., :end, :]


# ----------------------------------------------------------------------------- verification

@dataclass(frozen=True)
class TreeVerification:
    path: list[int]                 # accepted nodes, root to leaf
    correction: int                 # the target's token after the path (correction or bonus)
    correction_prob: float
    node_verdicts: list[str]        # per node: accepted, rejected or not reached
    target_probs: list[float]       # per node: target probability under its parent's distribution
    draft_probs: list[float]        # per node: draft probability (1.0 for one-hot candidates)
    uniforms: list[float] = field(default_factory=list)    # draws consulted (sampling)
    target_top: list[int] = field(default_factory=list)    # greedy: the argmax at each row visited
    residual: torch.Tensor | None = None                   # sampling: what the correction came from


def _verdicts(n: int, path: list[int], rejected: list[int]) -> list[str]:
    verdicts = [NOT_REACHED] * n
    for node in rejected:
        verdicts[node] = REJECTED
    for node in path:
        verdicts[node] = ACCEPTED
    return verdicts


def _parent_rows(parents: list[int], device: torch.device) -> torch.Tensor:
    """The logits row that scores each node: its parent's (row 0 for the root's children)."""
    return torch.tensor([p + 1 for p in parents], dtype=torch.long, device=device)


def _walk(kids: list[list[int]], ids: list[int], tops: list[int]) -> tuple[list[int], list[int], list[int], int]:
    """Down the tree along the child equal to the target's token at each row: (path, rejected
    children, the target's token at each row visited, the row where it stopped)."""
    path, rejected, visited, row = [], [], [], 0
    while True:
        visited.append(tops[row])
        match = next((c for c in kids[row] if ids[c] == tops[row]), None)
        rejected += [c for c in kids[row] if c != match]
        if match is None:
            return path, rejected, visited, row
        path.append(match)
        row = match + 1


def verify_tree_greedy(target_logits: torch.Tensor, tokens: torch.Tensor, parents: list[int],
                       draft_probs: torch.Tensor | None = None) -> TreeVerification:
    """target_logits: (n + 1, V) for [root] + nodes. Follows the argmax down the tree."""
    tops, top_probs, ids, target_p, draft_p = greedy_reads(target_logits, _parent_rows(parents, tokens.device),
                                                           tokens, draft_probs)
    path, rejected, visited, row = _walk(children(parents), ids, tops)
    return TreeVerification(path=path, correction=tops[row], correction_prob=top_probs[row],
                            node_verdicts=_verdicts(len(parents), path, rejected), target_probs=target_p,
                            draft_probs=draft_p, target_top=visited)


def tree_draws(sampler: Sampler, parents: list[int], start: int, vocab: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A sampled tree's draws, keyed by position (a node at depth d sits at `start` + d - 1): (the
    classic test's uniform of each node (n,), and the token noise of each row (n + 1, V), row 0 the
    root's position `start`). Siblings share a position but not a uniform (each is its own test);
    the first child's is the chain's there, so a chain given as a tree draws exactly as the chain."""
    depth = depths(parents)
    order = [0] * len(parents)
    for siblings in children(parents):
        for j, node in enumerate(siblings):
            order[node] = j
    positions = [start + d - 1 for d in depth]
    uniforms = torch.tensor(sampler.uniforms([p if j == 0 else f"{p}/{j}" for p, j in zip(positions, order)]),
                            device=device)
    by_depth = sampler.noise_rows(range(start, start + max(depth, default=0) + 1), vocab, device)
    return uniforms, by_depth[torch.tensor([0] + depth, device=device)]


def verify_tree_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tokens: torch.Tensor,
                        parents: list[int], uniforms: torch.Tensor, draws: torch.Generator | torch.Tensor, *,
                        invariant: bool = False) -> TreeVerification:
    """target_probs: (n + 1, V) warped target distributions for [root] + nodes; draft_probs: (n, V)
    the distribution each node was drawn from, or None when every node is a one-hot candidate;
    uniforms: (n,) U[0, 1) draws, node i's test consulting uniforms[i] (each node is tried at most
    once, so every test has a draw of its own); draws: the token noise of each row (n + 1, V)
    (`tree_draws`), or a generator to draw the correction from (classic only). `invariant`: follow
    the target's race under that noise instead (uniforms unused)."""
    n = len(parents)
    kids = children(parents)
    nodes = torch.arange(n, device=tokens.device)
    target_p = target_probs[_parent_rows(parents, tokens.device), tokens]
    draft_p = torch.ones_like(target_p) if draft_probs is None else draft_probs[nodes, tokens]

    if invariant:
        # The target's token at each row: its race under the noise of the row's position.
        top = (target_probs / draws).argmax(dim=-1)
        tops, top_p = to_host(top, target_probs.gather(1, top[:, None])[:, 0])
        ids, target_list, draft_list = to_host(tokens, target_p, draft_p)
        path, rejected, visited, row = _walk(kids, [int(i) for i in ids], [int(t) for t in tops])
        return TreeVerification(path=path, correction=int(tops[row]), correction_prob=top_p[row],
                                node_verdicts=_verdicts(n, path, rejected), target_probs=target_list,
                                draft_probs=draft_list, target_top=visited)

    def leftovers(row: int, siblings: list[int]):
        # What is left of a row's target distribution after siblings[0], then siblings[1], ... were rejected.
        left = target_probs[row]
        for node in siblings:
            q = None if draft_probs is None else draft_probs[node]
            left = residual(left, q, tokens[node:node + 1], target_probs[row])
            yield left

    # A node is tried only after all its earlier siblings were rejected, so it is tested against what
    # they left of the target distribution: computed on the device for every node at once.
    left_p = target_p.clone()
    for row, siblings in enumerate(kids):
        for node, left in zip(siblings[1:], leftovers(row, siblings)):   # (list first: no wasted step)
            left_p[node:node + 1] = left.index_select(0, tokens[node:node + 1])
    # Accept x with probability min(1, p(x) / q(x)), p being what is left of the target: one copy.
    accepts, uniform_list, target_list, draft_list = to_host(uniforms * draft_p < left_p, uniforms, target_p, draft_p)

    path, rejected, consulted, row = [], [], [], 0
    while True:
        taken = next((c for c in kids[row] if accepts[c]), None)
        tried = kids[row] if taken is None else kids[row][:kids[row].index(taken) + 1]
        consulted += [uniform_list[c] for c in tried]
        rejected += [c for c in tried if c != taken]
        if taken is None:
            break
        path.append(taken)
        row = taken + 1
    # No child of `row` accepted: the correction comes from what its children left (a leaf: the
    # target's own distribution, a bonus token), by the race under the row's noise.
    left = None
    for left in leftovers(row, kids[row]):  # noqa: B007 - drained: ends on what every child of `row` left
        pass
    dist = target_probs[row] if left is None else left
    if isinstance(draws, torch.Generator):
        correction, correction_prob = draw(dist, draws)
    else:
        token = (dist / draws[row]).argmax()[None]
        (correction,), (correction_prob,) = to_host(token, dist[token])
        correction = int(correction)
    return TreeVerification(path=path, correction=correction, correction_prob=correction_prob,
                            node_verdicts=_verdicts(n, path, rejected), target_probs=target_list,
                            draft_probs=draft_list, uniforms=consulted, residual=left)
