"""A single-file HTML report of recorded runs: opens offline, from disk, with no server.

Each run is drawn by `run_view.RunRenderer`, the Run tab's own renderer (token view with verdict
colours and per-token probabilities on hover, the plain baseline, the summary table, the four
charts), beside its settings and environment; several runs sit side by side after a table of their
headline numbers. plotly.js is embedded once for the whole file (the 1.2 MB basic bundle), and
nothing is fetched from the network. Every text from a recording is escaped.

A token shown with its verdict and hover costs about 150 bytes of HTML, so the report details its
first `DETAIL_TOKENS` tokens, over all its runs, and the Replay tab a run's first as many
(`DetailLimitedRenderer`); later cycles show only the text they added. A report is then at most
plotly.js plus about twice its recordings' size, however many drafts they rejected.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from ..core.events import REJECTED
from ..runs import Run
from ..runs.recording import Recording
from . import render
from .export import chart_div, plotly_script
from .render import CSS
from .run_view import RunRenderer, RunView, describe

# Tokens a page shows one by one (verdict, hover): all of a 4,096-token run at k = 4, whose cycles
# each show at most 4 rejected drafts and 1 token more (about 3 MB of HTML).
DETAIL_TOKENS = 5 * 4096

REPORT_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 24px; color: #1f2328; }
h1 { font-size: 1.5em; margin: 0 0 4px; } h2 { font-size: 1.2em; margin: 0 0 6px; }
.sv-report-meta { opacity: 0.75; margin-bottom: 12px; }
.sv-runs { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 18px; }
.sv-run { border: 1px solid #d0d7de; border-radius: 10px; padding: 12px; min-width: 0; }
.sv-run .sv-pair { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 8px; margin: 8px 0; }
.sv-run details { margin: 6px 0; } .sv-run pre { white-space: pre-wrap; font-size: 0.9em; }
.sv-charts { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 4px; }
.sv-charts > div { min-width: 0; }
.sv-charts > div:nth-child(5) { grid-column: 1 / -1; }   /* the timeline: both columns wide */
.sv-overview { border-collapse: collapse; margin-bottom: 16px; }
.sv-overview td, .sv-overview th { border-bottom: 1px solid #d0d7de; padding: 4px 10px; text-align: right; }
.sv-overview td:first-child, .sv-overview th:first-child { text-align: left; }
.sv-stats table td { padding: 2px 8px 2px 0; vertical-align: top; }
"""


# Each chart is drawn as the page is parsed, before the later sections exist and narrow the grid:
# once all are there, every chart fits itself to its final cell.
RESIZE = ("<script>window.addEventListener('load', () => document.querySelectorAll('.js-plotly-plot')"
          ".forEach(plot => Plotly.Plots.resize(plot)));</script>")


class DetailLimitedRenderer(RunRenderer):
    """The Run tab's renderer, detailing a run's first `detail` tokens shown (accepted and rejected
    drafts, corrections); from the cycle that would go past them on, each cycle shows only the text
    it added, under a note that says so. The numbers and charts still cover every cycle."""

    def __init__(self, detail: int = DETAIL_TOKENS):
        super().__init__()
        self.detail_left = detail

    def view(self, run: Run, state: str, **options) -> RunView:
        for cycle, text in zip(run.cycles[len(self.cycle_html):], run.texts[len(self.cycle_html):]):
            shown = (cycle.num_accepted + cycle.verdicts.count(REJECTED) + (cycle.correction is not None))
            if shown <= self.detail_left:
                self.detail_left -= shown
                self.cycle_html.append(render.cycle_html(cycle, text))
                continue
            note = ""
            if self.detail_left >= 0:   # the first cycle shown as text only
                note = (f'<span class="sv-placeholder">[from cycle {cycle.index + 1} on, only the text each cycle '
                        f'added: a page shows {DETAIL_TOKENS:,} tokens one by one]</span>')
                self.detail_left = -1
            added = "".join(text.drafted[i] for i in cycle.accepted_nodes) + (text.correction or "")
            self.cycle_html.append(render.render_cycle(cycle.index, [], note + render.token_text_html(added)))
        return super().view(run, state, **options)


def _kv_table(items: dict) -> str:
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in items.items())
    return f"<table>{rows}</table>"


def _overview(runs: Sequence[tuple[str, Run]]) -> str:
    head = ("<tr><th>Run</th><th>Measured speedup (95% range)</th><th>Draft acceptance rate</th>"
            "<th>Mean acceptance length</th><th>Tokens per target pass</th><th>Tokens</th></tr>")
    rows = []
    for label, run in runs:
        speed = run.speed
        speedup = (f"{speed.speedup:.2f}\u00d7 ({run.clock}; {speed.low:.2f}\u2013{speed.high:.2f})"
                   + ("" if speed.reliable else ", too short to be sure")) if speed else "no baseline"
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{speedup}</td>"
                    f"<td>{run.stats.draft_acceptance_rate:.1%}</td><td>{run.stats.mean_acceptance_length:.2f}</td>"
                    f"<td>{run.stats.tokens_per_cycle:.2f}</td><td>{run.stats.tokens}</td></tr>")
    return f'<table class="sv-overview" aria-label="runs compared">{head}{"".join(rows)}</table>'


def run_section(label: str, run: Run, environment: dict, number: int,
                renderer: DetailLimitedRenderer | None = None) -> str:
    view = (renderer or DetailLimitedRenderer()).view(run, "Recorded run.", final=True)
    figures = (view.acceptance, view.per_pass, view.race, view.positions, view.timeline)
    charts = "".join(chart_div(figure, f"run{number}-chart{i}") for i, figure in enumerate(figures))
    settings = {k: v for k, v in run.settings.to_dict().items() if v is not None}
    models = {"target": f"{run.target_name} ({run.target_parameters:,} parameters)",
              "draft": f"{run.draft_name} ({run.draft_parameters:,} parameters)",
              "prompt tokens": run.prompt_tokens, "dtype": run.dtype, "device": run.device, "clock": run.clock}
    return (f'<section class="sv-run" id="run-{number}"><h2>{html.escape(label)}</h2>'
            f'<div class="sv-report-meta">{html.escape(describe(run))}</div>'
            f'<details><summary>Prompt</summary><pre>{html.escape(run.prompt)}</pre></details>'
            f'<div class="sv-pair">{view.tokens}{view.baseline}</div>{view.stats}'
            f'<div class="sv-charts">{charts}</div>'
            f'<details><summary>Settings, models and environment</summary>{_kv_table(models)}'
            f'{_kv_table(settings)}{_kv_table(environment)}</details></section>')


def report_html(recordings: Sequence[Recording], title: str = "specviz report") -> str:
    """One standalone page for the runs of every recording, side by side."""
    runs = [(label if len(recordings) == 1 else f"{label} ({rec.name})", run, rec.environment)
            for rec in recordings for label, run in zip(rec.labels, rec.runs)]
    sources = ", ".join(f"{rec.name} (recorded {rec.created or 'at an unknown time'})" for rec in recordings)
    overview = _overview([(label, run) for label, run, _ in runs]) if len(runs) > 1 else ""
    parts, detail = [], DETAIL_TOKENS         # shared: the page details its first DETAIL_TOKENS tokens
    for number, (label, run, env) in enumerate(runs):
        renderer = DetailLimitedRenderer(detail)
        parts.append(run_section(label, run, env, number, renderer))
        detail = max(renderer.detail_left, 0)
    sections = "".join(parts)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title><style>{CSS}{REPORT_CSS}</style>{plotly_script()}</head>'
            f'<body><h1>{html.escape(title)}</h1><div class="sv-report-meta">Speculative decoding runs replayed '
            f'from {html.escape(sources)}. Hover a token for its probabilities.</div>{overview}'
            f'<div class="sv-runs">{sections}</div>{RESIZE}</body></html>')
