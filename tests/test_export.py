"""Export: cycles.jsonl, cycles.csv and summary.json agree with each other and with the events;
charts are standalone HTML."""

import json
import re
import math

import pytest
import torch
from tiny_pair import PROMPT, WORDS, TinyModels

from specviz import compare, export
from specviz.compare import RunConfig
from specviz.figures_compare import comparison_figures, sweep_figure


@pytest.fixture(scope="module")
def comparison():
    torch.set_grad_enabled(False)
    tiny = TinyModels()
    configs = [RunConfig(draft="ngram", max_new_tokens=20),
               RunConfig(draft="small", k=3, temperature=1.0, seed=5, max_new_tokens=20)]
    return compare.compare(configs, PROMPT, load=tiny.for_config)


@pytest.fixture(scope="module")
def exported(comparison, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    written, note = export.export_comparison(comparison, folder, figures=comparison_figures(comparison))
    return folder, written, note


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_files_are_written(exported):
    folder, written, note = exported
    names = {p.name for p in written}
    assert {"cycles.jsonl", "cycles.csv", "summary.json", "tokens_per_pass.html", "acceptance_by_position.html",
            "tokens_against_time.html"} == names
    assert note == ""
    # Standalone: plotly.js is inlined, nothing is fetched from a CDN.
    chart = (folder / "tokens_per_pass.html").read_text()
    assert len(chart) > 1_000_000 and not re.search(r"<script[^>]+src=", chart)


def test_jsonl_and_csv_hold_the_same_records(exported):
    folder, _, _ = exported
    lines = (folder / "cycles.jsonl").read_text().splitlines()
    from_jsonl = [strict_json(line) for line in lines]
    assert export.read_csv(folder / "cycles.csv") == from_jsonl
    assert all(list(record) == export.CYCLE_FIELDS for record in from_jsonl)


def test_records_match_the_events(exported, comparison):
    folder, _, _ = exported
    records = export.read_jsonl(folder / "cycles.jsonl")
    expected = [(label, c) for label, r in comparison.pairs() for c in r.cycles]
    assert len(records) == len(expected)
    for record, (label, cycle) in zip(records, expected):
        assert record["config"] == label and record["cycle"] == cycle.index and record["k"] == cycle.k
        for name in ("drafted", "num_accepted", "emitted", "correction", "correction_kind", "uniforms",
                     "target_top", "greedy", "draft_seconds", "verify_seconds"):
            assert record[name] == getattr(cycle, name), name
        assert record["verdicts"] == cycle.verdicts
        assert record["draft_probs"] == pytest.approx(cycle.draft_probs)
        assert record["target_probs"] == pytest.approx(cycle.target_probs)
        assert record["residual_top"] == [list(pair) for pair in cycle.residual_top]
        assert len(record["drafted_text"]) == len(cycle.drafted)
    # Word-level tokenizer: each drafted token's text is its word (with the separating space).
    for record in records:
        assert [t.strip() for t in record["drafted_text"]] == [WORDS[t] for t in record["drafted"]]
        if record["correction"] is not None:
            assert record["correction_text"].strip() == WORDS[record["correction"]]
    sampled = [r for r in records if not r["greedy"]]
    assert sampled and all(len(r["uniforms"]) == min(r["num_accepted"] + 1, len(r["drafted"])) for r in sampled)


def test_summary_agrees_with_the_cycle_records(exported, comparison):
    folder, _, _ = exported
    summary = strict_json((folder / "summary.json").read_text())
    records = export.read_jsonl(folder / "cycles.jsonl")
    assert summary["prompt"] == PROMPT and summary["winner"] == compare.winner_line(comparison)
    assert [c["config"] for c in summary["configurations"]] == comparison.labels
    for entry, result in zip(summary["configurations"], comparison.results):
        mine = [r for r in records if r["config"] == entry["config"]]
        drafted = sum(len(r["drafted"]) for r in mine)
        accepted = sum(r["num_accepted"] for r in mine)
        # vLLM's names, recomputed from the exported cycles.
        assert entry["draft_acceptance_rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
        assert entry["mean_acceptance_length"] == pytest.approx(sum(len(r["emitted"]) for r in mine) / len(mine))
        histogram = [0] * len(entry["acceptance_histogram"])
        for r in mine:
            histogram[r["num_accepted"]] += 1
        assert entry["acceptance_histogram"] == histogram
        assert entry["speedup"] == pytest.approx(result.speedup)
        assert entry["tokens"] == sum(len(r["emitted"]) for r in mine)
        assert entry["settings"]["draft"] == result.config.draft


def test_csv_keeps_empty_and_missing_text_apart(tmp_path):
    record = {name: None for name in export.CYCLE_FIELDS}
    record.update(config="c", cycle=0, k=2, drafted=[1, 2], drafted_text=["", " x"], num_accepted=2,
                  verdicts=["accepted", "accepted"], draft_probs=[1.0, 1.0], target_probs=[0.5, 0.25],
                  uniforms=[], target_top=[1, 2, 3], emitted=[1, 2], residual_top=[], greedy=True,
                  draft_seconds=0.1, verify_seconds=0.2, correction_text="")
    other = dict(record, cycle=1, correction_text=None, correction=7, correction_prob=0.125)
    export.write_csv([record, other], tmp_path / "c.csv")
    assert export.read_csv(tmp_path / "c.csv") == [record, other]


def test_nan_is_written_as_null(tmp_path):
    assert export._finite(float("nan")) is None and export._finite([1.0, math.inf]) == [1.0, None]


def test_sweep_summary_and_png_fallback(comparison, tmp_path, monkeypatch):
    tiny = TinyModels()
    sweep = compare.sweep(RunConfig(draft="ngram", max_new_tokens=8), PROMPT, ks=[1, 2], load=tiny.for_config)

    def no_chrome(figures, directory):
        raise RuntimeError("no Chrome found")

    monkeypatch.setattr(export, "write_pngs", no_chrome)
    written, note = export.export_comparison(sweep.comparison, tmp_path, figures={"k_sweep": sweep_figure(sweep)},
                                             sweep=sweep, png=True)
    assert "PNG charts skipped" in note and "no Chrome found" in note
    assert (tmp_path / "k_sweep.html").exists() and not (tmp_path / "k_sweep.png").exists()
    data = strict_json((tmp_path / "summary.json").read_text())["sweep"]
    assert [p["k"] for p in data["points"]] == [1, 2] and data["best_measured_k"] == sweep.best_measured_k
    assert data["points"][0]["theory_speedup"] == pytest.approx(sweep.theory(1))
