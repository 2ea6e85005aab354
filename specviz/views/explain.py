"""The Explain tab's content: the theory's formulas filled in with a run's numbers, the speedup curve
against k, and one cycle drawn with the app's own token styles. Pure functions; numbers from `metrics`."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from ..core.events import ACCEPTED, REJECTED, RESAMPLED
from ..metrics import SpecStats, best_k, expected_speedup, expected_tokens_per_pass
from . import render
from .charts import layout
from .drafter_marks import drafter_word

LATEX_DELIMITERS = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
EXAMPLE_NUMBERS = dict(alpha=0.7, k=4, c=0.05)


def run_numbers(label: str, stats, measured_speedup: float | None = None,
                theory_here: float | None = None, clock: str | None = None,
                calibration: str | None = None) -> dict:
    """What the Explain tab needs of a run, as plain data (for a gr.State); `clock` timed the speedup,
    `calibration` is `prose.calibration_text` of the run."""
    return {"label": label, "stats": stats.to_dict(), "speedup": measured_speedup, "theory_here": theory_here,
            "clock": clock, "calibration": calibration}


def formulas_markdown(stats=None, *, measured_speedup: float | None = None, theory_here: float | None = None,
                      label: str | None = None, clock: str | None = None, calibration: str | None = None,
                      alpha: float | None = None, k: int | None = None, c: float | None = None) -> str:
    """The two formulas of the theory, with a run's numbers in them: tokens per pass
    (1 - α^(k+1)) / (1 - α) and speedup over (k c + 1). `stats` is a SpecStats; without one,
    `alpha`, `k`, `c` (or the example numbers) fill them."""
    if stats is not None:
        alpha, k, c = stats.alpha, max(1, round(stats.mean_k)), stats.cost_ratio
        source = f"the last run ({label})" if label else "the last run"
    else:
        alpha = EXAMPLE_NUMBERS["alpha"] if alpha is None else alpha
        k = EXAMPLE_NUMBERS["k"] if k is None else int(k)
        c = EXAMPLE_NUMBERS["c"] if c is None else c
        source = "these numbers"
    per_pass = expected_tokens_per_pass(alpha, k)
    theory = expected_speedup(alpha, k, c)
    if alpha >= 1:
        per_pass_formula = rf"E = k + 1 = {per_pass:.2f}"
    else:
        per_pass_formula = (rf"E = \frac{{1 - {alpha:.2f}^{{{k + 1}}}}}{{1 - {alpha:.2f}}} = {per_pass:.2f}")
    lines = [
        f"#### With {source}: $\\alpha = {alpha:.2f}$, $k = {k}$, $c = {c:.3f}$",
        "",
        "$$" + per_pass_formula + r"\ \text{tokens per target pass}$$",
        "",
        rf"$$S = \frac{{E}}{{k c + 1}} = \frac{{{per_pass:.2f}}}{{{k} \times {c:.3f} + 1}} = {theory:.2f}\times$$",
        "",
    ]
    if stats is not None:
        lines.append(f"Measured: **{stats.tokens_per_cycle:.2f}** tokens per target pass "
                     f"({stats.tokens} tokens in {stats.cycles} passes)"
                     + (f", and a measured speedup of **{measured_speedup:.2f}\u00d7**"
                        + (f" ({clock})" if clock else "") + " over plain decoding."
                        if measured_speedup else "."))
        if theory_here:
            lines.append(f" At this machine's measured cost of a verification pass the theory gives "
                         f"**{theory_here:.2f}\u00d7**; the ideal above assumes a pass costs one plain step.")
        if stats.cycles_paused is not None:
            lines.append(f" The cost-aware policy drafted in **{stats.cycles_drafted}** of {stats.cycles} cycles and "
                         f"paused speculation in **{stats.cycles_paused}** (a plain step where no draft length was "
                         "expected to pay); $k$ above is the most it may draft.")
        if stats.drafters:
            lines.append(" By drafter: " + "; ".join(
                f"{drafter_word(name)} drafted in **{d['num_drafts']}** cycles, {d['num_accepted_tokens']} of "
                f"{d['num_draft_tokens']} tokens accepted" for name, d in stats.drafters.items()) + ".")
        if calibration:
            lines.append(f" Its costs come from this machine: calibration {calibration}.")
        lines.append("")
    best = best_k(alpha, c)
    if expected_speedup(alpha, best, c) < 1:
        lines.append(f"At this $\\alpha$ and $c$ speculation does not pay: even the best k, {best}, gives "
                     f"{expected_speedup(alpha, best, c):.2f}\u00d7. A cheaper drafter (smaller $c$) or a better "
                     "matched one (larger $\\alpha$) would.")
    else:
        lines.append(f"The theory's best k for this $\\alpha$ and $c$ is **{best}** "
                     f"({expected_speedup(alpha, best, c):.2f}\u00d7).")
    return "\n".join(lines)


def explain_markdown(numbers: dict | None = None) -> str:
    """The formulas part of the Explain tab for a `run_numbers` payload (None: example numbers)."""
    if not numbers:
        return (formulas_markdown() + "\n\n*Example numbers: run a comparison or a step-through, and this "
                "section fills in with that run's own.*")
    return formulas_markdown(SpecStats(**numbers["stats"]), measured_speedup=numbers.get("speedup"),
                             theory_here=numbers.get("theory_here"),
                             label=numbers.get("label"), clock=numbers.get("clock"),
                             calibration=numbers.get("calibration"))


def theory_figure(alpha: float, c: float, *, k_max: int = 12, measured: tuple[int, float] | None = None,
                  label: str = "this run") -> go.Figure:
    """Expected speedup against k at this α and c, beside curves for other acceptances, and the
    measured point (k, speedup) when there is one."""
    ks = list(range(1, k_max + 1))
    traces = []
    for other in (0.5, 0.7, 0.9):
        if abs(other - alpha) > 0.02:
            traces.append(go.Scatter(x=ks, y=[expected_speedup(other, k, c) for k in ks], mode="lines",
                                     name=f"\u03b1 = {other}", line=dict(color="#b0b7c0", width=1.5, dash="dot"),
                                     hovertemplate=f"\u03b1 = {other}, k = %{{x}}: %{{y:.2f}}\u00d7<extra></extra>"))
    traces.append(go.Scatter(x=ks, y=[expected_speedup(alpha, k, c) for k in ks], mode="lines+markers",
                             name=f"\u03b1 = {alpha:.2f} ({label})", line=dict(color="#CC79A7", width=3),
                             hovertemplate="k = %{x}: %{y:.2f}\u00d7<extra></extra>"))
    if measured:
        traces.append(go.Scatter(x=[measured[0]], y=[measured[1]], mode="markers", name="measured",
                                 marker=dict(symbol="star", size=18, color="#E69F00", line=dict(color="#333", width=1)),
                                 hovertemplate="measured: %{y:.2f}\u00d7 at k = %{x}<extra></extra>"))
    fig_layout = layout(f"Theoretical speedup against k at c = {c:.3f}", hovermode="closest",
                        xaxis=dict(title="k", dtick=1),
                        yaxis=dict(title="speedup \u00d7", rangemode="tozero", gridcolor="rgba(128,128,128,0.25)"))
    fig_layout["shapes"] = [dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                             line=dict(color="#7f7f7f", width=1, dash="dot"))]
    return go.Figure(traces, layout=fig_layout)


def illustration_html() -> str:
    """One cycle drawn with the app's own token styles: four drafts, two accepted, a rejection,
    the target's correction, and the draft that was never checked."""
    example = [("The", None), (" cat", ACCEPTED), (" sat", ACCEPTED), (" in", REJECTED), (" the", REJECTED),
               (" on", RESAMPLED)]
    spans = []
    for text, verdict in example:
        if verdict is None:
            spans.append(f'<span class="sv-prompt">{html.escape(text)}</span>')
        else:
            spans.append(render.render_token(render.Piece(text, verdict, verdict)))
    steps = [
        ("Draft", "a cheap drafter proposes k = 4 tokens: \u201ccat sat in the\u201d."),
        ("Verify", "one target forward over all of them gives the target's distribution at 5 positions."),
        ("Accept", "\u201ccat\u201d and \u201csat\u201d pass; \u201cin\u201d fails, so it and everything after it is "
                      "dropped."),
        ("Correct", "the target supplies its own token, \u201con\u201d: 3 tokens for one target pass."),
    ]
    items = "".join(f"<li><b>{html.escape(a)}</b>: {html.escape(b)}</li>" for a, b in steps)
    return (f'<div class="sv-panel sv-explain"><div class="sv-text">{"".join(spans)}</div>'
            f'{render.legend_html()}<ol>{items}</ol></div>')


# Two adjacent raw strings only to keep the residual's formula within the line length; one string.
EXPLAIN_INTRO = (r"""
## Speculative decoding

A language model writes one token per forward pass, and at batch size one each pass is limited by
reading the weights from memory, not by arithmetic: a pass over five tokens costs little more than a
pass over one. Speculative decoding spends that slack. A cheap **drafter** guesses the next $k$
tokens; the **target** model scores all of them in one pass; the longest prefix the target agrees
with is kept, and the same pass supplies one more token of the target's own. Every pass yields at
least one token, and as many as $k + 1$.

The drafters here: **prompt lookup** (`ngram`) copies what followed the last few tokens where they
occurred before in the prompt or the output (free, and very good at rewrites and edits);
**early exit** (`self:L`) runs only the target's first $L$ layers and its output head; a **draft model**
is a smaller model, with the target's tokenizer or with another one (then, greedy, its text is
re-tokenized into the target's tokens each cycle and the candidates are verified one-hot, like prompt
lookup's; sampling, it drafts only tokens both vocabularies share, with their renormalised probabilities).

A **trained draft head** (`head`, `head:DIR`, `head:ORG/NAME`; EAGLE-3, Li et al. 2025) is a small
network trained on the target's own text (`python -m specviz train-draft`). It never reads the tokens from
scratch: at the newest accepted position it reads the target's hidden states at **three depths**, a low
layer (2), a middle one ($L/2$) and a high one ($L-3$) of the target's $L$ layers, fused by one linear
layer, together with the embedding of the token just chosen, and runs them through a single decoder layer;
its output goes back in for the next draft token. Why three layers: the low one still says what the
current token is, the high one what the target is about to say; the very last layer (what EAGLE-1 read)
is already shaped for the target's own next token and carries less about the one after it. It is cheap
because it is one layer where the target has many, and its output layer scores only the few thousand most
frequent tokens where the target scores its whole vocabulary; the hidden states cost nothing extra, the
verification pass computes them anyway. The same folder (the `speculators` format) serves on vLLM as
`{"method": "eagle3", "model": DIR}`.

```
target: tokens -> layers 1..L -> full output layer (every token) -> token i+1
              layers 2, L/2, L-3 -> h_i (fused)
head:   [embedding(token i+1), h_i] -> 1 layer -> output rows of frequent tokens -> draft; its output -> next step
```

### Greedy verification (temperature 0)

A drafted token $x_i$ is accepted when it is the target's most likely token at its position:

$$x_i = \arg\max_x \; p_\text{target}(x \mid \text{prefix}, x_1, \dots, x_{i-1})$$

At the first mismatch the target's argmax replaces it. The output is exactly the plain greedy output.

### Speculative sampling (temperature above 0)

Each drafted token is accepted with probability

$$P(\text{accept } x_i) = \min\left(1,\ \frac{p_\text{target}(x_i)}{p_\text{draft}(x_i)}\right)$$

which is done by drawing $u_i \sim U[0, 1)$ and accepting while $u_i < p_\text{target}(x_i) / p_\text{draft}(x_i)$.
At the first rejection, the replacement is drawn from the **residual**

$$p_\text{residual}(x) = \frac{\max\left(0,\ p_\text{target}(x) - p_\text{draft}(x)\right)}"""
                 r"""{\sum_y \max\left(0,\ p_\text{target}(y) - p_\text{draft}(y)\right)}$$

and when every draft passes, a bonus token comes from $p_\text{target}$ at the next position. Tokens
the draft over-proposes are thinned out by the test; tokens it under-proposes are topped up by the
residual; together the output is distributed **exactly** as the target's own samples (Leviathan et
al. 2023; Chen et al. 2023, where $p_\text{target}$ is $p$ and $p_\text{draft}$ is $q$).

### How fast

If each drafted token is accepted independently with probability $\alpha$, one target pass yields

$$E = \frac{1 - \alpha^{k+1}}{1 - \alpha}$$

tokens on average. With $c$ the time of one draft step over the time of one target pass, a cycle
costs $k c + 1$ target passes, so the expected speedup over plain decoding is

$$S = \frac{1 - \alpha^{k+1}}{(1 - \alpha)(k c + 1)}$$

Longer drafts pay while $\alpha$ is high and $c$ is small.

### Two theories: the ideal, and this machine's

$S$ assumes that verifying $k + 1$ tokens in one pass costs the same as generating one token. On a GPU
at batch size one that is nearly true: the pass is bound by reading the weights, and a few more tokens
ride along almost free. On a CPU it is not: the arithmetic for $k + 1$ tokens is real work, and a
verification pass costs $P$ plain steps with $P$ between about 1.1 and 2 (more in float32). The run
summary measures $P$ (the median verification pass over the median plain step) and shows the theory
**at this pass cost**, $S / P$, next to the **ideal** $S$ (pass cost 1), which is what a GPU approaches.
The measured speedup should be read against $S / P$; what remains between them is the engine's own
time and how far real acceptance is from the theory's independent-tokens model.

### How much to draft: the cost-aware policy

specviz does not draft $k$ tokens every cycle unless asked (*Fixed k*). Before each cycle it picks the
draft length $n$ from 0 to $k$ that maximises the expected tokens per unit of time,

$$\frac{E[\text{tokens} \mid n]}{P(n)}, \qquad E[\text{tokens} \mid n] = 1 + \sum_{i=1}^{n} \prod_{j \le i} c_j,$$

where $c_j$ is this request's measured chance that draft position $j$ is accepted once the ones before it
were, and $P(n)$ is what a pass verifying $n$ drafted tokens (and drafting them) costs on this machine, in
plain steps, measured. $n = 0$ is a plain step, worth exactly 1: where no draft length is expected to
beat it (by 2%), the cycle pauses speculation. Prompt lookup keeps proposing while paused (it costs
nothing) and its proposals are checked against what the target writes, so drafting resumes as soon as
they come true; other drafters probe now and then. Verification is untouched, so the output is exactly
what it would be with any $k$.

With *auto* (hybrid drafting) the same objective chooses the drafter too: each drafter (prompt lookup,
suffix decoding, the target's trained head) has its own $c_j$, learned on this request, and its own
measured drafting cost, and each cycle the one with the highest expected tokens per unit of time drafts,
or none; where both copies pay, suffix decoding drafts unless prompt lookup has clearly given more on this
request (each copy's draft is scored against the text, so what either would have given is known), and
prompt lookup's nodes that suffix decoding's draft lacks join it in one tree where what they have added
on this request pays for the wider pass. Where a copy pays and the head's short chain is expected to add
more than its nodes cost, one tree holds both branches, verified in one pass. The token view marks each
drafted token with the drafter that wrote it.
""")


def explain_outputs(numbers: dict | None):
    """Formulas, figure, and the sliders' \u03b1, k and c for a `run_numbers` payload (None: example numbers)."""
    if not numbers:
        example = EXAMPLE_NUMBERS
        figure = theory_figure(example["alpha"], example["c"], label="example")
        return explain_markdown(None), figure, example["alpha"], example["k"], example["c"]
    stats = numbers["stats"]
    k = max(1, round(stats["mean_k"]))
    measured = (k, numbers["speedup"]) if numbers.get("speedup") else None
    figure = theory_figure(stats["alpha"], stats["cost_ratio"], measured=measured)
    # The sliders' ranges: alpha 0..0.99, k 1..16, c 0..1.
    return (explain_markdown(numbers), figure, min(round(stats["alpha"], 2), 0.99), min(k, 16),
            round(min(stats["cost_ratio"], 1.0), 3))
