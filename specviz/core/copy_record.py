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
decoding does not pay, or where it has clearly paid more on this request."""

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
class CopyRecord:
    """One request's record (module docstring): per drafter, its realized tokens per plain step's time
    less the preferred drafter's, over the cycles both offered (count, sum, sum of squares)."""

    prefer: str
    against: dict[str, list[float]] = field(default_factory=dict)
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
