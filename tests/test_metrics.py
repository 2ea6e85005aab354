"""The theory formulas and the statistics computed from events."""

import pytest

from conftest import make_cycle
from specviz.equal_work import first_divergence
from specviz.metrics import best_k, cost_ratio, expected_speedup, expected_tokens_per_pass, summarize


def test_theory_formulas():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert expected_speedup(0.5, 2, 0.5) == pytest.approx(1.75 / 2)
    # Free drafts and perfect acceptance: the longest k wins; costly drafts and poor acceptance: k = 1.
    assert best_k(0.99, 0.0, max_k=8) == 8
    assert best_k(0.3, 0.5) == 1
    # The best k maximises the formula.
    a, c = 0.8, 0.05
    assert all(expected_speedup(a, best_k(a, c), c) >= expected_speedup(a, k, c) for k in range(1, 17))


def test_summarize_counts_and_vllm_names():
    # 0.01 s per drafted token, 0.1 s per pass (the first: 0.5 s, it carries the prefill). The last
    # pass had no drafts (prompt lookup found none): it counts in tokens per cycle, not in vLLM's figures.
    cycles = [make_cycle(index=0, drafted=[1, 2, 3, 4], num_accepted=4, draft_seconds=0.04, verify_seconds=0.5),
              make_cycle(index=1, drafted=[1, 2, 3, 4], num_accepted=1, draft_seconds=0.04, verify_seconds=0.1),
              make_cycle(index=2, drafted=[5, 6, 7, 8], num_accepted=0, draft_seconds=0.04, verify_seconds=0.1),
              make_cycle(index=3, drafted=[1, 2], num_accepted=2, draft_seconds=0.02, verify_seconds=0.1),
              make_cycle(index=4, drafted=[], num_accepted=0, k=4, draft_seconds=0.0, verify_seconds=0.1)]
    s = summarize(cycles)
    assert (s.drafted, s.accepted, s.tokens, s.cycles, s.num_drafts) == (14, 7, 12, 5, 4)
    assert s.draft_acceptance_rate == pytest.approx(7 / 14)
    assert s.alpha == pytest.approx(7 / (7 + 2))           # two cycles had a rejection
    assert s.mean_acceptance_length == pytest.approx(1 + 7 / 4)     # vLLM's: per step that had drafts
    assert s.tokens_per_cycle == pytest.approx(12 / 5)               # the own loop's: every pass
    assert s.acceptance_histogram == [2, 1, 1, 0, 1]
    # vLLM's per position: accepted there / drafting steps; the own loop's: / the drafts reaching it.
    assert s.acceptance_rate_per_position == [pytest.approx(v) for v in (3 / 4, 2 / 4, 1 / 4, 1 / 4)]
    assert s.acceptance_when_reached == [pytest.approx(v) for v in (3 / 4, 2 / 4, 1 / 3, 1 / 3)]
    # c leaves out the first cycle (it carries the prefill): 0.01 s per draft token / 0.1 s per pass.
    assert cost_ratio(cycles) == pytest.approx(0.1)
    # The theory at a = 7/9 over the lengths drafted (4, 4, 4, 2, 0): 1 + a + ... + a^n tokens a pass.
    expected = sum(sum((7 / 9) ** i for i in range(n + 1)) for n in (4, 4, 4, 2, 0)) / 5
    assert s.expected_tokens_per_pass == pytest.approx(expected)
    assert s.expected_speedup == pytest.approx(expected / (14 / 5 * 0.1 + 1))
    d = s.to_dict()
    assert d["mean_acceptance_length"] == s.mean_acceptance_length and d["tokens_per_cycle"] == s.tokens_per_cycle
    assert "acceptance_by_position" not in d        # one name per figure in the JSON


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


# ----------------------------------------------------------------------------- measured speedup

def plain_steps(n, seconds=0.04, prefill=0.5):
    from specviz.core.events import Step

    return [Step(index=i, token=1, prob=0.5, seconds=prefill if i == 0 else seconds) for i in range(n)]


def test_speedup_compares_decode_only_cost_per_token_when_lengths_differ():
    from specviz.metrics import measure_speed

    # Sampling made the methods stop at different lengths: speculative 5 x 3 = 15 tokens, plain 4.
    cycles = [make_cycle(index=0, drafted=[1, 2], num_accepted=2, draft_seconds=0.0, verify_seconds=0.6)] + [
        make_cycle(index=i, drafted=[1, 2, 3], num_accepted=2, draft_seconds=0.0, verify_seconds=0.06)
        for i in range(1, 5)]
    speed = measure_speed(cycles, plain_steps(4))
    # Per token after the prefill: plain 0.04 s; speculative 4 x 0.06 s for 12 tokens = 0.02 s.
    assert speed.speedup == pytest.approx(2.0)
    assert (speed.spec_tokens, speed.plain_tokens, speed.same_length) == (15, 4, False)
    assert (speed.spec_decode_tokens, speed.plain_decode_tokens) == (12, 3)
    assert speed.spec_prefill_seconds == pytest.approx(0.6) and speed.plain_prefill_seconds == pytest.approx(0.5)
    assert speed.spec_decode_seconds == pytest.approx(0.24) and speed.plain_decode_seconds == pytest.approx(0.12)
    assert not speed.reliable                       # 4 passes and 3 steps: too short
    assert measure_speed(cycles[:1], plain_steps(4)) is None


def test_the_range_reflects_timing_noise_and_decides_reliability():
    import random

    from specviz.metrics import measure_speed

    steady = [make_cycle(index=i, drafted=[1, 2, 3], num_accepted=2, draft_seconds=0.0, verify_seconds=0.06)
              for i in range(30)]
    speed = measure_speed(steady, plain_steps(40))
    assert speed.low == speed.high == pytest.approx(speed.speedup) and speed.reliable
    rng = random.Random(1)
    noisy = [make_cycle(index=i, drafted=[1, 2, 3], num_accepted=2, draft_seconds=0.0,
                        verify_seconds=0.06 * rng.choice([0.3, 1, 3])) for i in range(30)]
    speed = measure_speed(noisy, plain_steps(40))
    assert speed.low < speed.speedup < speed.high and not speed.reliable
    # A pass's cost follows its draft length: that alone is not noise.
    sized = [make_cycle(index=i, drafted=[1] * n, num_accepted=n, draft_seconds=0.0, verify_seconds=0.03 + 0.01 * n)
             for i, n in enumerate([0, 4, 8] * 10)]
    speed = measure_speed(sized, plain_steps(40))
    assert speed.high / speed.low < 1.01 and speed.reliable


def test_theory_at_the_measured_pass_cost():
    from specviz.metrics import measure_speed, summarize, theory_at_pass_cost

    # Verification passes of 0.06 s against plain steps of 0.04 s: a pass costs 1.5 steps.
    cycles = [make_cycle(index=i, drafted=[1, 2, 3, 4], num_accepted=3, draft_seconds=0.0, verify_seconds=0.06)
              for i in range(10)]
    stats, speed = summarize(cycles), measure_speed(cycles, plain_steps(20))
    assert speed.pass_cost == pytest.approx(1.5)
    assert theory_at_pass_cost(stats, speed) == pytest.approx(stats.expected_speedup / 1.5)
    assert theory_at_pass_cost(stats, None) is None


def test_run_summary_reports_both_runs_with_the_prefill_apart(tiny):
    import statistics

    from specviz.runs import execute
    from specviz.settings import RunSettings
    from tiny_pair import PROMPT

    settings = RunSettings(draft="small", k=3, temperature=1.0, seed=4, max_new_tokens=24)
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=True)
    summary, cycles, steps = run.summary(), run.cycles, run.steps
    assert summary["tokens"] == sum(len(c.emitted) for c in cycles) and summary["baseline_tokens"] == len(steps)
    assert summary["seconds"] == pytest.approx(sum(c.seconds for c in cycles))
    # Each method's first event carries the prompt's prefill: reported apart, left out of the speedup.
    assert summary["spec_prefill_seconds"] == pytest.approx(cycles[0].seconds)
    assert summary["spec_decode_seconds"] == pytest.approx(sum(c.seconds for c in cycles[1:]))
    assert summary["baseline_prefill_seconds"] == pytest.approx(steps[0].seconds)
    assert summary["baseline_decode_seconds"] == pytest.approx(sum(s.seconds for s in steps[1:]))
    assert summary["compared"] == "decode-only seconds per token"
    spec_per_token = summary["spec_decode_seconds"] / (summary["tokens"] - len(cycles[0].emitted))
    plain_per_token = summary["baseline_decode_seconds"] / (len(steps) - 1)
    assert summary["speedup"] == pytest.approx(plain_per_token / spec_per_token)
    assert summary["speedup_low"] <= summary["speedup"] <= summary["speedup_high"]
    assert summary["verify_pass_cost"] == pytest.approx(statistics.median(c.verify_seconds for c in cycles[1:])
                                                        / statistics.median(s.seconds for s in steps[1:]))


def test_draft_cost_counts_the_tokens_drafted_not_the_k_asked_for():
    from specviz.metrics import draft_cost

    # k = 8 asked for, 2 tokens drafted per cycle at 0.01 s each, 0.1 s per pass: c = 0.1, and
    # drafting costs 0.2 of a pass per cycle (not 8 x 0.1).
    cycles = [make_cycle(index=i, drafted=[1, 2], num_accepted=1, k=8, draft_seconds=0.02, verify_seconds=0.1)
              for i in range(5)]
    stats = summarize(cycles)
    assert stats.cost_ratio == pytest.approx(0.1) and stats.mean_k == 8
    assert draft_cost(stats) == pytest.approx(0.2)


def test_measured_speedup_and_every_theory_equal_hand_computed_values():
    from specviz.metrics import ideal_speedup, measure_speed, summarize, theory_at_pass_cost

    # Five cycles drafting 2 tokens each, accepting 2, 2, 1, 2, 0: alpha = 7 accepted / (7 + 2 rejections).
    # Drafting 0.01 s a token and passes of 0.06 s after the first (the prefill, 0.5 s); plain steps of 0.04 s.
    cycles = [make_cycle(index=i, drafted=[1, 2], num_accepted=n, draft_seconds=0.02,
                         verify_seconds=0.5 if i == 0 else 0.06) for i, n in enumerate([2, 2, 1, 2, 0])]
    stats, speed = summarize(cycles), measure_speed(cycles, plain_steps(10))
    assert stats.alpha == pytest.approx(7 / 9)
    assert stats.cost_ratio == pytest.approx(0.01 / 0.06)                      # c = 1/6
    assert stats.expected_tokens_per_pass == pytest.approx(193 / 81)           # 1 + a + a^2 = 193/81
    assert stats.expected_speedup == pytest.approx(193 / 81 / (2 / 6 + 1))      # E / (n c + 1) = 193/108
    # Measured, decode only: 3 + 2 + 3 + 1 = 9 tokens in 4 x 0.08 s, against 0.04 s a plain token.
    assert speed.speedup == pytest.approx(0.04 / (0.32 / 9))                   # 9/8
    assert speed.pass_cost == pytest.approx(1.5)                               # 0.06 / 0.04
    assert theory_at_pass_cost(stats, speed) == pytest.approx(193 / 162)       # 193/108 / 1.5
    # Ideal: a pass costs one step, drafting its measured share: E / (n c P + 1) = (193/81) / 1.5.
    assert ideal_speedup(stats, speed) == pytest.approx(386 / 243)


# ----------------------------------------------------------------------------- equal work

def steps_writing(tokens, seconds=0.04, prefill=0.5):
    from specviz.core.events import Step

    return [Step(index=i, token=t, prob=0.5, seconds=prefill if i == 0 else seconds) for i, t in enumerate(tokens)]


def cycles_writing(chunks, verify_seconds=0.05):
    """One cycle per chunk of emitted tokens: all but the last drafted and accepted, the last the correction."""
    return [make_cycle(index=i, drafted=chunk[:-1], num_accepted=len(chunk) - 1, correction=chunk[-1],
                       draft_seconds=0.0, verify_seconds=verify_seconds) for i, chunk in enumerate(chunks)]


def test_greedy_outputs_that_part_compare_only_the_tokens_both_wrote():
    from specviz.equal_work import SHARED_PREFIX, equal_work
    from specviz.metrics import measure_speed

    plain = list(range(10)) + [99] * 4                       # plain ends (at its EOS, say) after 14 tokens
    spec = list(range(10)) + [50, 51, 52, 53, 54, 55] * 5    # parts at token 10, then writes 30 easy tokens
    cycles = cycles_writing([spec[i:i + 5] for i in range(0, len(spec), 5)])
    work = equal_work(cycles, steps_writing(plain), greedy=True)
    assert (work.parted_at, work.basis, work.tokens) == (10, SHARED_PREFIX, 10)
    assert [len(c.emitted) for c in work.cycles] == [5, 5] and len(work.steps) == 10
    # The speedup over the shared prefix: one pass of 0.05 s wrote 5 tokens (0.01 s each) against
    # 0.04 s a step; over everything, the easy continuation would have claimed the same rate for 40 tokens.
    assert measure_speed(work.cycles, work.steps).speedup == pytest.approx(4.0)
    # A part inside a cycle keeps only the whole cycles before it (a pass's time cannot be split).
    work = equal_work(cycles, steps_writing(list(range(7)) + [77] * 7), greedy=True)
    assert (work.parted_at, work.tokens, len(work.cycles), len(work.steps)) == (7, 5, 1, 5)



def test_outputs_that_part_at_a_near_tie_compare_the_same_text_along_plain_steps():
    """Plain decoding followed along the speculative text (`core.plain.follow`) from the parting: its own
    steps before it and its steps along the text after it, every token compared, the near-ties kept;
    where the following stopped (more than a near-tie), the comparison stops there too."""
    from specviz.core.events import Followed
    from specviz.equal_work import ALONG_NEAR_TIES, SHARED_PREFIX, equal_work
    from specviz.metrics import measure_speed

    plain = list(range(10)) + [99] * 10
    spec = list(range(10)) + [50, 51, 52, 53, 54] * 2
    cycles = cycles_writing([spec[i:i + 5] for i in range(0, len(spec), 5)])
    along = steps_writing(spec, seconds=0.03)[10:]            # the steps along the text: 0.03 s each
    followed = Followed(start=10, steps=tuple(along), near_ties=((10, 0.125), (14, 0.06)))
    work = equal_work(cycles, steps_writing(plain), greedy=True, followed=followed)
    assert (work.parted_at, work.basis, work.tokens) == (10, ALONG_NEAR_TIES, 20)
    assert [s.seconds for s in work.steps] == [s.seconds for s in steps_writing(plain)[:10]] + [0.03] * 10
    assert [s.token for s in work.steps] == spec and work.near_ties == ((10, 0.125), (14, 0.06))
    # Decode-only: 19 steps (9 of 0.04 s, 10 of 0.03 s) against 3 passes of 0.05 s for 15 tokens.
    assert measure_speed(work.cycles, work.steps).speedup == pytest.approx((0.66 / 19) / (0.15 / 15))
    # Stopped at 17 (plain decoding's argmax there was more than a near-tie away): the whole cycles before it.
    stopped = Followed(start=10, steps=tuple(along[:7]), near_ties=((10, 0.125), (14, 0.06)), stopped_at=17)
    work = equal_work(cycles, steps_writing(plain), greedy=True, followed=stopped)
    assert (work.basis, work.tokens, len(work.cycles)) == (ALONG_NEAR_TIES, 15, 3)
    assert work.near_ties == ((10, 0.125), (14, 0.06))
    # Stopped at 13: the whole cycles before it end at the parting, so it is the shared prefix after all.
    stopped = Followed(start=10, steps=tuple(along[:3]), near_ties=((10, 0.125),), stopped_at=13)
    work = equal_work(cycles, steps_writing(plain), greedy=True, followed=stopped)
    assert (work.basis, work.tokens, len(work.cycles), work.near_ties) == (SHARED_PREFIX, 10, 2, ())
    # Followed from elsewhere than where these outputs part: not theirs, the shared prefix as before.
    work = equal_work(cycles, steps_writing(plain), greedy=True, followed=Followed(start=12, steps=()))
    assert (work.basis, work.tokens) == (SHARED_PREFIX, 10)

def test_identical_and_sampled_outputs():
    from specviz.equal_work import EQUAL_LENGTH, SAME_OUTPUT, equal_work

    tokens = list(range(20))
    cycles = cycles_writing([tokens[i:i + 4] for i in range(0, 20, 4)])
    work = equal_work(cycles, steps_writing(tokens), greedy=True)
    assert (work.basis, work.parted_at, work.tokens, len(work.cycles)) == (SAME_OUTPUT, None, 20, 5)
    # A race still going: what both wrote so far (plain is at 9 tokens).
    work = equal_work(cycles, steps_writing(tokens[:9]), greedy=True)
    assert (work.basis, work.tokens, len(work.steps)) == (SAME_OUTPUT, 8, 8)
    # Sampled: texts differ by design, equal lengths count (plain wrote 13 other tokens).
    work = equal_work(cycles, steps_writing([100 + t for t in range(13)]), greedy=False)
    assert (work.basis, work.parted_at, work.tokens, len(work.steps)) == (EQUAL_LENGTH, None, 12, 12)
