"""Comparison and k-sweep charts: pure functions from results to plotly figures, one colour per
configuration (Okabe-Ito), plain decoding in grey. Transparent backgrounds, like `charts`."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import plotly.graph_objects as go

from .charts import CLOCKED, PLAIN_COLOUR, THEORY_COLOUR, layout
from .prose import baseline_labels

CONFIG_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
BEST_COLOUR = "#E69F00"
BASELINE_DASHES = ["dot", "dash", "dashdot", "longdash"]


def config_colour(i: int) -> str:
    return CONFIG_COLOURS[i % len(CONFIG_COLOURS)]


def _layout(title: str, x_title: str, y_title: str, **extra) -> dict:
    return layout(title, x_title, y_title, height=320, hovermode="closest", **extra)


# ----------------------------------------------------------------------------- comparison

def tokens_per_pass_overlay(labels: Sequence[str], results: Sequence) -> go.Figure:
    """Running mean of tokens per target pass against cycle, one line per configuration."""
    traces = []
    for i, (label, result) in enumerate(zip(labels, results)):
        emitted = [len(c.emitted) for c in result.cycles]
        running = [total / n for n, total in enumerate(accumulate(emitted), start=1)]
        traces.append(go.Scatter(
            x=list(range(1, len(running) + 1)), y=running, name=label, mode="lines",
            line=dict(color=config_colour(i), width=3), customdata=emitted,
            hovertemplate=f"{label}<br>cycle %{{x}}: %{{customdata}} tokens, mean %{{y:.2f}}<extra></extra>"))
    return go.Figure(traces, layout=_layout("Tokens per target pass (running mean)", "cycle", "tokens per pass",
                                            yaxis_rangemode="tozero"))


def position_overlay(labels: Sequence[str], results: Sequence) -> go.Figure:
    """vLLM's acceptance rate per draft position (accepted there / passes that had drafts), grouped
    bars per configuration: the same figure the engines' sweeps draw."""
    traces = []
    for i, (label, result) in enumerate(zip(labels, results)):
        by_position = result.stats.acceptance_rate_per_position
        traces.append(go.Bar(x=list(range(1, len(by_position) + 1)), y=by_position, name=label,
                             marker_color=config_colour(i),
                             hovertemplate=f"{label}<br>position %{{x}}: %{{y:.0%}} of the passes that had drafts"
                                           "<extra></extra>"))
    return go.Figure(traces, layout=_layout("Acceptance rate per draft position", "draft position", "accepted",
                                            yaxis_range=[0, 1.05], yaxis_tickformat=".0%", xaxis_dtick=1,
                                            barmode="group", bargap=0.2))


def race_overlay(labels: Sequence[str], results: Sequence, baselines: Sequence[tuple[str, Sequence]] = ()) -> go.Figure:
    """Tokens against each run's own time: every configuration, and each (name, steps) baseline."""
    traces = []
    for i, (label, result) in enumerate(zip(labels, results)):
        x = [0.0] + list(accumulate(c.seconds for c in result.cycles))
        y = [0] + list(accumulate(len(c.emitted) for c in result.cycles))
        traces.append(go.Scatter(x=x, y=y, name=label, mode="lines", line_shape="hv",
                                 line=dict(color=config_colour(i), width=3),
                                 hovertemplate=f"{label}: %{{y}} tokens at %{{x:.2f}} s<extra></extra>"))
    for n, (name, steps) in enumerate(baselines):
        traces.append(go.Scatter(x=[0.0] + list(accumulate(s.seconds for s in steps)), y=list(range(len(steps) + 1)),
                                 name=name, mode="lines", line_shape="hv",
                                 line=dict(color=PLAIN_COLOUR, width=3, dash=BASELINE_DASHES[n % 4]),
                                 hovertemplate=f"{name}: %{{y}} tokens at %{{x:.2f}} s<extra></extra>"))
    clocks = " / ".join(sorted({result.clock for result in results}))
    title = "Tokens against time" + (f" \u00b7 {CLOCKED} {clocks}" if clocks else "")
    return go.Figure(traces, layout=_layout(title, "seconds (each run's own time)", "tokens"))


def comparison_figures(comparison) -> dict[str, go.Figure]:
    """The Compare tab's charts by file name: tokens per pass, acceptance by position, the race."""
    labels, results = comparison.labels[: len(comparison.results)], comparison.results
    return {"tokens_per_pass": tokens_per_pass_overlay(labels, results),
            "acceptance_by_position": position_overlay(labels, results),
            "tokens_against_time": race_overlay(labels, results, [(name, result.steps) for name, result
                                                                   in baseline_labels(comparison)])}


# ----------------------------------------------------------------------------- k sweep

def sweep_figure(sweep) -> go.Figure:
    """Measured speedup against k, the theory's curve at the pooled α and median c, the best
    measured k (star) and the theory's best k (dashed line); 1× is plain decoding."""
    ks = [k for k, _ in sweep.points]
    measured = [r.speedup for _, r in sweep.points]
    grid = list(range(1, max(sweep.ks) + 1))
    theory = [sweep.theory(k) for k in grid]
    traces = [
        go.Scatter(x=ks, y=measured, name="measured", mode="lines+markers", line=dict(color=CONFIG_COLOURS[0], width=3),
                   marker=dict(size=9), hovertemplate="k = %{x}: %{y:.2f}\u00d7 measured<extra></extra>"),
        go.Scatter(x=grid, y=theory, name=f"theory (\u03b1 = {sweep.alpha:.2f}, c = {sweep.cost_ratio:.3f})",
                   mode="lines", line=dict(color=THEORY_COLOUR, width=2, dash="dash"),
                   hovertemplate="k = %{x}: %{y:.2f}\u00d7 in theory<extra></extra>"),
    ]
    shapes = [dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                   line=dict(color=PLAIN_COLOUR, width=1, dash="dot"))]
    annotations = []
    if ks:
        best = sweep.best_measured_k
        best_speedup = dict(sweep.points)[best].speedup
        traces.append(go.Scatter(x=[best], y=[best_speedup], name=f"best measured k = {best}", mode="markers",
                                 marker=dict(symbol="star", size=20, color=BEST_COLOUR,
                                             line=dict(color="#333", width=1)),
                                 hovertemplate="best measured: k = %{x}, %{y:.2f}\u00d7<extra></extra>"))
        theory_best = sweep.best_theory_k
        shapes.append(dict(type="line", x0=theory_best, x1=theory_best, yref="paper", y0=0, y1=1,
                           line=dict(color=THEORY_COLOUR, width=1, dash="dot")))
        annotations.append(dict(x=theory_best, yref="paper", y=1.0, text=f"theory's best k = {theory_best}",
                                showarrow=False, yanchor="bottom", font=dict(color=THEORY_COLOUR, size=12)))
    top = max([v for v in measured + theory if v is not None] + [1.0]) * 1.15
    return go.Figure(traces, layout=_layout("Speedup against k", "k (tokens drafted per cycle)", "speedup \u00d7",
                                            xaxis_dtick=1, yaxis_range=[0, top], shapes=shapes,
                                            annotations=annotations))
