"""One drafter on several engines (specviz's own loop, vLLM, llama.cpp), the same prompts and batch
sizes: the Load tab's "all three" view. Pure functions of each engine's finished sweep (a
`runs.load_result.LoadResult`, or None with the reason it has none).

The lesson it shows: speculation saves target steps, so what it buys depends on what a plain step
costs on that engine as much as on how many drafts are accepted. Each engine's own numbers, measured
its own way (the clock, the metric and the dtype are in the table), each against its own plain
decoding:

- `side_by_side_html`: per engine, batch size and k, the plain step's cost (ms per step of the whole
  batch), both throughputs, the speedup with its 95% range, the acceptance as the engine measures it,
  tokens per target pass, and whether the greedy texts equalled plain decoding's.
- `speedup_by_engine_figure`, `step_cost_figure`, `tokens_per_pass_figure`: the three charts.
- `lesson`: one paragraph at the smallest batch size measured.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from ..runs.load_result import LoadPoint, LoadResult
from .charts import PLAIN_COLOUR, layout, waiting
from .figures import config_colour


@dataclass(frozen=True)
class EngineRun:
    """One engine's part of the comparison: its title, its sweep (None when it did not run) and why not."""

    title: str
    result: LoadResult | None = None
    error: str | None = None


def _speculative(result: LoadResult | None) -> list[LoadPoint]:
    return sorted((p for p in (result.points if result else []) if p.k > 0), key=lambda p: (p.batch, p.k))


def step_ms(point: LoadPoint) -> float | None:
    """Milliseconds of one plain step of the whole batch (every request gains a token) at this point."""
    return 1000.0 * point.batch / point.plain_tokens_per_s if point.plain_tokens_per_s else None


def how_measured(run: EngineRun) -> str:
    """'bfloat16; decode only; thread CPU time' or 'float32; output throughput ...; wall time at the client'."""
    if run.result is None:
        return ""
    settings = run.result.settings
    metric = settings.get("decision_metric_text") or "decode only (prefill left out)"
    dtype = settings.get("dtype") or "?"
    if settings.get("engine") == "llamacpp":
        dtype = "the GGUF as stored"
    return f"{dtype}; {metric.split(' (')[0] if settings.get('engine') else metric}; {settings.get('clock', '?')}"


def side_by_side_html(runs: Sequence[EngineRun]) -> str:
    """The table, then how each engine measured (or why it has no figures)."""
    head = ["engine", "batch", "k", "plain step (ms)", "plain tok/s", "spec tok/s", "speedup (95% range)",
            "acceptance", "tokens per pass", "greedy texts equal plain"]
    body = []
    for run in runs:
        for p in _speculative(run.result):
            cost = step_ms(p)
            cells = [run.title, str(p.batch), str(p.k), f"{cost:.1f}" if cost else "-",
                     f"{p.plain_tokens_per_s:.1f}", f"{p.spec_tokens_per_s:.1f}",
                     f"<b>{p.speedup:.2f}\u00d7</b> ({p.speedup_low:.2f}-{p.speedup_high:.2f})", f"{p.alpha:.0%}",
                     f"{p.tokens_per_pass:.2f}", {True: "yes", False: "no", None: "-"}[p.identical]]
            body.append("<tr>" + "".join(f"<td>{c if i == 6 else html.escape(c)}</td>" for i, c in enumerate(cells))
                        + "</tr>")
    notes = []
    for run in runs:
        if run.error:
            notes.append(f"<li><b>{html.escape(run.title)}</b>: no figures: {html.escape(run.error)}</li>")
        elif run.result is not None:
            notes.append(f"<li><b>{html.escape(run.title)}</b>: {html.escape(how_measured(run))}</li>")
    table = ("<table class='sv-engines-table'><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
             + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>") if body else ""
    return (f"<div class='sv-engines' id='load-engines-table'><div class='sv-load-title'>One drafter, "
            f"{len(runs)} engines: each against its own plain decoding</div>{table}"
            "<div class='sv-engines-notes'>Acceptance is each engine's own measure (the own loop: accepted / "
            "(accepted + rejected); vLLM and llama.cpp: accepted / drafted). How each measured:<ul>"
            + "".join(notes) + "</ul></div></div>")


def _largest_k(runs: Sequence[EngineRun]) -> int | None:
    ks = {p.k for run in runs for p in _speculative(run.result)}
    return max(ks) if ks else None


def _axis(runs: Sequence[EngineRun]) -> dict:
    batches = sorted({p.batch for run in runs for p in _speculative(run.result)})
    return dict(type="category", categoryorder="array", categoryarray=[str(b) for b in batches],
                title=dict(text="batch size"))


def speedup_by_engine_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """Each engine's speedup over its own plain decoding (95% range) at the largest k, by batch size."""
    k = _largest_k(runs)
    figure = _bars(runs, f"Speedup per engine{f' at k = {k}' if k else ''} (each against its own plain decoding)",
                   "speedup \u00d7", lambda p: p.speedup, "\u00d7",
                   "Run all three engines to see their speedups side by side", ranges=True)
    if k is not None:
        figure.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, width=1.5, dash="dot"),   # its label clear of the bars
                         annotation_text="1\u00d7 (plain decoding)", annotation_position="top right")
    return figure


def _bars(runs: Sequence[EngineRun], title: str, y_title: str, value, unit: str, empty: str,
          ranges: bool = False) -> go.Figure:
    """`value` of each engine's points at the largest k, grouped by batch size (`ranges`: with each
    point's 95% speedup range as an error bar); `empty` before any point."""
    k = _largest_k(runs)
    figure = go.Figure(layout=layout(title, "batch size", y_title, hovermode="closest"))
    if k is None:
        return waiting(figure, empty)
    for i, run in enumerate(runs):
        points = [p for p in _speculative(run.result) if p.k == k and value(p) is not None]
        if points:
            errors = dict(type="data", symmetric=False, array=[p.speedup_high - p.speedup for p in points],
                          arrayminus=[p.speedup - p.speedup_low for p in points]) if ranges else None
            figure.add_trace(go.Bar(x=[str(p.batch) for p in points], y=[value(p) for p in points], name=run.title,
                                    marker_color=config_colour(i), error_y=errors,
                                    hovertemplate=f"{run.title}, batch %{{x}}: %{{y:.2f}} {unit}<extra></extra>"))
    figure.update_layout(barmode="group", xaxis=_axis(runs), yaxis_rangemode="tozero")
    return figure


def step_cost_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """What one plain step costs on each engine: what a draft has to save."""
    return _bars(runs, "A plain step's cost per engine (what speculation saves)", "ms per step", step_ms, "ms",
                 "Run all three engines to see what a plain step costs on each")


def tokens_per_pass_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """Tokens each target pass yields on each engine at the largest k (1 = plain decoding)."""
    k = _largest_k(runs)
    return _bars(runs, f"Tokens per target pass per engine{f' at k = {k}' if k else ''}", "tokens per pass",
                 lambda p: p.tokens_per_pass, "tokens", "Run all three engines to see how many drafts each accepts")


def lesson(runs: Sequence[EngineRun]) -> str:
    """The comparison at the smallest batch size and the largest k, in words (empty before any figure)."""
    k = _largest_k(runs)
    if k is None:
        return ""
    batch = min(p.batch for run in runs for p in _speculative(run.result))
    parts = []
    for run in runs:
        point = next((p for p in _speculative(run.result) if p.k == k and p.batch == batch), None)
        if point is not None:
            cost = step_ms(point)
            parts.append(f"{run.title} **{point.speedup:.2f}\u00d7** ({point.tokens_per_pass:.2f} tokens per pass, a "
                         f"plain step {cost:.1f} ms)" if cost else f"{run.title} **{point.speedup:.2f}\u00d7**")
    return (f"Batch {batch}, k = {k}: " + "; ".join(parts) + ". Speculation saves target steps: the cheaper an "
            "engine's plain step, the less a draft can save against what drafting and verifying cost.")
