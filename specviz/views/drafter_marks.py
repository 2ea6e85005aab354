"""Which drafter wrote a draft, as every view names and marks it (a hybrid run, `--draft auto`): one
word a class reads at a glance, a letter for the token view and the terminal, a colour for the charts."""

from __future__ import annotations

import html

from ..settings import parse_draft

# kind -> (word, letter, colour); a draft model's and early exit's kinds are "model" and "self".
_MARKS = {
    "ngram": ("copy", "c", "#2b8a3e"),          # prompt lookup: copied from the prompt or the output
    "ngram-tree": ("copy", "c", "#2b8a3e"),
    "suffix": ("suffix", "s", "#1971c2"),
    "head": ("head", "h", "#e8590c"),
    "self": ("early exit", "e", "#9c36b5"),
    "model": ("draft model", "m", "#9c36b5"),
}
NONE_COLOUR = "#adb5bd"


def _mark(name: str) -> tuple[str, str, str]:
    return _MARKS.get(parse_draft(name).kind, _MARKS["model"])


def drafter_word(name: str) -> str:
    """'copy', 'suffix', 'head', 'early exit' or 'draft model'."""
    return _mark(name)[0]


def drafters_word(names: str) -> str:
    """The words of drafters named together ('ngram+suffix': 'copy and suffix')."""
    return " and ".join(drafter_word(name) for name in names.split("+"))


def drafter_letter(name: str) -> str:
    return _mark(name)[1]


def drafter_colour(name: str) -> str:
    return _mark(name)[2]


def legend_items(names) -> list[tuple[str, str, str]]:
    """(letter, word, colour) of each drafter named, in a fixed order, each word once."""
    seen = {}
    for name in names:
        letter, word, colour = drafter_letter(name), drafter_word(name), drafter_colour(name)
        seen.setdefault(word, (letter, word, colour))
    order = [word for word, _, _ in _MARKS.values()]
    return sorted(seen.values(), key=lambda item: order.index(item[1]))


def mark_html(name: str) -> str:
    """A hybrid cycle's mark before its draft: the drafter's letter, its word on hover."""
    word = html.escape(drafter_word(name))
    return (f'<sup class="sv-by" data-drafter="{word}" title="drafted by {word} ({html.escape(name)})">'
            f'{html.escape(drafter_letter(name))}</sup>')


def cycle_writers(cycle) -> list[str]:
    """The drafters that wrote a hybrid cycle's draft, the one expected to pay most alone first (two when
    one tree held two drafters' branches)."""
    return list(dict.fromkeys([cycle.drafter] + [w for w in cycle.node_drafters() if w]))


def marks_html(cycle) -> str:
    """A hybrid cycle's marks before its draft: each writer's letter (two for a tree of two drafters'
    branches, joined by +)."""
    return '<sup class="sv-by">+</sup>'.join(mark_html(name) for name in cycle_writers(cycle))


def legend_items_html(names) -> str:
    """The token view's legend items for a hybrid run's drafters (none for a run of one drafter)."""
    return "".join(f'<span class="sv-legend-item"><sup class="sv-by" data-drafter="{html.escape(word)}">'
                   f'{html.escape(letter)}</sup><span class="sv-tok" data-drafter="{html.escape(word)}">token</span> '
                   f'drafted by {html.escape(word)}</span>' for letter, word, _ in legend_items(names))


def drafter_css() -> str:
    """Each drafter's colour: its letter, and a line under each token it drafted (hybrid runs)."""
    rules = [".sv-by { font-size: 0.7em; font-weight: 700; font-family: var(--font, sans-serif); margin-right: 1px; }"]
    for word, colour in {word: colour for word, _, colour in _MARKS.values()}.items():
        rules.append(f'.sv-by[data-drafter="{word}"] {{ color: {colour}; }}\n'
                     f'.sv-tok[data-drafter="{word}"] {{ border-bottom: 2px solid {colour}; }}')
    return "\n".join(rules)


def choice_text(cycle) -> str:
    """Why a hybrid cycle drafted with this drafter, or with none: each drafter's offer (the length the
    policy would draft with it, the tokens it expected, and that over a plain step's time) and the
    choice. '' for a cycle of one drafter."""
    if not cycle.offers:
        return ""
    parts = []
    for offer in sorted(cycle.offers, key=lambda o: -o["gain"]):
        word = drafter_word(offer["drafter"])
        if offer.get("with"):       # one tree holding two drafters' branches
            parts.append(f"one tree of {word}'s draft and {drafters_word(offer['with'])}'s, "
                         f"{offer['length']} deep, expected {offer['expected_tokens']:.1f} tokens "
                         f"({offer['gain']:.2f}\u00d7)")
        elif offer["length"]:
            parts.append(f"{word} offered {offer['length']} token{'s' if offer['length'] != 1 else ''}, expecting "
                         f"{offer['expected_tokens']:.1f} tokens from the pass "
                         f"({offer['gain']:.2f}\u00d7 a plain step)")
        else:
            parts.append(f"{word} was not expected to pay ({offer['gain']:.2f}\u00d7)")
    parts += [versus_text(offer["drafter"], offer["versus"]) for offer in cycle.offers if offer.get("versus")]
    parts += [added_text(offer) for offer in cycle.offers if offer.get("added")]
    writers = cycle_writers(cycle) if cycle.drafter else []
    chosen = (f"{' and '.join(drafter_word(w) for w in writers)} drafted one tree, verified in one pass"
              if len(writers) > 1 else f"{drafter_word(cycle.drafter)} drafted" if cycle.drafter else
              "none drafted: a plain step" if not cycle.drafted else "")
    return "; ".join(parts) + (f". So {chosen}." if chosen else ".")


def versus_text(name: str, versus: dict) -> str:
    """Why the preferred copy drafted where another copy also paid, or why the other did (core.copy_record)."""
    word, preferred = drafter_word(name), drafter_word(versus["preferred"])
    rule = (f"where {word} and {preferred} both pay, {preferred} drafts unless {word} has clearly given more "
            f"on this request")
    if not versus["cycles"]:
        return f"{rule}: not compared yet"
    cycles = f"{versus['cycles']} cycle{'s' if versus['cycles'] != 1 else ''}"
    return (f"{rule}: it has given {versus['ahead']:+.2f} tokens a plain step's time over {cycles}, "
            + ("clearly more" if versus["clearly"] else "not clearly more"))


def added_text(offer: dict) -> str:
    """What a tree of both copies expects of the nodes the other copy adds to the preferred one's draft."""
    added, other, preferred = offer["added"], drafters_word(offer["with"]), drafter_word(offer["drafter"])
    cycles = f"{added['cycles']} cycle{'s' if added['cycles'] != 1 else ''}"
    return (f"{other}'s nodes beyond {preferred}'s draft are expected to add {added['tokens']:.2f} tokens a pass "
            f"(from the {cycles} on this request where {other} offered nodes {preferred} did not, "
            f"counted cautiously while few)")


def drafted_by_text(drafter: str | None, two_branches: bool = False) -> str:
    """A drafted token's tooltip line for a hybrid run's `drafter` ('' for any other run); `two_branches`:
    its cycle's tree held two drafters' branches."""
    if not drafter:
        return ""
    why = ("one branch of a tree that held two drafters' drafts, expected to pay more together"
           if two_branches else "the drafter chosen to pay most this cycle")
    return f"\ndrafted by {drafter_word(drafter)} ({drafter}), {why}"
