"""Events -> HTML: the token view of a speculative run and the plain text of a baseline run.

Pure functions of a run's cycles and their token texts (`runs.CycleText`). Every token is one
`<span class="sv-tok" data-verdict=...>`: accepted, rejected, resampled or bonus. Verdicts are told
apart by colour (the Okabe-Ito palette, which stays distinct under the common colour-vision
deficiencies) and by a mark that needs no colour: rejected drafts are struck through, a resampled
correction has a wavy underline, a bonus token a double underline. Cycles are separated by a thin
bar. A cycle drafted across tokenizers also tells how the draft's own tokens became target tokens
(`retokenization`): in each drafted token's tooltip, and in a line behind a mark that opens it. The
page's stylesheet is `CSS`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ..clocks import timed
from ..core import tree_shape
from ..core.events import ACCEPTED, BONUS, NOT_REACHED, REJECTED, RESAMPLED, Cycle
from ..equal_work import ALONG_NEAR_TIES
from ..runs.result import CycleText
from .drafter_marks import drafted_by_text, drafter_css, drafter_word, legend_items_html, marks_html
from .retokenization import retokenization, retokenization_html

VERDICTS = (ACCEPTED, REJECTED, RESAMPLED, BONUS)

# Okabe-Ito. Bonus is blue rather than purple: under deuteranopia the bluish green and the
# reddish purple both turn grey-blue of the same lightness, while green and blue stay apart.
COLOURS = {ACCEPTED: "#009E73", REJECTED: "#D55E00", RESAMPLED: "#E69F00", BONUS: "#0072B2"}
EARLIER_COLOUR = "#CC79A7"     # Okabe-Ito reddish purple: a line over tokens drafted from earlier requests

LEGEND_TEXT = {
    ACCEPTED: "accepted draft",
    REJECTED: "rejected draft (struck through)",
    RESAMPLED: "target's correction (wavy)",
    BONUS: "bonus: all accepted (double underline)",
}


@dataclass(frozen=True)
class Piece:
    """One token as shown: its text, its verdict and the tooltip."""
    text: str
    verdict: str
    title: str
    earlier: bool = False       # drafted only from an earlier request's text (suffix decoding)
    drafter: str | None = None  # a hybrid run: the word for the drafter that drafted it (views.drafter_marks)


def _prob(p: float | None) -> str:
    return "n/a" if p is None or p != p else f"{p:.3f}"  # p != p: NaN


def cycle_pieces(cycle: Cycle, text: CycleText) -> list[Piece]:
    """The pieces of one cycle, in reading order: the accepted drafts, the rejected drafts where
    they were proposed (a tree: the candidates tried and rejected where the path stopped or
    branched), then the target's own token. A tree's unreached nodes are not pieces (`tree_note`)."""
    pieces = []
    across = retokenization(cycle, text)
    accepted = cycle.accepted_nodes
    rejected = [i for i, v in enumerate(cycle.verdicts) if v == REJECTED]
    depths = tree_shape.depths(cycle.parents) if cycle.is_tree else None
    was_accepted = set(accepted)
    writers, two_branches = cycle.node_drafters(), cycle.drafted_by is not None
    for i in accepted + rejected:
        verdict = ACCEPTED if i in was_accepted else REJECTED
        where = f"draft {i + 1}" if depths is None else f"node {i + 1} (depth {depths[i]})"
        title = (f"cycle {cycle.index + 1}, {where}: {verdict}\n"
                 f"draft p = {_prob(cycle.draft_probs[i])}, target p = {_prob(cycle.target_probs[i])}")
        earlier = bool(cycle.from_earlier and cycle.from_earlier[i])
        if earlier:
            title += "\ndrafted from an earlier request's text (suffix decoding remembers this session's runs)"
        if across:
            title += f"\nacross tokenizers: {across}"
        writer = writers[i]
        pieces.append(Piece(text.drafted[i], verdict, title + drafted_by_text(writer, two_branches), earlier,
                            writer and drafter_word(writer)))
    if cycle.correction is not None:
        if cycle.correction_kind == RESAMPLED:
            what = "the target's correction after the rejection"
        elif cycle.drafted:
            what = "bonus: every draft accepted, the target adds one more"
        else:
            what = "bonus: nothing was drafted, the target adds its own token"
        label = "target p" if cycle.greedy else "p in the distribution it was drawn from"
        title = f"cycle {cycle.index + 1}: {what}\n{label} = {_prob(cycle.correction_prob)}"
        pieces.append(Piece(text.correction, cycle.correction_kind or BONUS, title))
    return pieces


def tree_note(cycle: Cycle, text: CycleText) -> str:
    """A tree cycle in words (for a hover): its size, and the branches that lost."""
    if not cycle.is_tree:
        return ""
    verdicts = cycle.verdicts
    kids = tree_shape.children(cycle.parents)   # kids[node + 1]: a node's children; kids[0]: the root's

    def branch(node: int) -> str:   # a node's text and its first descendants' after it
        out = text.drafted[node]
        while kids[node + 1]:
            node = kids[node + 1][0]
            out += text.drafted[node]
        return out

    lost = [branch(i) for i, v in enumerate(verdicts) if v == REJECTED]
    unreached = verdicts.count(NOT_REACHED)
    return (f"token tree: {len(cycle.drafted)} nodes verified in one pass, {len(cycle.accepted_nodes)} accepted"
            + (f"; rejected branches: {', '.join(repr(b) for b in lost)}" if lost else "")
            + (f"; {unreached} nodes under them not reached" if unreached else ""))


def cycle_html(cycle: Cycle, text: CycleText) -> str:
    """One cycle's tokens as HTML, a tree marked by a branch sign that lists what it tried, a cycle
    drafted across tokenizers by a mark that opens its re-tokenization."""
    note = tree_note(cycle, text)
    marker = (f'<span class="sv-branches" data-nodes="{len(cycle.drafted)}" tabindex="0" title="{html.escape(note)}">'
              f'\u2442{len(cycle.drafted)}</span>') if note else ""
    return render_cycle(cycle.index, cycle_pieces(cycle, text), marker + retokenization_html(cycle, text),
                        marks_html(cycle) if cycle.drafter and cycle.drafted else "")


def run_cycles_html(run) -> list[str]:
    """A run's token view, one HTML string per cycle."""
    return [cycle_html(c, t) for c, t in zip(run.cycles, run.texts)]


# ----------------------------------------------------------------------------- HTML

def token_text_html(text: str) -> str:
    """Escaped token text with newlines made visible (a return mark, then the real break).
    The container keeps other whitespace (white-space: pre-wrap)."""
    return html.escape(text).replace("\n", '<span class="sv-nl">\u21b5</span>\n')


def render_token(piece: Piece) -> str:
    if piece.verdict not in VERDICTS:
        raise ValueError(f"unknown verdict {piece.verdict!r}")
    title = piece.title if piece.text else piece.title + "\n(part of a character that the next token completes)"
    title = html.escape(title)
    earlier = (' data-earlier="1"' if piece.earlier else "") + (
        f' data-drafter="{html.escape(piece.drafter)}"' if piece.drafter else "")
    # tabindex: a token takes the keyboard focus, and Enter pins its details (the app's token-details script)
    return (f'<span class="sv-tok sv-{piece.verdict}" data-verdict="{piece.verdict}"{earlier} tabindex="0" '
            f'title="{title}">{token_text_html(piece.text)}</span>')


def render_cycle(index: int, pieces: Sequence[Piece], extra: str = "", before: str = "") -> str:
    """One cycle: its tokens (after `before`, and `extra` HTML) inside a span that draws the boundary before it."""
    tokens = "".join(render_token(p) for p in pieces)
    return f'<span class="sv-cycle" data-cycle="{index}">{before}{tokens}{extra}</span>'


def legend_html(drafters: Sequence[str] = ()) -> str:
    """The verdicts' legend; with `drafters` (a hybrid run's), each drafter's mark too."""
    items = "".join(
        f'<span class="sv-legend-item"><span class="sv-tok sv-{v}" data-legend="{v}">token</span> '
        f'{html.escape(LEGEND_TEXT[v])}</span>' for v in VERDICTS)
    bar = ('<span class="sv-legend-item"><span class="sv-cycle sv-cycle-sample"></span> '
           'one cycle (one target pass)</span>')
    return f'<div class="sv-legend" aria-label="legend">{items}{bar}{legend_items_html(drafters)}</div>'


def panel_html(title: str, status: str, body: str, *, kind: str, legend: bool = False, placeholder: str = "",
               drafters: Sequence[str] = ()) -> str:
    """A titled panel with a status line and a body of token text (`drafters`: a hybrid run's, in the legend)."""
    content = body or f'<span class="sv-placeholder">{html.escape(placeholder)}</span>'
    return (f'<div class="sv-panel sv-{kind}"><div class="sv-panel-head"><span class="sv-panel-title">'
            f'{html.escape(title)}</span><span class="sv-panel-status">{html.escape(status)}</span></div>'
            f'{legend_html(drafters) if legend else ""}<div class="sv-text">{content}</div></div>')


def token_view_html(cycle_html: Sequence[str], status: str = "", drafters: Sequence[str] = ()) -> str:
    """The speculative run: legend (with a hybrid run's `drafters`), then every cycle so far."""
    return panel_html("Speculative decoding", status, "".join(cycle_html), kind="spec", legend=True, drafters=drafters,
                      placeholder="Drafted tokens appear here, cycle by cycle.")


def baseline_html(text: str, status: str = "") -> str:
    """The plain run: its text, uncoloured."""
    return panel_html("Plain decoding (baseline)", status, token_text_html(text), kind="plain",
                      placeholder="The baseline's tokens appear here, one per target pass.")


def race_status(tokens: int, seconds: float, done: bool, clock: str) -> str:
    """A panel's status: '34 tokens \u00b7 2.06 s \u00b7 16.5 tokens/s (thread CPU time)', its clock named."""
    parts = [f"{tokens} tokens", f"{seconds:.2f} s"]
    if seconds > 0:
        parts.append(f"{tokens / seconds:.1f} tokens/s")
    parts[-1] = timed(parts[-1], clock)
    if done:
        parts.append("done")
    return " \u00b7 ".join(parts)


# ----------------------------------------------------------------------------- stylesheet

def _tint(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


CSS = f"""
.sv-panel {{ border: 1px solid var(--border-color-primary, #ccc); border-radius: 8px; padding: 10px 12px;
  background: var(--block-background-fill, transparent); }}
.sv-panel-head {{ display: flex; justify-content: space-between; gap: 12px; flex-wrap: wrap;
  font-weight: 600; margin-bottom: 6px; }}
.sv-panel-status {{ font-weight: 400; opacity: 0.8; font-variant-numeric: tabular-nums; }}
.sv-text {{ white-space: pre-wrap; word-break: break-word; line-height: 1.9; font-size: 1.05em;
  font-family: var(--font-mono, ui-monospace, monospace); max-height: 34em; overflow-y: auto; }}
.sv-placeholder {{ opacity: 0.6; font-style: italic; font-family: var(--font, sans-serif); }}
.sv-legend {{ display: flex; flex-wrap: wrap; gap: 2px 14px; font-size: 0.85em; margin: 2px 0 8px; }}
.sv-legend-item {{ white-space: nowrap; }}
.sv-tok {{ border-radius: 3px; padding: 1px 0; margin-right: 1px; text-decoration-thickness: 2px;
  text-underline-offset: 3px; }}
.sv-tok:empty {{ display: inline-block; min-width: 0.4em; min-height: 1em; vertical-align: middle; }}
.sv-tok[data-earlier] {{ box-shadow: inset 0 3px 0 {EARLIER_COLOUR}; }}
.sv-accepted {{ background: {_tint(COLOURS[ACCEPTED], 0.22)}; }}
.sv-rejected {{ background: {_tint(COLOURS[REJECTED], 0.18)}; text-decoration: line-through;
  text-decoration-color: {COLOURS[REJECTED]}; opacity: 0.85; }}
.sv-resampled {{ background: {_tint(COLOURS[RESAMPLED], 0.35)}; text-decoration: underline wavy;
  text-decoration-color: {COLOURS[RESAMPLED]}; font-weight: 700; }}
.sv-bonus {{ background: {_tint(COLOURS[BONUS], 0.22)}; text-decoration: underline double;
  text-decoration-color: {COLOURS[BONUS]}; font-weight: 700; }}
.sv-nl {{ opacity: 0.55; }}
{drafter_css()}
.sv-branches {{ font-size: 0.75em; opacity: 0.7; vertical-align: super; cursor: help; }}
details.sv-retok {{ display: inline; }}
details.sv-retok > summary {{ display: inline; list-style: none; cursor: pointer; font-size: 0.75em; opacity: 0.7;
  vertical-align: super; font-family: var(--font, sans-serif); }}
details.sv-retok > summary::-webkit-details-marker {{ display: none; }}
details.sv-retok[open] > summary {{ opacity: 1; font-weight: 700; }}
.sv-retok-line {{ display: block; white-space: normal; font-size: 0.85em; line-height: 1.7; margin: 2px 0 4px;
  padding: 2px 8px; border-left: 3px solid {COLOURS[BONUS]}; background: {_tint(COLOURS[BONUS], 0.06)}; }}
.sv-retok-part {{ margin-right: 0.6em; }}
.sv-piece {{ display: inline-block; white-space: pre; border: 1px solid rgba(128, 128, 128, 0.6);
  border-radius: 3px; padding: 0 3px; margin: 0 1px; }}
.sv-piece-cut {{ border-style: dashed; }}
.sv-cycle {{ border-left: 2px solid rgba(128, 128, 128, 0.55); margin-left: 3px; padding-left: 2px; }}
.sv-cycle-sample {{ display: inline-block; height: 1em; vertical-align: middle; }}
.sv-stats table {{ border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }}
.sv-stats table, .sv-stats tr {{ border: none !important; }}
.sv-stats td, .sv-stats th {{ padding: 3px 8px; border: none !important;
  border-bottom: 1px solid var(--border-color-primary, #ddd) !important; text-align: left; }}
.sv-stats th {{ font-weight: 600; }}
.sv-stats td.sv-num {{ text-align: right; font-weight: 600; }}
.sv-stats th.sv-num {{ text-align: right; }}
.sv-stats .sv-headline {{ font-size: 1.05em; font-weight: 600; margin: 4px 0 4px; }}
.sv-tiles {{ display: flex; flex-wrap: wrap; gap: 8px; margin: 2px 0; }}
.sv-tile {{ flex: 1 1 150px; border: 1px solid var(--border-color-primary, #ccc); border-radius: 8px;
  padding: 4px 10px; font-variant-numeric: tabular-nums; }}
.sv-tile-value {{ font-size: 1.6em; font-weight: 700; line-height: 1.2; }}
.sv-tile-caption {{ font-size: 0.85em; opacity: 0.85; }}
.sv-tile-speedup {{ flex: 1.4 1 190px; border: 2px solid {COLOURS[BONUS]}; }}
.sv-tile-speedup .sv-tile-value {{ font-size: 2.4em; color: {COLOURS[BONUS]}; }}
.dark .sv-tile-speedup .sv-tile-value {{ color: #56B4E9; }}
.sv-details > summary {{ cursor: pointer; font-weight: 600; padding: 2px 0; }}
.sv-pair-note {{ font-size: 0.9em; opacity: 0.85; }}
.sv-stats .sv-note {{ margin-top: 8px; opacity: 0.9; }}
.sv-error {{ border: 2px solid {COLOURS[REJECTED]}; border-radius: 8px; padding: 10px 12px;
  background: {_tint(COLOURS[REJECTED], 0.1)}; }}
.sv-error strong {{ color: {COLOURS[REJECTED]}; }}
"""


# ----------------------------------------------------------------------------- summary

def _row(name: str, value: str, note: str = "") -> str:
    return (f'<tr><th scope="row">{html.escape(name)}</th><td class="sv-num">{html.escape(value)}</td>'
            f'<td>{html.escape(note)}</td></tr>')


def _tile(value: str, caption: str, *, kind: str) -> str:
    return (f'<div class="sv-tile sv-tile-{kind}"><div class="sv-tile-value">{html.escape(value)}</div>'
            f'<div class="sv-tile-caption">{html.escape(caption)}</div></div>')


def outputs_text(run) -> str:
    """' · identical outputs' once a finished race that must write the same tokens both ways (greedy,
    or sampled with drafter-invariant sampling) did, the place where they part if not; '' while that is
    not known (or for classic sampled runs)."""
    if not (run.steps and run.done and run.settings.same_output):
        return ""
    if run.identical:
        return " \u00b7 identical outputs"
    if run.compared.basis == ALONG_NEAR_TIES:
        return f" \u00b7 over the same {run.compared.tokens} tokens, near-ties apart"
    return f" \u00b7 over the {run.compared.tokens} tokens both wrote"


def summary_html(run, *, state: str, notes: Sequence[str] = ()) -> str:
    """A run's numbers (a `runs.Run`) for a class to read at a glance: the speedup large, three key
    numbers (acceptance, tokens per target pass, the cost of a pass), one headline sentence; then,
    behind "Details", every figure with what it compares and how sure it is. `notes` are extra
    paragraphs for the details (plain text)."""
    from .compared_prose import compared_text, parted_text
    from .prose import (cost_ratio_text, cross_tokenizer_lines, speed_text, speedup_caption, speedup_headline,
                        theory_lines)

    spec, plain, speed = run.stats, run.plain, run.speed
    big, headline = speedup_headline(run)
    pass_cost = (f"{speed.pass_cost:.2f}", "plain steps: the cost of one verification pass") if speed else (
        "\u2013", "plain steps per verification pass")
    tiles = "".join([
        _tile(big, speedup_caption(run), kind="speedup"),
        _tile(f"{spec.draft_acceptance_rate:.0%}", f"of drafted tokens accepted ({spec.accepted} of {spec.drafted})",
              kind="acceptance"),
        _tile(f"{spec.tokens_per_cycle:.2f}", f"tokens per target pass ({spec.tokens} tokens in {spec.cycles} passes)",
              kind="per-pass"),
        _tile(*pass_cost, kind="pass-cost"),
    ])
    rows = [
        _row("Draft acceptance rate", f"{spec.draft_acceptance_rate:.1%}",
             f"{spec.accepted} of {spec.drafted} drafted tokens accepted (the figure above)"),
        _row("Mean acceptance length", f"{spec.mean_acceptance_length:.2f}", f"1 + {spec.accepted} accepted / "
             f"{spec.num_drafts} passes that had drafts: tokens per verification step, the target's own included"),
        _row("Per-token acceptance \u03b1", f"{spec.alpha:.3f}", "accepted / (accepted + rejections): a draft's "
             "chance to pass one test, the theory's a; above the rate, as drafts after a rejection go untested"),
        _row("Tokens per target pass", f"{spec.tokens_per_cycle:.2f}", f"{spec.tokens} tokens in {spec.cycles} "
             f"passes, those without drafts too; theory {spec.expected_tokens_per_pass:.2f}, mean k {spec.mean_k:.1f}"),
        *([_row("Nodes verified per pass", f"{spec.mean_nodes_per_pass:.2f}",
                f"a token tree's nodes, all verified in one pass; {spec.accepted} of {spec.drafted} accepted "
                f"({spec.draft_acceptance_rate:.1%}, the tree's efficiency)")]
          if any(c.is_tree for c in run.cycles) else []),
        *([_row("From earlier requests", f"{spec.accepted_from_earlier} accepted",
                f"of {spec.drafted_from_earlier} drafted tokens that only earlier runs' text proposed (marked "
                "by a line over the token): suffix decoding remembers this session's runs")]
          if spec.drafted_from_earlier is not None else []),
        *(_row(name, value, note) for name, value, note in cross_tokenizer_lines(run)),
        _row("Cost ratio c", cost_ratio_text(run), "one draft step's time / one target pass's time, measured"),
        _row("Measured speedup", speed_text(run) if speed else "\u2013", compared_text(run)),
        *(_row(name, value, note) for name, value, note in theory_lines(run)),
        *(_row(f"{name}, with prefill", f"{s.tokens_per_second:.1f} tokens/s",
               f"{s.tokens} tokens in " + timed(f"{s.seconds:.2f} s", run.clock))
          for name, s in (("Speculative", spec), ("Plain", plain))
          if s),
    ]
    paragraphs = "".join(f'<p class="sv-note">{html.escape(n)}</p>' for n in notes)
    state_html = f'<div class="sv-state">{html.escape(state)}</div>' if state else ""
    # The pair's one-line note (drafting across tokenizers), where the headline is read.
    note_html = f'<div class="sv-pair-note">{html.escape(run.note)}</div>' if run.note else ""
    # Greedy outputs that part break the method's promise: said first, before any figure.
    parted = parted_text(run) if run.steps else None
    parted_html = f'<div class="sv-parted" role="alert">{html.escape(parted)}</div>' if parted else ""
    return (f'<div class="sv-stats">{parted_html}<div class="sv-tiles">{tiles}</div>'
            f'<div class="sv-headline" role="status">{html.escape(headline + outputs_text(run))}</div>{note_html}'
            f'{state_html}'
            f'<details class="sv-details"><summary>Details: every figure, what it compares, the theory</summary>'
            f'<table aria-label="acceptance and speedup">{"".join(rows)}</table>{paragraphs}</details></div>')


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]], *, label: str) -> str:
    """A table of text cells: the first column left-aligned, the numbers after it right-aligned."""
    head = "".join(f'<th class="{"sv-num" if i else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="{"sv-num" if i else ""}">{html.escape(cell)}</td>'
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return (f'<div class="sv-stats"><table aria-label="{html.escape(label)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def status_html(state: str, headline: str, note: str = "") -> str:
    """A comparison's state line, its headline (the winner, or progress) and an optional note."""
    return (f'<div class="sv-stats"><div class="sv-state">{html.escape(state)}</div>'
            f'<div class="sv-winner" role="status">{html.escape(headline)}</div>'
            + (f'<p class="sv-note">{html.escape(note)}</p>' if note else "") + "</div>")


RUN_ADVICE = "Fix the settings and press Run again; the summary shows acceptance and speedup after a run."


def error_html(message: str, *, heading: str = "This run could not go ahead.", advice: str = RUN_ADVICE) -> str:
    return (f'<div class="sv-stats sv-error" role="alert"><strong>{html.escape(heading)}</strong> '
            f'{html.escape(message)}<br><span class="sv-note">{html.escape(advice)}</span></div>')


def idle_html() -> str:
    return ('<div class="sv-stats sv-idle">Press <b>Run</b>: the prompt is decoded twice, by speculative '
            'decoding and by plain decoding, interleaved on the same model. The summary shows the '
            'acceptance rate and the measured speedup.</div>')


def info_html(message: str) -> str:
    """A neutral line in a summary box (escaped)."""
    return f'<div class="sv-stats sv-info" role="status">{html.escape(message)}</div>'


def stopped_html(summary: str) -> str:
    """A summary (`summary_html` or `idle_html`) under the banner that says the run was stopped."""
    return ('<div class="sv-stopped" role="status"><b>Stopped.</b> The numbers below cover the run up to '
            'the stop.</div>' + summary)


def summary_loading_html(target: str | None, draft: str, progress: str = "") -> str:
    name = target or "the built-in SmolLM2-135M-Instruct"
    detail = f'<div class="sv-note">{html.escape(progress)}</div>' if progress else ""
    return (f'<div class="sv-stats sv-loading" role="status">Loading {html.escape(name)} with drafter '
            f'{html.escape(draft)}\u2026 A first load takes a while (the built-in model is converted from '
            f'GGUF once); later runs reuse the loaded models. The summary shows acceptance and speedup '
            f'once the run starts.{detail}</div>')
