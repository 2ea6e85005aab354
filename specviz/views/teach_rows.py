"""Step mode's rows: one per drafted token, with the test that decided it recomputed from the
recorded numbers, the order the target tested them in, and the table that shows them.

Sampling: drafted token x at position i is accepted when the recorded uniform draw u_i is below
min(1, target(x) / draft(x)); the first draw that is not ends the accepted prefix, and the tokens
after it are never checked. Greedy: a drafted token is accepted when it is the target's argmax at
its position (`Cycle.target_top`). A token tree's children are tested in order at each node the
target reached (`tested_nodes`). Recomputing the verdicts from these numbers must give the cycle's
own verdicts; the tests check that it does.
"""

from __future__ import annotations

import dataclasses
import html
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core import tree_shape
from ..core.events import ACCEPTED, NOT_REACHED, REJECTED, Cycle

TokenText = Callable[[int], str]
NOT_CHECKED = "not checked"
NOT_YET = "not yet"                # stepping test by test: a node the target has not tested yet
GE = "\u2265"


def visible(text: str) -> str:
    """Token text with its whitespace made visible: leading/trailing spaces as '␣', newlines as
    '↵', tabs as '⇥', other invisible characters as their code point."""
    if text == "":
        return "\u2205"  # a token that only starts a multi-byte character
    shown = "".join(_visible_char(ch) for ch in text)
    stripped = shown.strip(" ")
    lead, trail = len(shown) - len(shown.lstrip(" ")), len(shown) - len(shown.rstrip(" "))
    return "\u2423" * lead + stripped + "\u2423" * trail if stripped else "\u2423" * len(shown)


def _visible_char(ch: str) -> str:
    if ch in VISIBLE:
        return VISIBLE[ch]
    if ch != " " and unicodedata.category(ch)[0] in "CZ":   # control, format, separator
        return f"U+{ord(ch):04X}"
    return ch


VISIBLE = {"\n": "\u21b5", "\t": "\u21e5", "\r": "\u240d"}


def number(x: float, *, latex: bool = False) -> str:
    """A probability to three decimals, or in scientific notation when it would print as 0.000."""
    if x == 0 or abs(x) >= 0.0005:
        return f"{x:.3f}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return rf"{mantissa}\times10^{{{int(exponent)}}}" if latex else f"{mantissa}e{int(exponent)}"


def acceptance_ratio(target_prob: float, draft_prob: float) -> float:
    """min(1, target / draft): the probability that speculative sampling accepts the token."""
    if draft_prob <= 0:
        return 1.0
    return min(1.0, target_prob / draft_prob)


# ----------------------------------------------------------------------------- rows

@dataclass(frozen=True)
class TokenRow:
    position: int                 # 1-based draft position
    token: int
    text: str
    draft_prob: float
    target_prob: float | None     # None: hidden, not tested yet (`up_to_test`)
    ratio: float | None           # min(1, target / draft)
    uniform: float | None         # the draw compared with `ratio` (sampling, checked tokens only)
    target_top: int | None        # greedy: the target's argmax here (checked tokens only)
    target_top_text: str | None
    checked: bool                 # False after the first rejection: never compared
    accepted: bool | None         # recomputed from the numbers above; None when not checked
    verdict: str                  # the cycle's own verdict (accepted / rejected)


def token_rows(cycle: Cycle, text_of: TokenText) -> list[TokenRow]:
    """One row per drafted token, with the test that decided it recomputed from the recorded numbers.
    A token tree's rows carry its recorded verdicts (`tree_tries` tells its tests node by node)."""
    if cycle.is_tree:   # sampling: the k-th child tried drew the k-th uniform
        draws = {} if cycle.greedy else dict(zip((child for _, _, child in tree_walk(cycle)), cycle.uniforms))
        return [TokenRow(i + 1, token, text_of(token), cycle.draft_probs[i], cycle.target_probs[i],
                         acceptance_ratio(cycle.target_probs[i], cycle.draft_probs[i]), draws.get(i), None, None,
                         verdict != NOT_REACHED, verdict == ACCEPTED if verdict != NOT_REACHED else None,
                         verdict if verdict != NOT_REACHED else REJECTED)
                for i, (token, verdict) in enumerate(zip(cycle.drafted, cycle.verdicts))]
    rows = []
    for i, token in enumerate(cycle.drafted):
        ratio = acceptance_ratio(cycle.target_probs[i], cycle.draft_probs[i])
        top = cycle.target_top[i] if cycle.greedy and i < len(cycle.target_top) else None
        uniform = cycle.uniforms[i] if not cycle.greedy and i < len(cycle.uniforms) else None
        checked = (top is not None) if cycle.greedy else (uniform is not None)
        if not checked:
            accepted = None
        elif cycle.greedy:
            accepted = token == top
        else:
            accepted = uniform < ratio
        rows.append(TokenRow(i + 1, token, text_of(token), cycle.draft_probs[i], cycle.target_probs[i], ratio,
                             uniform, top, None if top is None else text_of(top), checked, accepted,
                             cycle.verdicts[i]))
    return rows


def recomputed_num_accepted(rows: Sequence[TokenRow]) -> int:
    """Length of the accepted prefix as the recomputed tests give it."""
    n = 0
    for row in rows:
        if not row.accepted:
            break
        n += 1
    return n


def rows_html(rows: Sequence[TokenRow], greedy: bool, current: int | None = None, tree: bool = False) -> str:
    """The per-token table: the token, both probabilities, the test and its verdict; the row at
    position `current` (stepping test by test) is outlined. A sampled tree's tests are told node by
    node in the narrative (`tree_tries`): a child after a rejected sibling is tested against what is
    left of the target's distribution, which min(1, target/draft) does not show."""
    if greedy:
        head = ["#", "drafted token", "draft p", "target p", "target's argmax", "test", "verdict"]
    else:
        head = ["#", "drafted token", "draft p", "target p", "min(1, target/draft)", "uniform u", "test", "verdict"]
    body = []
    for row in rows:
        token = _token_cell(row.text, row.token)
        if not row.checked:
            test, verdict = "\u2013", NOT_YET if row.verdict == NOT_YET else NOT_CHECKED
        elif greedy:
            test = "same token" if row.accepted else "different token"
            verdict = row.verdict
        elif tree:   # a later sibling is tested against what is left of the target's distribution
            test = "\u2013" if row.uniform is None else f"u = {number(row.uniform)}: see the steps"
            verdict = row.verdict
        else:
            test = f"{number(row.uniform)} {'<' if row.accepted else GE} {number(row.ratio)}"
            verdict = row.verdict
        cells = [str(row.position), token, number(row.draft_prob), _maybe(row.target_prob)]
        if greedy:
            cells.append("" if row.target_top is None else _token_cell(row.target_top_text, row.target_top))
        else:
            cells += [_maybe(row.ratio), "" if row.uniform is None else number(row.uniform)]
        cells += [html.escape(test), _verdict_cell(verdict)]
        marked = ' class="sv-current-row"' if row.position == current else ""
        body.append(f"<tr{marked}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(head)}">The drafter proposed nothing this cycle.</td></tr>')
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (f'<div class="sv-stats sv-teach"><table aria-label="drafted tokens and their tests">'
            f'<thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _maybe(x: float | None) -> str:
    return "\u2013" if x is None else number(x)


def _token_cell(text: str | None, token: int) -> str:
    return f'<code>{html.escape(visible(text or ""))}</code> <span class="sv-id">#{token}</span>'


def _verdict_cell(verdict: str) -> str:
    if verdict == NOT_YET:
        return f'<span class="sv-not-yet">{NOT_YET}</span>'
    if verdict == NOT_CHECKED:
        # Not a verdict: grey and dashed, never the rejected colour it was mistaken for (issue 18).
        return f'<span class="sv-unchecked">{NOT_CHECKED}</span>'
    return f'<span class="sv-tok sv-{verdict}" data-verdict="{verdict}">{verdict}</span>'


def tree_walk(cycle: Cycle) -> list[tuple[int, int, int]]:
    """(depth, node reached, child tested) for each child the target tested, in order, at each node it
    reached (its children not marked "not reached": sampling tries them in turn until one is
    accepted; greedy compares every one with the argmax). Node -1 is the root (the last token)."""
    kids = tree_shape.children(cycle.parents)   # kids[node + 1]: a node's children; kids[0]: the root's
    walk = []
    for depth, visited in enumerate([-1] + cycle.accepted_nodes):
        tried = [c for c in kids[visited + 1] if cycle.verdicts[c] != NOT_REACHED]
        if not tried:
            break
        walk += [(depth, visited, child) for child in tried]
    return walk


def tested_nodes(cycle: Cycle, rows: Sequence[TokenRow]) -> list[int]:
    """The drafted tokens (node indices) the target tested, in the order it tested them: a tree's
    children node by node, a chain's positions up to the first rejection."""
    if cycle.is_tree:
        return [child for _, _, child in tree_walk(cycle)]
    return [row.position - 1 for row in rows if row.checked]


def up_to_test(rows: Sequence[TokenRow], tested: Sequence[int], test: int) -> list[TokenRow]:
    """`rows` as they stand after the test at `test` (0-based) of `tested`: the others not tested yet,
    their target probability hidden too (greedy: above 0.5 it would tell the verdict)."""
    done = set(tested[: test + 1])
    return [row if row.position - 1 in done else
            dataclasses.replace(row, target_prob=None, ratio=None, checked=False, accepted=None, uniform=None,
                                target_top=None, target_top_text=None, verdict=NOT_YET)
            for row in rows]
