"""The cost-aware policy (core.draft_policy): what it estimates, what it decides, and that deciding how
much to draft never changes the output (greedy equality here; the sampled distribution in
test_sampling)."""

import pytest

from conftest import make_gpt2, make_llama, reference, truncated_copy
from specviz import DraftModelDrafter, PromptLookupDrafter, speculative_decode
from specviz.core.draft_policy import EVIDENCE_REACH, MIN_GAIN, Acceptance, CostAwarePolicy, expected_tokens
from specviz.core.pass_costs import (DraftCosts, PassCosts, calibrate, calibration_widths,
                                     CONTEXTS, context_tokens, contexts_for)
from specviz.core.timing import Clock

N = 40
# A CPU in float32, as measured on the built-in model: a pass over any drafted tokens costs ~1.7 steps.
FP32_LIKE = {0: 1.0, 1: 1.6, 2: 1.7, 4: 1.75, 8: 1.9}
# Native bf16: wide passes nearly free.
BF16_LIKE = {0: 1.0, 1: 1.02, 4: 1.05, 8: 1.1}
# Between the two (a GPU at batch 1, roughly): one more token costs a little.
GPU_LIKE = {0: 1.0, 1: 1.1, 4: 1.2, 8: 1.35}


def run(target, draft, prompt, **kw):
    cycles = list(speculative_decode(target, draft, prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


# ----------------------------------------------------------------------------- estimates

def test_expected_tokens_is_one_plus_the_chance_of_reaching_each_position():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])
    assert expected_tokens([1.0, 1.0, 1.0]) == [1.0, 2.0, 3.0, 4.0]


def test_pass_costs_keep_what_each_width_measured_and_interpolate_the_rest():
    costs = PassCosts({0: 0.05, 2: 0.10, 3: 0.06, 4: 0.08, 8: 0.12})   # 3 timed cheaper than 2 (a CPU's kernels)
    relative = costs.relative(8)
    assert relative[0] == 1.0
    assert relative[1] == pytest.approx(1.5)                  # halfway between widths 0 and 2
    assert relative[2] == pytest.approx(2.0) and relative[3] == pytest.approx(1.2)   # kept, not pooled
    assert relative[6] == pytest.approx(2.0) and relative[8] == pytest.approx(2.4)


def test_the_policy_drafts_further_where_a_wider_pass_costs_less():
    # The first drafted token is always accepted, the second never: one token is all a draft gives. Priced
    # smoothly, the policy drafts one; where the pass over 3 costs less than the one over 1 (as in float32
    # on a CPU, `PassCosts`), it drafts 3 (for the same expected tokens).
    bumpy = CostAwarePolicy(PassCosts({0: 1.0, 1: 1.25, 2: 1.35, 3: 1.05, 4: 1.3}, learn=False))
    smooth = CostAwarePolicy(PassCosts({0: 1.0, 1: 1.25, 2: 1.35, 3: 1.45, 4: 1.55}, learn=False))
    for policy in (bumpy, smooth):
        for _ in range(20):
            policy.observe(0, 4, 1, [])
    assert bumpy.plan(0, 4, free=False).length == 3
    assert smooth.plan(0, 4, free=False).length == 1


def test_a_fixed_table_does_not_learn():
    costs = PassCosts({0: 1.0, 4: 2.0}, learn=False)
    costs.observe(4, 100.0)
    drafting = DraftCosts(0.1, learn=False)
    drafting.observe(4, 100.0)
    assert costs.relative(4)[4] == 2.0 and drafting.per_token == 0.1


def test_drafting_is_priced_per_drafter_and_its_first_measurement_is_kept_whole():
    costs = PassCosts({0: 1.0, 4: 2.0}, learn=False)
    drafting = DraftCosts()
    assert not drafting.known
    drafting.observe(4, 0.004)                                # the first 4 ms over 4 tokens: 1 ms each, not 0.25
    assert drafting.per_token == pytest.approx(0.001)
    drafting.observe(2, 0.010)                                # later ones refresh a running mean
    assert drafting.per_token == pytest.approx(0.001 + 0.25 * (0.005 - 0.001))
    model_drafter = CostAwarePolicy(costs, DraftCosts(0.25, learn=False))
    lookup = CostAwarePolicy(costs)                           # a free drafter: no drafting cost of its own
    assert model_drafter.relative(4) == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])
    assert lookup.relative(4) == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0])
    # One drafter's measured drafting never reaches another's table.
    model_drafter.draft_costs.learn = True
    model_drafter.draft_costs.observe(1, 9.0)
    assert lookup.draft_costs.per_token is None and lookup.relative(4)[4] == pytest.approx(2.0)


def test_calibration_takes_the_median_of_its_samples(pairs_llama):
    # Three timed passes after an untimed one: one slow outlier moves the median not at all.
    target = pairs_llama
    ticks = iter([0.0, 1.0, 1.0, 1.1, 1.1, 1.2, 1.2, 9.2])    # untimed 1.0, then 0.1, 0.1, 8.0
    costs = PassCosts()
    calibrate(target, list(range(5, 25)), [0], costs, lambda: next(ticks), samples=3)
    assert costs.seconds[0] == pytest.approx(0.1)


def test_calibration_times_widths_in_rounds_so_a_slow_stretch_cancels_in_their_ratios(pairs_llama):
    # Widths 0 and 4 timed in rounds: the untimed round, then three in which a 4-token pass costs 1.5
    # plain steps; the host is twice as slow over the last two rounds. Timed one width after the other,
    # the slow stretch would fall on the 4-token pass alone (0.1 s, then 0.3 s: 3 steps); in rounds, each
    # ratio is taken within its round.
    target = pairs_llama
    durations = [0.1, 0.15,  0.1, 0.15,  0.2, 0.3,  0.2, 0.3]
    ticks, now = [], 0.0
    for seconds in durations:
        ticks += [now, now + seconds]
        now += seconds
    clock = iter(ticks)
    costs = PassCosts(learn=False)
    calibrate(target, list(range(5, 25)), [0, 4], costs, lambda: next(clock), samples=3)
    assert costs.seconds[0] == pytest.approx(0.2)             # the plain step's median
    assert costs.relative(4)[4] == pytest.approx(1.5)


def test_acceptance_by_position_follows_what_was_seen():
    acceptance = Acceptance()
    prior = acceptance.rates(3)
    assert prior == pytest.approx([0.5, 0.5, 0.5])
    for _ in range(10):
        acceptance.observe(matched=0, length=4)               # the first token always wrong
    assert acceptance.rates(1)[0] < 0.1
    for _ in range(10):
        acceptance.observe(matched=4, length=4)               # then whole drafts right
    assert acceptance.rates(4)[0] > 0.7 and min(acceptance.rates(4)) > 0.7


def test_calibration_times_every_width_asked(pairs_llama):
    target = pairs_llama
    costs = PassCosts()
    widths = calibration_widths(8)
    assert widths == [0, 1, 2, 3, 4, 8]
    calibrate(target, list(range(5, 25)), widths, costs, Clock(target.device), samples=1)
    assert sorted(costs.seconds) == widths and all(s > 0 for s in costs.seconds.values())


def test_a_pass_is_priced_between_the_two_timed_contexts_nearest_its_own():
    # As measured in float32 here (scripts/context_costs.py): a pass over drafted tokens costs more
    # plain steps after a long context than after a short one.
    costs = PassCosts(learn=False)
    for context, table in ((64, {0: 1.0, 4: 1.2}), (1024, {0: 1.2, 4: 2.4})):
        for width, seconds in table.items():
            costs.at(context).seed(width, seconds)
    assert costs.context == 64 and costs.contexts == [64, 1024] and costs.at(1024) is costs.longer[1024]
    assert costs.relative(4)[4] == pytest.approx(1.2)                 # its own context's
    assert costs.relative(4, 10)[4] == pytest.approx(1.2)             # before the shortest: the shortest's
    assert costs.relative(4, 544)[4] == pytest.approx(1.6)            # halfway: halfway between
    assert costs.relative(4, 4000)[4] == pytest.approx(2.0)           # past the longest: the longest's
    assert PassCosts({0: 1.0, 4: 1.5}).relative(4, 4000)[4] == 1.5    # a given table: any context
    # A learning table refreshes the context nearest the pass it saw.
    learning = PassCosts(context=64)
    learning.seed(0, 1.0)
    learning.at(1024).seed(0, 1.0)
    learning.observe(0, 2.0, context=900)
    assert learning.seconds[0] == 1.0 and learning.at(1024).seconds[0] == pytest.approx(1.25)


def test_drafting_is_priced_between_the_two_timed_contexts_nearest_its_own():
    # A model's drafting reads every earlier position (a head's attention, its catch-up on the target's
    # features): timed after each context a request is priced between, in plain steps after it.
    drafting = DraftCosts(learn=False)
    drafting.set(128, 0.1)
    drafting.set(1024, 0.3)
    assert drafting.per_token == 0.1 and drafting.contexts == [128, 1024]
    assert drafting.at() == 0.1 and drafting.at(100) == 0.1 and drafting.at(4000) == 0.3
    assert drafting.at(576) == pytest.approx(0.2)
    assert DraftCosts(0.1).at(4000) == 0.1                            # a given cost: any context
    passes = PassCosts(learn=False)
    for context, step in ((128, 1.0), (1024, 2.0)):
        passes.at(context).seed(0, step)
        passes.at(context).seed(4, 1.5 * step)
    assert passes.step_after(576) == pytest.approx(1.5)
    policy = CostAwarePolicy(passes, drafting)
    assert policy.relative(4, context=128)[4] == pytest.approx(1.5 + 4 * 0.1)
    assert policy.relative(4, context=1024)[4] == pytest.approx(1.5 + 4 * 0.3 / 2.0)   # in steps after 1024


def test_a_request_is_priced_between_the_contexts_around_its_prompt():
    # CONTEXTS = 128, 256, ... 4096: the shortest always (every table's own), then the two around the
    # prompt, of those a model's positions hold.
    assert contexts_for(40, 8192, 8) == [128]
    assert contexts_for(128, 8192, 8) == [128]
    assert contexts_for(200, 8192, 8) == [128, 256]
    assert contexts_for(790, 8192, 8) == [128, 512, 1024]
    assert contexts_for(3000, 8192, 32) == [128, 2048, 4096]
    assert contexts_for(3000, 2048, 8) == [128, 1024]                 # 2048 and up do not fit the model
    assert context_tokens([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1] and context_tokens([1, 2, 3], 2) == [1, 2]


def test_the_same_drafts_pay_after_a_short_context_and_not_after_a_long_one():
    costs = PassCosts(learn=False)
    for context, table in ((64, {0: 1.0, 1: 1.2, 8: 1.4}), (1024, {0: 1.0, 1: 2.2, 8: 3.0})):
        for width, seconds in table.items():
            costs.at(context).seed(width, seconds)
    policy = CostAwarePolicy(costs)
    for _ in range(6):                                        # half of each position accepted
        policy.state(0).acceptance.observe(matched=1, length=2)
    short, long = policy.plan(0, 8, free=True, context=100), policy.plan(0, 8, free=True, context=1024)
    assert short.length > 0 and short.gain > MIN_GAIN
    assert long.length == 0 and long.gain < short.gain


# ----------------------------------------------------------------------------- decisions

def test_drafts_that_all_miss_settle_on_plain_steps(prompt):
    target, unrelated = make_llama(0), make_llama(1, layers=2)
    policy = CostAwarePolicy(PassCosts(GPU_LIKE, learn=False))
    out, cycles = run(target, unrelated, prompt, max_new_tokens=N, k=4, policy=policy)
    assert out == reference(target, prompt)
    assert sum(c.num_accepted for c in cycles) <= 2            # the draft is unrelated: it (almost) never agrees
    # Eight cycles to learn (one draft token was accepted by chance), then plain steps, drafting again
    # only to probe (and ever more rarely).
    later = cycles[8:]
    assert sum(c.planned == 0 for c in later) >= 0.8 * len(later)
    assert all(c.probe for c in later if c.planned)
    assert all(c.expected_gain < MIN_GAIN for c in later if c.planned == 0)


def test_a_draft_that_always_agrees_drafts_all_it_may(prompt):
    target = make_llama(0)
    policy = CostAwarePolicy(PassCosts(FP32_LIKE, learn=False))
    out, cycles = run(target, target, prompt, max_new_tokens=N, k=8, policy=policy)
    assert out == reference(target, prompt)
    assert all(c.num_accepted == len(c.drafted) for c in cycles)
    # Drafting 8 where every token is accepted: each draft reaches at most EVIDENCE_REACH past the
    # deepest position seen reached (2, 4, 6, ...), then the longest draft.
    planned = [c.planned for c in cycles[:-1]]
    assert planned[:4] == [2, 4, 6, 8] and planned[4:] == [8] * len(planned[4:])


def test_a_paused_request_whose_text_starts_repeating_drafts_again_at_once():
    policy = CostAwarePolicy(PassCosts(FP32_LIKE, learn=False))
    output = []
    for i in range(12):                                        # proposals that never come true: paused
        plan = policy.plan(0, 8, free=True, signal=1)
        policy.propose_freely(0, [999] * 8, len(output), signal=1)
        output.append(i)
        policy.observe(0, plan.length, 0, output)
    assert plan.length == 0 and plan.gain < 1
    text = list(range(100, 140))                               # the output now copies text the drafter finds
    policy.propose_freely(0, text[:8], len(output), signal=3)
    output.append(text[0])
    policy.observe(0, 0, 0, output)
    output.append(text[1])
    policy.observe(0, 0, 0, output)
    assert policy.plan(0, 8, free=True, signal=3).length > 0  # two tokens of evidence: drafting pays again


def test_on_a_device_where_passes_cost_many_steps_it_never_drafts_a_coin_flip(prompt):
    policy = CostAwarePolicy(PassCosts({0: 1.0, 1: 3.0, 8: 4.0}, learn=False))
    assert policy.plan(0, 8, free=True).length == 0            # E[tokens] <= 2 at the prior: never 3x the cost
    policy = CostAwarePolicy(PassCosts(BF16_LIKE, learn=False))
    # Nearly free passes: a draft model drafts at the prior, as far past what it reached as evidence allows.
    assert policy.plan(0, 8, free=False).length == EVIDENCE_REACH
    # Prompt lookup, scored for free, waits for evidence where a pass costs more than a step: one token of it.
    policy = CostAwarePolicy(PassCosts(FP32_LIKE, learn=False))
    assert policy.plan(0, 8, free=True).length == 0
    policy.propose_freely(0, [5, 6, 7, 8, 9, 10, 11, 12], 0)
    policy.observe(0, 0, 0, [5])
    assert policy.plan(0, 8, free=True).length >= 4


# ----------------------------------------------------------------------------- lossless

@pytest.fixture(scope="module")
def pairs_llama():
    return make_llama(0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_name", ["same", "unrelated", "smaller", "ngram"])
@pytest.mark.parametrize("table", ["fp32", "bf16", "measured"])
def test_greedy_equals_generate_with_the_policy(prompt, arch, draft_name, table):
    target = make_llama(0) if arch == "llama" else make_gpt2(0)
    draft = {"same": target, "unrelated": (make_llama(1, layers=2) if arch == "llama" else make_gpt2(1, layers=1)),
             "smaller": truncated_copy(target, 1), "ngram": PromptLookupDrafter()}[draft_name]
    if table == "measured":
        costs = PassCosts()
        calibrate(target, prompt[0].tolist(), calibration_widths(8), costs, Clock(target.device), samples=1)
    else:
        costs = PassCosts(FP32_LIKE if table == "fp32" else BF16_LIKE, learn=False)
    out, cycles = run(target, draft, prompt, max_new_tokens=N, k=8, policy=CostAwarePolicy(costs))
    assert out == reference(target, prompt)
    assert sum(len(c.emitted) for c in cycles) == N
    for c in cycles:
        if c.planned is None:                                 # prompt lookup found nothing to propose
            assert draft_name == "ngram" and not c.drafted
        else:
            assert 0 <= c.planned <= 8 and len(c.drafted) <= c.planned


def test_the_policy_and_dynamic_k_are_one_choice_or_the_other(prompt):
    target = make_llama(0)
    with pytest.raises(ValueError, match="pick one"):
        speculative_decode(target, PromptLookupDrafter(), prompt, k=4, dynamic_k=True,
                           policy=CostAwarePolicy(PassCosts(FP32_LIKE)))


def test_a_draft_model_paused_catches_up_when_it_drafts_again(prompt):
    # Paused cycles feed the draft model nothing; its next proposal reads what it missed (greedy equal).
    target = make_llama(0)
    smaller = DraftModelDrafter(truncated_copy(target, 1))
    policy = CostAwarePolicy(PassCosts({0: 1.0, 1: 1.3, 2: 1.6, 8: 2.5}, learn=False), probe_after=1)
    out, cycles = run(target, smaller, prompt, max_new_tokens=N, k=2, policy=policy)
    assert out == reference(target, prompt)
    planned = [c.planned for c in cycles]
    assert 0 in planned and any(planned), planned


# ----------------------------------------------------------------------------- cost tables across runs

def lookup_and_model(max_new_tokens: int):
    """The tiny pair, the same target drafted by prompt lookup, a repeating prompt, and the settings
    of a prompt-lookup run and of a draft-model run on it."""
    from dataclasses import replace

    from specviz.core.drafters import PromptLookupDrafter
    from specviz.models.tiny import tiny_pair
    from specviz.settings import RunSettings, validate

    pair = tiny_pair("tiny")
    lookup = replace(pair, draft=PromptLookupDrafter(), draft_name="prompt lookup", draft_parameters=0)
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    common = dict(target="tiny", k=4, max_new_tokens=max_new_tokens, chat=False)
    return (pair, lookup, prompt, validate(RunSettings(draft="ngram", **common)),
            validate(RunSettings(draft="tiny", **common)))


def test_a_drafters_measured_costs_never_price_another_drafters_drafts():
    # In one process (as the app and Compare run): prompt lookup, then a draft model on the same
    # target, then prompt lookup again. Each drafter has its own drafting table; the target's pass
    # table is shared (same target, device, dtype, threads) and timed once.
    import torch

    from specviz.runs import cost_tables
    from specviz.runs import run as runs

    pair, lookup, prompt, lookup_settings, model_settings = lookup_and_model(max_new_tokens=24)

    statuses = [r.status for r in runs.race(lookup_settings, prompt, lookup)]
    assert statuses[0].startswith("Calibrating: timing target passes") and not statuses[-1]
    first = runs.execute(lookup_settings, prompt, lookup)       # the tables exist now: nothing to time
    assert first.calibration_seconds == 0 and first.summary()["calibration_seconds"] == 0
    model = runs.execute(model_settings, prompt, pair)
    assert model.calibration_seconds > 0 and model.calibrated == [f"{model.draft_name}'s drafting after 128 tokens"]
    summary = model.summary()
    assert summary["calibration_seconds"] == model.calibration_seconds
    assert summary["first_token_wall_seconds"] >= model.calibration_seconds
    again = runs.execute(lookup_settings, prompt, lookup)
    assert again.calibration_seconds == 0

    tables = cost_tables._DRAFT_COSTS[pair.target]
    threads = torch.get_num_threads()
    assert tables[threads, model.draft_name].per_token > 0
    assert not tables[threads, "prompt lookup"].known            # the draft model's cost stayed its own


def test_a_configuration_decides_the_same_whatever_ran_before_it():
    # The tables a run decides from are the calibration's medians and nothing after: no run's own
    # passes move them, so prompt lookup drafts the same lengths, cycle by cycle, fresh and after a
    # draft model's run on the same target (before, each run's passes refreshed a shared running mean,
    # and identical runs in one process drafted 54-63 tokens of 96 on a summarisation prompt).
    import torch

    from specviz.runs import cost_tables
    from specviz.runs import run as runs

    pair, lookup, prompt, lookup_settings, model_settings = lookup_and_model(max_new_tokens=32)

    fresh = runs.execute(lookup_settings, prompt, lookup, baseline=True)
    table = cost_tables._PASS_COSTS[pair.target][torch.get_num_threads()]
    calibrated = dict(table.seconds)
    model = runs.execute(model_settings, prompt, pair, baseline=True)
    drafting = cost_tables._DRAFT_COSTS[pair.target][torch.get_num_threads(), model.draft_name].per_token
    runs.execute(model_settings, prompt, pair)
    after = runs.execute(lookup_settings, prompt, lookup, baseline=True)

    assert table.seconds == calibrated
    assert cost_tables._DRAFT_COSTS[pair.target][torch.get_num_threads(), model.draft_name].per_token == drafting
    assert [len(c.drafted) for c in after.cycles] == [len(c.drafted) for c in fresh.cycles]
    assert after.stats.drafted == fresh.stats.drafted
    # The costs it decided from, in its summary and its JSON (string keys only) and in Explain's words.
    import json

    from specviz.views.prose import calibration_text
    decided = json.loads(json.dumps(after.summary()["decided_on"]))
    assert decided == fresh.summary()["decided_on"] and decided["pass_steps"][0] == 1.0
    assert decided["step_seconds"] == calibrated[0] and len(decided["pass_steps"]) == lookup_settings.k + 1
    assert table.context == CONTEXTS[0] and decided["pass_steps_by_context"][str(CONTEXTS[0])] == decided["pass_steps"]
    assert "decided from a plain step of" in calibration_text(after)


def test_a_long_prompts_run_is_priced_after_the_contexts_around_it(monkeypatch):
    # A prompt of ~300 tokens: its passes are timed after 128 (every table's own), 256 and 512 tokens,
    # said before the race and kept in the summary; a later short run times nothing more.
    import weakref

    from specviz.runs import cost_tables
    from specviz.runs import run as runs
    from specviz.views.prose import calibration_text

    monkeypatch.setattr(cost_tables, "_PASS_COSTS", weakref.WeakKeyDictionary())
    pair, lookup, prompt, lookup_settings, model_settings = lookup_and_model(max_new_tokens=8)
    statuses, long = [], None
    for long in runs.race(lookup_settings, "the cat sat on the mat. " * 12, lookup):
        statuses.append(long.status)
    assert 256 < long.prompt_tokens < 512
    assert "after 128, 256 and 512 tokens" in statuses[0] and "after 128, 256 and 512 tokens" in long.calibrated[0]
    steps = long.summary()["decided_on"]["pass_steps_by_context"]
    assert sorted(steps, key=int) == ["128", "256", "512"]
    assert all(len(v) == lookup_settings.k + 1 for v in steps.values())
    assert "steps after 512 tokens of context" in calibration_text(long)
    short = runs.execute(lookup_settings, prompt, lookup)
    assert short.calibration_seconds == 0 and short.summary()["decided_on"]["pass_steps_by_context"] == steps
    # A draft model's drafting is timed after the same contexts, and priced between them too.
    monkeypatch.setattr(cost_tables, "_DRAFT_COSTS", weakref.WeakKeyDictionary())
    model = runs.execute(model_settings, "the cat sat on the mat. " * 12, pair)
    assert model.calibrated == [f"{model.draft_name}'s drafting after 128, 256 and 512 tokens"]
    by_context = model.summary()["decided_on"]["drafting_steps_by_context"][model.draft_name]
    assert sorted(by_context, key=int) == ["128", "256", "512"] and all(v > 0 for v in by_context.values())
    assert "after 512 tokens)" in calibration_text(model) and f"{model.draft_name} " in calibration_text(model)
