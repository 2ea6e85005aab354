"""Comparisons and the k sweep on the tiny pair (`runs.compare`): shared baselines, the table and the
winner line (`views.prose`), the figures (`views.figures`) and the `compare` command line."""

from types import SimpleNamespace

import pytest

from tiny_pair import PROMPT

from specviz import cli, metrics
from specviz.errors import SpecvizError
from specviz.metrics import expected_speedup, measure_speed, pooled_alpha
from specviz.runs.compare import compare, iter_comparison, sweep
from specviz.runs.comparison import Comparison, config_labels
from specviz.settings import RunSettings, validate
from specviz.views import prose
from specviz.views.figures import comparison_figures, sweep_figure

TOKENS = 24
X = "\u00d7"


def settings(**values) -> RunSettings:
    # Fixed k unless a test says otherwise: these tests read what was drafted, which the cost-aware
    # policy decides from measured times on the tiny pair.
    return validate(RunSettings(**{"fixed_k": True, **values}))


@pytest.fixture(scope="module")
def comparison(tiny):
    configs = [settings(draft="ngram", max_new_tokens=TOKENS), settings(draft="same", k=3, max_new_tokens=TOKENS),
               settings(draft="small", k=2, temperature=0.9, seed=3, max_new_tokens=TOKENS)]
    return compare(configs, PROMPT, loader=tiny.loader)


def test_configurations_share_one_baseline_per_target_and_sampling(comparison):
    greedy_ngram, greedy_same, sampled = comparison.results
    assert comparison.done and comparison.labels == ["ngram k=4", "same k=3", "small k=2 T=0.9"]
    # The two greedy configurations share one plain run; the sampled one needs its own.
    assert greedy_same.steps is greedy_ngram.steps and greedy_same.plain == greedy_ngram.plain
    assert sampled.steps is not greedy_ngram.steps and len(sampled.steps) == TOKENS
    assert [name for name, _ in prose.baseline_labels(comparison)] == ["plain decoding (greedy)",
                                                                       "plain decoding (T=0.9)"]
    # Greedy speculative output equals plain greedy output (float32), whatever the drafter.
    assert greedy_ngram.identical and greedy_same.identical
    # A draft identical to the target has every draft accepted.
    assert greedy_same.stats.draft_acceptance_rate == 1.0
    # The speedup is the decode-only one, against the configuration's own (or shared) baseline.
    assert all(r.speedup == pytest.approx(measure_speed(r.cycles, r.steps).speedup) for r in comparison.results)


def test_iter_comparison_yields_as_it_goes_and_reports_progress(tiny):
    configs = [settings(draft="ngram", max_new_tokens=8), settings(draft="self:2", max_new_tokens=8)]
    finished, messages = [], []
    for partial in iter_comparison(configs, PROMPT, loader=tiny.loader,
                                           progress=lambda f, m: messages.append((f, m))):
        finished.append(len(partial.results))
    # Many yields (one per event), the finished count rising 0 -> 1 -> 2.
    assert len(finished) > 4 and finished == sorted(finished) and finished[-1] == 2 and 0 in finished
    fractions = [f for f, _ in messages]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert messages[0][1].startswith("[1/2] ngram k=4") and messages[-1][1].startswith("[2/2] self:2 k=4")


def test_a_consumer_that_stops_iterating_stops_the_work(tiny):
    configs = [settings(draft="ngram", max_new_tokens=TOKENS), settings(draft="self:2", max_new_tokens=TOKENS)]
    calls = len(tiny.calls)
    for partial in iter_comparison(configs, PROMPT, loader=tiny.loader):
        assert partial.current is not None and not partial.results
        break
    assert len(tiny.calls) == calls + 1   # the second configuration was never loaded


def test_nothing_to_compare_is_a_user_error():
    with pytest.raises(SpecvizError, match="Nothing to compare"):
        compare([], PROMPT)


def test_labels_are_distinct_and_name_the_target_only_when_targets_differ():
    same = config_labels([settings(draft="ngram"), settings(draft="ngram"), settings(draft="ngram", k=8)])
    assert same == ["ngram k=4", "ngram k=4 #2", "ngram k=8"]
    mixed = config_labels([settings(target="a/b", draft="self:4", dynamic_k=True), settings(draft="ngram")])
    assert mixed == ["a/b: self:4 k=4..8 (dynamic)", "default: ngram k=4"]


def test_table_has_a_row_per_configuration_and_per_baseline(comparison):
    rows = prose.table_rows(comparison)
    assert len(rows) == 3 + 2 and all(len(row) == len(prose.TABLE_HEADERS) for row in rows)
    same = comparison.results[1]
    s = same.stats
    assert rows[1][:6] == ["same k=3", "100.0%", f"{s.mean_acceptance_length:.2f}", f"{s.tokens_per_cycle:.2f}",
                           f"{s.cost_ratio:.3f}", f"{same.speedup:.2f}{X}"]
    ideal = metrics.ideal_speedup(s, same.speed)
    assert rows[1][7:] == [f"{same.theory_at_pass_cost:.2f}{X}", f"{ideal:.2f}{X}", f"{s.tokens_per_second:.1f}"]
    assert rows[3][0] == "plain decoding (greedy)" and rows[3][5] == f"1.00{X}"
    assert rows[3][-1] == f"{same.plain.tokens_per_second:.1f}"
    # Greedy configurations, and the sampled one (drafter-invariant sampling), are checked against the plain output.
    assert prose.identity_line(comparison) == "Outputs: identical to plain decoding's (3 of 3)."


def fake(speedup, per_pass, k, c, pass_ms=50):
    cycles = [SimpleNamespace(verify_seconds=pass_ms / 1000)] * 3
    return SimpleNamespace(speedup=speedup, cycles=cycles, stats=SimpleNamespace(
        tokens_per_cycle=per_pass, mean_k=k, cost_ratio=c, drafted=3 * k, cycles=3))


def fake_comparison(*results):
    labels = [f"config {i + 1}" for i in range(len(results))]
    return Comparison("p", [None] * len(results), labels, list(results))


def test_winner_line_says_whether_acceptance_or_cost_won():
    by_acceptance = prose.winner_line(fake_comparison(fake(1.4, 2.0, 4, 0.2), fake(2.1, 3.5, 4, 0.25)))
    assert by_acceptance.startswith(f"config 2 won: 2.10{X} over plain decoding against 1.40{X} for config 1")
    assert "on acceptance: 3.50 tokens per target pass against 2.00, although drafting costs 1.00" in by_acceptance
    by_cost = prose.winner_line(fake_comparison(fake(2.5, 2.0, 4, 0.001), fake(1.2, 3.0, 4, 0.3)))
    assert by_cost.startswith("config 1 won") and "on draft cost: drafting costs 0.00" in by_cost
    assert "although 2.00 tokens per target pass against 3.00" in by_cost
    both = prose.winner_line(fake_comparison(fake(2.5, 3.0, 4, 0.001), fake(1.2, 2.0, 4, 0.3)))
    assert "on acceptance and draft cost" in both
    # Same acceptance and draft cost, but the other drafts longer and pays for it in the target pass.
    verify = prose.winner_line(fake_comparison(fake(2.7, 2.25, 4, 0.0, 60), fake(2.0, 2.25, 6, 0.0, 85)))
    assert "on verification cost: a target pass took 60 ms against 85 ms, verifying 4.0 drafted tokens against 6.0" \
        in verify
    odd = prose.winner_line(fake_comparison(fake(2.7, 2.25, 6, 0.0, 60), fake(2.0, 2.25, 4, 0.0, 85)))
    assert "as many drafted tokens or more (timing noise?)" in odd
    noise = prose.winner_line(fake_comparison(fake(1.51, 2.0, 4, 0.1), fake(1.5, 2.0, 4, 0.1)))
    assert "timing noise" in noise
    contradiction = prose.winner_line(fake_comparison(fake(1.4, 1.9, 4, 0.7), fake(0.4, 2.6, 4, 0.0)))
    assert contradiction.startswith("config 1 won") and "the timings contradict the counts" in contradiction
    slower = prose.winner_line(fake_comparison(fake(0.8, 1.1, 4, 0.5), fake(0.9, 1.2, 4, 0.5)))
    assert slower.startswith("No configuration beat plain decoding; config 2 came closest")
    assert prose.winner_line(fake_comparison(fake(1.7, 2.0, 4, 0.1))) == f"config 1: 1.70{X} over plain decoding."


def test_sweep_runs_each_k_against_one_baseline_and_marks_the_best(tiny):
    config = settings(draft="small", dynamic_k=True, max_new_tokens=TOKENS)
    result = sweep(config, PROMPT, ks=[1, 2, 3], loader=tiny.loader)
    assert result.ks == [1, 2, 3] and [r.settings.k for _, r in result.points] == [1, 2, 3]
    assert not any(r.settings.dynamic_k for _, r in result.points)      # a sweep fixes k
    assert len({id(r.steps) for _, r in result.points}) == 1             # one shared baseline
    assert result.alpha == pytest.approx(pooled_alpha([r.cycles for _, r in result.points]))
    accepted = sum(r.stats.accepted for _, r in result.points)
    rejections = sum(c.num_accepted < len(c.drafted) for _, r in result.points for c in r.cycles)
    assert result.alpha == pytest.approx(accepted / (accepted + rejections))
    assert result.theory(2) == pytest.approx(expected_speedup(result.alpha, 2, result.cost_ratio))
    assert result.best_measured_k == max(result.points, key=lambda p: p[1].speedup)[0]
    assert result.best_theory_k == max([1, 2, 3], key=result.theory)
    assert len(prose.sweep_rows(result)) == 3 and f"k = {result.best_measured_k}" in prose.sweep_line(result)

    figure = sweep_figure(result)
    names = [trace.name for trace in figure.data]
    assert names[0] == "measured" and names[1].startswith("theory") and names[2].startswith("best measured k")
    assert list(figure.data[0].y) == [r.speedup for _, r in result.points]
    assert list(figure.data[2].x) == [result.best_measured_k]
    assert any(shape.x0 == result.best_theory_k for shape in figure.layout.shapes)


def test_comparison_figures_overlay_every_configuration(comparison):
    figures = comparison_figures(comparison)
    assert set(figures) == {"tokens_per_pass", "acceptance_by_position", "tokens_against_time"}
    assert [t.name for t in figures["tokens_per_pass"].data] == comparison.labels
    assert [t.name for t in figures["acceptance_by_position"].data] == comparison.labels
    race = [t.name for t in figures["tokens_against_time"].data]
    assert race == comparison.labels + ["plain decoding (greedy)", "plain decoding (T=0.9)"]
    # The race's last point per configuration: all its tokens at its total time.
    first = comparison.results[0]
    assert figures["tokens_against_time"].data[0].y[-1] == first.stats.tokens
    assert figures["tokens_against_time"].data[0].x[-1] == pytest.approx(first.stats.seconds)
    assert comparison_figures(Comparison("", [], [], []))["tokens_per_pass"].data == ()


# ----------------------------------------------------------------------------- across tokenizers

CROSS = "other-tokenizer k=4 (cross-tokenizer)"


@pytest.fixture(scope="module")
def across(tiny):
    """Prompt lookup against a draft with another tokenizer (the target's weights under reversed ids)."""
    configs = [settings(draft="ngram", max_new_tokens=TOKENS, chat=False, fixed_k=True),
               settings(draft="other-tokenizer", max_new_tokens=TOKENS, chat=False, fixed_k=True)]
    return compare(configs, PROMPT, loader=tiny.loader)


def test_a_same_and_a_cross_tokenizer_configuration_run_side_by_side(across):
    ngram, other = across.results
    # The label says which one drafts across tokenizers (known once its pair has loaded).
    assert across.labels == ["ngram k=4", CROSS]
    assert other.steps is ngram.steps                      # one shared greedy baseline
    assert ngram.identical and other.identical             # both lossless (float32, greedy)
    assert all(c.is_cross_tokenizer for c in other.cycles[:-1]) and not any(c.is_cross_tokenizer for c in ngram.cycles)
    assert other.stats.draft_acceptance_rate > 0.9         # the same model under other ids
    per_token = other.stats.draft_tokens_per_target_token
    assert per_token >= 1.0 and ngram.stats.draft_tokens_per_target_token is None
    # The table gains a column for it; the same-tokenizer row and the baseline leave it blank.
    headers, rows = prose.table_headers(across), prose.table_rows(across)
    assert headers == prose.TABLE_HEADERS + ["draft tokens per target token"]
    assert all(len(row) == len(headers) for row in rows)
    assert [row[0] for row in rows] == ["ngram k=4", CROSS, "plain decoding"]
    assert [row[-1] for row in rows] == ["", f"{per_token:.2f}", ""]
    # The charts name it as the table does.
    figures = comparison_figures(across)
    assert [t.name for t in figures["tokens_per_pass"].data] == ["ngram k=4", CROSS]
    assert CROSS in [t.name for t in figures["tokens_against_time"].data]


def test_a_comparison_without_a_cross_tokenizer_draft_has_no_such_column(comparison):
    assert prose.table_headers(comparison) == prose.TABLE_HEADERS
    assert not any(label.endswith("(cross-tokenizer)") for label in comparison.labels)


def test_the_compare_tab_shows_the_cross_tokenizer_configuration(across):
    from specviz.ui import compare_tab

    view = compare_tab.compare_view(across)
    assert CROSS in view.table and "draft tokens per target token" in view.table
    columns = [update["value"] for update in view.columns[:2]]
    per_token = across.results[1].stats.draft_tokens_per_target_token
    assert CROSS in columns[1] and f"{per_token:.2f} draft tokens per target token" in columns[1]
    assert "draft tokens per target token" not in columns[0]


def test_the_compare_button_runs_both_side_by_side(tiny):
    from specviz.settings import LOCAL
    from specviz.ui import compare_tab
    from specviz.ui.common import RAW, TICK

    rows = [[True, "", "ngram", 4, False, 0.0, 1], [True, "", "other-tokenizer", 4, False, 0.0, 1]]
    views = [v for v in compare_tab.compare_work(LOCAL, tiny.loader)(PROMPT, rows, 16, 0, RAW) if v is not TICK]
    final = views[-1]
    assert "2 configurations" in final.status and CROSS in final.table
    assert "draft tokens per target token" in final.table
    comparison, _ = final.result
    assert comparison.labels == ["ngram k=4", CROSS] and all(run.identical for run in comparison.results)


# ----------------------------------------------------------------------------- command line

def test_cli_compare_of_a_same_and_a_cross_tokenizer_draft(tiny, monkeypatch, capsys):
    monkeypatch.setattr("specviz.cli.compare.load", tiny.loader)
    monkeypatch.setenv("COLUMNS", "260")                  # the table on one line per row
    code = cli.entry(["compare", "--draft", "ngram", "--draft", "other-tokenizer", "--max-new-tokens", "12", "--raw",
                      "--no-color", PROMPT])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "configuration" in line)
    assert code == 0 and header.split()[-5:] == ["draft", "tokens", "per", "target", "token"]
    row = next(line for line in out.splitlines() if line.strip().startswith("other-tokenizer"))
    assert row.split()[:3] == ["other-tokenizer", "k=4", "(cross-tokenizer)"] and float(row.split()[-1]) >= 1.0
    assert "Greedy outputs: identical to plain decoding's (2 of 2)." in out


def test_cli_compare_prints_the_table_and_exports(tiny, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("specviz.cli.compare.load", tiny.loader)
    code = cli.entry(["compare", "--draft", "ngram", "--draft", "self:2", "--max-new-tokens", "12", "--no-color",
                      "--export", str(tmp_path / "out"), "--no-png", "--record", str(tmp_path / "c.json"), PROMPT])
    out = capsys.readouterr().out
    assert code == 0
    assert "ngram k=4" in out and "self:2 k=4" in out and "plain decoding" in out
    assert ("won" in out or "came closest" in out) and "Greedy outputs" in out
    assert f"wrote 5 files to {tmp_path / 'out'}" in out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"cycles.jsonl", "cycles.csv", "summary.json",
                                                              "recording.json", "charts.html"}
    # The recording holds both configurations, each against the shared baseline.
    from specviz.runs import recording
    recorded = recording.load(tmp_path / "c.json")
    assert recording.load(tmp_path / "out" / "recording.json").labels == recorded.labels   # the export has it too
    assert recorded.kind == "compare" and recorded.labels == ["ngram k=4", "self:2 k=4"]
    assert all(run.steps and run.stats.tokens == 12 for run in recorded.runs)


def test_cli_sweep(tiny, monkeypatch, capsys):
    monkeypatch.setattr("specviz.cli.compare.load", tiny.loader)
    assert cli.entry(["compare", "--draft", "ngram", "--sweep", "--max-new-tokens", "8", "--no-color", PROMPT]) == 0
    out = capsys.readouterr().out
    assert "k sweep of ngram" in out and "Best measured k" in out and "plain decoding:" in out
    assert cli.entry(["compare", "--draft", "ngram", "--draft", "self:2", "--sweep", PROMPT]) == 2
    assert "give one --draft" in capsys.readouterr().err


def test_cli_reports_a_failed_load(monkeypatch, capsys):
    def refuse(settings, progress=None):
        raise SpecvizError("no such model")

    monkeypatch.setattr("specviz.cli.compare.load", refuse)
    assert cli.entry(["compare", "--draft", "ngram", PROMPT]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines()[-1] == "error: no such model"
