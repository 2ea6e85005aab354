"""How decoding is timed (core.timing, and the loops' use of it): the clock waits for the device the
model is on, and speculative and plain decoding time the same kinds of work (the caches' rows dropped
when requests leave a batch, the reads the views need)."""

import time

import pytest
import torch
from conftest import make_llama, truncated_copy
from test_batched import EOS, NEW_TOKENS, ragged_prompts

from specviz.core import decoding, timing
from specviz.core.decoding import batched_speculative_decode, speculative_decode
from specviz.core.plain import batched_autoregressive_decode
from specviz.core.ragged_cache import RaggedCache
from specviz.core.timing import Clock


def test_the_clock_waits_for_the_models_own_gpu(monkeypatch):
    # `--device cuda:1` must time cuda:1's queue: a bare torch.cuda.synchronize() waits for the
    # current device (cuda:0), which returns while cuda:1 is still computing.
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    clock = Clock(torch.device("cuda", 1))
    clock()
    assert waited == [torch.device("cuda", 1)]
    assert clock.name == "wall clock, device-synchronised"



# ----------------------------------------------------------------------------- the same work on both sides

COST = 1000.0       # seconds a patched operation adds to the fake clock: far above any real pass


class FakeTime:
    """time.thread_time and time.perf_counter as the real perf_counter plus what patched operations add."""

    def __init__(self):
        self.added = 0.0

    def thread_time(self) -> float:
        return time.perf_counter() + self.added

    perf_counter = thread_time


def costing(fake: FakeTime, function):
    def costly(*args, **kwargs):
        fake.added += COST
        return function(*args, **kwargs)
    return costly


@pytest.fixture
def fake_time(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_rows_leaving_the_batch_are_timed_on_both_sides(fake_time, monkeypatch):
    # Dropping finished rows from the caches (the target's, the draft model's) is work each side
    # does when requests end: plain decoding's step times its cache's select, so the speculative
    # pass must time its own (and the drafter's), or the speedup leans toward speculation.
    monkeypatch.setattr(RaggedCache, "select", costing(fake_time, RaggedCache.select))
    target = make_llama(0, layers=2, eos=EOS)
    prompts = ragged_prompts(6, seed=3)
    speculative = list(batched_speculative_decode(target, truncated_copy(target, 1), prompts,
                                                  max_new_tokens=NEW_TOKENS, k=3))
    plain = list(batched_autoregressive_decode(target, prompts, max_new_tokens=NEW_TOKENS))
    def someone_left(events):
        return [len(a.requests) > len(b.requests) for a, b in zip(events, events[1:])]

    for event, left in zip(plain, someone_left(plain)):
        assert (event.seconds >= COST) == left
    assert any(someone_left(speculative)) and not all(someone_left(speculative))
    for event, left in zip(speculative, someone_left(speculative)):
        # The target's cache drops the rows in the verification time, the draft model's in the drafting time.
        assert (event.verify_seconds >= COST) == (event.draft_seconds >= COST) == left


def test_what_the_views_read_of_a_pass_is_timed(fake_time, monkeypatch):
    # A plain step's seconds include reading its token's probability for the views; a sampled pass's
    # include reading its residual's top tokens after a rejection.
    monkeypatch.setattr(decoding, "_residual_tops", costing(fake_time, decoding._residual_tops))
    target = make_llama(0, layers=2, eos=EOS)
    cycles = list(speculative_decode(target, truncated_copy(target, 1), ragged_prompts(3, seed=3)[2],
                                     max_new_tokens=NEW_TOKENS, k=3, temperature=1.0, seed=0, sampling="classic"))
    assert all(c.verify_seconds >= COST for c in cycles)
    assert any(c.residual_top for c in cycles)            # classic sampling resamples from a residual


def test_what_the_policy_learns_from_a_cycle_is_timed_as_the_next_cycles_drafting(fake_time, monkeypatch):
    # The cost-aware policy's work after a pass (scoring proposals, updating acceptance and costs) is
    # work plain decoding does not do: it counts, in the next cycle's drafting (the cycle just
    # reported has been timed already), so a hybrid's heavier bookkeeping is not left off its speedup.
    from specviz.core.draft_policy import CostAwarePolicy
    from specviz.core.pass_costs import PassCosts

    monkeypatch.setattr(CostAwarePolicy, "learn", costing(fake_time, CostAwarePolicy.learn))
    target = make_llama(0, layers=2, eos=EOS)
    policy = CostAwarePolicy(PassCosts({0: 1.0, 1: 1.05, 2: 1.1, 3: 1.15}, learn=False))
    cycles = list(speculative_decode(target, truncated_copy(target, 1), ragged_prompts(3, seed=3)[2],
                                     max_new_tokens=NEW_TOKENS, k=3, policy=policy))
    assert len(cycles) > 2
    assert cycles[0].draft_seconds < COST
    assert all(COST <= c.draft_seconds < 2 * COST and c.verify_seconds < COST for c in cycles[1:])
