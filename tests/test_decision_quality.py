"""scripts/decision_quality.py: every drafter's runs priced by one fixed pass table, per category."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import decision_quality  # noqa: E402 - after the sys.path insert


def test_every_drafter_is_priced_on_the_same_work_per_category(tiny, tmp_path, capsys):
    out = tmp_path / "quality.json"
    assert decision_quality.main(["--target", "tiny", "--limit", "1", "--max-new-tokens", "12", "--without-head",
                                  "--by-gain", "--json", str(out)], loader=tiny.loader) == 0
    report = json.loads(out.read_text())
    rows, summary = report["rows"], report["summary"]
    names = ["ngram", "suffix", "auto", "auto-no-head", "auto-by-gain"]
    assert {r["config"] for r in rows} == set(names)
    # Greedy in fp32: every drafter emits the same tokens for a prompt (each priced over equal work).
    by_prompt = {}
    for row in rows:
        by_prompt.setdefault(row["prompt"], set()).add(row["tokens"])
        # Every pass is priced from the one table (after its context): between its cheapest and dearest
        # width at any context timed (a pass may cost less than a plain step where the device says so:
        # the table is measured, not assumed).
        tables = list(report["pass_costs_by_context"].values())
        cheapest, dearest = min(map(min, tables)), max(map(max, tables))
        assert cheapest * row["passes"] <= row["pass_steps"] <= dearest * row["passes"]
        assert set(row["chosen"]) <= {"ngram", "suffix"} if row["config"].startswith("auto") else True
    assert all(len(tokens) == 1 for tokens in by_prompt.values())
    categories = {r["category"] for r in rows}
    assert set(summary) == categories | {"overall"}
    for cells in summary.values():
        assert set(cells) == set(names)
        for cell in cells.values():
            assert cell["pass_only"] >= cell["priced"] > 0
    assert report["pass_costs"][0] == 1.0
    printed = capsys.readouterr().out
    assert "vs best single" in printed and "overall:" in printed


def test_a_prompt_file_of_ones_own_is_priced_per_its_categories(tiny, tmp_path, capsys):
    import long_prompts

    made = long_prompts.long_prompts()
    # Each request holds every bundled summarisation and rewrite passage: long, and not Spec-Bench's.
    assert len(made["prompts"]) == 4 and min(len(p["prompt"]) for p in made["prompts"]) > 3000
    assert long_prompts.main([str(tmp_path / "long.json")]) == 0
    assert json.loads((tmp_path / "long.json").read_text()) == made
    # A set of one's own (the tiny target's 512 positions hold a short one).
    own, out = tmp_path / "own.json", tmp_path / "quality.json"
    own.write_text(json.dumps({"categories": ["mine"], "prompts": [
        {"id": "mine-0", "category": "mine", "prompt": made["prompts"][0]["prompt"][-200:]}]}))
    assert decision_quality.main(["--target", "tiny", "--prompts", str(own), "--max-new-tokens", "8",
                                  "--draft", "ngram", "--json", str(out)], loader=tiny.loader) == 0
    report = json.loads(out.read_text())
    assert [r["prompt"] for r in report["rows"]] == ["mine-0"] and set(report["summary"]) == {"mine", "overall"}
    assert "mine: ngram" in capsys.readouterr().out
