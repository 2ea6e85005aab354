"""Export (`views.export`): cycles.jsonl, cycles.csv and summary.json agree with each other and with
the events; every chart is in one standalone charts.html."""

import csv
import json
import math
import re

import pytest
from tiny_pair import PROMPT, WORDS

from specviz.errors import SpecvizError
from specviz.runs.compare import compare, sweep
from specviz.settings import RunSettings, validate
from specviz.views import export
from specviz.views.figures import comparison_figures, sweep_figure
from specviz.views.prose import winner_line

PLOTLY_BANNER = "* plotly.js ("   # the first line of the basic bundle's library comment: once per embedded copy


@pytest.fixture(scope="module")
def comparison(tiny):
    configs = [validate(RunSettings(fixed_k=True, draft="ngram", max_new_tokens=20)),
               validate(RunSettings(fixed_k=True, draft="small", k=3, temperature=1.0, seed=5, max_new_tokens=20))]
    return compare(configs, PROMPT, loader=tiny.loader)


@pytest.fixture(scope="module")
def exported(comparison, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    written, note = export.export_comparison(comparison, folder, figures=comparison_figures(comparison))
    return folder, written, note


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def read_csv(path):
    with open(path, encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        return reader.fieldnames, list(reader)


def test_files_are_written(exported):
    folder, written, note = exported
    assert {p.name for p in written} == {"cycles.jsonl", "cycles.csv", "summary.json", "recording.json", "charts.html"}
    assert note == ""


def test_charts_html_holds_every_chart_with_plotly_embedded_once(exported):
    folder, _, _ = exported
    page = (folder / "charts.html").read_text(encoding="utf-8")
    assert page.count(PLOTLY_BANNER) == 1
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", page, re.DOTALL)
    assert sum(PLOTLY_BANNER in script for script in scripts) == 1
    # Standalone: nothing is fetched from a CDN.
    assert not re.search(r"<script[^>]+src=", page)
    assert sorted(re.findall(r'<div id="(chart-\d+)"', page)) == ["chart-0", "chart-1", "chart-2"]
    for name in ("tokens_per_pass", "acceptance_by_position", "tokens_against_time"):
        assert f'<section id="{name}">' in page


def test_csv_has_plain_values_that_agree_with_the_jsonl(exported):
    folder, _, _ = exported
    records = [strict_json(line) for line in (folder / "cycles.jsonl").read_text().splitlines()]
    assert all(list(record) == export.CYCLE_FIELDS for record in records)
    fields, rows = read_csv(folder / "cycles.csv")
    assert fields == export.CSV_FIELDS and len(rows) == len(records)
    for row, record in zip(rows, records):
        assert row == export.csv_row(record)
        # Scalars as plain text, parsed back with nothing but int() and float().
        assert row["config"] == record["config"]
        for name in ("cycle", "k", "num_accepted"):
            assert int(row[name]) == record[name], name
        assert int(row["num_drafted"]) == len(record["drafted"]) and int(row["num_emitted"]) == len(record["emitted"])
        assert row["correction"] == ("" if record["correction"] is None else str(record["correction"]))
        assert row["correction_kind"] == (record["correction_kind"] or "")
        assert row["greedy"] == str(record["greedy"])
        for name in ("draft_seconds", "verify_seconds", "correction_prob"):
            if record[name] is None:
                assert row[name] == ""
            else:
                assert float(row[name]) == pytest.approx(record[name], rel=1e-5), name
        # Lists flattened: ids and probabilities space-separated, token texts concatenated.
        assert [int(t) for t in row["drafted"].split()] == record["drafted"]
        assert row["verdicts"].split() == record["verdicts"]
        assert [float(p) for p in row["target_probs"].split()] == pytest.approx(record["target_probs"], rel=1e-5)
        assert row["drafted_text"] == "".join(record["drafted_text"])
        assert row["correction_text"] == (record["correction_text"] or "")


def test_csv_row_of_a_handmade_record():
    record = {name: None for name in export.CYCLE_FIELDS}
    record.update(config="c, with a comma", cycle=0, k=2, drafted=[1, 2], drafted_text=["", ' "x"'], num_accepted=1,
                  verdicts=["accepted", "rejected"], draft_probs=[1.0, 1.0], target_probs=[0.5, 0.123456789],
                  uniforms=[], target_top=[1, 2, 3], emitted=[1, 7], residual_top=[], greedy=True, correction=7,
                  correction_kind="resampled", correction_prob=0.125, correction_text="\n", draft_seconds=0.1,
                  verify_seconds=0.2)
    row = export.csv_row(record)
    assert row == {"config": "c, with a comma", "cycle": "0", "k": "2", "num_drafted": "2", "num_accepted": "1",
                   "num_emitted": "2", "drafted": "1 2", "drafted_text": ' "x"', "verdicts": "accepted rejected",
                   "draft_probs": "1 1", "target_probs": "0.5 0.123457", "correction": "7", "correction_text": "\n",
                   "correction_kind": "resampled", "correction_prob": "0.125", "greedy": "True",
                   "draft_seconds": "0.1", "verify_seconds": "0.2", "num_draft_pieces": "", "draft_pieces": "",
                   "cut_text": "", "shared_mass": ""}
    # Drafted across tokenizers: the draft model's own tokens as their text, their count, the cut text.
    record.update(draft_pieces=[" jump", "ed", " o"], cut_text=" o", shared_mass=[0.75, 1.0, 0.5])
    row = export.csv_row(record)
    assert (row["num_draft_pieces"], row["draft_pieces"], row["cut_text"], row["shared_mass"]) == (
        "3", " jumped o", " o", "0.75 1 0.5")


def test_csv_survives_commas_quotes_and_newlines(tmp_path):
    record = {name: None for name in export.CYCLE_FIELDS}
    record.update(config='a, "b"', cycle=0, k=1, drafted=[3], drafted_text=['line\nbreak, "quoted"'], num_accepted=1,
                  verdicts=["accepted"], draft_probs=[1.0], target_probs=[1.0], emitted=[3], greedy=True,
                  draft_seconds=0.0, verify_seconds=0.0)
    export.write_csv([record], tmp_path / "c.csv")
    _, rows = read_csv(tmp_path / "c.csv")
    assert rows == [export.csv_row(record)] and rows[0]["drafted_text"] == 'line\nbreak, "quoted"'


def test_a_failed_write_leaves_the_existing_file_as_it_was(exported, tmp_path):
    # A lone surrogate cannot be written as UTF-8: the write fails, and the file it would have
    # replaced is untouched (written whole or not at all, never truncated first).
    folder, _, _ = exported
    record = dict(export.read_jsonl(folder / "cycles.jsonl")[0], drafted_text=["caf\udce9"])
    for write, name in ((export.write_csv, "c.csv"), (export.write_jsonl, "c.jsonl")):
        path = tmp_path / name
        path.write_text("the previous export")
        with pytest.raises(SpecvizError, match="cannot encode"):
            write([record], path)
        assert path.read_text() == "the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "c.jsonl"]     # no partial file left


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
    # Sampled: classic cycles keep one uniform per tested token; drafter-invariant ones none (their test
    # is the target's own token, kept in target_top).
    sampled = [r for r in records if not r["greedy"]]
    tested = [0 if r["invariant"] else min(r["num_accepted"] + 1, len(r["drafted"])) for r in sampled]
    assert sampled and [len(r["uniforms"]) for r in sampled] == tested
    assert all(len(r["target_top"]) == r["num_accepted"] + 1 for r in sampled if r["invariant"])


def test_summary_agrees_with_the_cycle_records(exported, comparison):
    folder, _, _ = exported
    summary = strict_json((folder / "summary.json").read_text())
    records = export.read_jsonl(folder / "cycles.jsonl")
    assert summary["prompt"] == PROMPT and summary["winner"] == winner_line(comparison)
    assert [c["config"] for c in summary["configurations"]] == comparison.labels
    for entry, result in zip(summary["configurations"], comparison.results):
        mine = [r for r in records if r["config"] == entry["config"]]
        drafted = sum(len(r["drafted"]) for r in mine)
        accepted = sum(r["num_accepted"] for r in mine)
        # vLLM's names, recomputed from the exported cycles.
        assert entry["draft_acceptance_rate"] == pytest.approx(accepted / drafted if drafted else 0.0)
        drafts = sum(1 for r in mine if r["drafted"])
        assert entry["mean_acceptance_length"] == pytest.approx(1 + (accepted / drafts if drafts else 0.0))
        assert entry["tokens_per_cycle"] == pytest.approx(sum(len(r["emitted"]) for r in mine) / len(mine))
        histogram = [0] * len(entry["acceptance_histogram"])
        for r in mine:
            histogram[r["num_accepted"]] += 1
        assert entry["acceptance_histogram"] == histogram
        assert entry["speedup"] == pytest.approx(result.speedup)
        assert entry["tokens"] == sum(len(r["emitted"]) for r in mine)
        assert entry["settings"]["draft"] == result.settings.draft


def test_a_cross_tokenizer_configuration_exports_its_draft_models_tokens(tiny, tmp_path):
    configs = [validate(RunSettings(draft="ngram", max_new_tokens=16, chat=False, fixed_k=True)),
               validate(RunSettings(draft="other-tokenizer", max_new_tokens=16, chat=False, fixed_k=True))]
    comparison = compare(configs, PROMPT, loader=tiny.loader)
    export.export_comparison(comparison, tmp_path)
    records = export.read_jsonl(tmp_path / "cycles.jsonl")
    cross = comparison.results[1]
    mine = [r for r in records if r["config"] == comparison.labels[1]]
    assert comparison.labels[1].endswith("(cross-tokenizer)") and len(mine) == len(cross.cycles)
    for record, cycle in zip(mine, cross.cycles):
        assert record["draft_pieces"] == cycle.draft_pieces and record["cut_text"] == cycle.cut_text
    assert all(r["draft_pieces"] is None for r in records if r["config"] == "ngram k=4")
    _, rows = read_csv(tmp_path / "cycles.csv")
    crossed = [row for row in rows if row["config"] == comparison.labels[1]]
    # (The last cycle, with no room left to draft, has no draft tokens.)
    assert [row["num_draft_pieces"] for row in crossed] == ["" if c.draft_pieces is None else str(len(c.draft_pieces))
                                                            for c in cross.cycles]
    assert crossed[0]["draft_pieces"] == "".join(cross.cycles[0].draft_pieces)
    assert {row["num_draft_pieces"] for row in rows if row["config"] == "ngram k=4"} == {""}
    entries = strict_json((tmp_path / "summary.json").read_text())["configurations"]
    assert [e["cross_tokenizer"] for e in entries] == [False, True]
    assert entries[1]["draft_tokens_per_target_token"] == pytest.approx(cross.stats.draft_tokens_per_target_token)
    assert entries[0]["draft_tokens_per_target_token"] is None
    # The recording replays it with the draft model's tokens.
    from specviz.runs import recording

    replayed = recording.load(tmp_path / "recording.json")
    assert replayed.labels == comparison.labels and replayed.runs[1].cycles == cross.cycles


def test_nan_is_written_as_null():
    assert export._finite(float("nan")) is None and export._finite([1.0, math.inf]) == [1.0, None]


def test_sweep_summary_and_png_fallback(tiny, tmp_path, monkeypatch):
    result = sweep(validate(RunSettings(fixed_k=True, draft="ngram", max_new_tokens=8)), PROMPT, ks=[1, 2],
                   loader=tiny.loader)

    def no_chrome(figures, directory):
        raise RuntimeError("no Chrome found")

    monkeypatch.setattr(export, "write_pngs", no_chrome)
    written, note = export.export_comparison(result.comparison, tmp_path, figures={"k_sweep": sweep_figure(result)},
                                             sweep=result, png=True)
    assert "PNG charts skipped" in note and "no Chrome found" in note
    assert (tmp_path / "charts.html").exists() and not (tmp_path / "k_sweep.png").exists()
    assert '<section id="k_sweep">' in (tmp_path / "charts.html").read_text(encoding="utf-8")
    data = strict_json((tmp_path / "summary.json").read_text())["sweep"]
    assert [p["k"] for p in data["points"]] == [1, 2] and data["best_measured_k"] == result.best_measured_k
    assert data["points"][0]["theory_speedup"] == pytest.approx(result.theory(1))
