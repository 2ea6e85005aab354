"""The shape of a token tree, as plain lists: `parents[i]` is node i's parent (-1: a child of the last
token), parents listed before their children. No tensors here: recordings, charts and views read
trees through this module without importing torch; `core.trees` drafts and verifies them."""

from __future__ import annotations

from .events import Cycle


def depths(parents: list[int]) -> list[int]:
    """Depth of each node (a child of the last token has depth 1)."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def draft_reach(cycle: Cycle) -> int:
    """How deep a cycle's draft went: a chain's length, a tree's deepest node."""
    return max(depths(cycle.parents), default=0) if cycle.is_tree else len(cycle.drafted)


def children(parents: list[int]) -> list[list[int]]:
    """children[0]: the root's children; children[1 + i]: node i's, in the order drafted."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        out[parent + 1].append(node)
    return out


def child_with(parents: list[int], tokens: list[int], node: int, token: int) -> int | None:
    """The child of `node` (-1: the root) that holds `token`, the first drafted; None if it has none."""
    return next((i for i, (p, t) in enumerate(zip(parents, tokens)) if p == node and t == token), None)


def add_tree(tokens: list[int], parents: list[int], new_tokens: list[int], new_parents: list[int],
             keep=None) -> list[int | None]:
    """Add a tree (`new_tokens`, `new_parents`) to another (`tokens`, `parents`, extended in place) as a
    trie: a node whose parent's place already has a child holding its token shares that child, any other
    is appended. Only the nodes `keep(i)` holds (an ancestor-closed set; default all) are added. Returns
    where each new node went (None: not kept)."""
    place: list[int | None] = []
    for i, (token, parent) in enumerate(zip(new_tokens, new_parents)):
        if keep is not None and not keep(i):
            place.append(None)
            continue
        under = -1 if parent < 0 else place[parent]
        hit = child_with(parents, tokens, under, token)
        if hit is None:
            tokens.append(token)
            parents.append(under)
            hit = len(tokens) - 1
        place.append(hit)
    return place


def check_tree(parents: list[int]) -> None:
    if any(not -1 <= p < i for i, p in enumerate(parents)):
        raise ValueError(f"a tree lists each node after its parent (parents {parents})")


def subtree_without(parents: list[int], drop: set[int]) -> list[int]:
    """The nodes kept when `drop` and all their descendants are removed, in order."""
    removed: set[int] = set()
    for node, parent in enumerate(parents):
        if node in drop or parent in removed:
            removed.add(node)
    return [i for i in range(len(parents)) if i not in removed]
