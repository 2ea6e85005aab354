"""Comparisons over a set of prompts: the bootstrap on known data, the winner rule, the prompt-file
formats and their bad input, the harness on the tiny pair, and the command line."""

import json
import random
import statistics

import pytest
from test_cli import folder, no_loading, one_error_line  # noqa: F401 - fixtures
from tiny_pair import PROMPT

from specviz.catalog import BenchPrompt, preset_prompt_sets, read_prompt_file
from specviz.cli import entry
from specviz.errors import SpecvizError
from specviz.metrics import bootstrap_median, paired_ratio
from specviz.runs.prompt_set_result import PromptRun, PromptSetComparison
from specviz.runs.prompt_sets import compare_prompt_set
from specviz.settings import RunSettings
from specviz.views import prompt_sets as views

# ----------------------------------------------------------------------------- the statistics


def test_the_bootstrap_interval_covers_the_true_median():
    # Log-normal samples of 30 "speedups" around a true median of 1.5: the interval must hold it
    # in about 95% of the samples (at least 88 of 100 here; a too-narrow interval fails).
    rng = random.Random(7)
    hits = 0
    for trial in range(100):
        values = [1.5 * rng.lognormvariate(0, 0.3) for _ in range(30)]
        middle, low, high = bootstrap_median(values, samples=400, seed=trial)
        assert low <= middle <= high
        hits += low <= 1.5 <= high
    assert hits >= 88


def test_the_paired_comparison_separates_clearly_different_configurations():
    rng = random.Random(3)
    base = [rng.uniform(0.8, 3.0) for _ in range(20)]        # prompts differ a lot ...
    faster = [b * 1.3 * rng.uniform(0.95, 1.05) for b in base]   # ... the configurations differ by 30%
    ratio, low, high = paired_ratio(faster, base)
    assert 1.2 < ratio < 1.4 and low > 1.15
    # Unpaired, the same data cannot tell them apart: the prompt-to-prompt spread swamps the difference.
    assert bootstrap_median(faster)[1] < bootstrap_median(base)[2]
    same = [b * (0.96 if i % 2 else 1.04) for i, b in enumerate(base)]   # as often a bit slower as faster
    assert paired_ratio(same, base)[1] < 1 < paired_ratio(same, base)[2]


def comparison_of(speedups_by_config: list[list[float]]) -> PromptSetComparison:
    configs = [RunSettings(fixed_k=True, draft="ngram", k=k) for k in range(1, len(speedups_by_config) + 1)]
    prompts = [BenchPrompt(f"p{i}", "a", "x") for i in range(len(speedups_by_config[0]))]
    comparison = PromptSetComparison(configs, [f"c{i}" for i in range(len(configs))], prompts, 1)
    for c, speedups in enumerate(speedups_by_config):
        for p, value in enumerate(speedups):
            comparison.results.append(PromptRun(c, p, 0, value, 10, 10, 4, 8, 6, 1.0, None))
    return comparison


def test_a_winner_is_named_only_when_its_paired_interval_clears_one():
    rng = random.Random(1)
    base = [rng.uniform(1.0, 2.0) for _ in range(12)]
    clear = comparison_of([[b * 1.4 for b in base], base])
    assert clear.winner()[0] == 0 and views.summary(clear)["winner"] == "c0"
    assert views.winner_line(clear).startswith("c0 wins: 1.40")
    close = comparison_of([[b * rng.choice([0.97, 1.05]) for b in base], base])
    assert close.winner()[0] is None and views.summary(close)["winner"] is None
    assert views.winner_line(close).startswith("No clear winner") and "More prompts" in views.winner_line(close)


# ----------------------------------------------------------------------------- prompt files

def test_prompt_files_one_per_line_or_jsonl(tmp_path):
    lines = tmp_path / "prompts.txt"
    lines.write_text("first prompt\n\n  second prompt  \n", encoding="utf-8")
    assert [p.prompt for p in read_prompt_file(lines)] == ["first prompt", "second prompt"]
    records = tmp_path / "prompts.jsonl"
    records.write_text('{"prompt": "a", "category": "rewrite"}\n{"prompt": "b", "chat": false}\n', encoding="utf-8")
    prompts = read_prompt_file(records)
    assert [(p.prompt, p.category, p.chat) for p in prompts] == [("a", "rewrite", True), ("b", "file", False)]
    sets = preset_prompt_sets()
    assert len(sets["examples"]) >= 12 and {"chat", "rewrite"} <= set(sets)


@pytest.mark.parametrize("content, message", [
    (b"", "holds no prompts"),
    (b"   \n\n", "holds no prompts"),
    (b"ok\n" + b"x" * 20_001 + b"\n", "line 2: a prompt of 20001 characters"),
    (b"caf\xe9\n", "not UTF-8"),
    (b'{"prompt": "a"}\n{"prompt": \n', "line 2: not a JSON object"),
    (b'{"text": "a"}\n', 'needs a non-empty "prompt"'),
])
def test_bad_prompt_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "prompts.txt"
    path.write_bytes(content)
    with pytest.raises(SpecvizError, match=message):
        read_prompt_file(path)


def test_the_length_limit_is_the_prompts_not_its_json_lines(tmp_path):
    # A JSON line is longer than its prompt (the key, the quotes, escapes): the limit is on the prompt.
    from specviz.catalog import MAX_PROMPT_CHARS

    path = tmp_path / "prompts.jsonl"
    longest = 'say "' + "x" * (MAX_PROMPT_CHARS - 7) + '"\n'       # quotes and a newline: escaped in JSON
    line = json.dumps({"prompt": longest, "category": "long"})
    path.write_text(line + "\n")
    assert len(line) > MAX_PROMPT_CHARS and [p.prompt for p in read_prompt_file(path)] == [longest]
    path.write_text(json.dumps({"prompt": "x" * (MAX_PROMPT_CHARS + 1)}) + "\n")
    with pytest.raises(SpecvizError, match=f"line 1: a prompt of {MAX_PROMPT_CHARS + 1} characters"):
        read_prompt_file(path)
    path.write_text(json.dumps({"prompt": "short", "earlier": ["y" * (MAX_PROMPT_CHARS + 1)]}) + "\n")
    with pytest.raises(SpecvizError, match="a prompt of"):                # earlier turns are prompts too
        read_prompt_file(path)


# ----------------------------------------------------------------------------- the harness

def test_configurations_alternate_prompt_by_prompt_against_a_shared_baseline(tiny):
    prompts = [BenchPrompt(f"p{i}", "ab"[i % 2], PROMPT + " the cat" * i) for i in range(4)]
    configs = [RunSettings(fixed_k=True, draft="same", k=3, max_new_tokens=16),
               RunSettings(fixed_k=True, draft="random", k=3, max_new_tokens=16)]
    comparison = compare_prompt_set(configs, prompts, repeats=2, loader=tiny.loader)
    assert comparison.done and len(comparison.results) == 2 * 4 * 2
    order = [(r.round, r.prompt, r.config) for r in comparison.results]
    assert order == [(k, p, c) for k in range(2) for p in range(4) for c in range(2)]
    assert all(r.baseline_tokens == 16 for r in comparison.results)
    assert comparison.winner()[0] == 0                      # the target as its own draft beats a random one
    data = views.summary(comparison)
    first = data["configurations"][0]
    assert first["prompts"] == 4 and len(first["speedup_ci95"]) == 2 and set(first["by_category"]) == {"a", "b"}
    assert first["draft_acceptance_rate"] == 1.0 and data["winner"] == "same k=3"


def test_a_prompt_set_compares_a_same_and_a_cross_tokenizer_draft(tiny, tmp_path):
    prompts = [BenchPrompt(f"p{i}", "ab"[i % 2], PROMPT + " the cat" * i, chat=False) for i in range(3)]
    configs = [RunSettings(fixed_k=True, draft="ngram", k=4, max_new_tokens=12, chat=False),
               RunSettings(fixed_k=True, draft="other-tokenizer", k=4, max_new_tokens=12, chat=False)]
    comparison = compare_prompt_set(configs, prompts, loader=tiny.loader)
    assert comparison.labels == ["ngram k=4", "other-tokenizer k=4 (cross-tokenizer)"]
    cross = [r for r in comparison.results if r.config == 1]
    assert all(r.draft_model_tokens >= r.drafted for r in cross)          # the cut tokens are drafted too
    assert all(r.draft_model_tokens is None for r in comparison.results if r.config == 0)
    per_token = comparison.summary(1).draft_tokens_per_target_token
    assert per_token == pytest.approx(sum(r.draft_model_tokens for r in cross) / sum(r.drafted for r in cross))
    assert comparison.summary(0).draft_tokens_per_target_token is None
    assert views.table_headers(comparison) == views.TABLE_HEADERS + ["draft tokens per target token"]
    rows = {row[0]: row for row in views.table_rows(comparison)}
    assert rows["other-tokenizer k=4 (cross-tokenizer)"][-1] == f"{per_token:.2f}" and rows["ngram k=4"][-1] == ""
    data = views.summary(comparison)
    assert [c["draft_tokens_per_target_token"] for c in data["configurations"]] == [None, per_token]
    written = views.write_files(comparison, tmp_path)
    csv_text = next(path for path in written if path.name == "rows.csv").read_text()
    assert csv_text.splitlines()[0].endswith(",draft_model_tokens")
    # Without a cross-tokenizer draft, no such column.
    plain = compare_prompt_set(configs[:1], prompts[:1], loader=tiny.loader)
    assert views.table_headers(plain) == views.TABLE_HEADERS


# ----------------------------------------------------------------------------- the command line

def test_compare_over_a_prompt_file_writes_rows_and_a_summary(folder, tmp_path, capsys):  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the mat and the cat sat on the\nthe dog ran in the park and the dog\n")
    out, export = tmp_path / "set.json", tmp_path / "set"
    code = entry(["compare", "--target", folder, "--draft", "ngram", "--draft", "self:2", "--dtype", "float32",
                  "--max-new-tokens", "12", "--raw", "--prompts", str(prompts), "--json", str(out),
                  "--export", str(export), "--no-color"])
    stdout = capsys.readouterr().out
    assert code == 0 and "Over the prompts" in stdout and "by category" in stdout
    data = json.loads(out.read_text())
    assert {c["config"] for c in data["configurations"]} == {"ngram k=4", "self:2 k=4"}
    assert len(data["rows"]) == 4 and "winner" in data
    assert sorted(p.name for p in export.iterdir()) == ["charts.html", "rows.csv", "summary.json"]
    assert statistics.median([r["speedup"] for r in data["rows"] if r["config"] == "ngram k=4"]) > 0


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "no-such-set"], "no such prompt set"),
    (["--prompts", "rewrite", "a prompt too"], "either a prompt or --prompts"),
    (["--prompts", "rewrite", "--repeats", "0"], "--repeats must be from 1 to 100"),
    (["--repeats", "2", "a prompt"], "go with --prompts"),
])
def test_prompt_set_mistakes_fail_before_loading(no_loading, capsys, argv, message):  # noqa: F811
    assert message in one_error_line(capsys, entry(["compare", *argv]))


def test_repeated_work_drafts_from_its_own_earlier_turns_and_nothing_else(tiny):
    captured = []
    prompts = [BenchPrompt("again", "repeated", PROMPT, chat=False, earlier=(PROMPT,)),
               BenchPrompt("fresh", "other", PROMPT, chat=False)]
    settings = RunSettings(target="tiny", draft="suffix", k=4, max_new_tokens=32, chat=False, fixed_k=True)
    compare_prompt_set([settings], prompts, repeats=2, loader=tiny.loader,
                       after_run=lambda c, p, r, run: captured.append((p, r, run.stats)))
    by_prompt = {(p, r): stats for p, r, stats in captured}
    # With its earlier turn (the same request) the suffix drafter drafts the earlier answer...
    assert by_prompt[0, 0].accepted_from_earlier > 10
    # ...and without one it has nothing: no prompt learns from another, nor from its earlier round.
    assert by_prompt[1, 0].accepted_from_earlier == 0 == by_prompt[1, 1].accepted_from_earlier
    assert by_prompt[0, 1].accepted_from_earlier == by_prompt[0, 0].accepted_from_earlier


def test_the_repeated_category_ships_with_earlier_turns():
    repeated = preset_prompt_sets()["repeated"]
    assert len(repeated) == 5 and all(p.earlier for p in repeated)
    from specviz.catalog import load_bench_prompts
    assert all(p.category != "repeated" for p in load_bench_prompts())     # opt-in for the benchmark


def test_a_prompt_file_may_give_earlier_turns(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "b", "earlier": ["a"]}) + "\n")
    assert read_prompt_file(path)[0].earlier == ("a",)
    path.write_text(json.dumps({"prompt": "b", "earlier": "a"}) + "\n")
    with pytest.raises(SpecvizError, match="earlier"):
        read_prompt_file(path)


def test_time_left_counts_down_and_is_not_raised_by_a_slower_run():
    # 4 runs, started at t = 0; the second finished at t = 10 (a pace of 5 s a run).
    comparison = PromptSetComparison(configs=[RunSettings()], labels=["a"], prompts=[None, None], repeats=2,
                                     results=[object(), object()], started=0.0, last_finished=10.0)
    assert comparison.seconds_left(now=10.0) == 10.0
    assert comparison.seconds_left(now=13.0) == 7.0          # counts down during the third run
    comparison.results.append(object())
    comparison.last_finished = 24.0                           # a slow third run: the pace is now 8 s
    assert comparison.seconds_left(now=24.0) == 7.0           # not raised to 8: it only falls
    assert comparison.seconds_left(now=30.0) == 2.0           # 8 - 6, counting down again
    assert comparison.seconds_left(now=40.0) == 0.0
    comparison.results.append(object())
    comparison.last_finished = 41.0
    assert comparison.seconds_left(now=41.0) == 0.0           # all done
