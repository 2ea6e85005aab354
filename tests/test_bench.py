"""The bench: structure and correctness only (no timing is asserted; benchmarks print ratios).
Everything runs on the tiny in-process pair (`models.tiny`); nothing is downloaded."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specviz.catalog import load_bench_prompts
from specviz.cli import entry
from specviz.core.timing import Clock
from specviz.errors import SpecvizError
from specviz.models import Detokenizer, encode_prompt
from specviz.models.tiny import ByteTokenizer, encode_bytes, tiny_pair
from specviz.runs import bench
from specviz.runs import prompt_sets
from specviz.runs.run import load, race
from specviz.views import bench_table
from specviz.settings import RunSettings, validate

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {"specviz_tokens_per_s", "transformers_tokens_per_s", "baseline_tokens_per_s", "identical_to_baseline",
            "acceptance_rate", "tokens_per_cycle", "mean_acceptance_length", "cost_ratio", "specviz_speedup",
            "transformers_speedup", "specviz_vs_transformers", "expected_speedup", "category", "draft"}


def tiny_setup(draft: str, max_new_tokens: int = 12, k: int | None = None) -> bench.Setup:
    settings = validate(RunSettings(target="tiny", draft=draft, k=k or bench.default_k(draft),
                                    max_new_tokens=max_new_tokens, device="cpu"))
    return bench.Setup(settings, load(settings))


def test_prompt_set_has_six_categories_of_five():
    prompts = load_bench_prompts()
    assert len(prompts) == 30 and len({p.id for p in prompts}) == 30
    counts = {c: sum(p.category == c for p in prompts) for c in {p.category for p in prompts}}
    assert counts == dict.fromkeys(["chat", "code", "rewrite", "summarisation", "translation", "maths"], 5)


def test_category_filter_and_limit():
    prompts = load_bench_prompts(categories=["code", "maths"], limit=2)
    assert [p.category for p in prompts] == ["code", "code", "maths", "maths"]
    with pytest.raises(SpecvizError, match="unknown category"):
        load_bench_prompts(categories=["poetry"])


def test_byte_tokenizer_serves_the_run_path():
    tokenizer = ByteTokenizer()
    # The chat frame of the old tiny bench, through the one prompt encoder.
    assert torch.equal(encode_prompt(tokenizer, "héllo", chat=True), encode_bytes("héllo"))
    assert encode_prompt(tokenizer, "héllo", chat=False)[0].tolist() == list("héllo".encode())
    # A two-byte character: the first byte adds nothing yet, the second carries the whole character.
    detok = Detokenizer(tokenizer, list(b"h"))
    assert [detok.push(b) for b in "é!".encode()] == ["", "é", "!"]
    assert tokenizer.decode([104, 300, 105]) == "hi"   # ids past the bytes are the models' unused vocabulary


def test_tiny_pair_drafters():
    assert tiny_pair("tiny", device="cpu").draft_name == "tiny-draft"
    assert tiny_pair("ngram", device="cpu").draft_parameters == 0
    assert tiny_pair("self:3", device="cpu").draft_name == "self:3"
    with pytest.raises(SpecvizError, match="'tiny'"):
        tiny_pair("some/model", device="cpu")
    with pytest.raises(SpecvizError, match="between 1 and 7"):
        tiny_pair("self:9", device="cpu")


@pytest.mark.parametrize("draft", ["tiny", "ngram", "self:3"])
def test_tiny_bench_rows(draft, monkeypatch):
    # specviz's side goes through the prompt-set harness: one race per prompt, plain and speculative
    # decoding interleaved, with no per-run warm-up (the bench warms every method up once).
    calls = []

    def recording_race(settings, prompt, pair, **options):
        calls.append(options)
        return race(settings, prompt, pair, **options)

    monkeypatch.setattr(prompt_sets, "race", recording_race)
    setup = tiny_setup(draft)
    prompts = load_bench_prompts(categories=["rewrite", "maths"], limit=1)
    k = bench.DEFAULT_K[setup.draft.kind]
    rows = bench.run_bench(setup, prompts)
    assert calls == [{"baseline": True, "warm_up": False, "seed": None}] * 2   # one race per prompt (greedy: no seed)
    assert [r["category"] for r in rows] == ["rewrite", "maths"]
    for row in rows:
        assert REQUIRED <= row.keys()
        assert row["new_tokens"] == 12 and row["k"] == k
        # fp32 greedy: specviz and transformers both reproduce plain decoding exactly
        assert row["identical_to_baseline"] is True and row["first_divergence"] is None
        assert row["transformers_identical_to_baseline"] is True
        assert row["specviz_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0
        assert 0.0 <= row["acceptance_rate"] <= 1.0 and 1.0 <= row["tokens_per_cycle"] <= k + 1
        assert "tokens_per_pass" not in row     # a name that meant the mean acceptance length in earlier files
        # The host's load over the prompt's runs (steal: None for a race shorter than a clock tick).
        assert row["busy_host_repeats"] in (0, 1) and row["host_load_average"] >= 0
        assert row["host_steal_share"] is None or 0.0 <= row["host_steal_share"] <= 1.0
    summary = bench.summarize_rows(rows)
    assert [s["category"] for s in summary] == ["rewrite", "maths", "overall"]
    assert summary[-1]["prompts"] == 2 and summary[-1]["identical"] == 2


def test_tokens_per_second_is_tokens_over_each_methods_own_event_time(monkeypatch):
    runs = []

    def keeping_race(*args, **options):
        for run in race(*args, **options):
            yield run
        runs.append(run)

    monkeypatch.setattr(prompt_sets, "race", keeping_race)
    rows = bench.run_bench(tiny_setup("ngram", max_new_tokens=8), load_bench_prompts(categories=["code"], limit=1))
    run = runs[-1]
    assert rows[0]["specviz_tokens_per_s"] == pytest.approx(run.stats.tokens / run.stats.seconds)
    assert rows[0]["baseline_tokens_per_s"] == pytest.approx(len(run.steps) / run.plain.seconds)
    assert rows[0]["verify_pass_cost"] == pytest.approx(run.speed.pass_cost)
    assert rows[0]["decided_on"] == run.decided_on and rows[0]["decided_on"]["pass_steps"][0] == 1.0


def test_transformers_gets_the_same_drafter_with_fixed_k():
    kwargs, config, _ = bench.transformers_settings(tiny_setup("ngram", k=8))
    assert kwargs == {"prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 3} and config == {}
    kwargs, config, _ = bench.transformers_settings(tiny_setup("self:2"))
    assert kwargs == {"assistant_early_exit": 2}
    assert config == {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant",
                      "assistant_confidence_threshold": 0.0}
    setup = tiny_setup("tiny", k=3)
    kwargs, _, _ = bench.transformers_settings(setup)
    assert kwargs["assistant_model"] is setup.assistant is setup.pair.draft.model
    # The settings are put on the assistant's generation_config for the call only.
    before = setup.assistant.generation_config.num_assistant_tokens
    timed = bench.run_transformers(setup, encode_bytes("hello"), Clock(setup.device), 4)
    assert len(timed.tokens) == 4 and timed.target_passes >= 1
    assert setup.assistant.generation_config.num_assistant_tokens == before


def test_describe_names_the_clock():
    meta = bench.describe(tiny_setup("ngram"))
    assert meta["clock"] == Clock(torch.device("cpu")).name
    assert meta["target"] == "tiny-llama" and meta["draft"] == "ngram" and meta["k"] == 8
    # Every drafter kind has transformers' counterpart described (suffix and trees: its chain prompt lookup).
    for draft in ("ngram-tree", "suffix", "self:1", "tiny"):
        assert "prompt_lookup_num_tokens" in bench.describe(tiny_setup(draft))["transformers_settings"] or \
            draft in ("self:1", "tiny")


def cross_tokenizer_setup(max_new_tokens: int = 12) -> bench.Setup:
    """The tiny word-level pair drafted across tokenizers: the target's weights under reversed ids,
    one word short (transformers tells tokenizers apart by vocabulary size only)."""
    from conftest import reordered_copy
    from tiny_pair import WORDS, TinyModels, tiny_tokenizer

    from specviz.core.cross_tokenizer import CrossTokenizerDrafter
    from specviz.models import ModelPair

    models = TinyModels()
    words = [w for w in reversed(WORDS) if w != "blue"]
    draft_tokenizer = tiny_tokenizer(words)
    drafter = CrossTokenizerDrafter(reordered_copy(models.target, models.tokenizer, draft_tokenizer), draft_tokenizer,
                                    models.tokenizer, name="reversed")
    pair = ModelPair(target=models.target, tokenizer=models.tokenizer, draft=drafter, target_name="tiny",
                     draft_name="reversed", target_parameters=1, draft_parameters=1, device=models.target.device,
                     dtype=torch.float32, eos_token_ids=[])
    settings = validate(RunSettings(target="tiny", draft="./reversed", k=4, max_new_tokens=max_new_tokens,
                                    device="cpu", chat=False))
    return bench.Setup(settings, pair)


def test_a_cross_tokenizer_bench_counts_the_draft_models_tokens_per_target_token():
    from tiny_pair import PROMPT

    from specviz.catalog import BenchPrompt

    setup = cross_tokenizer_setup()
    prompts = [BenchPrompt("words-1", "rewrite", PROMPT, chat=False), BenchPrompt("words-2", "maths", PROMPT[4:],
                                                                                  chat=False)]
    rows = bench.run_bench(setup, prompts)
    for row in rows:
        # Against transformers' Universal Assisted Decoding: both write the target's greedy output.
        assert row["identical_to_baseline"] is True and row["transformers_identical_to_baseline"] is True
        assert row["cross_tokenizer"] is True and row["acceptance_rate"] > 0.5
        drafted = row["mean_drafted"] * row["target_passes"]
        assert row["draft_tokens_per_target_token"] == pytest.approx(row["draft_model_tokens"] / drafted)
        assert row["draft_tokens_per_target_token"] >= 1.0     # the cut token is drafted too
    summary = bench.summarize_rows(rows)
    assert summary[-1]["draft_tokens_per_target_token"] == pytest.approx(
        statistics.median(r["draft_tokens_per_target_token"] for r in rows))
    table = bench_table.markdown_table(summary)
    header, _, *lines = table.splitlines()
    assert "draft tok/target tok" in header and all(line.startswith("| reversed (cross-tokenizer) |") for line in lines)
    # A same-tokenizer bench has no such column, and its rows say so.
    same = bench.run_bench(tiny_setup("ngram", max_new_tokens=8), load_bench_prompts(categories=["code"], limit=1))
    assert same[0]["cross_tokenizer"] is False and same[0]["draft_tokens_per_target_token"] is None
    assert "draft tok/target tok" not in bench_table.markdown_table(bench.summarize_rows(same))


def test_markdown_table_renders():
    from specviz.equal_work import ALONG_NEAR_TIES

    rows = [dict(category=c, target="t", draft="ngram", k=8, dtype="float32", acceptance_rate=0.5, tokens_per_cycle=2.0,
                 cost_ratio=0.01, baseline_tokens_per_s=10.0, specviz_tokens_per_s=20.0, transformers_tokens_per_s=19.0,
                 specviz_speedup=2.0, transformers_speedup=1.9, specviz_vs_transformers=1.05, expected_speedup=2.1,
                 speedup_vs_theory=0.95, identical_to_baseline=True, transformers_identical_to_baseline=True)
            for c in ("code", "maths")]
    table = bench_table.markdown_table(bench.summarize_rows(rows))
    lines = table.splitlines()
    assert len(lines) == 2 + 3 and all(line.startswith("|") and line.endswith("|") for line in lines)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "**overall**" in lines[-1] and "2.00x" in lines[-1] and "2/2 (HF 2)" in lines[-1]
    # An output that parted at a near-tie and was compared along the speculative text is counted apart.
    rows[0].update(identical_to_baseline=False, compared_basis=ALONG_NEAR_TIES)
    table = bench_table.markdown_table(bench.summarize_rows(rows))
    assert "1/2 (+1 along near-ties) (HF 2)" in table.splitlines()[-1]


def test_bench_command_writes_json_and_markdown(tmp_path, capsys):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    code = entry(["bench", "--target", "tiny", "--draft", "tiny", "--draft", "ngram", "--category", "code,maths",
                  "--limit", "1", "--max-new-tokens", "8", "--quiet", "--json", str(out), "--markdown", str(md)])
    assert code == 0
    data = json.loads(out.read_text())
    assert [m["draft"] for m in data["meta"]] == ["tiny-draft", "ngram"]
    assert [m["k"] for m in data["meta"]] == [4, 8]
    assert len(data["rows"]) == 4 and all(REQUIRED <= row.keys() for row in data["rows"])
    assert {row["category"] for row in data["rows"]} == {"code", "maths"}
    printed = capsys.readouterr().out
    assert "hardware:" in printed and "| draft | category |" in printed
    assert f"clock: {data['meta'][0]['clock']}" in printed
    assert md.read_text().strip() in printed


def test_spec_bench_ships_whole_with_its_license_and_reads_as_its_leaderboard_groups_it():
    from specviz.catalog import SPEC_BENCH_CATEGORIES, SPEC_BENCH_FILE, load_spec_bench

    everything = load_spec_bench()
    assert len(everything) == 480 and len({p.id for p in everything}) == 480
    counts = {c: sum(p.category == c for p in everything) for c in SPEC_BENCH_CATEGORIES}
    assert counts == {"mt_bench": 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert "Apache License" in (SPEC_BENCH_FILE.parent / "LICENSE").read_text()
    first = load_spec_bench(["qa", "rag"], limit=2)
    assert [p.id for p in first] == ["spec-bench-321", "spec-bench-322", "spec-bench-481", "spec-bench-482"]
    drawn = load_spec_bench(["qa", "rag"], limit=2, sample_seed=7)
    assert drawn == load_spec_bench(["qa", "rag"], limit=2, sample_seed=7)        # the same seed, the same draw
    assert drawn != first and [p.category for p in drawn] == ["qa", "qa", "rag", "rag"]
    assert drawn != load_spec_bench(["qa", "rag"], limit=2, sample_seed=8)
    with pytest.raises(SpecvizError, match="unknown Spec-Bench category"):
        load_spec_bench(["poetry"])


def test_bench_runs_spec_bench_by_name(tmp_path):
    out = tmp_path / "bench.json"
    code = entry(["bench", "--target", "tiny", "--draft", "ngram", "--prompts", "spec-bench", "--category", "qa",
                  "--limit", "1", "--sample-seed", "3", "--max-new-tokens", "6", "--quiet", "--json", str(out)])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 and rows[0]["category"] == "qa" and rows[0]["id"].startswith("spec-bench-")


@pytest.mark.parametrize("argv, message", [
    (["--category", "poetry"], "unknown category"),
    (["--clock", "process"], "unrecognized arguments: --clock"),   # gone: the core Clock chooses
    (["--k", "0"], "k (tokens drafted per cycle)"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--draft", "gpt2"], "for the tiny target"),
    (["--prompts", "spec-bench", "--category", "poetry"], "unknown Spec-Bench category"),
    (["--prompts", "spec-bench", "--sample-seed", "3"], "give --limit too"),
])
def test_bench_command_reports_bad_input(capsys, argv, message):
    assert entry(["bench", "--target", "tiny", "--quiet", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1].startswith("error: ") and message in err


@pytest.mark.slow
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


@pytest.mark.slow
def test_gpu_paths_dry_run_on_cpu_checks_the_loop_and_the_head_without_gradio_or_vllm(tmp_path):
    # scripts/gpu_paths.py on a CPU: the batched loop and the head (the Clock and out-of-memory checks need CUDA).
    code = ("import sys; sys.path.insert(0, 'scripts'); import gpu_paths; rc = gpu_paths.main(sys.argv[1:]); "
            "assert not {'gradio', 'vllm'} & set(sys.modules), 'gradio or vllm imported'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, "--device", "cpu", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-2000:]
    report = json.loads((tmp_path / "gpu_paths.json").read_text())
    checks = {c["check"]: c for c in report["checks"]}
    assert set(checks) == {"batched loop on cpu", "head in the batched loop on cpu"}
    drafters = checks["batched loop on cpu"]["drafters"]
    assert set(drafters) == {"draft model", "prompt lookup", "early exit"}
    assert all(d["identical_rows"] == d["rows"] == 4 for d in drafters.values())
    assert checks["head in the batched loop on cpu"]["identical_rows"] == 4
    assert "need CUDA" in report["skipped"][0]


def test_bench_without_transformers_leaves_its_columns_empty_and_says_why(tmp_path):
    out = tmp_path / "bench.json"
    code = entry(["bench", "--target", "tiny", "--draft", "ngram", "--category", "code", "--limit", "1",
                  "--max-new-tokens", "8", "--quiet", "--no-transformers", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["meta"][0]["transformers_settings"] == "not run (--no-transformers)"
    assert [row["transformers_speedup"] for row in data["rows"]] == [None]
    assert data["rows"][0]["specviz_speedup"] is not None
