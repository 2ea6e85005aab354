"""Events -> plotly figures. Pure functions of the cycles (and baseline steps) so far; the app calls
them again after each cycle, so every chart is live.

- `acceptance_figure`: acceptance per cycle, and cumulative.
- `tokens_per_pass_figure`: tokens per target pass, its running mean, the theory's value at the
  measured acceptance, and how much each cycle drafted (the cost-aware policy's draft length, with
  the cycles where it paused speculation and took a plain step).
- `race_figure`: tokens against each method's own time, for both methods, and the running speedup.
- `position_figure`: acceptance by draft position.
- `timeline_figure`: where each method's time goes, event by event: drafting and verification beside
  plain decoding's steps, on one axis.

Backgrounds are transparent so the page's light or dark theme shows through.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import plotly.graph_objects as go

from ..core.events import ACCEPTED, Cycle, Step
from ..core.tree_shape import draft_reach
from ..equal_work import ALONG_NEAR_TIES, EqualWork
from ..metrics import SpecStats, Speed, running_speedup
from .drafter_marks import cycle_writers, drafter_colour, drafter_word
from .render import COLOURS

SPEC_COLOUR, PLAIN_COLOUR, THEORY_COLOUR = "#0072B2", "#7f7f7f", "#CC79A7"
ACCEPTED_COLOUR, RUNNING_COLOUR = COLOURS[ACCEPTED], "#E69F00"


def layout(title: str, x_title: str | None = None, y_title: str | None = None, **extra) -> dict:
    """The look every specviz chart shares (transparent, so the page's theme shows through);
    `extra` overrides or adds plotly layout keys."""
    base = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        height=300, margin=dict(l=56, r=20, t=44, b=48),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
        font=dict(size=13, color="#3f3f46"),   # the page's CSS lightens it in dark mode
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, bgcolor="rgba(0,0,0,0)"),
        xaxis=dict(title=dict(text=x_title or "", standoff=4), gridcolor="rgba(128,128,128,0.25)", zeroline=False),
        yaxis=dict(title=y_title or "", gridcolor="rgba(128,128,128,0.25)", zeroline=False),
        hoverlabel=dict(bgcolor="white", font=dict(color="#222")),
        hovermode="x unified", bargap=0.15)
    base.update(extra)
    return base


def _cycle_numbers(cycles: Sequence[Cycle]) -> list[int]:
    return [c.index + 1 for c in cycles]


def acceptance_figure(cycles: Sequence[Cycle]) -> go.Figure:
    """Share of each cycle's drafts that was accepted, and the running acceptance rate."""
    x = _cycle_numbers(cycles)
    per_cycle = [c.num_accepted / len(c.drafted) if c.drafted else None for c in cycles]
    drafted = list(accumulate(len(c.drafted) for c in cycles))
    accepted = list(accumulate(c.num_accepted for c in cycles))
    cumulative = [a / d if d else None for a, d in zip(accepted, drafted)]
    return go.Figure(
        [go.Bar(x=x, y=per_cycle, name="this cycle", marker_color=ACCEPTED_COLOUR,
                customdata=[[c.num_accepted, len(c.drafted)] for c in cycles],
                hovertemplate="%{customdata[0]} of %{customdata[1]} accepted<extra></extra>"),
         go.Scatter(x=x, y=cumulative, name="cumulative", mode="lines", line=dict(color=RUNNING_COLOUR, width=3),
                    hovertemplate="cumulative %{y:.1%}<extra></extra>")],
        layout=layout("Acceptance per cycle", "cycle", "accepted drafts",
                       yaxis_range=[0, 1.05], yaxis_tickformat=".0%"))


def tokens_per_pass_figure(cycles: Sequence[Cycle], stats: SpecStats | None) -> go.Figure:
    """Tokens each target pass produced, their running mean, and the expectation
    (1 - a^(k+1)) / (1 - a) at the acceptance measured so far."""
    x = _cycle_numbers(cycles)
    emitted = [len(c.emitted) for c in cycles]
    running = [total / n for n, total in enumerate(accumulate(emitted), start=1)]
    traces = [
        go.Bar(x=x, y=emitted, name="this pass", marker_color=SPEC_COLOUR,
               hovertemplate="%{y} tokens<extra></extra>"),
        go.Scatter(x=x, y=running, name="running mean", mode="lines", line=dict(color=RUNNING_COLOUR, width=3),
                   hovertemplate="mean %{y:.2f}<extra></extra>"),
    ]
    theory = None
    if cycles and stats is not None:
        theory = stats.expected_tokens_per_pass
        traces.append(go.Scatter(
            x=[0.5, len(cycles) + 0.5], y=[theory, theory], mode="lines",
            name=f"theory at \u03b1 = {stats.alpha:.2f}", line=dict(color=THEORY_COLOUR, dash="dash", width=2),
            hovertemplate="theory %{y:.2f}<extra></extra>"))
    nodes = [len(c.drafted) for c in cycles]
    if any(c.is_tree for c in cycles):
        # A token tree verifies more candidates than it can accept: show what each pass paid for.
        traces.append(go.Scatter(x=x, y=nodes, name="nodes verified", mode="markers",
                                 marker=dict(symbol="line-ew-open", size=14, color=PLAIN_COLOUR, line=dict(width=2)),
                                 hovertemplate="%{y} nodes verified<extra></extra>"))
    else:
        nodes = []
    drafted = []
    if any(c.planned is not None for c in cycles):
        # The cost-aware policy's choice, cycle by cycle: what it drafted, and where it paused.
        drafted = [len(c.drafted) for c in cycles]
        traces.append(go.Scatter(x=x, y=drafted, name="drafted", mode="lines", line=dict(color=PLAIN_COLOUR, width=1.5,
                                                                                      shape="hvh"),
                                 customdata=[[_policy_note(c)] for c in cycles],
                                 hovertemplate="%{y} drafted%{customdata[0]}<extra></extra>"))
        # A hybrid run: which drafter each cycle chose, a marker in its colour.
        for word, chose in _by_drafter(cycles).items():
            traces.append(go.Scatter(x=_cycle_numbers(chose), y=[len(c.drafted) for c in chose],
                                     name=f"drafted by {word}", mode="markers",
                                     marker=dict(symbol="diamond" if " + " in word else "circle", size=7,
                                                 color=drafter_colour(chose[0].drafter)),
                                     customdata=[[_policy_note(c)] for c in chose],
                                     hovertemplate="%{y} drafted%{customdata[0]}<extra></extra>"))
        paused = [c for c in cycles if c.planned == 0]
        if paused:
            traces.append(go.Scatter(x=_cycle_numbers(paused), y=[0] * len(paused), name="paused (plain step)",
                                     mode="markers", marker=dict(symbol="x-thin-open", size=9, color=THEORY_COLOUR,
                                                                 line=dict(width=2)),
                                     customdata=[[_policy_note(c)] for c in paused],
                                     hovertemplate="paused%{customdata[0]}<extra></extra>"))
    top = max(emitted + nodes + drafted + [theory or 0, 1]) + 0.5
    return go.Figure(traces, layout=layout("Tokens per target pass", "cycle", "tokens", yaxis_range=[0, top]))


def _by_drafter(cycles: Sequence[Cycle]) -> dict[str, list[Cycle]]:
    """A hybrid run's drafting cycles by the word for their drafter (empty for a run of one drafter); a tree
    that held two drafters' branches: both words, 'suffix + head'."""
    groups: dict[str, list[Cycle]] = {}
    for c in cycles:
        if c.drafter and c.drafted:
            groups.setdefault(_writers_word(c), []).append(c)
    return groups


def _writers_word(cycle: Cycle) -> str:
    return " + ".join(drafter_word(name) for name in cycle_writers(cycle))


def _policy_note(cycle: Cycle) -> str:
    """The policy's reason, for a hover: ': expected 0.92x' (paused) or ': expected 1.40x'."""
    if cycle.expected_gain is None:
        return ": nothing to propose" if cycle.planned is None and not cycle.drafted else ""
    by = f" by {_writers_word(cycle)}" if cycle.drafter and cycle.drafted else ""
    return f"{by}: expected {cycle.expected_gain:.2f}x" + (" (a probe)" if cycle.probe else "")


# A chart's seconds, named in its title once a run has a clock (the axes stay as before a run).
CLOCKED = "seconds on"


def race_figure(cycles: Sequence[Cycle], steps: Sequence[Step], speed: Speed | None = None,
                compared: EqualWork | None = None, clock: str = "") -> go.Figure:
    """Tokens generated against time, each method on its own clock (the sum of its own step
    times), and the running speedup on the right axis over the events `compared` (the tokens both
    wrote: `equal_work.equal_work`; default all)."""
    spec_x = [0.0] + list(accumulate(c.seconds for c in cycles))
    spec_y = [0] + list(accumulate(len(c.emitted) for c in cycles))
    plain_x = [0.0] + list(accumulate(s.seconds for s in steps))
    plain_y = list(range(len(steps) + 1))
    speedup_x, speedup_y = running_speedup(*((compared.cycles, compared.steps) if compared else (cycles, steps)))
    title = "Tokens against time"
    if speed is not None:
        over = (f", first {compared.tokens} tokens" if compared is not None and compared.tokens < len(spec_y) - 1
                else "")
        title += f" \u2014 speedup {speed.speedup:.2f}\u00d7 (decode only{over})"
    if clock:
        title += f" \u00b7 {CLOCKED} {clock}"
    traces = [
        go.Scatter(x=spec_x, y=spec_y, name="speculative", mode="lines", line=dict(color=SPEC_COLOUR, width=3),
                   line_shape="hv", hovertemplate="speculative: %{y} tokens at %{x:.2f} s<extra></extra>"),
        go.Scatter(x=plain_x, y=plain_y, name="plain", mode="lines", line=dict(color=PLAIN_COLOUR, width=3, dash="dot"),
                   line_shape="hv", hovertemplate="plain: %{y} tokens at %{x:.2f} s<extra></extra>"),
        go.Scatter(x=speedup_x, y=speedup_y, name="running speedup (right)", mode="lines", yaxis="y2",
                   line=dict(color=RUNNING_COLOUR, width=2), hovertemplate="speedup %{y:.2f}\u00d7<extra></extra>"),
    ]
    top = max([y for y in speedup_y if y is not None] + [1.0]) * 1.15
    fig_layout = layout(title, "seconds (each method's own time)", "tokens",
                     yaxis2=dict(title="speedup \u00d7", overlaying="y", side="right", range=[0, top],
                                 showgrid=False, zeroline=False))
    fig_layout["margin"]["r"] = 56
    fig_layout["hovermode"] = "closest"
    return go.Figure(traces, layout=fig_layout)


def position_figure(cycles: Sequence[Cycle], stats: SpecStats | None) -> go.Figure:
    """For draft position i (a tree's depth i): the share of drafts reaching it whose token there was
    accepted."""
    by_position = stats.acceptance_when_reached if cycles and stats is not None else []
    reach = [draft_reach(c) for c in cycles]
    reached = [sum(r > i for r in reach) for i in range(len(by_position))]
    x = list(range(1, len(by_position) + 1))
    what = "depth" if any(c.is_tree for c in cycles) else "draft position"
    return go.Figure(
        [go.Bar(x=x, y=by_position, name="accepted", marker_color=ACCEPTED_COLOUR, customdata=reached,
                hovertemplate=f"{what} %{{x}}: %{{y:.0%}} of %{{customdata}} drafts<extra></extra>")],
        layout=layout(f"Acceptance by {what}", what, "accepted",
                       yaxis_range=[0, 1.05], yaxis_tickformat=".0%", showlegend=False,
                       xaxis_dtick=1))


DRAFT_COLOUR, VERIFY_COLOUR = "#E69F00", SPEC_COLOUR
NOT_COMPARED_OPACITY = 0.3


def timeline_figure(cycles: Sequence[Cycle], steps: Sequence[Step], compared: EqualWork | None = None,
                    clock: str = "") -> go.Figure:
    """Where the time goes, on one axis of each method's own time: the speculative lane alternates each
    cycle's drafting and its verification pass, the plain lane has one segment per step. A drafter
    pays when its passes write enough tokens to cover what drafting and a pass cost over a step. Events
    past `compared` (outputs that parted, or a longer sampled text) are faded: the speedup leaves them out."""
    kept_cycles = len(compared.cycles) if compared else len(cycles)
    kept_steps = len(compared.steps) if compared else len(steps)
    starts = [0.0] + list(accumulate(c.seconds for c in cycles))
    lane = dict(orientation="h", width=0.6, marker_line=dict(width=0.6, color="rgba(255,255,255,0.9)"))

    def faded(kept: int, n: int) -> list[float]:
        return [1.0 if i < kept else NOT_COMPARED_OPACITY for i in range(n)]

    prefill = ["(prefill included)" if i == 0 else "" for i in range(max(len(cycles), len(steps)))]
    traces = [
        go.Bar(y=["speculative"] * len(cycles), base=starts[:-1], x=[c.draft_seconds for c in cycles],
               name="drafting", marker=dict(color=DRAFT_COLOUR, opacity=faded(kept_cycles, len(cycles))),
               customdata=[[c.index + 1, len(c.drafted), c.draft_seconds * 1e3] for c in cycles],
               hovertemplate="cycle %{customdata[0]}: drafted %{customdata[1]} tokens in %{customdata[2]:.1f} ms"
                             "<extra></extra>", **lane),
        go.Bar(y=["speculative"] * len(cycles), base=[s + c.draft_seconds for s, c in zip(starts, cycles)],
               x=[c.verify_seconds for c in cycles], name="verification pass",
               marker=dict(color=VERIFY_COLOUR, opacity=faded(kept_cycles, len(cycles))),
               customdata=[[c.index + 1, len(c.drafted), c.num_accepted, len(c.emitted), c.verify_seconds * 1e3,
                            prefill[i]] for i, c in enumerate(cycles)],
               hovertemplate="cycle %{customdata[0]}: verified %{customdata[1]}, accepted %{customdata[2]}, wrote "
                             "%{customdata[3]} in %{customdata[4]:.1f} ms %{customdata[5]}<extra></extra>", **lane),
        go.Bar(y=["plain"] * len(steps), base=[0.0] + list(accumulate(s.seconds for s in steps))[:-1],
               x=[s.seconds for s in steps], name="plain step (one token)",
               marker=dict(color=PLAIN_COLOUR, opacity=faded(kept_steps, len(steps))),
               customdata=[[s.index + 1, s.seconds * 1e3, prefill[i]] for i, s in enumerate(steps)],
               hovertemplate="step %{customdata[0]}: 1 token in %{customdata[1]:.1f} ms %{customdata[2]}"
                             "<extra></extra>", **lane),
    ]
    # A hybrid run: a lane per drafter, each of its cycles (drafting and pass) in its colour; a tree of two
    # drafters' branches shows in both lanes.
    lanes: dict[str, list[int]] = {}
    for i, c in enumerate(cycles):
        if c.drafter and c.drafted:
            for name in cycle_writers(c):
                lanes.setdefault(name, []).append(i)
    words = {}
    for name, mine in lanes.items():
        word = drafter_word(name)
        words[word] = f"drafted by {word}"
        traces.append(go.Bar(y=[words[word]] * len(mine), base=[starts[i] for i in mine],
                             x=[cycles[i].seconds for i in mine], name=words[word], showlegend=False,
                             marker=dict(color=drafter_colour(name), opacity=[1.0 if i < kept_cycles else
                                                                              NOT_COMPARED_OPACITY for i in mine]),
                             customdata=[[cycles[i].index + 1, _writers_word(cycles[i]), len(cycles[i].drafted),
                                          len(cycles[i].emitted)] for i in mine],
                             hovertemplate="cycle %{customdata[0]}: %{customdata[1]} drafted %{customdata[2]}, "
                                           "wrote %{customdata[3]}<extra></extra>", **lane))
    title = "Where the time goes"
    spent = sum(c.seconds for c in cycles)
    if spent:
        title += f" (drafting {sum(c.draft_seconds for c in cycles) / spent:.0%})"
    if clock:
        title += f" \u00b7 {CLOCKED} {clock}"
    figure = go.Figure(traces, layout=layout(title, "seconds (each method's own time)", None,
                                             barmode="overlay", height=260 + 28 * len(words), hovermode="closest",
                                             yaxis=dict(categoryorder="array", categoryarray=["plain", "speculative"]
                                                        + sorted(words.values(), reverse=True),
                                                        gridcolor="rgba(0,0,0,0)")))
    figure.update_layout(margin_b=84, legend_y=-0.34)      # the legend below the axis title, clear of it
    if compared is not None and (kept_cycles < len(cycles) or kept_steps < len(steps)):
        figure.add_annotation(text=f"faded: past the {compared.tokens} tokens both wrote (not in the speedup)",
                              xref="paper", yref="paper", x=1, y=1.02, xanchor="right", yanchor="bottom",
                              showarrow=False, font=dict(size=11))
    return figure


# What each chart shows once there is data, after "Run to see" (or "Play to see" in the Replay tab).
EMPTY_TEXT = ("the share of each cycle's drafts accepted", "how many tokens each target pass wrote",
              "both methods race: tokens against time", "how far into a draft the target agrees",
              "where each method's time goes (drawn when the run ends)")


def waiting(figure: go.Figure, text: str) -> go.Figure:
    """`figure` before any data: no axes (an empty chart's default ranges mean nothing), a line saying
    what will appear. Titles and traces stay, so nothing moves when the data comes."""
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False)
    figure.update_layout(showlegend=False, annotations=[dict(text=text, xref="paper", yref="paper", x=0.5, y=0.5,
                                                             showarrow=False, font=dict(size=14))])
    return figure


def run_figures(run=None, *, action: str = "Run") -> tuple[go.Figure, ...]:
    """Every chart of the Run tab for a `runs.Run` (None: the charts before a run, saying what
    pressing `action` will show), in display order."""
    if run is None:
        empty = (acceptance_figure([]), tokens_per_pass_figure([], None), race_figure([], []),
                 position_figure([], None), timeline_figure([], []))
        return tuple(waiting(figure, f"{action} to see {text}") for figure, text in zip(empty, EMPTY_TEXT))
    stats = run.stats if run.cycles else None
    compared = run.compared if run.steps else None
    # Outputs that parted at a near-tie and were compared along the speculative text: plain decoding's
    # steps as the speedup timed them (its own before the parting, along the text after it).
    steps = compared.steps if compared is not None and compared.basis == ALONG_NEAR_TIES else run.steps
    return (acceptance_figure(run.cycles), tokens_per_pass_figure(run.cycles, stats),
            race_figure(run.cycles, steps, run.speed, compared, run.clock), position_figure(run.cycles, stats),
            timeline_figure(run.cycles, steps, compared, run.clock))


def training_figure(history: Sequence[tuple], baseline: float | None = None) -> go.Figure:
    """A draft head's training (runs.train_draft): per finished epoch its loss and its held-out
    agreement with the target (first and second drafted token), the baseline as a dashed line."""
    figure = go.Figure(layout=layout("Training the draft head", "epoch", "held-out agreement"))
    epochs = [h[0] for h in history]
    figure.add_scatter(x=epochs, y=[h[2] for h in history], mode="lines+markers", name="agreement, 1st token")
    figure.add_scatter(x=epochs, y=[h[3] for h in history], mode="lines+markers", name="agreement, 2nd token")
    figure.add_scatter(x=epochs, y=[h[1] for h in history], mode="lines+markers", name="loss", yaxis="y2")
    if baseline is not None:
        figure.add_hline(y=baseline, line_dash="dash", annotation_text="most frequent follower")
    figure.update_layout(xaxis=dict(dtick=1), yaxis=dict(tickformat=".0%", rangemode="tozero"),
                         yaxis2=dict(title="loss", overlaying="y", side="right", rangemode="tozero"))
    return figure
