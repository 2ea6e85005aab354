"""Step mode: one cycle at a time, with every number that decided it. Pure functions from a `Cycle`
(and a way to print token ids) to table rows, a short narrative and figures.

Sampling: drafted token x at position i is accepted when the recorded uniform draw u_i is below
min(1, target(x) / draft(x)); the first draw that is not ends the accepted prefix, and the tokens
after it are never checked. The correction is drawn from the residual max(0, target - draft),
normalised; `Cycle.residual_top` holds its top tokens. Greedy: a drafted token is accepted when it
is the target's argmax at its position (`Cycle.target_top`). Recomputing the verdicts from these
numbers must give the cycle's own verdicts; the tests check that it does.
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import plotly.graph_objects as go

from . import render
from .charts import layout
from ..core import trees
from ..core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED, Cycle

TokenText = Callable[[int], str]
NOT_CHECKED = "not checked"
NOT_REACHED_NODE = "not reached"   # a tree node under a branch that lost
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
    target_prob: float
    ratio: float                  # min(1, target / draft)
    uniform: float | None         # the draw compared with `ratio` (sampling, checked tokens only)
    target_top: int | None        # greedy: the target's argmax here (checked tokens only)
    target_top_text: str | None
    checked: bool                 # False after the first rejection: never compared
    accepted: bool | None         # recomputed from the numbers above; None when not checked
    verdict: str                  # the cycle's own verdict (accepted / rejected)


def token_rows(cycle: Cycle, text_of: TokenText) -> list[TokenRow]:
    """One row per drafted token, with the test that decided it recomputed from the recorded numbers.
    A token tree's rows carry its recorded verdicts (`tree_tries` tells its tests node by node)."""
    if cycle.is_tree:
        return [TokenRow(i + 1, token, text_of(token), cycle.draft_probs[i], cycle.target_probs[i],
                         acceptance_ratio(cycle.target_probs[i], cycle.draft_probs[i]), None, None, None,
                         verdict != NOT_REACHED_NODE, verdict == ACCEPTED if verdict != NOT_REACHED_NODE else None,
                         verdict if verdict != NOT_REACHED_NODE else REJECTED)
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


def rows_html(rows: Sequence[TokenRow], greedy: bool) -> str:
    """The per-token table: the token, both probabilities, the test and its verdict."""
    if greedy:
        head = ["#", "drafted token", "draft p", "target p", "target's argmax", "test", "verdict"]
    else:
        head = ["#", "drafted token", "draft p", "target p", "min(1, target/draft)", "uniform u", "test", "verdict"]
    body = []
    for row in rows:
        token = _token_cell(row.text, row.token)
        if not row.checked:
            test, verdict = "\u2013", NOT_CHECKED
        elif greedy:
            test = "same token" if row.accepted else "different token"
            verdict = row.verdict
        else:
            test = f"{number(row.uniform)} {'<' if row.accepted else GE} {number(row.ratio)}"
            verdict = row.verdict
        cells = [str(row.position), token, number(row.draft_prob), number(row.target_prob)]
        if greedy:
            cells.append("" if row.target_top is None else _token_cell(row.target_top_text, row.target_top))
        else:
            cells += [number(row.ratio), "" if row.uniform is None else number(row.uniform)]
        cells += [html.escape(test), _verdict_cell(verdict)]
        body.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    if not rows:
        body.append(f'<tr><td colspan="{len(head)}">The drafter proposed nothing this cycle.</td></tr>')
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (f'<div class="sv-stats sv-teach"><table aria-label="drafted tokens and their tests">'
            f'<thead><tr>{header}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _token_cell(text: str | None, token: int) -> str:
    return f'<code>{html.escape(visible(text or ""))}</code> <span class="sv-id">#{token}</span>'


def _verdict_cell(verdict: str) -> str:
    if verdict == NOT_CHECKED:
        return f'<span class="sv-tok sv-rejected" data-verdict="{REJECTED}">{NOT_CHECKED}</span>'
    return f'<span class="sv-tok sv-{verdict}" data-verdict="{verdict}">{verdict}</span>'


# ----------------------------------------------------------------------------- narrative

def _md_token(text: str) -> str:
    # A code span: no markdown inside. '$' would still open LaTeX in the page, so it is swapped
    # for a full-width dollar sign; backticks for a prime.
    return "`" + visible(text).replace("$", "\uff04").replace("`", "\u2032") + "`"


def tree_tries(cycle: Cycle, text_of: TokenText) -> list[str]:
    """A tree's verification node by node, in the order the target tried the children: at each node
    it reached, each child until one was accepted (greedy: the child equal to its argmax; sampling:
    a draw u against what is left of its distribution)."""
    kids = trees.children(cycle.parents)   # kids[node + 1]: a node's children; kids[0]: the root's
    lines, draws, step = [], iter(cycle.uniforms), 0
    for depth, visited in enumerate([-1] + cycle.accepted_nodes):
        tried = [c for c in kids[visited + 1] if cycle.verdicts[c] != NOT_REACHED_NODE]
        if not tried:
            break
        where = "after the last token" if visited < 0 else f"after {_md_token(text_of(cycle.drafted[visited]))}"
        if cycle.greedy and depth < len(cycle.target_top):
            where += f", the target's argmax is {_md_token(text_of(cycle.target_top[depth]))}"
        lines.append(f"**Depth {depth + 1}** ({where}):")
        for child in tried:
            step += 1
            verdict = cycle.verdicts[child]
            token = _md_token(text_of(cycle.drafted[child]))
            if cycle.greedy:
                test = "equal to the argmax" if verdict == ACCEPTED else "not the argmax"
            else:
                u = next(draws, None)
                test = ("" if u is None else f"$u = {number(u, latex=True)}$ against its probability in what is "
                        "left of the target's distribution")
            lines.append(f"{step}. node {child + 1}, {token} (draft p {number(cycle.draft_probs[child])}): "
                         f"{test} \u2192 **{verdict}**")
    return lines


def cycle_markdown(cycle: Cycle, rows: Sequence[TokenRow], text_of: TokenText, total: int | None = None) -> str:
    """What happened in this cycle, in words and in the formulas' terms (Markdown with $LaTeX$)."""
    of_total = f" of {total}" if total else ""
    mode = "greedy verification" if cycle.greedy else "speculative sampling"
    lines = [f"### Cycle {cycle.index + 1}{of_total}: k = {cycle.k}, {mode}", ""]
    if not cycle.drafted:
        lines.append("The drafter had nothing to propose (prompt lookup found no match), so this target pass "
                     "produced one token, as plain decoding would.")
    else:
        lines.append(f"The drafter proposed {len(cycle.drafted)} token{'s' if len(cycle.drafted) > 1 else ''}; "
                     f"one target pass scored them all at once.")
        lines.append("")
    if cycle.is_tree and cycle.drafted:
        path = " ".join(_md_token(text_of(cycle.drafted[i])) for i in cycle.accepted_nodes) or "nothing"
        lines.append(f"They form a **tree**: the target checked the children of each node it reached, "
                     f"following the one it agreed with. Accepted path: {path}; "
                     f"{cycle.verdicts.count(REJECTED)} candidates rejected where it went on, "
                     f"{cycle.verdicts.count(NOT_REACHED_NODE)} nodes under them never reached (the picture shows "
                     "the tree).")
        lines += ["", *tree_tries(cycle, text_of)]
    for row in ([] if cycle.is_tree else rows):
        token = _md_token(row.text)
        if not row.checked:
            lines.append(f"{row.position}. {token}: never checked: everything after the first rejection is "
                         "discarded.")
        elif cycle.greedy:
            same = "is" if row.accepted else "is not"
            lines.append(f"{row.position}. {token}: the target's argmax here is {_md_token(row.target_top_text)}, "
                         f"which {same} the drafted token \u2192 **{row.verdict}**")
        else:
            sign = "<" if row.accepted else r"\ge"
            u, t, d, r = (number(x, latex=True) for x in (row.uniform, row.target_prob, row.draft_prob, row.ratio))
            lines.append(f"{row.position}. {token}: $u = {u} {sign} "
                         rf"\min\left(1, \frac{{{t}}}{{{d}}}\right) = {r}$" f" \u2192 **{row.verdict}**")
    lines.append("")
    if cycle.correction is None:
        lines.append("The last accepted draft was the end-of-sequence token, so the run ends here.")
    elif cycle.correction_kind == RESAMPLED:
        correction = _md_token(text_of(cycle.correction))
        if cycle.greedy:
            lines.append(f"The target's own choice, {correction}, replaces the rejected draft.")
        else:
            lines.append(r"The correction is drawn from the residual $\max(0,\ p_\text{target} - p_\text{draft})$, "
                         f"normalised: it gave {correction} (probability {cycle.correction_prob:.3f} there). "
                         "Drawing from the residual, rather than from the target, is what keeps the output "
                         "distributed exactly as the target's.")
    elif cycle.drafted:
        lines.append(f"Every draft was accepted, so the same target pass also gives one more token for free: "
                     f"the bonus {_md_token(text_of(cycle.correction))}.")
    else:
        lines.append(f"The target's token: {_md_token(text_of(cycle.correction))}.")
    lines.append("")
    lines.append(f"**This pass emitted {len(cycle.emitted)} token{'s' if len(cycle.emitted) != 1 else ''}** "
                 f"({cycle.num_accepted} accepted draft{'s' if cycle.num_accepted != 1 else ''}"
                 f"{' + 1 from the target' if cycle.correction is not None else ''}).")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures

def _layout(title: str, **extra) -> dict:
    return layout(title, **{"margin": dict(l=56, r=20, t=44, b=56), "hovermode": "closest",
                            "legend": dict(orientation="h", yanchor="top", y=-0.25, x=0, bgcolor="rgba(0,0,0,0)"),
                            **extra})


def _verdict_colour(row: TokenRow) -> str:
    return render.COLOURS[ACCEPTED] if row.accepted else "#999999" if not row.checked else render.COLOURS[REJECTED]


def verification_figure(cycle: Cycle, rows: Sequence[TokenRow]) -> go.Figure:
    """Sampling: per drafted token, a bar of min(1, target/draft) and a diamond at the uniform draw
    (accepted when the diamond is below the bar top). Greedy: draft and target probability of each
    drafted token, with the argmax test under each bar."""
    x = [f"{row.position}. {visible(row.text)}" for row in rows]
    colours = [_verdict_colour(row) for row in rows]
    if cycle.greedy:
        traces = [go.Bar(x=x, y=[r.draft_prob for r in rows], name="draft p", marker_color="#56B4E9",
                         hovertemplate="draft p %{y:.3f}<extra></extra>"),
                  go.Bar(x=x, y=[r.target_prob for r in rows], name="target p", marker_color=colours,
                         hovertemplate="target p %{y:.3f}<extra></extra>")]
        tests = ["= argmax" if r.accepted else "not checked" if not r.checked else "\u2260 argmax" for r in rows]
        ticks = [f"{xi}<br>{test}" for xi, test in zip(x, tests)]
        layout = _layout("Greedy: is each draft the target's argmax?", barmode="group",
                         yaxis=dict(range=[0, 1.05], title="probability", gridcolor="rgba(128,128,128,0.25)"),
                         xaxis=dict(tickvals=x, ticktext=ticks))
        return go.Figure(traces, layout=layout)
    traces = [
        go.Bar(x=x, y=[r.ratio for r in rows], name="min(1, target/draft): accept probability",
               marker_color=colours, customdata=[[r.target_prob, r.draft_prob] for r in rows],
               hovertemplate="min(1, %{customdata[0]:.3f} / %{customdata[1]:.3f}) = %{y:.3f}<extra></extra>"),
        go.Scatter(x=[xi for xi, r in zip(x, rows) if r.uniform is not None],
                   y=[r.uniform for r in rows if r.uniform is not None], name="uniform draw u (accept if below)",
                   mode="markers",
                   marker=dict(symbol="diamond", size=14, color="#222", line=dict(color="white", width=1)),
                   hovertemplate="u = %{y:.3f}<extra></extra>"),
    ]
    layout = _layout("Sampling: accept while u < min(1, target/draft)",
                     yaxis=dict(range=[0, 1.05], title="probability", gridcolor="rgba(128,128,128,0.25)"))
    return go.Figure(traces, layout=layout)


TREE_COLOURS = {ACCEPTED: render.COLOURS[ACCEPTED], REJECTED: render.COLOURS[REJECTED], NOT_REACHED_NODE: "#b0b7c0"}


def tree_figure(cycle: Cycle, text_of: TokenText) -> go.Figure:
    """A token tree as drawn: the last token at the root on the left, each node one column deeper
    than its parent, an edge to its parent, coloured by verdict (accepted, rejected, not reached)."""
    depth, row, rows_used = {-1: 0}, {-1: 0.0}, {}
    for node, parent in enumerate(cycle.parents):
        depth[node] = depth[parent] + 1
        row[node] = float(rows_used.get(depth[node], 0))
        rows_used[depth[node]] = row[node] + 1
    edges_x, edges_y = [], []
    for node, parent in enumerate(cycle.parents):
        edges_x += [depth[parent], depth[node], None]
        edges_y += [row[parent], row[node], None]
    verdicts = cycle.verdicts
    labels = [visible(text_of(t)) for t in cycle.drafted]
    traces = [go.Scatter(x=edges_x, y=edges_y, mode="lines", line=dict(color="#9aa5b1", width=1.5),
                         hoverinfo="skip", showlegend=False),
              go.Scatter(x=[0], y=[0], mode="markers+text", text=["last token"], textposition="top center",
                         marker=dict(size=14, color="#555"), showlegend=False, hoverinfo="skip")]
    for verdict in (ACCEPTED, REJECTED, NOT_REACHED_NODE):
        nodes = [i for i, v in enumerate(verdicts) if v == verdict]
        if nodes:
            traces.append(go.Scatter(
                x=[depth[i] for i in nodes], y=[row[i] for i in nodes], mode="markers+text", name=verdict,
                text=[labels[i] for i in nodes], textposition="top center",
                marker=dict(size=14, color=TREE_COLOURS[verdict], line=dict(color="white", width=1)),
                customdata=[[cycle.target_probs[i]] for i in nodes],
                hovertemplate="%{text}: target p %{customdata[0]:.3f}<extra>" + verdict + "</extra>"))
    return go.Figure(traces, layout=_layout(
        f"The token tree: {len(cycle.drafted)} nodes in one pass, {len(cycle.accepted_nodes)} accepted",
        xaxis=dict(title="depth", dtick=1, zeroline=False), yaxis=dict(visible=False, autorange="reversed")))


def residual_figure(cycle: Cycle, text_of: TokenText) -> go.Figure:
    """After a sampled rejection: the top of the residual distribution the correction came from,
    the correction highlighted. Otherwise a figure that says why there is none."""
    if cycle.residual_top:
        labels = [f"{visible(text_of(t))} #{t}" for t, _ in cycle.residual_top]
        colours = [render.COLOURS[RESAMPLED] if t == cycle.correction else "#9aa5b1" for t, _ in cycle.residual_top]
        figure = go.Figure(
            [go.Bar(y=labels, x=[p for _, p in cycle.residual_top], orientation="h", marker_color=colours,
                    name="residual", hovertemplate="%{y}: %{x:.3f}<extra></extra>")],
            layout=_layout("Residual max(0, target \u2212 draft), normalised: top tokens", showlegend=False,
                           xaxis=dict(title="probability", gridcolor="rgba(128,128,128,0.25)"),
                           yaxis=dict(autorange="reversed")))
        return figure
    if cycle.correction is None:
        why = "The run ended on an accepted end-of-sequence token."
    elif cycle.correction_kind == BONUS:
        why = "No rejection: every draft was accepted, and the bonus token came from the target itself."
    else:  # greedy: the correction is simply the argmax
        why = "Greedy: after a mismatch the target's argmax is the correction; there is no residual to draw from."
    return go.Figure(layout=_layout("Residual distribution", showlegend=False, xaxis=dict(visible=False),
                                    yaxis=dict(visible=False),
                                    annotations=[dict(text=why, x=0.5, y=0.5, xref="paper", yref="paper",
                                                      showarrow=False, font=dict(size=14))]))


# ----------------------------------------------------------------------------- a run, stepped through

@dataclass
class TeachRun:
    """A finished run, ready to step through: its cycles, each cycle's token HTML and the text of
    every token id the views print. Holds no model, so it can live in session state."""
    label: str
    cycles: list[Cycle]
    cycle_html: list[str]
    texts: dict[int, str]

    def text_of(self, token: int) -> str:
        return self.texts.get(token, f"#{token}")


def teach_run(run, tokenizer, label: str = "") -> TeachRun:
    """From a finished `runs.Run` and its tokenizer."""
    texts = token_texts(run.cycles, lambda ids: tokenizer.decode(ids, skip_special_tokens=False,
                                                                 clean_up_tokenization_spaces=False))
    return TeachRun(label, list(run.cycles), render.run_cycles_html(run), texts)


class StepView(NamedTuple):
    tokens: str               # token view up to and including this cycle (HTML)
    narrative: str            # Markdown with LaTeX
    table: str                # per-token HTML table
    verification: go.Figure
    residual: go.Figure
    position: str             # "cycle i of n"


def step_view(run: TeachRun, index: int) -> StepView:
    """Everything the Teach tab shows for cycle `index` (clamped to the run)."""
    index = max(0, min(index, len(run.cycles) - 1))
    cycle = run.cycles[index]
    rows = token_rows(cycle, run.text_of)
    # The current cycle is marked so that the page can outline it.
    current = run.cycle_html[index].replace('class="sv-cycle"', 'class="sv-cycle sv-current"', 1)
    shown = run.cycle_html[:index] + [current]
    tokens = render.token_view_html(shown, f"{run.label} \u00b7 cycle {index + 1} of {len(run.cycles)}")
    return StepView(tokens, cycle_markdown(cycle, rows, run.text_of, len(run.cycles)), rows_html(rows, cycle.greedy),
                    tree_figure(cycle, run.text_of) if cycle.is_tree else verification_figure(cycle, rows),
                    residual_figure(cycle, run.text_of), f"Cycle {index + 1} of {len(run.cycles)}")


def token_texts(cycles: Sequence[Cycle], decode: Callable[[list[int]], str]) -> dict[int, str]:
    """Each token id the step views print, decoded on its own."""
    ids = {t for c in cycles for t in (*c.drafted, *c.emitted, *c.target_top, *(t for t, _ in c.residual_top))}
    return {t: decode([t]) for t in ids}
