"""A load sweep (`runs.load_result.LoadResult`) -> the Load tab's figures, its decision sentence and the
token views of the batch in progress. Pure functions of the result (and of the cycles so far).

- `speedup_figure`: speedup against batch size, one line per k > 0, each point with its 95% range
  as an error bar, the theory (the measured cost curve priced at what each pass computed) dashed,
  1x marked, the crossover batch annotated.
- `throughput_figure`: tokens per second of both methods against batch size.
- `latency_figure`: seconds a request waits per token, both methods, against batch size.
- `decision`: one sentence: up to which batch size to speculate, and the best k per batch size.
- `outputs_note`: what the greedy outputs were compared with (the same batch decoded plainly), and how
  they came out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import plotly.graph_objects as go

from ..runs.load_result import LoadPoint, LoadResult
from .charts import CLOCKED, PLAIN_COLOUR, THEORY_COLOUR, layout, waiting
from .figures import config_colour
from .render import panel_html

EMPTY_TEXT = ("speedup against batch size, per k", "both methods' throughput against batch size",
              "the time a request waits per token")


def _by_k(result: LoadResult) -> dict[int, list[LoadPoint]]:
    """The speculative points (k > 0), by k, in batch order."""
    out: dict[int, list[LoadPoint]] = {}
    for point in sorted(result.points, key=lambda p: (p.k, p.batch)):
        if point.k > 0:
            out.setdefault(point.k, []).append(point)
    return out


def _plain(result: LoadResult) -> tuple[list[int], list[LoadPoint]]:
    """One plain-decoding point per batch size: the k = 0 point when measured, else the first k's
    plain baseline at that size (each point carries its own plain run's numbers)."""
    chosen: dict[int, LoadPoint] = {}
    for point in sorted(result.points, key=lambda p: (p.batch, p.k != 0, p.k)):
        chosen.setdefault(point.batch, point)
    batches = sorted(chosen)
    return batches, [chosen[b] for b in batches]


def _batch_axis(result: LoadResult) -> dict:
    # Batch sizes are few and usually powers of two: a log axis with a tick at each measured one.
    batches = result.batches
    return dict(type="log", tickvals=batches, ticktext=[str(b) for b in batches], title=dict(text="batch size"))


def engine_metric(result: LoadResult | None) -> str | None:
    """What an engine sweep's speedup measures (its decision metric, in words); None for the own loop."""
    return (result.settings.get("decision_metric_text") if result is not None else None) or None


def speedup_figure(result: LoadResult | None) -> go.Figure:
    """Measured speedup (with its 95% range) and the theory, per k, against batch size."""
    metric = engine_metric(result)
    basis = ((result.settings.get("timing") or {}).get("basis") or {}).get("speedup") if result else None
    title = (f"Speedup in {metric.split(' (')[0]} (speculative / plain, {basis or 'with prefill'})" if metric
             else "Speedup against batch size (decode only)")
    figure = go.Figure(layout=layout(title, "batch size (concurrent requests)" if metric else "batch size",
                                     "speedup \u00d7", hovermode="closest"))
    if result is None or not _by_k(result):
        return waiting(figure, f"Run to see {EMPTY_TEXT[0]}" if result is None or not result.points
                       else "Only k = 0 measured: add a draft length above 0 to see a speedup")
    for i, (k, points) in enumerate(_by_k(result).items()):
        colour = config_colour(i)
        x = [p.batch for p in points]
        figure.add_trace(go.Scatter(
            x=x, y=[p.speedup for p in points], name=f"k = {k}", mode="lines+markers",
            line=dict(color=colour, width=3), marker=dict(size=9),
            error_y=dict(type="data", symmetric=False, array=[p.speedup_high - p.speedup for p in points],
                         arrayminus=[p.speedup - p.speedup_low for p in points], color=colour),
            customdata=[[p.speedup_low, p.speedup_high, p.mean_acceptance_length] for p in points],
            hovertemplate=(f"k = {k}, batch %{{x}}: %{{y:.2f}}\u00d7 (95% range %{{customdata[0]:.2f}}-"
                           "%{customdata[1]:.2f}), mean acceptance length %{customdata[2]:.2f}<extra></extra>")))
        if any(p.theory is None for p in points):   # an engine's sweep (vLLM) has no cost curve to price
            continue
        figure.add_trace(go.Scatter(
            x=x, y=[p.theory for p in points], name=f"theory, k = {k}", mode="lines",
            line=dict(color=colour, width=2, dash="dash"),
            hovertemplate=f"theory, k = {k}, batch %{{x}}: %{{y:.2f}}\u00d7<extra></extra>"))
    figure.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, width=1.5, dash="dot"),
                     annotation_text="1\u00d7 (plain decoding)", annotation_position="bottom left")
    crossover = result.crossover_batch
    if crossover is not None:
        figure.add_vline(x=crossover, line=dict(color=THEORY_COLOUR, width=2))
        # On a log axis an annotation's x is the log of the value (add_vline's own label misplaces it).
        figure.add_annotation(x=math.log10(crossover), y=1, yref="paper", text=f"crossover: batch {crossover}",
                              showarrow=False, xanchor="left", yanchor="top", xshift=4,
                              font=dict(color=THEORY_COLOUR))
    top = max([p.speedup_high for p in result.points] + [p.theory for p in result.points if p.theory is not None]
              + [1.0]) * 1.15
    figure.update_layout(xaxis=_batch_axis(result), yaxis_range=[0, top])
    return figure


def _per_batch_figure(result: LoadResult | None, title: str, axis: str, unit: str, empty: str, plain_value,
                      spec_value) -> go.Figure:
    """One value against batch size (`axis` its axis title, `unit` in the hover): plain decoding
    (`plain_value` of a point) and speculation per k (`spec_value`); before any point, `empty` says
    what will appear."""
    clock = result.settings.get("clock") if result is not None else None
    figure = go.Figure(layout=layout(title + (f" \u00b7 {CLOCKED} {clock}" if clock else ""), "batch size", axis,
                                     hovermode="closest"))
    if result is None or not result.points:
        return waiting(figure, f"Run to see {empty}")
    batches, plain = _plain(result)
    figure.add_trace(go.Scatter(x=batches, y=[plain_value(p) for p in plain], name="plain", mode="lines+markers",
                                line=dict(color=PLAIN_COLOUR, width=3, dash="dot"),
                                hovertemplate=f"plain, batch %{{x}}: %{{y:.1f}} {unit}<extra></extra>"))
    for i, (k, points) in enumerate(_by_k(result).items()):
        figure.add_trace(go.Scatter(
            x=[p.batch for p in points], y=[spec_value(p) for p in points], name=f"speculative, k = {k}",
            mode="lines+markers", line=dict(color=config_colour(i), width=3),
            hovertemplate=f"k = {k}, batch %{{x}}: %{{y:.1f}} {unit}<extra></extra>"))
    figure.update_layout(xaxis=_batch_axis(result), yaxis_rangemode="tozero")
    return figure


def throughput_figure(result: LoadResult | None) -> go.Figure:
    """All rows' tokens per second against batch size: plain decoding, and speculation per k."""
    title = ("Output throughput against concurrency (prefill included)" if engine_metric(result)
             else "Throughput against batch size")
    return _per_batch_figure(result, title, "tokens per second", "tokens/s", EMPTY_TEXT[1],
                             lambda p: p.plain_tokens_per_s, lambda p: p.spec_tokens_per_s)


def latency_figure(result: LoadResult | None) -> go.Figure:
    """Milliseconds a request waits per token (mean over its rows) against batch size."""
    title = ("Time per output token (TPOT) against concurrency" if engine_metric(result)
             else "Latency per token against batch size")
    return _per_batch_figure(result, title, "ms per token", "ms per token", EMPTY_TEXT[2],
                             lambda p: p.plain_latency * 1000, lambda p: p.spec_latency * 1000)


def load_figures(result: LoadResult | None) -> tuple[go.Figure, go.Figure, go.Figure]:
    return speedup_figure(result), throughput_figure(result), latency_figure(result)


# ----------------------------------------------------------------------------- the decision

def best_k_text(result: LoadResult) -> str:
    """'batch 1: k 4, batch 2: k 2, batch 4: off'."""
    return ", ".join(f"batch {batch}: {'k ' + str(k) if k else 'off'}" for batch, k in result.recommended_k.items())


def decision(result: LoadResult | None) -> str:
    """The sweep's answer in one sentence (empty before any point); on an engine, it names the metric
    it follows."""
    if result is None or not result.points:
        return ""
    metric = engine_metric(result)
    text = _decision(result)
    return f"By {metric}: {text[0].lower()}{text[1:]}" if metric and text.startswith(("Speculation", "On this")) \
        else text


def _decision(result: LoadResult) -> str:
    if not _by_k(result):
        return "Only plain decoding (k = 0) was measured: add a draft length above 0 to see whether speculation pays."
    measured = [b for b in result.batches if result.best(b) is not None]
    crossover = result.crossover_batch
    if crossover == measured[0]:
        return (f"Speculation does not pay here at any batch size measured ({', '.join(map(str, measured))}): "
                "plain decoding is as fast or faster.")
    # Speculate below the crossover (or at every size measured when there is none).
    up_to = max(b for b in measured if crossover is None or b < crossover)
    beyond = "" if crossover is None else f" (from batch {crossover} it no longer pays)"
    everywhere = " (it paid at every batch size measured)" if crossover is None else ""
    return (f"On this machine, with this pair, speculate up to batch {up_to}{beyond}{everywhere}; "
            f"best k per batch size: {best_k_text(result)}.")


def outputs_note(result: LoadResult | None) -> str:
    """What a point's `identical` compared, and how the sweep's greedy outputs came out (empty before a
    speculative point, or when sampled). It compares each request's output from batched speculative
    decoding with its output from batched plain decoding of the same batch, not with the prompt decoded
    alone, which only the tests check (in float32): in bfloat16 both batched outputs can differ from a
    prompt decoded alone at a near-tie of the top two logits (a batch rounds differently)."""
    compared = [p for p in (result.points if result else []) if p.k > 0 and p.identical is not None]
    if not compared:
        return ""
    differ = [f"batch {p.batch}, k = {p.k}" for p in compared if not p.identical]
    outcome = ("the same for every request at every point" if not differ else
               f"different at {len(differ)} of {len(compared)} points ({'; '.join(differ)})")
    note = ("Greedy outputs, each request's batched speculative output against its batched plain output of the "
            f"same batch (not against the prompt decoded alone): {outcome}.")
    dtype = result.settings.get("dtype")
    if dtype and dtype not in ("float32", "fp32"):
        note += (f" In {dtype} a batch's arithmetic can flip a near-tie, so this does not show that each request "
                 "matches its prompt decoded alone; that needs float32.")
    return note


# ----------------------------------------------------------------------------- the batch in progress

def rows_html(title: str, rows: Sequence[Sequence[str]], statuses: Sequence[str]) -> str:
    """The batch in progress: one small token view per request (its cycles' HTML), side by side."""
    panels = "".join(panel_html(f"request {i + 1}", status, "".join(cycles), kind="spec",
                                placeholder="Waiting for its first pass.")
                     for i, (cycles, status) in enumerate(zip(rows, statuses)))
    return (f'<div class="sv-load-batch"><div class="sv-load-title">{html.escape(title)}</div>'
            f'<div class="sv-load-rows">{panels}</div></div>')
