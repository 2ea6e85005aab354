"""The theory formulas and the statistics computed from events."""

import pytest

from specviz.core.events import Cycle
from specviz.metrics import (best_k, cost_ratio, expected_speedup, expected_tokens_per_pass, first_divergence,
                             summarize)


def cycle(index, drafted, accepted, draft_s=0.01, verify_s=0.1, k=4):
    kind = "bonus" if accepted == len(drafted) else "resampled"
    return Cycle(index=index, k=k, drafted=drafted, num_accepted=accepted, emitted=drafted[:accepted] + [99],
                 correction=99, correction_kind=kind, correction_prob=0.5, draft_probs=[0.5] * len(drafted),
                 target_probs=[0.5] * len(drafted), uniforms=[], residual_top=[], greedy=True,
                 draft_seconds=draft_s * len(drafted), verify_seconds=verify_s)


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
    cycles = [cycle(0, [1, 2, 3, 4], 4, verify_s=0.5), cycle(1, [1, 2, 3, 4], 1), cycle(2, [5, 6, 7, 8], 0),
              cycle(3, [1, 2], 2)]
    s = summarize(cycles)
    assert (s.drafted, s.accepted, s.tokens, s.cycles) == (14, 7, 11, 4)
    assert s.draft_acceptance_rate == pytest.approx(7 / 14)
    assert s.alpha == pytest.approx(7 / (7 + 2))           # two cycles had a rejection
    assert s.mean_acceptance_length == pytest.approx(11 / 4)
    assert s.acceptance_histogram == [1, 1, 1, 0, 1]
    assert s.acceptance_by_position == [pytest.approx(3 / 4), pytest.approx(2 / 4), pytest.approx(1 / 3), pytest.approx(1 / 3)]
    # c leaves out the first cycle (it carries the prefill): 0.01 s per draft token / 0.1 s per pass.
    assert cost_ratio(cycles) == pytest.approx(0.1)
    expected = sum(expected_tokens_per_pass(s.alpha, n) for n in (4, 4, 4, 2)) / 4
    assert s.expected_tokens_per_pass == pytest.approx(expected)
    assert s.expected_speedup == pytest.approx(expected / (3.5 * 0.1 + 1))
    assert s.to_dict()["mean_acceptance_length"] == s.mean_acceptance_length


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
