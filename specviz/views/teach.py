"""Step mode: one cycle at a time, or one test at a time, with every number that decided it. Pure
functions from a `Cycle` (and a way to print token ids) to a short narrative and the step's views:
the rows and their table come from `teach_rows`, the figures from `teach_figures`.

The correction after a sampled rejection is drawn from the residual max(0, target - draft),
normalised; `Cycle.residual_top` holds its top tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import plotly.graph_objects as go

from . import render
from ..core.events import ACCEPTED, NOT_REACHED, REJECTED, RESAMPLED, Cycle
from .drafter_marks import choice_text
from .teach_figures import note_figure, residual_figure, tree_figure, verification_figure
from .teach_rows import (TokenRow, TokenText, number, rows_html, token_rows,
                         tested_nodes, tree_walk, up_to_test, visible)


# ----------------------------------------------------------------------------- narrative

def _md_token(text: str) -> str:
    # A code span: no markdown inside. '$' would still open LaTeX in the page, so it is swapped
    # for a full-width dollar sign; backticks for a prime.
    return "`" + visible(text).replace("$", "\uff04").replace("`", "\u2032") + "`"


def tree_tries(cycle: Cycle, text_of: TokenText, upto: int | None = None) -> list[str]:
    """A tree's verification node by node, in the order the target tested the children of each node
    it reached (`tree_walk`; greedy: every child against its argmax; sampling: each child in turn, a
    draw u against what is left of its distribution, until one is accepted). With `upto`, the tests
    up to that one (0-based), which is marked."""
    lines, draws, last_depth = [], iter(cycle.uniforms), None
    walk = tree_walk(cycle)
    for step, (depth, visited, child) in enumerate(walk if upto is None else walk[: upto + 1], start=1):
        if depth != last_depth:   # a paragraph between two numbered lists, blank lines around it
            last_depth = depth
            where = "after the last token" if visited < 0 else f"after {_md_token(text_of(cycle.drafted[visited]))}"
            if cycle.greedy and depth < len(cycle.target_top):
                where += f", the target's argmax is {_md_token(text_of(cycle.target_top[depth]))}"
            lines += ([""] if lines else []) + [f"**Depth {depth + 1}** ({where}):", ""]
        verdict = cycle.verdicts[child]
        token = _md_token(text_of(cycle.drafted[child]))
        if cycle.greedy:
            test = "equal to the argmax" if verdict == ACCEPTED else "not the argmax"
        else:
            u = next(draws, None)
            test = ("" if u is None else f"$u = {number(u, latex=True)}$ against its probability in what is "
                    "left of the target's distribution")
        marked = CURRENT if upto is not None and step == upto + 1 else ""
        lines.append(f"{step}. node {child + 1}, {token} (draft p {number(cycle.draft_probs[child])}): "
                     f"{test} \u2192 **{verdict}**{marked}")
    return lines


CURRENT = " \u25c0 *this test*"


def across_tokenizers(cycle: Cycle, text_of: TokenText, in_context: Sequence[str] | None = None) -> list[str]:
    """A cycle drafted across tokenizers, step by step: what the draft wrote in its own tokens, the
    target tokens its text became (`in_context`: their texts as decoded in the output, where a
    leading space shows; else each decoded on its own), what the alignment cut, and how the target
    tests the candidates. No lines for a cycle drafted in the target's tokens."""
    if not cycle.is_cross_tokenizer:
        return []
    pieces = " ".join(_md_token(p) for p in cycle.draft_pieces)
    n = len(cycle.drafted)
    became = " ".join(_md_token(t) for t in (in_context or [text_of(t) for t in cycle.drafted]))
    if not cycle.draft_pieces:
        wrote = "- The draft model, which has its own tokenizer, wrote no token this cycle."
    else:
        wrote = (f"- The draft model, which has its own tokenizer, wrote {pieces} "
                 f"({len(cycle.draft_pieces)} of its own tokens).")
    if cycle.shared_mass is not None:      # token-level intersection: one target token per draft token
        mass = sum(cycle.shared_mass) / len(cycle.shared_mass) if cycle.shared_mass else 1.0
        retokenized = (f"- The draft sampled only among its tokens whose text is exactly one target token (the "
                       f"vocabulary both share: {mass:.0%} of its probability on average this cycle), renormalised, "
                       f"so each of its tokens is a target token: {became}." if n else
                       "- The draft sampled no token the target's vocabulary shares: there is nothing to test.")
        cut = "- Nothing was cut: each draft token is a whole target token."
        test = ("- The candidates carry those renormalised draft probabilities $q$, so the target tests them "
                r"by standard speculative sampling: $x$ is accepted with probability $\min(1, p_\text{target}(x) / "
                "q(x))$, and after a rejection the correction is drawn from the normalised residual, which keeps "
                "the output distributed exactly as the target's.")
    else:
        retokenized = (f"- That text was **re-tokenized** with the target's tokenizer, after the text the target "
                       f"has already written: {became} ({n} target token{'s' if n != 1 else ''})." if n else
                       "- That text was **re-tokenized** with the target's tokenizer: it gave no whole target "
                       "token, so there is nothing to test.")
        if cycle.cut_text:
            cut = (f"- The end, {_md_token(cycle.cut_text)}, was **cut** and left for the next cycle to draft "
                   "again: past the k candidates, or (when the drafter cuts its last token) maybe the start of a "
                   "longer target token, which only more text would tell.")
        else:
            cut = "- Nothing was cut: the draft's text ended where a target token ends."
        if cycle.greedy:
            test = ("- The target verifies them as **one-hot** drafts (draft probability 1): greedy, each is "
                    "accepted when it is the target's argmax, so the output is exactly the target's own.")
        else:
            test = ("- The target verifies them as **one-hot** drafts (draft probability 1): a candidate $x$ is "
                    r"accepted with probability $\min(1, p_\text{target}(x) / 1) = p_\text{target}(x)$, and "
                    "after a rejection the correction is drawn from the target's distribution without $x$, which "
                    "keeps the output distributed exactly as the target's.")
    # Bullets, not a numbered list: the drafts' numbered tests follow, and would continue its numbers.
    return ["**Drafted across tokenizers** (the draft and the target split text differently):", "",
            wrote, retokenized, cut, test, ""]


def _row_line(row: TokenRow, greedy: bool) -> str:
    """A chain position's test, in words and in the formula's terms."""
    token = _md_token(row.text)
    if not row.checked:
        return f"{row.position}. {token}: never checked: everything after the first rejection is discarded."
    if greedy:
        same = "is" if row.accepted else "is not"
        return (f"{row.position}. {token}: the target's argmax here is {_md_token(row.target_top_text)}, "
                f"which {same} the drafted token \u2192 **{row.verdict}**")
    sign = "<" if row.accepted else r"\ge"
    u, t, d, r = (number(x, latex=True) for x in (row.uniform, row.target_prob, row.draft_prob, row.ratio))
    return (f"{row.position}. {token}: $u = {u} {sign} "
            rf"\min\left(1, \frac{{{t}}}{{{d}}}\right) = {r}$" f" \u2192 **{row.verdict}**")


def _tests_so_far(cycle: Cycle, rows: Sequence[TokenRow], tested: Sequence[int], text_of: TokenText,
                  upto: int) -> list[str]:
    """Stepping test by test: how the target checks this cycle's drafts, its `tested` nodes up to
    `upto` (the last one marked), and what comes next. It does not say how many tests there will be:
    that would tell where the first rejection is."""
    upto = max(0, min(upto, len(tested) - 1))
    if cycle.is_tree:
        how = ("compares every child of each node it reaches with its argmax and follows the one that matches"
               if cycle.greedy else "tries the children of each node it reaches in turn and follows the first "
               "it accepts")
        lines = [f"The drafter proposed a **tree** of {len(cycle.drafted)} tokens; one target pass scored them "
                 f"all. The target now {how} (grey nodes in the picture: not tested yet).", "",
                 *tree_tries(cycle, text_of, upto)]
    else:
        lines = [f"The drafter proposed {len(cycle.drafted)} token{'s' if len(cycle.drafted) > 1 else ''}; one "
                 "target pass scored them all. The target now checks them in order, up to the first it "
                 "rejects.", ""]
        lines += [_row_line(row, cycle.greedy) for row in rows if row.position - 1 in tested[: upto + 1]]
        lines[-1] += CURRENT
    more = ("Next test \u25b6 shows the next one." if upto + 1 < len(tested) else
            "That was the last test: Next test \u25b6 shows the outcome.")
    return lines + ["", f"*Test {upto + 1}. {more}*"]


def policy_pause_text(cycle: Cycle) -> str:
    """Why a cycle of the cost-aware policy did not draft."""
    return (f"**Speculation paused** (expected {cycle.expected_gain:.2f}×: paused). From what this request "
            "has accepted so far at each draft position, and what a verification pass costs on this machine, "
            "no draft length was expected to beat a plain step, so this pass verified nothing and produced one "
            "token, as plain decoding would. The drafter's proposals are still checked against what the target "
            "writes, and drafting resumes as soon as they start coming true.")


def policy_draft_text(cycle: Cycle) -> str:
    """Why a cycle of the cost-aware policy drafted what it drafted."""
    if cycle.probe:
        return (f"A **probe**: drafting was not expected to pay (expected {cycle.expected_gain:.2f}×), but "
                f"after a run of plain steps the policy drafts {cycle.planned} token"
                f"{'s' if cycle.planned != 1 else ''} to learn whether it pays again.")
    return (f"The cost-aware policy chose to draft up to **{cycle.planned}** (of at most {cycle.k}): the length "
            f"with the most expected tokens per unit of time, expected {cycle.expected_gain:.2f}× a plain step.")


def cycle_markdown(cycle: Cycle, rows: Sequence[TokenRow], text_of: TokenText, total: int | None = None,
                   upto: int | None = None, drafted_texts: Sequence[str] | None = None) -> str:
    """What happened in this cycle, in words and in the formulas' terms (Markdown with $LaTeX$). With
    `upto`, only the target's tests up to that one (0-based, see `tested_nodes`), and no outcome yet.
    `drafted_texts`: the drafted tokens' texts in context (for a cycle drafted across tokenizers)."""
    of_total = f" of {total}" if total else ""
    mode = "greedy verification" if cycle.greedy else "speculative sampling"
    lines = [f"### Cycle {cycle.index + 1}{of_total}: k = {cycle.k}, {mode}", ""]
    tested = tested_nodes(cycle, rows) if upto is not None else []
    if tested:
        return "\n".join(lines + _tests_so_far(cycle, rows, tested, text_of, upto))
    choice = choice_text(cycle)
    if choice:       # a hybrid run: which drafter drafted, and what it was compared with
        lines += [f"**Which drafter**: {choice}", ""]
    if cycle.planned == 0:
        lines.append(policy_pause_text(cycle))
    elif not cycle.drafted:
        lines.append("The drafter had nothing to propose (prompt lookup found no match), so this target pass "
                     "produced one token, as plain decoding would.")
    else:
        if cycle.planned is not None:
            lines.append(policy_draft_text(cycle))
            lines.append("")
        lines.append(f"The drafter proposed {len(cycle.drafted)} token{'s' if len(cycle.drafted) > 1 else ''}; "
                     f"one target pass scored them all at once.")
        lines.append("")
    lines += across_tokenizers(cycle, text_of, drafted_texts)
    if cycle.is_tree and cycle.drafted:
        path = " ".join(_md_token(text_of(cycle.drafted[i])) for i in cycle.accepted_nodes) or "nothing"
        lines.append(f"They form a **tree**: the target checked the children of each node it reached, "
                     f"following the one it agreed with. Accepted path: {path}; "
                     f"{cycle.verdicts.count(REJECTED)} candidates rejected where it went on, "
                     f"{cycle.verdicts.count(NOT_REACHED)} nodes under them never reached (the picture shows "
                     "the tree).")
        lines += ["", *tree_tries(cycle, text_of)]
    lines += [] if cycle.is_tree else [_row_line(row, cycle.greedy) for row in rows]
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


# ----------------------------------------------------------------------------- a run, stepped through

@dataclass
class TeachRun:
    """A finished run, ready to step through: its cycles, each cycle's token HTML and the text of
    every token id the views print. Holds no model, so it can live in session state."""
    label: str
    cycles: list[Cycle]
    cycle_html: list[str]
    texts: dict[int, str]
    drafted_texts: list[list[str]] = field(default_factory=list)   # per cycle: its drafts' texts in context

    def text_of(self, token: int) -> str:
        return self.texts.get(token, f"#{token}")


def teach_run(run, tokenizer, label: str = "") -> TeachRun:
    """From a finished `runs.Run` and its tokenizer."""
    texts = token_texts(run.cycles, lambda ids: tokenizer.decode(ids, skip_special_tokens=False,
                                                                 clean_up_tokenization_spaces=False))
    return TeachRun(label, list(run.cycles), render.run_cycles_html(run), texts, [t.drafted for t in run.texts])


class StepView(NamedTuple):
    tokens: str               # token view up to and including this cycle (HTML)
    narrative: str            # Markdown with LaTeX
    table: str                # per-token HTML table
    verification: go.Figure
    residual: go.Figure
    position: str             # "Cycle i of n"; stepping test by test ", test j" or ", outcome"


def step_view(run: TeachRun, index: int, test: int | None = None) -> StepView:
    """Everything the Teach tab shows for cycle `index` (clamped to the run): the whole cycle (`test`
    None), the target's tests up to `test` (0-based, see `tested_nodes`) and not yet the outcome, or
    with `test` past the last test the whole cycle as the outcome of stepping through it."""
    index = max(0, min(index, len(run.cycles) - 1))
    cycle = run.cycles[index]
    rows = token_rows(cycle, run.text_of)
    position = f"Cycle {index + 1} of {len(run.cycles)}"
    tested = tested_nodes(cycle, rows)
    if test is None or test >= len(tested):
        # The current cycle is marked so that the page can outline it.
        current = run.cycle_html[index].replace('class="sv-cycle"', 'class="sv-cycle sv-current"', 1)
        tokens = render.token_view_html(run.cycle_html[:index] + [current],
                                        f"{run.label} \u00b7 cycle {index + 1} of {len(run.cycles)}")
        in_context = run.drafted_texts[index] if index < len(run.drafted_texts) else None
        return StepView(tokens, cycle_markdown(cycle, rows, run.text_of, len(run.cycles), drafted_texts=in_context),
                        rows_html(rows, cycle.greedy, tree=cycle.is_tree),
                        tree_figure(cycle, run.text_of) if cycle.is_tree else verification_figure(cycle, rows),
                        residual_figure(cycle, run.text_of), position + ("" if test is None else ", outcome"))
    test = max(0, test)
    last = test == len(tested) - 1    # then the drafts not tested are known never to be
    so_far = rows if last else up_to_test(rows, tested, test)
    # This cycle's tokens are not decided yet: the token view shows the cycles before it.
    tokens = render.token_view_html(run.cycle_html[:index], f"{run.label} \u00b7 before cycle {index + 1}")
    figure = (tree_figure(cycle, run.text_of, tested[: test + 1], untested_known=last) if cycle.is_tree else
              verification_figure(cycle, so_far))
    return StepView(tokens, cycle_markdown(cycle, rows, run.text_of, len(run.cycles), upto=test),
                    rows_html(so_far, cycle.greedy, current=tested[test] + 1, tree=cycle.is_tree), figure,
                    note_figure("Correction or bonus", "Comes after the last test: press Next test."),
                    f"{position}, test {test + 1}")


def next_test(run: TeachRun, index: int, test: int | None, delta: int) -> tuple[int, int | None]:
    """Stepping test by test (`delta` +1 or -1) from cycle `index` at `test`. A cycle's steps are its
    tests (0 .. m - 1, see `tested_nodes`), then its outcome (m); they run on across cycles and stop
    at either end of the run. `test` None is the whole cycle as a cycle step showed it: Next test
    starts its tests, Previous test goes to the previous cycle's outcome."""
    def steps_in(i: int) -> int:
        return len(tested_nodes(run.cycles[i], token_rows(run.cycles[i], run.text_of)))
    index = max(0, min(index, len(run.cycles) - 1))
    steps = steps_in(index)
    if test is None:
        here = (-1 if steps else 0) if delta > 0 else 0
    else:
        here = max(0, min(test, steps))
    here += delta
    if here < 0:
        return (index, 0 if test is not None else None) if index == 0 else (index - 1, steps_in(index - 1))
    if here > steps:
        return (index, steps) if index == len(run.cycles) - 1 else (index + 1, 0)
    return index, here


def token_texts(cycles: Sequence[Cycle], decode: Callable[[list[int]], str]) -> dict[int, str]:
    """Each token id the step views print, decoded on its own."""
    ids = {t for c in cycles for t in (*c.drafted, *c.emitted, *c.target_top, *(t for t, _ in c.residual_top))}
    return {t: decode([t]) for t in ids}
