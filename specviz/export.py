"""A comparison (or a single run) as files: `cycles.jsonl`, `cycles.csv`, `summary.json`, and the
charts as standalone HTML (plotly.js inlined, so they open offline) and, when kaleido can drive a
Chrome or Chromium, PNG.

One cycle record per cycle and configuration; `config` names the configuration (its label in the
comparison). In the CSV, list-valued fields (drafted ids, their text, verdicts, probabilities,
uniform draws, ...) and the correction's text are JSON text in one cell; `read_csv` turns them back into lists.
`summary.json` has one entry per configuration, with vLLM's metric names where vLLM has one
(`draft_acceptance_rate`, `mean_acceptance_length`, `acceptance_histogram`) plus `speedup`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path


log = logging.getLogger(__name__)

CYCLE_FIELDS = ["config", "cycle", "k", "drafted", "drafted_text", "num_accepted", "verdicts", "draft_probs",
                "target_probs", "uniforms", "target_top", "correction", "correction_text", "correction_kind",
                "correction_prob", "emitted", "residual_top", "greedy", "draft_seconds", "verify_seconds"]
# JSON text in a CSV cell: the lists, and the correction's text (which may be "" and may be missing).
JSON_FIELDS = {"drafted", "drafted_text", "verdicts", "draft_probs", "target_probs", "uniforms", "target_top",
               "emitted", "residual_top", "correction_text"}
INT_FIELDS = {"cycle", "k", "num_accepted", "correction"}
FLOAT_FIELDS = {"correction_prob", "draft_seconds", "verify_seconds"}


def _finite(value):
    """NaN and infinities become None: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# ----------------------------------------------------------------------------- records

def cycle_records(label: str, result) -> list[dict]:
    """One record per cycle of a `RunResult`, in CYCLE_FIELDS order. A cycle's pieces are its
    drafted tokens in order, then its correction or bonus token."""
    records = []
    for c, pieces in zip(result.cycles, result.pieces):
        record = c.to_dict()
        correction = pieces[len(c.drafted)].text if c.correction is not None else None
        record.update(config=label, cycle=c.index, drafted_text=[p.text for p in pieces[: len(c.drafted)]],
                      correction_text=correction)
        records.append({name: _finite(record[name]) for name in CYCLE_FIELDS})
    return records


def comparison_records(comparison) -> list[dict]:
    return [record for label, result in comparison.pairs() for record in cycle_records(label, result)]


def configuration_summary(label: str, result) -> dict:
    """One configuration's entry in summary.json: `RunResult.summary()` (the stats under vLLM's
    names, the baseline and `speedup`) plus its label and settings."""
    return _finite_dict({"config": label, "settings": asdict(result.config), **result.summary()})


def _finite_dict(data: dict) -> dict:
    return {key: _finite_dict(value) if isinstance(value, dict) else _finite(value) for key, value in data.items()}


def summary(comparison, *, sweep=None, winner: str | None = None) -> dict:
    from .compare import winner_line

    data = {"prompt": comparison.prompt,
            "configurations": [configuration_summary(label, result) for label, result in comparison.pairs()],
            "winner": winner if winner is not None else winner_line(comparison)}
    if sweep is not None:
        data["sweep"] = {"alpha": sweep.alpha, "cost_ratio": sweep.cost_ratio,
                         "best_measured_k": sweep.best_measured_k, "best_theory_k": sweep.best_theory_k,
                         "points": [{"k": k, "speedup": r.speedup, "theory_speedup": sweep.theory(k),
                                     "mean_acceptance_length": r.stats.mean_acceptance_length,
                                     "draft_acceptance_rate": r.stats.draft_acceptance_rate}
                                    for k, r in sweep.points]}
    return data


# ----------------------------------------------------------------------------- files

def write_jsonl(records: Sequence[Mapping], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def write_csv(records: Sequence[Mapping], path: Path) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=CYCLE_FIELDS)
        writer.writeheader()
        for record in records:
            writer.writerow({name: json.dumps(value, ensure_ascii=False) if name in JSON_FIELDS else
                             "" if value is None else value for name, value in record.items()})
    return path


def read_csv(path: Path) -> list[dict]:
    """cycles.csv back into records equal to cycles.jsonl's."""
    def parse(name: str, cell: str):
        if name in JSON_FIELDS:
            return json.loads(cell)
        if cell == "" and name != "config":
            return None
        if name in INT_FIELDS:
            return int(cell)
        if name in FLOAT_FIELDS:
            return float(cell)
        if name == "greedy":
            return cell == "True"
        return cell

    with open(path, encoding="utf-8", newline="") as source:
        return [{name: parse(name, cell) for name, cell in row.items()} for row in csv.DictReader(source)]


def write_figures(figures: Mapping[str, object], directory: Path, *, png: bool = False) -> tuple[list[Path], str]:
    """Each figure as NAME.html (plotly.js inlined: works offline) and, with `png`, NAME.png.
    Returns the files written and a note ("" or why PNG was skipped)."""
    directory = Path(directory)
    written = []
    for name, figure in figures.items():
        path = directory / f"{name}.html"
        figure.write_html(path, include_plotlyjs=True, full_html=True)
        written.append(path)
    note = ""
    if png and figures:
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
    summary_path = directory / "summary.json"
    summary_path.write_text(json.dumps(summary(comparison, sweep=sweep), indent=2, ensure_ascii=False),
                            encoding="utf-8")
    written.append(summary_path)
    chart_files, note = write_figures(figures or {}, directory, png=png)
    return written + chart_files, note
