"""A cycle drafted across tokenizers (`core.cross_tokenizer`), as the token view shows it: the draft
model's own tokens, the target tokens their text became and what the alignment cut, in one line for
a tooltip (`retokenization`) and as a closed line behind a mark that a presenter opens
(`retokenization_html`). Whitespace is made visible as in Teach (`teach_rows.visible`); the styles
are in `render.CSS` (`.sv-retok`, `.sv-piece`)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ..core.events import Cycle
from ..runs.result import CycleText
from .teach_rows import visible


def _joined(pieces: Sequence[str]) -> str:
    return "|".join(visible(p) for p in pieces) if pieces else "(no tokens)"


def retokenization(cycle: Cycle, text: CycleText) -> str:
    """A cycle drafted across tokenizers in one line: the draft model's own tokens, the target tokens
    their text became (`|` between tokens, whitespace made visible), and the end of the text the
    alignment cut. '' for a cycle drafted in the target's tokens."""
    if not cycle.is_cross_tokenizer:
        return ""
    line = f"draft: `{_joined(cycle.draft_pieces)}` \u2192 target: `{_joined(text.drafted)}`"
    if cycle.cut_text:
        line += f"; cut: `{visible(cycle.cut_text)}` (left for the next cycle)"
    return line


def _pieces_html(pieces: Sequence[str], kind: str) -> str:
    if not pieces:
        return '<span class="sv-placeholder">(no tokens)</span>'
    return "".join(f'<span class="sv-piece sv-piece-{kind}">{html.escape(visible(p))}</span>' for p in pieces)


def retokenization_html(cycle: Cycle, text: CycleText) -> str:
    """A cross-tokenizer cycle's mark (\u21c4, the line as its tooltip) that opens the line itself, each
    token boxed; '' for a cycle drafted in the target's tokens. Closed, it takes one small mark."""
    line = retokenization(cycle, text)
    if not line:
        return ""
    cut = (f'<span class="sv-retok-part">cut: {_pieces_html([cycle.cut_text], "cut")} (left for the next '
           'cycle)</span>') if cycle.cut_text else ""
    return (f'<details class="sv-retok" data-cycle="{cycle.index}"><summary title="{html.escape(line)}" '
            f'aria-label="cycle {cycle.index + 1}: the draft\'s own tokens and the target tokens they became">'
            f'\u21c4</summary><span class="sv-retok-line"><span class="sv-retok-part">draft: '
            f'{_pieces_html(cycle.draft_pieces, "draft")}</span> \u2192 <span class="sv-retok-part">target: '
            f'{_pieces_html(text.drafted, "target")}</span>{cut}</span></details>')
