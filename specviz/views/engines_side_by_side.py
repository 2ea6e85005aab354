"""One drafter on several engines (specviz's own loop, vLLM, llama.cpp), the same prompts and batch
sizes: the Load tab's "all three" view. Pure functions of each engine's finished sweep (a
`runs.load_result.LoadResult`, or None with the reason it has none).

Every row is on one basis (docs/figures.md, docs/llamacpp.md says why this one): decode-only time per
output token (TPOT) of each request, mean over requests, each engine against its own plain decoding, and
vLLM's acceptance figures, one formula for all three. The engines compare by ratios: each engine's TPOT
is timed on its own clock (the own loop by its thread's CPU time, the engines by the wall clock at
their client), so absolute times are set beside each other only within one clock.

- `side_by_side_html` / `side_by_side_records`: per engine (its dtype and clock), batch size and k, the
  speedup in TPOT with its 95% range, the draft acceptance rate, the mean acceptance length and whether
  the greedy texts equalled plain decoding's; then the plain and speculative TPOT, one table per clock.
- `speedup_by_engine_figure`, `step_cost_figure` (one panel per clock), `acceptance_length_figure`.
- `lesson`: one paragraph at the smallest batch size measured.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..clocks import DECODE_ONLY, clock_text, timing
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


BASIS = "decode-only time per output token (TPOT) per request, mean over requests"
ACCEPTANCE = "draft acceptance rate = accepted / drafted; mean acceptance length = 1 + accepted / drafting steps"


def step_ms(point: LoadPoint) -> float | None:
    """Milliseconds of one plain step of the whole batch (every request gains a token): plain TPOT."""
    return 1000.0 * point.plain_latency if point.plain_latency else None


def served_dtype(result: LoadResult) -> str:
    """The dtype an engine's sweep ran in: llama.cpp the GGUF as stored, vLLM what its servers got (its
    JSON's `engine.dtype`: on a GPU "auto", vLLM's own choice, whatever the own loop ran in), the own
    loop its settings' dtype."""
    settings = result.settings
    if settings.get("engine") == "llamacpp":
        return "GGUF as stored"
    return (getattr(result, "engine", None) or {}).get("dtype") or settings.get("dtype") or "?"


def clock_of(run: EngineRun) -> str:
    """The clock that timed an engine's sweep ('thread CPU time', 'wall time at the client')."""
    return run.result.settings.get("clock", "?") if run.result is not None else "?"


def how_measured(run: EngineRun) -> str:
    """'float32; thread CPU time' or 'GGUF as stored; wall time at the client'."""
    if run.result is None:
        return ""
    return f"{served_dtype(run.result)}; timed by {clock_text(clock_of(run))}"


def by_clock(runs: Sequence[EngineRun]) -> dict[str, list[EngineRun]]:
    """The engines that measured, grouped by the clock that timed them (in the runs' order)."""
    groups: dict[str, list[EngineRun]] = {}
    for run in runs:
        if _speculative(run.result):
            groups.setdefault(clock_of(run), []).append(run)
    return groups


def side_by_side_records(runs: Sequence[EngineRun]) -> dict:
    """The table as JSON: its basis, and one record per engine, batch size and k (its TPOT on its clock)."""
    return {"basis": BASIS, "acceptance": ACCEPTANCE, "timing": {
                run.title: timing(clock_of(run), tpot_ratio=DECODE_ONLY, plain_tpot_ms=DECODE_ONLY,
                                  spec_tpot_ms=DECODE_ONLY)
                for run in runs if run.result is not None},
            "rows": [{"engine": run.title, "dtype": served_dtype(run.result), "clock": clock_of(run),
                      "batch": p.batch, "k": p.k,
                      "plain_tpot_ms": 1000.0 * p.plain_latency,
                      "spec_tpot_ms": 1000.0 * p.spec_latency, "tpot_ratio": p.tpot_ratio,
                      "tpot_range": [p.tpot_low, p.tpot_high], "draft_acceptance_rate": p.draft_acceptance_rate,
                      "mean_acceptance_length": p.mean_acceptance_length, "identical": p.identical}
                     for run in runs for p in _speculative(run.result)],
            "errors": {run.title: run.error for run in runs if run.error}}


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], bold: int | None = None) -> str:
    """A table of escaped cells (the column `bold`: markup of its own)."""
    body = "".join("<tr>" + "".join(f"<td>{c if i == bold else html.escape(c)}</td>" for i, c in enumerate(cells))
                   + "</tr>" for cells in rows)
    return ("<table class='sv-engines-table'><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + body + "</tbody></table>") if rows else ""


def side_by_side_html(runs: Sequence[EngineRun]) -> str:
    """The table of ratios and acceptance, how each engine measured (or why it has no figures), then
    each clock's absolute TPOT in a table of its own."""
    head = ["engine", "dtype", "batch", "k", "speedup in TPOT (95% range)", "draft acceptance rate",
            "mean acceptance length", "greedy texts equal plain"]
    records = side_by_side_records(runs)["rows"]
    rows = [[row["engine"], row["dtype"], str(row["batch"]), str(row["k"]),
             f"<b>{row['tpot_ratio']:.2f}\u00d7</b> ({row['tpot_range'][0]:.2f}-{row['tpot_range'][1]:.2f})",
             f"{row['draft_acceptance_rate']:.0%}", f"{row['mean_acceptance_length']:.2f}",
             {True: "yes", False: "no", None: "-"}[row["identical"]]] for row in records]
    per_clock = "".join(
        f"<div class='sv-engines-step'>TPOT timed by {html.escape(clock)} ({html.escape(', '.join(engines))})</div>"
        + _table(["engine", "batch", "k", "plain TPOT (ms)", "spec TPOT (ms)"],
                 [[row["engine"], str(row["batch"]), str(row["k"]), f"{row['plain_tpot_ms']:.1f}",
                   f"{row['spec_tpot_ms']:.1f}"] for row in records if row["clock"] == clock])
        for clock, engines in ((clock, [run.title for run in group]) for clock, group in by_clock(runs).items()))
    notes = []
    for run in runs:
        if run.error:
            notes.append(f"<li><b>{html.escape(run.title)}</b>: no figures: {html.escape(run.error)}</li>")
        elif run.result is not None:
            notes.append(f"<li><b>{html.escape(run.title)}</b>: {html.escape(how_measured(run))}</li>")
    return (f"<div class='sv-engines' id='load-engines-table'><div class='sv-load-title'>One drafter, "
            f"{len(runs)} engines: each against its own plain decoding</div>{_table(head, rows, bold=4)}"
            f"<div class='sv-engines-notes'>Every row on one basis: {html.escape(BASIS)}; "
            f"{html.escape(ACCEPTANCE)}. How each measured:<ul>" + "".join(notes) + "</ul>"
            f"{html.escape(APART)}</div>{per_clock}</div>")


# Why the absolute times stand in a table per clock.
APART = ("The speedups compare across engines; absolute times only on one clock: one thread's CPU time leaves "
         "out what a server's client waits for, so milliseconds on two clocks are not comparable.")


def _largest_k(runs: Sequence[EngineRun]) -> int | None:
    ks = {p.k for run in runs for p in _speculative(run.result)}
    return max(ks) if ks else None


def _axis(runs: Sequence[EngineRun]) -> dict:
    batches = sorted({p.batch for run in runs for p in _speculative(run.result)})
    return dict(type="category", categoryorder="array", categoryarray=[str(b) for b in batches],
                title=dict(text="batch size"))


def speedup_by_engine_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """Each engine's speedup in TPOT over its own plain decoding (95% range) at the largest k, by batch size."""
    k = _largest_k(runs)
    figure = _bars(runs, f"Speedup in TPOT per engine{f' at k = {k}' if k else ''} (each against its own plain "
                   "decoding, decode only)", "speedup \u00d7", lambda p: p.tpot_ratio, "\u00d7",
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
            errors = dict(type="data", symmetric=False, array=[p.tpot_high - p.tpot_ratio for p in points],
                          arrayminus=[p.tpot_ratio - p.tpot_low for p in points]) if ranges else None
            figure.add_trace(go.Bar(x=[str(p.batch) for p in points], y=[value(p) for p in points], name=run.title,
                                    marker_color=config_colour(i), error_y=errors,
                                    hovertemplate=f"{run.title}, batch %{{x}}: %{{y:.2f}} {unit}<extra></extra>"))
    figure.update_layout(barmode="group", xaxis=_axis(runs), yaxis_rangemode="tozero")
    return figure


def step_cost_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """What one plain step costs on each engine (plain TPOT): what a draft has to save. One panel per
    clock, each with its own axis: milliseconds on two clocks are not set on one axis."""
    title = "A plain step's cost per engine (plain TPOT: what speculation saves), on each engine's clock"
    groups = by_clock(runs)
    if len(groups) < 2:
        clock = next(iter(groups), "")
        return _bars(runs, title, f"ms per step ({clock})" if clock else "ms per step", step_ms, "ms",
                     "Run all three engines to see what a plain step costs on each")
    k = _largest_k(runs)
    figure = make_subplots(rows=1, cols=len(groups), subplot_titles=list(groups), horizontal_spacing=0.12)
    figure.update_layout(layout(title, "batch size", None, hovermode="closest"))
    index = {run.title: i for i, run in enumerate(runs)}
    for col, (clock, group) in enumerate(groups.items(), start=1):
        for run in group:
            points = [p for p in _speculative(run.result) if p.k == k and step_ms(p) is not None]
            figure.add_trace(go.Bar(x=[str(p.batch) for p in points], y=[step_ms(p) for p in points], name=run.title,
                                    marker_color=config_colour(index[run.title]),
                                    hovertemplate=f"{run.title}, batch %{{x}}: %{{y:.2f}} ms ({clock})<extra></extra>"),
                             row=1, col=col)
        figure.update_yaxes(title_text=f"ms per step ({clock})", rangemode="tozero", row=1, col=col)
        figure.update_xaxes(_axis(runs), row=1, col=col)
    figure.update_layout(barmode="group")
    return figure


def acceptance_length_figure(runs: Sequence[EngineRun]) -> go.Figure:
    """Mean acceptance length on each engine at the largest k (1 = nothing accepted), one definition for all."""
    k = _largest_k(runs)
    return _bars(runs, f"Mean acceptance length per engine{f' at k = {k}' if k else ''}", "tokens per drafting step",
                 lambda p: p.mean_acceptance_length, "tokens",
                 "Run all three engines to see how many drafts each accepts")


def lesson(runs: Sequence[EngineRun]) -> str:
    """The comparison at the smallest batch size and the largest k, in words (empty before any figure)."""
    k = _largest_k(runs)
    if k is None:
        return ""
    batch = min(p.batch for run in runs for p in _speculative(run.result))

    def point_of(run: EngineRun) -> LoadPoint | None:
        return next((p for p in _speculative(run.result) if p.k == k and p.batch == batch), None)

    parts = [f"{run.title} **{point.tpot_ratio:.2f}\u00d7** (mean acceptance length {point.mean_acceptance_length:.2f})"
             for run in runs if (point := point_of(run)) is not None]
    # A plain step's cost, compared only among the engines one clock timed.
    steps = []
    for clock, group in by_clock(runs).items():
        costs = [f"{run.title} {step_ms(point):.1f} ms" for run in group
                 if (point := point_of(run)) is not None and step_ms(point)]
        if costs:
            steps.append(f"{', '.join(costs)} ({clock})")
    return (f"Batch {batch}, k = {k}, speedup in decode-only time per token: " + "; ".join(parts) + ". Speculation "
            "saves target steps, so what it buys depends on what a step costs against drafting and verifying. "
            + (f"A plain step: {'; '.join(steps)}; times on different clocks are not compared." if steps else ""))
