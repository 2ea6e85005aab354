"""Step mode: the numbers shown for each cycle recompute its verdicts; the residual and greedy
views; the Explain tab's formulas filled with a run's numbers."""

import re

import pytest
from markdown_it import MarkdownIt
from conftest import make_cycle
from tiny_pair import PROMPT, WORDS

from specviz.views import teach, teach_figures, teach_rows
from specviz.core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED, Cycle
from specviz.metrics import expected_speedup, expected_tokens_per_pass, summarize
from specviz.runs import execute
from specviz.settings import RunSettings
from specviz.views import explain


def run(tiny, draft, **options):
    # The Teach tab's rule: rejection sampling, whose uniforms and residual it teaches.
    settings = RunSettings(sampling="classic", draft=draft, max_new_tokens=40, **{"fixed_k": True, **options})
    return execute(settings, PROMPT, tiny.loader(settings))


def text_of(token: int) -> str:
    return WORDS[token]


def check_rows_recompute_verdicts(cycle: Cycle) -> list[teach_rows.TokenRow]:
    rows = teach_rows.token_rows(cycle, text_of)
    assert [row.verdict for row in rows] == cycle.verdicts
    assert teach_rows.recomputed_num_accepted(rows) == cycle.num_accepted
    for row in rows:
        if row.position <= cycle.num_accepted:                       # the accepted prefix passed its test
            assert row.checked and row.accepted
        elif row.position == cycle.num_accepted + 1:                 # the first rejection failed it
            assert row.checked and row.accepted is False
        else:                                                        # the rest was never tested
            assert not row.checked and row.accepted is None
    return rows


@pytest.mark.parametrize("draft", ["small", "random", "ngram"])
def test_sampling_rows_recompute_each_verdict_from_the_uniform_draws(tiny, draft):
    result = run(tiny, draft, k=4, temperature=1.0, seed=11)
    rejected = accepted = 0
    for cycle in result.cycles:
        rows = check_rows_recompute_verdicts(cycle)
        for row in rows:
            assert row.ratio == pytest.approx(min(1.0, row.target_prob / row.draft_prob))
            if row.checked:
                # The rule itself: accepted exactly when u < min(1, target / draft).
                assert (row.uniform < row.ratio) == (row.verdict == ACCEPTED)
                accepted += row.accepted
                rejected += not row.accepted
    if draft != "ngram":   # prompt lookup may find few matches in 40 tokens; the others draft every cycle
        assert accepted and rejected


def test_a_draft_equal_to_the_target_is_always_accepted(tiny):
    result = run(tiny, "same", k=3, temperature=0.8, seed=2)
    for cycle in result.cycles:
        rows = check_rows_recompute_verdicts(cycle)
        assert all(row.ratio == pytest.approx(1.0, abs=1e-4) for row in rows)
        assert cycle.correction_kind == BONUS and not cycle.residual_top


def test_greedy_rows_compare_each_draft_with_the_target_argmax(tiny):
    result = run(tiny, "small", k=4)
    assert any(c.num_accepted for c in result.cycles) and any(c.num_accepted < len(c.drafted) for c in result.cycles)
    for cycle in result.cycles:
        rows = check_rows_recompute_verdicts(cycle)
        for row in rows[: cycle.num_accepted]:
            assert row.token == row.target_top and row.target_top_text == WORDS[row.token]
        if cycle.num_accepted < len(cycle.drafted):
            first_rejected = rows[cycle.num_accepted]
            assert first_rejected.token != first_rejected.target_top == cycle.correction
        assert all(row.uniform is None for row in rows)


# A sampled cycle worked out by hand: 4 accepted (u 0.5 < 0.45 / 0.5), 5 rejected (u 0.9 >= 0.1 / 0.4), 6
# never checked, 9 drawn from the residual.
KNOWN = dict(index=2, drafted=[4, 5, 6], num_accepted=1, correction=9, correction_prob=0.6,
             draft_probs=[0.5, 0.4, 0.3], target_probs=[0.45, 0.1, 0.2], uniforms=[0.5, 0.9],
             residual_top=[(9, 0.6), (10, 0.3), (4, 0.1)], greedy=False, verify_seconds=0.02)


def known_cycle(**changes):
    return make_cycle(**(KNOWN | changes))


def test_rows_table_and_narrative_of_a_known_cycle():
    cycle = known_cycle()
    rows = check_rows_recompute_verdicts(cycle)
    assert [r.ratio for r in rows] == pytest.approx([0.9, 0.25, 2 / 3])
    assert [r.uniform for r in rows] == [0.5, 0.9, None]
    table = teach_rows.rows_html(rows, greedy=False)
    assert "0.500 &lt; 0.900" in table and "0.900 \u2265 0.250" in table and "not checked" in table
    assert table.count('data-verdict="accepted"') == 1 and table.count('data-verdict="rejected"') == 1
    assert table.count('sv-unchecked') == 1   # the untested draft has no verdict's colour (issue 18)
    text = teach.cycle_markdown(cycle, rows, text_of, total=7)
    assert text.startswith("### Cycle 3 of 7: k = 3, speculative sampling")
    assert r"$u = 0.500 < \min\left(1, \frac{0.450}{0.500}\right) = 0.900$ → **accepted**" in text
    assert r"\ge" in text and "never checked" in text and f"`{WORDS[9]}`" in text      # the correction
    assert "emitted 2 tokens" in text


def test_residual_figure_shows_the_distribution_the_correction_came_from():
    cycle = known_cycle()
    figure = teach_figures.residual_figure(cycle, text_of)
    bars = figure.data[0]
    assert list(bars.x) == [0.6, 0.3, 0.1] and bars.y[0] == f"{WORDS[9]} #9"
    assert bars.marker.color[0] != bars.marker.color[1]          # the correction stands out
    bonus = known_cycle(num_accepted=3, uniforms=[0.1, 0.1, 0.1], target_probs=[0.9, 0.9, 0.9], residual_top=[])
    assert bonus.emitted == [4, 5, 6, 9] and bonus.correction_kind == BONUS
    note = teach_figures.residual_figure(bonus, text_of)
    assert not note.data and "every draft was accepted" in note.layout.annotations[0].text


def test_verification_figure_puts_each_draw_against_its_ratio():
    cycle = known_cycle()
    figure = teach_figures.verification_figure(cycle, teach_rows.token_rows(cycle, text_of))
    ratio, draws = figure.data
    assert list(ratio.y) == pytest.approx([0.9, 0.25, 2 / 3]) and list(draws.y) == [0.5, 0.9]
    greedy = known_cycle(greedy=True, uniforms=[], target_top=[4, 7], residual_top=[], correction=7)
    figure = teach_figures.verification_figure(greedy, check_rows_recompute_verdicts(greedy))
    assert [t.name for t in figure.data] == ["draft p", "target p"]
    assert "= argmax" in figure.layout.xaxis.ticktext[0] and "\u2260 argmax" in figure.layout.xaxis.ticktext[1]


def test_step_view_walks_through_a_run(tiny):
    result = run(tiny, "small", k=3, temperature=0.9, seed=4)
    stepped = teach.teach_run(result, tiny.tokenizer, label="small k=3")
    assert stepped.text_of(result.cycles[0].drafted[0]).strip() == WORDS[result.cycles[0].drafted[0]]
    first = teach.step_view(stepped, 0)
    assert first.position == f"Cycle 1 of {len(result.cycles)}"
    assert first.tokens.count("data-cycle=") == 1 and "sv-current" in first.tokens
    last = teach.step_view(stepped, 10_000)                       # clamped to the last cycle
    assert last.position == f"Cycle {len(result.cycles)} of {len(result.cycles)}"
    assert last.tokens.count("data-cycle=") == len(result.cycles)
    assert last.tokens.count("data-verdict=") == sum(len(c.drafted) + (c.correction is not None) for c in result.cycles)


def test_visible_whitespace():
    assert teach_rows.visible(" the") == "\u2423the" and teach_rows.visible("a\n") == "a\u21b5"
    assert teach_rows.visible("  ") == "\u2423\u2423" and teach_rows.visible("") == "\u2205"
    assert teach_rows.visible("\u00a0") == "U+00A0" and teach_rows.visible("\r\n") == "\u240d\u21b5"
    assert teach_rows.number(0.000012) == "1.2e-5" and teach_rows.number(0.000012, latex=True) == r"1.2\times10^{-5}"


def test_formulas_are_filled_with_a_runs_numbers(tiny):
    # Seed 4 accepts 41% of the drafts: enough for the formulas to find a k that pays at this host's
    # measured c (at 23%, seed 1 since position-keyed draws, a busy host's c of 0.35 left none).
    result = run(tiny, "small", k=4, temperature=1.0, seed=4)
    stats = summarize(result.cycles)
    text = explain.formulas_markdown(stats, measured_speedup=1.234, label="small k=4", clock="thread CPU time")
    a, c = stats.alpha, stats.cost_ratio
    assert f"$\\alpha = {a:.2f}$" in text and "$k = 4$" in text and f"$c = {c:.3f}$" in text
    assert f"= {expected_tokens_per_pass(a, 4):.2f}" in text and f"= {expected_speedup(a, 4, c):.2f}\\times" in text
    assert "**1.23\u00d7**" in text and f"**{stats.mean_acceptance_length:.2f}**" in text
    assert "**1.23\u00d7** (thread CPU time) over plain decoding" in text
    numbers = explain.run_numbers("small k=4", stats, 1.234, clock="thread CPU time")
    assert explain.explain_markdown(numbers) == text
    assert "Example numbers" in explain.explain_markdown(None)
    figure = explain.theory_figure(a, c, measured=(4, 1.234))
    mine = next(t for t in figure.data if "this run" in t.name)
    assert list(mine.y) == pytest.approx([expected_speedup(a, k, c) for k in range(1, 13)])
    assert figure.data[-1].name == "measured" and list(figure.data[-1].y) == [1.234]


def test_illustration_uses_the_token_styles():
    page = explain.illustration_html()
    for verdict in (ACCEPTED, REJECTED, RESAMPLED):
        assert f'data-verdict="{verdict}"' in page


def test_a_tree_cycle_is_drawn_as_a_tree(tiny):
    settings_run = run(tiny, "ngram-tree", k=4)
    stepped = teach.teach_run(settings_run, tiny.tokenizer, label="ngram-tree k=4")
    index = next(i for i, c in enumerate(settings_run.cycles) if c.is_tree and len(c.drafted) > 1)
    cycle = settings_run.cycles[index]
    figure = teach.step_view(stepped, index).verification
    assert figure.layout.title.text.startswith(f"The token tree: {len(cycle.drafted)} nodes")
    drawn = {trace.name: len(trace.x) for trace in figure.data[2:]}
    assert sum(drawn.values()) == len(cycle.drafted)
    assert drawn.get("accepted", 0) == len(cycle.accepted_nodes)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_teach_tells_a_trees_verification_node_by_node(tiny, temperature):
    from tiny_pair import PROMPT

    from specviz.core.events import ACCEPTED, REJECTED
    from specviz.runs import execute
    from specviz.settings import RunSettings

    settings = RunSettings(sampling="classic", target="tiny", draft="ngram-tree", k=4, max_new_tokens=64, chat=False,
                           temperature=temperature, seed=0, fixed_k=True)
    run = execute(settings, PROMPT, tiny.loader(settings))
    # some cycle goes deeper than one level (so the Markdown check below sees two depths)
    assert any(sum(line.startswith("**Depth") for line in teach.tree_tries(c, str)) > 1
               for c in run.cycles if c.is_tree)
    for cycle in (c for c in run.cycles if c.is_tree and c.drafted):
        lines = teach.tree_tries(cycle, lambda token: str(token))
        tries = [line for line in lines if line[:1].isdigit()]
        # Every node the target tried appears once, in order, with its recorded verdict.
        assert len(tries) == sum(v in (ACCEPTED, REJECTED) for v in cycle.verdicts)
        assert sum("**accepted**" in t for t in tries) == cycle.num_accepted
        if temperature:
            assert len(tries) == len(cycle.uniforms)
        assert sum(line.startswith("**Depth") for line in lines) >= 1
        # Rendered, each depth is a paragraph of its own, not swallowed by the list above it.
        page = MarkdownIt().render("\n".join(lines))
        assert page.count("<li>") == len(tries) and not re.search(r"<li>(?:(?!</li>).)*Depth", page, re.S)


@pytest.mark.parametrize("draft, temperature",
                         [("ngram-tree", 0.0), ("ngram-tree", 0.9), ("small", 0.9), ("small", 0.0)])
def test_stepping_test_by_test_walks_every_test_in_order_then_each_outcome(tiny, draft, temperature):
    settings = RunSettings(sampling="classic", target="tiny", draft=draft, k=4, max_new_tokens=32, chat=False,
                           temperature=temperature, seed=2, fixed_k=True)
    result = execute(settings, PROMPT, tiny.loader(settings))
    stepped = teach.teach_run(result, tiny.tokenizer, label=draft)
    def tested_in(cycle):
        return teach_rows.tested_nodes(cycle, teach_rows.token_rows(cycle, text_of))

    # From the first cycle's first step to the run's end, Next test visits each cycle's tests, then its
    # outcome (step m of a cycle with m tests).
    position, seen = (0, 0), []
    while True:
        seen.append(position)
        after = teach.next_test(stepped, *position, +1)
        if after == position:
            break
        assert teach.next_test(stepped, *after, -1) == position    # Previous test undoes it
        position = after
    expected = []
    for i, cycle in enumerate(result.cycles):
        tested = tested_in(cycle)
        expected += [(i, j) for j in range(len(tested) + 1)]
        # The target tests the accepted drafts, and each rejected one where it went on; nothing else.
        assert len(tested) == len(set(tested)) == sum(v in (ACCEPTED, REJECTED) for v in cycle.verdicts) - (
            0 if cycle.is_tree else sum(not r.checked for r in teach_rows.token_rows(cycle, text_of)))
        assert [n for n in tested if cycle.verdicts[n] == ACCEPTED] == (
            cycle.accepted_nodes if cycle.is_tree else list(range(cycle.num_accepted)))
        # From a cycle step's whole view, Next test starts this cycle's tests; Previous test goes back
        # to the previous cycle's outcome.
        following = (i, 0) if tested else teach.next_test(stepped, i, 0, +1)
        assert teach.next_test(stepped, i, None, +1) == following
        assert teach.next_test(stepped, i, None, -1) == ((i - 1, len(tested_in(result.cycles[i - 1]))) if i
                                                         else (0, None))
    assert seen == expected
    for index, test in seen:                                      # every step draws (sampled trees included)
        view = teach.step_view(stepped, index, test)
        outcome = test == len(tested_in(result.cycles[index]))
        assert view.position == (f"Cycle {index + 1} of {len(result.cycles)}, "
                                 + ("outcome" if outcome else f"test {test + 1}"))
    assert teach.next_test(stepped, 0, 0, -1) == (0, 0)           # the run's first test stays put

    # A test's view shows the tests so far, the one just made marked, and not yet the outcome; it does
    # not say how many tests there will be (that would tell where the first rejection is).
    index, cycle = next((i, c) for i, c in enumerate(result.cycles) if len(tested_in(c)) > 1)
    tested = tested_in(cycle)
    view = teach.step_view(stepped, index, 0)
    assert view.position == f"Cycle {index + 1} of {len(result.cycles)}, test 1"
    assert view.narrative.count(teach.CURRENT) == 1 and "*Test 1. Next test" in view.narrative
    # one verdict so far; every other draft (even one the target will never reach) is "not yet", its
    # target probability hidden
    assert view.table.count("data-verdict") == 1 and view.table.count(teach_rows.NOT_YET) == len(cycle.drafted) - 1
    assert view.table.count("sv-current-row") == 1
    assert view.tokens.count("data-cycle=") == index              # this cycle's tokens are not decided yet
    shown = {f"{p:.3f}" for p in cycle.target_probs[1:]} - {f"{cycle.target_probs[tested[0]]:.3f}"}
    if not cycle.is_tree:
        assert not any(f"<td>{p}</td>" in view.table for p in shown)
    whole = teach.step_view(stepped, index)
    assert teach.CURRENT not in whole.narrative and "emitted" in whole.narrative and "emitted" not in view.narrative
    last = teach.step_view(stepped, index, len(tested) - 1)       # the last test: what was never tested is known
    assert "That was the last test" in last.narrative and teach_rows.NOT_YET not in last.table
    if cycle.is_tree:
        drawn = {trace.name: len(trace.x) for trace in view.verification.data[2:]}
        assert drawn["this test"] == 1
        assert sum(n for name, n in drawn.items() if name != "this test") == len(cycle.drafted)
        assert drawn[teach_rows.NOT_YET] == len(cycle.drafted) - 1
        assert teach_rows.NOT_YET not in {trace.name for trace in last.verification.data}
        title = view.verification.layout.title.text
        assert "tested so far" in title and "accepted" not in title


# ----------------------------------------------------------------------------- across tokenizers

@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_cross_tokenizer_cycle_is_explained_step_by_step(tiny, temperature):
    settings = RunSettings(sampling="classic", fixed_k=True, draft="other-tokenizer", k=4, max_new_tokens=24,
                           chat=False, temperature=temperature, seed=1)
    result = execute(settings, PROMPT, tiny.loader(settings), warm_up=False)
    stepped = teach.teach_run(result, tiny.tokenizer, label="other-tokenizer k=4")
    if temperature:      # sampling drafts with token-level intersection: its own narrative
        told = [i for i, c in enumerate(result.cycles) if c.is_cross_tokenizer and c.drafted]
        assert told and all(result.cycles[i].shared_mass is not None for i in told)
        for i in told:
            narrative = teach.step_view(stepped, i).narrative
            assert "**Drafted across tokenizers**" in narrative and "Nothing was cut" in narrative
            assert "whose text is exactly one target token" in narrative
            assert r"accepted with probability $\min(1, p_\text{target}(x) / q(x))$" in narrative
            rows = check_rows_recompute_verdicts(result.cycles[i])
            assert [row.draft_prob for row in rows] == result.cycles[i].draft_probs
        return
    told = [i for i, c in enumerate(result.cycles) if c.is_cross_tokenizer and c.drafted and c.cut_text]
    assert told
    for i in told:
        cycle, in_context = result.cycles[i], result.texts[i].drafted
        narrative = teach.step_view(stepped, i).narrative
        # What the draft wrote in its own tokens, the target tokens its text became, what was cut.
        assert "**Drafted across tokenizers**" in narrative
        assert ("wrote " + " ".join(teach._md_token(p) for p in cycle.draft_pieces)
                + f" ({len(cycle.draft_pieces)} of its own tokens)") in narrative
        assert ("**re-tokenized** with the target's tokenizer, after the text the target has already written: "
                + " ".join(teach._md_token(t) for t in in_context)) in narrative
        assert f"The end, {teach._md_token(cycle.cut_text)}, was **cut** and left for the next cycle" in narrative
        # Then the target verifies the candidates as one-hot drafts: the rows show draft p 1.
        assert "**one-hot** drafts" in narrative
        if cycle.greedy:
            assert "accepted when it is the target's argmax" in narrative
        else:
            assert r"accepted with probability $\min(1, p_\text{target}(x) / 1) = p_\text{target}(x)$" in narrative
        rows = check_rows_recompute_verdicts(cycle)
        assert [row.draft_prob for row in rows] == [1.0] * len(cycle.drafted)
        # Rendered, the four steps are a list of their own: the drafts' numbered tests still start at 1.
        page = MarkdownIt().render(narrative)
        assert page.count("<ul>") == 1 and "<ol>" in page and "<ol start" not in page
    same = execute(RunSettings(fixed_k=True, draft="small", k=4, max_new_tokens=16, chat=False), PROMPT,
                   tiny.loader(RunSettings(fixed_k=True, draft="small")), warm_up=False)
    assert all("across tokenizers" not in teach.step_view(teach.teach_run(same, tiny.tokenizer), i).narrative
               for i in range(len(same.cycles)))
