"""One definition per figure on every engine (docs/figures.md): the counts of a real own-loop run,
handed to the engine side as vLLM's per-request metrics and as llama.cpp's per-response timings and
server counters would carry them, give the own loop's figures through the engines' formula."""

from __future__ import annotations

import pytest

from specviz.engines.llamacpp import counted_acceptance
from specviz.engines.vllm_client import Response, spec_figures
from specviz.metrics import acceptance_rate_per_position
from specviz.runs.engine_load import acceptance
from specviz.runs.run import execute
from specviz.settings import RunSettings
from tiny_pair import PROMPT

K = 4


def own_loop_run(tiny, draft: str):
    # Fixed k: on models this small the cost-aware policy rightly pauses (a draft costs what the target does).
    settings = RunSettings(target="tiny", draft=draft, k=K, max_new_tokens=48, fixed_k=True)
    return execute(settings, PROMPT, tiny.pair(None, draft), warm_up=False)


def vllm_metrics(cycles) -> dict:
    """What vLLM's `metrics.speculative_decoding` says of a request decoded in these cycles: its
    steps that had drafts, their drafted and accepted tokens and the histogram of those steps."""
    drafting = [c for c in cycles if c.drafted]
    histogram = [0] * (K + 1)
    for c in drafting:
        histogram[c.num_accepted] += 1
    return {"num_spec_steps": len(drafting), "num_draft_tokens": sum(len(c.drafted) for c in drafting),
            "num_accepted_draft_tokens": sum(c.num_accepted for c in drafting), "acceptance_histogram": histogram}


# "small" accepts some drafts at position 1, "same" (the target as its own draft) every draft at every
# position, "ngram" some, with passes where prompt lookup found nothing to draft.
@pytest.mark.parametrize("draft", ["small", "same", "ngram"])
def test_the_engines_formula_on_the_own_loops_counts_gives_its_figures(tiny, draft):
    run = own_loop_run(tiny, draft)
    stats = run.stats
    assert stats.num_drafts > 0 and stats.accepted > 0        # a run that tests something
    chunk = {"metrics": {"speculative_decoding": vllm_metrics(run.cycles)}}
    figures = acceptance([Response(index=0, tokens=stats.tokens, spec=spec_figures(chunk))])
    assert figures["draft_acceptance_rate"] == pytest.approx(stats.draft_acceptance_rate)
    assert figures["mean_acceptance_length"] == pytest.approx(stats.mean_acceptance_length)
    assert figures["acceptance_rate_per_position"] == pytest.approx(stats.acceptance_rate_per_position)
    assert acceptance_rate_per_position(figures["acceptance_histogram"]) == pytest.approx(
        stats.acceptance_rate_per_position)


def test_llamacpps_timings_and_counters_give_the_same_figures(tiny):
    run = own_loop_run(tiny, "ngram")
    stats = run.stats
    chunk = {"timings": {"draft_n": stats.drafted, "draft_n_accepted": stats.accepted}}
    # The server's counters before and after the request: drafting steps, and accepted per position.
    accepted_at = [sum(1 for c in run.cycles if c.num_accepted > i) for i in range(K)]
    before = {"drafts": 10.0, "per_position": [3.0, 2.0, 1.0, 0.0]}
    after = {"drafts": 10.0 + stats.num_drafts, "per_position": [b + a for b, a in zip(before["per_position"],
                                                                                      accepted_at)]}
    figures = acceptance([Response(index=0, tokens=stats.tokens, spec=spec_figures(chunk))],
                         counted_acceptance(before, after))
    assert figures["mean_acceptance_length"] == pytest.approx(stats.mean_acceptance_length)
    assert figures["draft_acceptance_rate"] == pytest.approx(stats.draft_acceptance_rate)
    shown = figures["acceptance_rate_per_position"]
    assert shown == pytest.approx(stats.acceptance_rate_per_position[:len(shown)])
    assert all(v == 0 for v in stats.acceptance_rate_per_position[len(shown):])


def test_prompt_lookup_passes_without_drafts_count_in_tokens_per_pass_only(tiny):
    run = own_loop_run(tiny, "ngram")
    stats = run.stats
    idle = sum(1 for c in run.cycles if not c.drafted)
    assert stats.num_drafts == stats.cycles - idle
    assert stats.tokens_per_cycle == pytest.approx(stats.tokens / stats.cycles)
    assert stats.mean_acceptance_length == pytest.approx(1 + stats.accepted / stats.num_drafts)
    assert stats.alpha >= stats.draft_acceptance_rate
