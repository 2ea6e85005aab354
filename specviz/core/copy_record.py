"""Which copy drafts when two pay: a hybrid's record of its free drafters (prompt lookup, suffix
decoding) measured against each other on what they would each have given.

Where two free drafters both offer a draft in a cycle, the hybrid verifies one, but both are scored
against the tokens the target then writes (greedy: exactly what verification would have accepted).
So each one's *realized* tokens per unit of time in that cycle are known, the one not verified too:
its draft at the length its own plan chose, the matched depth plus the token the pass adds, over the
pass its width would have cost. The hybrid drafts with its preferred copy (`HybridDrafter.prefer`:
suffix decoding for the built-in `auto`) unless another has given clearly more on this request: a
mean paired difference over at least `MIN_COMPARED` cycles above `CLEAR` standard errors.

Why not by their expected gains, and why a preferred one: measured on the bundled prompts (fp32, the
built-in model; `scripts/copy_choice.py`, docs/benchmarks.md "Which copy drafts when both pay"), in the
cycles where both paid, the copies' expected tokens moved with noise more than with what came true
(prompt lookup expected 2.75 tokens where it was chosen and gave 2.64; 2.18 where it was not and would
have given 2.73), so choosing by them every cycle gave 1.970 tokens per plain step's time where suffix
decoding alone in the same cycles would have given 1.995 (prompt lookup 1.926). Suffix decoding finds
what prompt lookup finds (the longest earlier match, up to 16 tokens, against prompt lookup's 3) and
drafts the continuations that followed it, so it is preferred; prompt lookup drafts where suffix
decoding does not pay, or where it has clearly paid more on this request.

One tree of both (`union`, `HybridDrafter(both=True)`, the built-in `auto`): where the other copy's
offer holds nodes the preferred one's does not, the record keeps what they would have added (a tree of
both gives the deeper of the two matches: greedy, exactly what its verification accepts), and the tree
drafts in a cycle where the preferred draft's expected tokens plus what those nodes are expected to add
(`added`: their mean on this request, shrunk towards none by MIN_COMPARED cycles that added none) over
the tree's pass beat the preferred draft alone over its own. Unlike a choice between the copies, this
needs no clear lead: the tree holds the preferred draft whole, so it risks only its extra width, which
the pass costs price. In the cycles where it drafted on the bundled prompts (`scripts/copy_choice.py`'s
kind of count, docs/benchmarks.md "One tree of both copies"), what the other copy's nodes were expected
to add came true (0.18 expected, 0.17 given, fp32)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import tree_shape

MIN_COMPARED = 8    # cycles both offered before another copy may take over from the preferred one
CLEAR = 2.0         # standard errors its mean paired difference must stand above zero


@dataclass
class Offered:
    """One free drafter's offer in a cycle: its draft (`parents[i]`: node i's parent, -1 the root; a
    chain: i - 1) as its plan cut it (`length` deep), the output position its first token would take."""

    name: str
    tokens: list[int]
    parents: list[int]
    length: int
    start: int

    def width(self) -> int:
        """The nodes a pass verifies for it: those no deeper than `length`."""
        return sum(d <= self.length for d in tree_shape.depths(self.parents))

    def matched(self, output: Sequence[int]) -> int | None:
        """How deep the output follows it (at most `length`); None while the output is too short to say."""
        node, depth = -1, 0
        while depth < self.length:
            if self.start + depth >= len(output):
                return None
            token = output[self.start + depth]
            node = tree_shape.child_with(self.parents, self.tokens, node, token)
            if node is None:
                break
            depth += 1
        return depth


@dataclass
class Union:
    """One tree of several offers, each cut to its plan's length, sharing what they share (a trie):
    `sources[i]`, node i's first holder (the offer's index, its node there)."""

    tokens: list[int]
    parents: list[int]
    sources: list[tuple[int, int]]

    def depth(self) -> int:
        return max(tree_shape.depths(self.parents), default=0)


def union(offers: Sequence[Offered]) -> Union:
    """The tree of `offers` (module docstring: what a tree of both gives is the deeper of their matches,
    plus the token the pass adds, over a pass as wide as the tree)."""
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[tuple[int, int]] = []
    for index, offer in enumerate(offers):
        depths, before = tree_shape.depths(offer.parents), len(tokens)
        place = tree_shape.add_tree(tokens, parents, offer.tokens, offer.parents,
                                    keep=lambda i, depths=depths, offer=offer: depths[i] <= offer.length)
        sources += [(index, node) for node, at in enumerate(place) if at is not None and at >= before]
    return Union(tokens, parents, sources)


@dataclass
class CopyRecord:
    """One request's record (module docstring): per drafter, its realized tokens per plain step's time
    less the preferred drafter's, over the cycles both offered (count, sum, sum of squares)."""

    prefer: str
    both: bool = False          # a tree of both offers may draft (`tree_pays`)
    against: dict[str, list[float]] = field(default_factory=dict)
    # Over the cycles where the other copies' offers held nodes the preferred one's did not: how many,
    # and the tokens a tree of both would have given beyond the preferred copy's draft (count, sum).
    extra: list[float] = field(default_factory=lambda: [0.0, 0.0])
    pending: list[list[Offered]] = field(default_factory=list)

    def offer(self, offers: Sequence[Offered]) -> None:
        """A cycle's offers, the preferred among them (scored once the output reaches them)."""
        if len(offers) > 1 and any(offer.name == self.prefer for offer in offers):
            self.pending.append(list(offers))

    def observe(self, output: Sequence[int], relative: Callable[[int], list[float]]) -> None:
        """Score every cycle whose offers the output has reached (`relative(w)`: a pass's cost over a
        plain step for widths 0..w)."""
        waiting = []
        for offers in self.pending:
            matched = [offer.matched(output) for offer in offers]
            if any(m is None for m in matched):
                waiting.append(offers)
                continue
            widths = [offer.width() for offer in offers]
            cost = relative(max(widths))
            realized = {offer.name: (m + 1) / cost[w] for offer, m, w in zip(offers, matched, widths)}
            preferred = next(i for i, offer in enumerate(offers) if offer.name == self.prefer)
            if self.both and len(union(offers).tokens) > widths[preferred]:
                self.extra[0] += 1
                self.extra[1] += max(matched) - matched[preferred]
            for name, value in realized.items():
                if name != self.prefer:
                    difference = value - realized[self.prefer]
                    total = self.against.setdefault(name, [0.0, 0.0, 0.0])
                    total[0], total[1], total[2] = total[0] + 1, total[1] + difference, total[2] + difference ** 2
        self.pending = waiting

    def clearly_ahead(self, name: str) -> float:
        """How clearly `name` has given more than the preferred drafter: its mean paired difference less
        CLEAR standard errors (> 0: clearly ahead); -inf before MIN_COMPARED cycles."""
        n, total, squares = self.against.get(name, (0.0, 0.0, 0.0))
        if n < MIN_COMPARED:
            return float("-inf")
        mean = total / n
        spread = max(squares / n - mean ** 2, 0.0) ** 0.5
        return mean - CLEAR * spread / (n - 1) ** 0.5

    def versus(self, name: str) -> dict:
        """What a cycle's offer of `name` (not the preferred) records of the comparison: the preferred
        drafter, the cycles compared, `name`'s mean paired difference (tokens per plain step's time),
        and whether that is clearly ahead."""
        n, total, _ = self.against.get(name, (0.0, 0.0, 0.0))
        return dict(preferred=self.prefer, cycles=int(n), ahead=total / n if n else 0.0,
                    clearly=self.clearly_ahead(name) > 0)

    def leader(self, names: Sequence[str]) -> str:
        """Of `names` (the preferred among them), the one that drafts: another only when clearly ahead."""
        ahead = max((name for name in names if name != self.prefer), key=self.clearly_ahead, default=None)
        return ahead if ahead is not None and self.clearly_ahead(ahead) > 0 else self.prefer

    def added(self) -> float:
        """The tokens the other copies' nodes are expected to add to the preferred copy's draft in a cycle
        where they hold nodes it does not: their mean over such cycles on this request, shrunk towards
        none by MIN_COMPARED cycles that added none (a request starts expecting nothing of them)."""
        n, total = self.extra
        return total / (n + MIN_COMPARED)

    def tokens_added(self) -> dict:
        """What a tree of both records (an offer's "added"): the cycles where the other copies held nodes
        the preferred one did not, and the tokens they are expected to add (`added`)."""
        return dict(cycles=int(self.extra[0]), tokens=self.added())
