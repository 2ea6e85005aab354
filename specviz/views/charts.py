"""Events -> plotly figures. Pure functions of the cycles (and baseline steps) so far; the app calls
them again after each cycle, so every chart is live.

- `acceptance_figure`: acceptance per cycle, and cumulative.
- `tokens_per_pass_figure`: tokens per target pass, its running mean, and the theory's value at
  the measured acceptance.
- `race_figure`: tokens against each method's own time, for both methods, and the running speedup.
- `position_figure`: acceptance by draft position.

Backgrounds are transparent so the page's light or dark theme shows through.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import plotly.graph_objects as go

from ..core.events import ACCEPTED, Cycle, Step
from ..core.trees import draft_reach
from ..metrics import SpecStats, Speed, running_speedup
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
    top = max(emitted + nodes + [theory or 0, 1]) + 0.5
    return go.Figure(traces, layout=layout("Tokens per target pass", "cycle", "tokens", yaxis_range=[0, top]))


def race_figure(cycles: Sequence[Cycle], steps: Sequence[Step], speed: Speed | None = None) -> go.Figure:
    """Tokens generated against time, each method on its own clock (the sum of its own step
    times), and the running speedup on the right axis."""
    spec_x = [0.0] + list(accumulate(c.seconds for c in cycles))
    spec_y = [0] + list(accumulate(len(c.emitted) for c in cycles))
    plain_x = [0.0] + list(accumulate(s.seconds for s in steps))
    plain_y = list(range(len(steps) + 1))
    speedup_x, speedup_y = running_speedup(cycles, steps)
    title = "Tokens against time"
    if speed is not None:
        title += f" \u2014 speedup {speed.speedup:.2f}\u00d7 (decode only)"
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
    by_position = stats.acceptance_by_position if cycles and stats is not None else []
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


# What each chart shows once there is data, after "Run to see" (or "Play to see" in the Replay tab).
EMPTY_TEXT = ("the share of each cycle's drafts accepted", "how many tokens each target pass wrote",
              "both methods race: tokens against time", "how far into a draft the target agrees")


def waiting(figure: go.Figure, text: str) -> go.Figure:
    """`figure` before any data: no axes (an empty chart's default ranges mean nothing), a line saying
    what will appear. Titles and traces stay, so nothing moves when the data comes."""
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False)
    figure.update_layout(showlegend=False, annotations=[dict(text=text, xref="paper", yref="paper", x=0.5, y=0.5,
                                                             showarrow=False, font=dict(size=14))])
    return figure


def run_figures(run=None, *, action: str = "Run") -> tuple[go.Figure, go.Figure, go.Figure, go.Figure]:
    """Every chart of the Run tab for a `runs.Run` (None: the charts before a run, saying what
    pressing `action` will show), in display order."""
    if run is None:
        empty = (acceptance_figure([]), tokens_per_pass_figure([], None), race_figure([], []),
                 position_figure([], None))
        return tuple(waiting(figure, f"{action} to see {text}") for figure, text in zip(empty, EMPTY_TEXT))
    stats = run.stats if run.cycles else None
    return (acceptance_figure(run.cycles), tokens_per_pass_figure(run.cycles, stats),
            race_figure(run.cycles, run.steps, run.speed), position_figure(run.cycles, stats))


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
