"""The bench: structure and correctness only (no timing is asserted; benchmarks print ratios).
Everything runs on the tiny in-process pair; nothing is downloaded."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specviz import bench
from specviz.cli import entry

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {"specviz_tokens_per_s", "transformers_tokens_per_s", "baseline_tokens_per_s", "identical_to_baseline",
            "acceptance_rate", "tokens_per_pass", "cost_ratio", "specviz_speedup", "transformers_speedup",
            "specviz_vs_transformers", "expected_speedup", "category", "draft"}


def test_prompt_set_has_six_categories_of_five():
    prompts = bench.load_prompts()
    assert len(prompts) == 30 and len({p.id for p in prompts}) == 30
    counts = {c: sum(p.category == c for p in prompts) for c in {p.category for p in prompts}}
    assert counts == dict.fromkeys(["chat", "code", "rewrite", "summarisation", "translation", "maths"], 5)


def test_category_filter_and_limit():
    prompts = bench.load_prompts(categories=["code", "maths"], limit=2)
    assert [p.category for p in prompts] == ["code", "code", "maths", "maths"]
    with pytest.raises(bench.BenchError, match="unknown category"):
        bench.load_prompts(categories=["poetry"])


@pytest.mark.parametrize("draft", ["tiny", "ngram", "self:3"])
def test_tiny_bench_rows(draft):
    setup = bench.tiny_setup(draft, device="cpu")
    prompts = bench.load_prompts(categories=["rewrite", "maths"], limit=1)
    k = bench.DEFAULT_K[setup.draft_kind]
    rows = bench.run_bench(setup, prompts, k=k, max_new_tokens=12)
    assert [r["category"] for r in rows] == ["rewrite", "maths"]
    for row in rows:
        assert REQUIRED <= row.keys()
        assert row["new_tokens"] == 12 and row["k"] == k
        # fp32 greedy: specviz and transformers both reproduce plain decoding exactly
        assert row["identical_to_baseline"] is True and row["first_divergence"] is None
        assert row["transformers_identical_to_baseline"] is True
        assert row["specviz_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0
        assert 0.0 <= row["acceptance_rate"] <= 1.0 and 1.0 <= row["tokens_per_pass"] <= k + 1
    summary = bench.summarize_rows(rows)
    assert [s["category"] for s in summary] == ["rewrite", "maths", "overall"]
    assert summary[-1]["prompts"] == 2 and summary[-1]["identical"] == 2


def test_transformers_gets_the_same_drafter_with_fixed_k():
    kwargs, config, _ = bench.transformers_settings(bench.tiny_setup("ngram", device="cpu"), 8)
    assert kwargs == {"prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 3} and config == {}
    kwargs, config, _ = bench.transformers_settings(bench.tiny_setup("self:2", device="cpu"), 4)
    assert kwargs == {"assistant_early_exit": 2}
    assert config == {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant",
                      "assistant_confidence_threshold": 0.0}
    setup = bench.tiny_setup("tiny", device="cpu")
    kwargs, _, _ = bench.transformers_settings(setup, 4)
    assert kwargs["assistant_model"] is setup.assistant
    # The settings are put on the assistant's generation_config for the call only.
    before = setup.assistant.generation_config.num_assistant_tokens
    bench.run_transformers(setup, bench.encode_bytes("hello"), 4, 3, bench.clock_for(setup.device))
    assert setup.assistant.generation_config.num_assistant_tokens == before


def test_markdown_table_renders():
    rows = [dict(category=c, target="t", draft="ngram", k=8, dtype="float32", acceptance_rate=0.5, tokens_per_pass=2.0,
                 cost_ratio=0.01, baseline_tokens_per_s=10.0, specviz_tokens_per_s=20.0, transformers_tokens_per_s=19.0,
                 specviz_speedup=2.0, transformers_speedup=1.9, specviz_vs_transformers=1.05, expected_speedup=2.1,
                 speedup_vs_theory=0.95, identical_to_baseline=True, transformers_identical_to_baseline=True)
            for c in ("code", "maths")]
    table = bench.markdown_table(bench.summarize_rows(rows))
    lines = table.splitlines()
    assert len(lines) == 2 + 3 and all(line.startswith("|") and line.endswith("|") for line in lines)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "**overall**" in lines[-1] and "2.00x" in lines[-1] and "2/2 (HF 2)" in lines[-1]


def test_bench_command_writes_json_and_markdown(tmp_path, capsys):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    code = entry(["bench", "--target", "tiny", "--draft", "tiny", "--draft", "ngram", "--category", "code,maths",
                  "--limit", "1", "--max-new-tokens", "8", "--quiet", "--json", str(out), "--markdown", str(md)])
    assert code == 0
    data = json.loads(out.read_text())
    assert [m["draft"] for m in data["meta"]] == ["tiny-draft", "ngram"]
    assert len(data["rows"]) == 4 and all(REQUIRED <= row.keys() for row in data["rows"])
    assert {row["category"] for row in data["rows"]} == {"code", "maths"}
    printed = capsys.readouterr().out
    assert "hardware:" in printed and "| draft | category |" in printed
    assert md.read_text().strip() in printed


def test_bench_command_reports_bad_category(capsys):
    assert entry(["bench", "--target", "tiny", "--category", "poetry", "--quiet"]) == 2
    assert "unknown category" in capsys.readouterr().err


def test_gpu_script_smoke_mode_runs_on_cpu_without_gradio(tmp_path):
    # Runs the script as `python scripts/gpu_bench.py ...` would, then checks it never imported gradio.
    code = ("import sys; sys.path.insert(0, 'scripts'); import gpu_bench; rc = gpu_bench.main(sys.argv[1:]); "
            "assert 'gradio' not in sys.modules, 'gradio imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, "--device", "cpu", "--small", "--out", str(tmp_path),
                             "--prompts", "1", "--max-new-tokens", "6", "--max-q", "2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert set(report["pass_cost"]["tiny"]["ms"]) == {"1", "2"}
    assert [(p["target"], p["draft"]) for p in report["pairs"]] == [("tiny", "self"), ("tiny", "tiny-draft"),
                                                                     ("tiny", "ngram")]
    for pair in report["pairs"]:
        assert pair["throughput"]["identical_to_baseline"] == 1
        assert {"plain", "specviz", "transformers"} <= pair["overhead"].keys()
        assert pair["overhead"]["specviz"]["cycles"] >= 1 and pair["overhead"]["specviz"]["forward_calls"] >= 1
    self_pair = report["pairs"][0]["throughput"]
    assert self_pair["acceptance_rate"] == 1.0   # the target drafting for itself: everything accepted
    assert "| tiny | self |" in (tmp_path / "gpu_bench.md").read_text()
