"""One definition per figure on every engine (docs/figures.md), checked against answers worked out by
hand: a few cycles built here with known drafted and accepted counts, what vLLM's per-request metrics
and llama.cpp's per-response timings and server counters say of the same request, and the figures
vLLM's formulas (`vllm/v1/spec_decode/metrics.py`, quoted in STYLE.md) give, written as literals. The
own loop and the engines share one formula (`metrics.acceptance_figures`), so a test that fed one side's
counts to the other would pass with that formula wrong; these cannot."""

from __future__ import annotations

import pytest

from specviz.engines.llamacpp import counted_acceptance
from specviz.engines.vllm_client import Response, spec_figures
from specviz.metrics import acceptance_rate_per_position, summarize
from specviz.runs.engine_load import acceptance
from specviz.runs.run import execute
from specviz.settings import RunSettings
from conftest import make_cycle
from tiny_pair import PROMPT

K = 4


def cycle(index: int, drafted: int, accepted: int):
    """A chain cycle that drafted `drafted` tokens and accepted the first `accepted` (k = 4)."""
    return make_cycle(index=index, drafted=range(1, drafted + 1), num_accepted=accepted, k=K, verify_seconds=0.1)


# Four target passes: 3 of 4 drafted tokens accepted, 2 of 4, 0 of 1, and a pass with nothing drafted
# (prompt lookup found no match). By hand, vLLM's way: 3 drafting steps, 9 drafted, 5 accepted;
# position 1 accepted in 2 steps, position 2 in 2, position 3 in 1, position 4 in none.
CYCLES = [cycle(0, 4, 3), cycle(1, 4, 2), cycle(2, 1, 0), cycle(3, 0, 0)]
EXPECTED = {"draft_acceptance_rate": 5 / 9, "mean_acceptance_length": 1 + 5 / 3,
            "acceptance_rate_per_position": [2 / 3, 2 / 3, 1 / 3, 0.0]}
# What vLLM's `metrics.speculative_decoding` reports for that request (steps with drafts only), and its
# histogram of those steps by tokens accepted (0: one step, 2: one, 3: one).
VLLM_METRICS = {"num_spec_steps": 3, "num_draft_tokens": 9, "num_accepted_draft_tokens": 5,
                "acceptance_histogram": [1, 0, 1, 1, 0]}


def assert_expected(figures: dict, positions: int = K) -> None:
    for name in ("draft_acceptance_rate", "mean_acceptance_length"):
        assert figures[name] == pytest.approx(EXPECTED[name]), name
    shown = figures["acceptance_rate_per_position"]
    assert shown == pytest.approx(EXPECTED["acceptance_rate_per_position"][:len(shown)]) and len(shown) >= positions


def test_the_own_loops_figures_are_vllms_on_hand_built_cycles():
    stats = summarize(CYCLES)
    assert (stats.num_drafts, stats.drafted, stats.accepted, stats.tokens, stats.cycles) == (3, 9, 5, 9, 4)
    assert_expected(stats.to_dict())
    assert stats.acceptance_histogram == [2, 0, 1, 1, 0]       # every pass, the one without a draft too
    assert stats.tokens_per_cycle == pytest.approx(9 / 4)     # tokens per pass: the plain pass counts here
    assert stats.alpha == pytest.approx(5 / (5 + 3))          # three rejections: the theory's a, another name
    assert stats.acceptance_when_reached == pytest.approx([2 / 3, 2 / 2, 1 / 2, 0 / 2])


def test_vllms_per_request_metrics_give_the_same_figures():
    figures = acceptance([Response(index=0, tokens=9, spec=spec_figures(
        {"metrics": {"speculative_decoding": VLLM_METRICS}}))])
    assert_expected(figures)
    assert acceptance_rate_per_position(figures["acceptance_histogram"]) == pytest.approx(
        EXPECTED["acceptance_rate_per_position"])
    # Two requests' metrics add up before the formulas apply: the same request twice, the same figures.
    twice = acceptance([Response(index=i, tokens=9, spec=spec_figures({"metrics": {"speculative_decoding":
                                                                                   VLLM_METRICS}})) for i in (0, 1)])
    assert_expected(twice)
    assert twice["num_draft_tokens"] == 18


def test_llamacpps_timings_and_counters_give_the_same_figures():
    chunk = {"timings": {"draft_n": 9, "draft_n_accepted": 5}}
    # The server's counters before and after the request: drafting steps, and accepted per position.
    before = {"drafts": 10.0, "per_position": [3.0, 2.0, 1.0, 0.0]}
    after = {"drafts": 13.0, "per_position": [5.0, 4.0, 2.0, 0.0]}
    figures = acceptance([Response(index=0, tokens=9, spec=spec_figures(chunk))], counted_acceptance(before, after))
    assert_expected(figures, positions=3)                     # the counters stop at the last accepted position
    assert figures["acceptance_histogram"] == [1, 0, 1, 1]


# ----------------------------------------------------------------------------- a real run

def own_loop_run(tiny, draft: str):
    # Fixed k: on models this small the cost-aware policy rightly pauses (a draft costs what the target does).
    settings = RunSettings(target="tiny", draft=draft, k=K, max_new_tokens=48, fixed_k=True)
    return execute(settings, PROMPT, tiny.pair(None, draft), warm_up=False)


# "small" accepts some drafts at position 1, "same" (the target as its own draft) every draft at every
# position, "ngram" some, with passes where prompt lookup found nothing to draft.
@pytest.mark.parametrize("draft", ["small", "same", "ngram"])
def test_a_real_runs_figures_are_vllms_formulas_on_its_cycles(tiny, draft):
    # The expected figures are vLLM's formulas written out here on the cycles' raw fields.
    run = own_loop_run(tiny, draft)
    stats = run.stats
    drafting = [c for c in run.cycles if c.drafted]
    drafted, accepted = sum(len(c.drafted) for c in drafting), sum(c.num_accepted for c in drafting)
    assert drafting and accepted > 0                           # a run that tests something
    assert stats.draft_acceptance_rate == pytest.approx(accepted / drafted)
    assert stats.mean_acceptance_length == pytest.approx(1 + accepted / len(drafting))
    assert stats.acceptance_rate_per_position == pytest.approx(
        [sum(c.num_accepted > i for c in drafting) / len(drafting) for i in range(K)])
    assert stats.tokens_per_cycle == pytest.approx(sum(len(c.emitted) for c in run.cycles) / len(run.cycles))
    if draft == "same":
        assert stats.draft_acceptance_rate == 1.0 and stats.acceptance_rate_per_position[-1] > 0.5
    if draft == "ngram":
        assert len(drafting) < len(run.cycles)                 # passes without a draft occurred
