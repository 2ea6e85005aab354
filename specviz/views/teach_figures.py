"""Step mode's figures: a cycle's tests (bars and draws), a token tree coloured by verdict, and the
residual distribution a correction was drawn from."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from . import render
from .charts import layout
from ..core.events import ACCEPTED, BONUS, NOT_REACHED, REJECTED, RESAMPLED, Cycle
from .teach_rows import NOT_YET, TokenRow, TokenText, visible


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
        tests = ["= argmax" if r.accepted else NOT_YET if r.verdict == NOT_YET else "not checked" if not r.checked
                 else "\u2260 argmax" for r in rows]
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


TREE_COLOURS = {ACCEPTED: render.COLOURS[ACCEPTED], REJECTED: render.COLOURS[REJECTED], NOT_REACHED: "#b0b7c0",
                NOT_YET: "#e3e7ec"}


def tree_figure(cycle: Cycle, text_of: TokenText, tested: Sequence[int] | None = None,
                untested_known: bool = False) -> go.Figure:
    """A token tree as drawn: the last token at the root on the left, each node one column deeper
    than its parent, an edge to its parent, coloured by verdict (accepted, rejected, not reached).
    Stepping test by test, `tested` holds the nodes tested so far: the others are "not yet" (unless
    `untested_known`: after the last test they are known never to be), and the last one tested is
    ringed."""
    depth, row, rows_used = {-1: 0}, {-1: 0.0}, {}
    for node, parent in enumerate(cycle.parents):
        depth[node] = depth[parent] + 1
        row[node] = float(rows_used.get(depth[node], 0))
        rows_used[depth[node]] = row[node] + 1
    edges_x, edges_y = [], []
    for node, parent in enumerate(cycle.parents):
        edges_x += [depth[parent], depth[node], None]
        edges_y += [row[parent], row[node], None]
    verdicts = (cycle.verdicts if tested is None or untested_known else
                [v if i in tested else NOT_YET for i, v in enumerate(cycle.verdicts)])
    labels = [visible(text_of(t)) for t in cycle.drafted]
    traces = [go.Scatter(x=edges_x, y=edges_y, mode="lines", line=dict(color="#9aa5b1", width=1.5),
                         hoverinfo="skip", showlegend=False),
              go.Scatter(x=[0], y=[0], mode="markers+text", text=["last token"], textposition="top center",
                         marker=dict(size=14, color="#555"), showlegend=False, hoverinfo="skip")]
    for verdict in (ACCEPTED, REJECTED, NOT_REACHED, NOT_YET):
        nodes = [i for i, v in enumerate(verdicts) if v == verdict]
        if nodes:
            traces.append(go.Scatter(
                x=[depth[i] for i in nodes], y=[row[i] for i in nodes], mode="markers+text", name=verdict,
                text=[labels[i] for i in nodes], textposition="top center",
                marker=dict(size=14, color=TREE_COLOURS[verdict], line=dict(color="white", width=1)),
                customdata=[[cycle.target_probs[i]] for i in nodes],
                hovertemplate=("%{text}: not tested yet<extra></extra>" if verdict == NOT_YET else
                               "%{text}: target p %{customdata[0]:.3f}<extra>" + verdict + "</extra>")))
    if tested:
        last = tested[-1]
        traces.append(go.Scatter(x=[depth[last]], y=[row[last]], mode="markers", name="this test",
                                 marker=dict(size=26, color="rgba(0,0,0,0)", line=dict(color="#0072B2", width=3)),
                                 hoverinfo="skip"))
    return go.Figure(traces, layout=_layout(
        f"The token tree: {len(cycle.drafted)} nodes in one pass, "
        + (f"{len(cycle.accepted_nodes)} accepted" if tested is None else f"{len(tested)} tested so far"),
        xaxis=dict(title="depth", dtick=1, zeroline=False), yaxis=dict(visible=False, autorange="reversed")))


def note_figure(title: str, why: str) -> go.Figure:
    """A figure with nothing to plot, saying why."""
    return go.Figure(layout=_layout(title, showlegend=False, xaxis=dict(visible=False), yaxis=dict(visible=False),
                                    annotations=[dict(text=why, x=0.5, y=0.5, xref="paper", yref="paper",
                                                      showarrow=False, font=dict(size=14))]))


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
    return note_figure("Residual distribution", why)
