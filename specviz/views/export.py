"""A comparison (or a single run) as files: `cycles.jsonl` (the full records), `cycles.csv` (one plain
value per cell, for a spreadsheet, `csv` or pandas), `summary.json`, `recording.json` (every run, to
replay or report with no model: `runs.recording`), and `charts.html`: every chart in
one standalone page (plotly.js embedded once, so it opens offline) and, when kaleido can drive a
Chrome or Chromium, one PNG per chart.

One cycle record per cycle and configuration; `config` names the configuration (its label in the
comparison). `summary.json` has one entry per configuration, with vLLM's metric names where vLLM has
one (`draft_acceptance_rate`, `mean_acceptance_length`, `acceptance_histogram`) plus `speedup`. A
configuration drafted across tokenizers has the draft model's own tokens in each cycle record
(`draft_pieces`, `cut_text`) and `cross_tokenizer`, `draft_tokens_per_target_token` in its summary.
"""

from __future__ import annotations

import csv
import html
import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..catalog import plotly_js
from ..files import write_atomic
from ..runs import recording
from .prose import winner_line

log = logging.getLogger(__name__)

# The last three are a cross-tokenizer draft's (null otherwise): the draft model's own tokens as
# text, the end of its text the alignment cut, and the shared vocabulary's share per draft token.
CYCLE_FIELDS = ["config", "cycle", "k", "drafted", "drafted_text", "num_accepted", "verdicts", "draft_probs",
                "target_probs", "uniforms", "target_top", "correction", "correction_text", "correction_kind",
                "correction_prob", "emitted", "residual_top", "greedy", "invariant", "draft_seconds", "verify_seconds",
                "draft_pieces", "cut_text", "shared_mass"]
# The CSV keeps the scalar fields and flattens the lists into plain text: ids, probabilities and
# verdicts space-separated, token texts concatenated (the JSONL has every list as a list).
CSV_FIELDS = ["config", "cycle", "k", "num_drafted", "num_accepted", "num_emitted", "drafted", "drafted_text",
              "verdicts", "draft_probs", "target_probs", "correction", "correction_text", "correction_kind",
              "correction_prob", "greedy", "draft_seconds", "verify_seconds", "num_draft_pieces", "draft_pieces",
              "cut_text", "shared_mass"]


def _finite(value):
    """NaN and infinities become None: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# ----------------------------------------------------------------------------- records

def cycle_records(label: str, run) -> list[dict]:
    """One record per cycle of a `runs.Run`, in CYCLE_FIELDS order."""
    records = []
    for c, text in zip(run.cycles, run.texts):
        record = c.to_dict()
        record.update(config=label, cycle=c.index, drafted_text=text.drafted, correction_text=text.correction)
        records.append({name: _finite(record[name]) for name in CYCLE_FIELDS})
    return records


def comparison_records(comparison) -> list[dict]:
    return [record for label, result in comparison.pairs() for record in cycle_records(label, result)]


def configuration_summary(label: str, run) -> dict:
    """One configuration's entry in summary.json: `Run.summary()` (the stats under vLLM's names, the
    baseline and `speedup`; for a draft with another tokenizer, its draft tokens per target token)
    plus its label, its settings and whether it drafted across tokenizers."""
    return _finite_dict({"config": label, "settings": run.settings.to_dict(),
                         "cross_tokenizer": run.stats.draft_model_tokens is not None, **run.summary()})


def _finite_dict(data: dict) -> dict:
    return {key: _finite_dict(value) if isinstance(value, dict) else _finite(value) for key, value in data.items()}


def finite_json(data):
    """`data` (dicts, lists, numbers, text) with every non-finite number as None: strict JSON, as a
    browser or an API client parses it."""
    if isinstance(data, dict):
        return {key: finite_json(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(value) for value in data]
    return _finite(data)


def summary(comparison, *, sweep=None) -> dict:
    data = {"prompt": comparison.prompt,
            "configurations": [configuration_summary(label, run) for label, run in comparison.pairs()],
            "winner": winner_line(comparison)}
    if sweep is not None:
        data["sweep"] = {"alpha": sweep.alpha, "cost_ratio": sweep.cost_ratio,
                         "best_measured_k": sweep.best_measured_k, "best_theory_k": sweep.best_theory_k,
                         "points": [{"k": k, "speedup": r.speedup, "theory_speedup": sweep.theory(k),
                                     "mean_acceptance_length": r.stats.mean_acceptance_length,
                                     "draft_acceptance_rate": r.stats.draft_acceptance_rate,
                                     "tokens_per_cycle": r.stats.tokens_per_cycle}
                                    for k, r in sweep.points]}
    return data


# ----------------------------------------------------------------------------- files

def write_jsonl(records: Sequence[Mapping], path: Path) -> Path:
    return write_atomic(path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


# Token texts read as the text they make when concatenated; every other list (ids, probabilities,
# verdicts) is space-separated so that `cell.split()` gives its items back.
TEXT_LISTS = {"drafted_text", "draft_pieces"}


def _cell(value, *, text: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ("" if text else " ").join(_cell(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def csv_row(record: Mapping) -> dict:
    """A JSONL record as one CSV row of plain values (CSV_FIELDS)."""
    pieces = record["draft_pieces"]
    flat = dict(record, num_drafted=len(record["drafted"]), num_emitted=len(record["emitted"]),
                num_draft_pieces=None if pieces is None else len(pieces))
    return {name: _cell(flat[name], text=name in TEXT_LISTS) for name in CSV_FIELDS}


def write_csv(records: Sequence[Mapping], path: Path) -> Path:
    return write_atomic(path, csv_text(CSV_FIELDS, map(csv_row, records)))


def csv_text(fields: Sequence[str], rows) -> str:
    """Rows (dicts) as CSV text, built in memory so that the file is written whole."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def charts_html(figures: Mapping[str, object], title: str = "specviz charts") -> str:
    """Every figure in one standalone page: plotly.js embedded once, then one div per chart."""
    parts = [f'<section id="{html.escape(name)}">{chart_div(figure, f"chart-{i}")}</section>'
             for i, (name, figure) in enumerate(figures.items())]
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'{plotly_script()}</head><body style="font-family: sans-serif">{"".join(parts)}</body></html>')


def plotly_script() -> str:
    """plotly.js inline, once per standalone page (`catalog.plotly_js`)."""
    return f'<script type="text/javascript">{plotly_js()}</script>'


def chart_div(figure, div_id: str) -> str:
    """One figure's div and its drawing script, for a page that has `plotly_script` already."""
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                          config={"displaylogo": False, "responsive": True})


def write_figures(figures: Mapping[str, object], directory: Path, *, png: bool = False) -> tuple[list[Path], str]:
    """All figures in charts.html and, with `png`, each as NAME.png. Returns the files written and a
    note ("" or why PNG was skipped)."""
    directory = Path(directory)
    if not figures:
        return [], ""
    written, note = [write_atomic(directory / "charts.html", charts_html(figures))], ""
    if png:
        try:
            written += write_pngs(figures, directory)
        except Exception as exc:  # noqa: BLE001 - PNG is optional; the HTML charts are written
            log.info("PNG export skipped: %s", exc)
            note = f"PNG charts skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()
    return written, note


def write_pngs(figures: Mapping[str, object], directory: Path) -> list[Path]:
    """PNG through kaleido (which needs a Chrome or Chromium on PATH, or BROWSER_PATH). Figures
    have transparent backgrounds for the app's themes; the PNGs get a white one."""
    import plotly.io as pio

    paths = [Path(directory) / f"{name}.png" for name in figures]
    opaque = [_opaque(figure) for figure in figures.values()]
    pio.write_images(opaque, paths, width=900, height=420, scale=2)
    return paths


def _opaque(figure):
    import plotly.graph_objects as go

    copy = go.Figure(figure)
    copy.update_layout(paper_bgcolor="white", plot_bgcolor="white", font_color="#333")
    return copy


def export_comparison(comparison, directory: Path | str, *, figures: Mapping[str, object] | None = None,
                      sweep=None, png: bool = False) -> tuple[list[Path], str]:
    """Write every file for `comparison` into `directory` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    records = comparison_records(comparison)
    written = [write_jsonl(records, directory / "cycles.jsonl"), write_csv(records, directory / "cycles.csv")]
    written.append(write_atomic(directory / "summary.json",
                                json.dumps(summary(comparison, sweep=sweep), indent=2, ensure_ascii=False)))
    if comparison.results:   # every configuration's run, to replay or report without the models
        record = recording.recording(comparison.results, comparison.labels, kind="compare")
        written.append(write_atomic(directory / "recording.json", recording.dumps(record)))
    chart_files, note = write_figures(figures or {}, directory, png=png)
    return written + chart_files, note
