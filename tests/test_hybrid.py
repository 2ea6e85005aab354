"""Hybrid drafting (`--draft auto`, core.hybrid): lossless whichever drafter the policy chooses (greedy
equals `generate` in fp32 with the choice forced either way by fixed costs; sampled runs follow the
target's distribution); each cycle records the drafter whose draft was verified; the per-drafter
counts sum to the run's; recordings keep the choice (and older ones still load); the token view marks
each drafted token with its drafter; the benchmark's leaderboard has a row per method and a column
per category; 'auto' is refused where it cannot run."""

import json

import numpy as np
import pytest
import torch
from conftest import make_llama
from test_head import HEAD_LENGTH, HEAD_VOCAB, small_head
from test_sampling import exact_joint, pooled_chisquare

from specviz import speculative_decode
from specviz.core.pass_costs import DraftCosts, PassCosts
from specviz.core.drafters import PromptLookupDrafter
from specviz.core.hybrid import HybridDrafter, HybridPolicy
from specviz.core.lookup_trees import SuffixDrafter
from specviz.core.sampling import Sampler
from specviz.errors import SpecvizError
from specviz.metrics import summarize
from specviz.settings import RunSettings, parse_draft, validate

VOCAB = 40
# A prompt that repeats itself (prompt lookup and suffix decoding find continuations) and a pass whose
# cost grows slowly with width: copying pays when the copy holds.
PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]])
PASSES = {w: 1.0 + 0.05 * w for w in range(0, 65)}


@pytest.fixture(scope="module")
def target():
    torch.set_grad_enabled(False)
    return make_llama(0, layers=4, vocab=VOCAB)


def hybrid(target, *, with_suffix=True, seed=0):
    components = [PromptLookupDrafter()] + ([SuffixDrafter()] if with_suffix else []) + \
        [small_head(target, VOCAB, seed=seed)]
    return HybridDrafter(components)


def fixed_policy(head_seconds_per_token: float, **options) -> HybridPolicy:
    """Costs that never learn: a pass costs 1 + 0.05 per drafted token (seconds), the head drafts at
    `head_seconds_per_token`."""
    return HybridPolicy(PassCosts(PASSES, learn=False), {"head": DraftCosts(head_seconds_per_token, learn=False)},
                        **options)


def greedy_reference(target, prompt, n):
    return target.generate(prompt, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(prompt),
                           pad_token_id=0)[0, prompt.shape[1]:].tolist()


def recorded_proposals(drafter: HybridDrafter) -> dict:
    """Each component's proposals, by (its name, the length of the sequence it drafted after): its
    `propose` wrapped, the real drafter underneath."""
    seen = {}
    for component in drafter.components:
        def propose(sequence, k, sampler, original=component.propose, name=component.name):
            draft = original(sequence, k, sampler)
            seen[(str(name), sequence.shape[1])] = draft.tokens.tolist()
            return draft
        component.propose = propose
    return seen


# ----------------------------------------------------------------------------- lossless, whatever drafts

@pytest.mark.parametrize("head_cost, expected", [(1e-4, "head"), (10.0, "ngram")], ids=["head-cheap", "head-dear"])
def test_greedy_auto_equals_generate_whichever_drafter_the_costs_choose(target, head_cost, expected):
    drafter = hybrid(target)
    # No probes: a head that costs 10 plain steps a token then never drafts.
    policy = fixed_policy(head_cost, probe_after=1000, max_probe_after=1000)
    cycles = list(speculative_decode(target, drafter, PROMPT, max_new_tokens=40, k=4, policy=policy))
    assert [t for c in cycles for t in c.emitted] == greedy_reference(target, PROMPT, 40)
    chosen = {c.drafter for c in cycles if c.drafted}
    assert expected in chosen
    if expected == "ngram":
        assert "head" not in chosen
    # Every cycle compared every drafter that had something to offer; a plain step chose none.
    assert all(c.offers for c in cycles)
    assert all(c.drafter is None for c in cycles if not c.drafted)


def test_each_cycle_records_the_drafter_whose_draft_was_verified(target):
    drafter = hybrid(target)
    proposals = recorded_proposals(drafter)
    output_start = PROMPT.shape[1]
    cycles = list(speculative_decode(target, drafter, PROMPT, max_new_tokens=40, k=4, policy=fixed_policy(0.02)))
    length = output_start
    drafted_by = set()
    for cycle in cycles:
        if cycle.drafter is not None:
            proposal = proposals[(cycle.drafter, length)]
            if cycle.is_tree:
                assert set(cycle.drafted) <= set(proposal)
            else:
                assert cycle.drafted == proposal[:len(cycle.drafted)]
            drafted_by.add(cycle.drafter)
            # The chosen offer is the best paying one compared this cycle.
            offers = {o["drafter"]: o for o in cycle.offers}
            assert offers[cycle.drafter]["gain"] == max(o["gain"] for o in cycle.offers if o["length"])
        length += len(cycle.emitted)
    assert len(drafted_by) >= 2, drafted_by


def test_the_head_reads_the_target_every_pass_even_when_another_drafter_drafts(target):
    # Its features cover every kept position at every cycle, so that the cycle it drafts in needs no catching up.
    drafter = hybrid(target)
    head = drafter.components[-1]
    cycles = []
    policy = fixed_policy(10.0, probe_after=1000, max_probe_after=1000)
    for cycle in speculative_decode(target, drafter, PROMPT, max_new_tokens=30, k=4, policy=policy):
        cycles.append(cycle)
        assert head.states[0].count == PROMPT.shape[1] + sum(len(c.emitted) for c in cycles) - 1
    assert "head" not in {c.drafter for c in cycles}


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_head_that_does_not_pay_is_probed_by_scoring_not_by_verifying(target, temperature):
    # Passes that make the head's drafts not pay at its prior acceptance (a drafted token costs as
    # much as a plain step): alone it would probe with wider passes every few cycles. In the hybrid its
    # probe is a short draft scored against what the target writes, never verified: it learns its
    # acceptance (evidence in its own estimate) while no cycle verifies a draft it was not expected to
    # pay for, and the text stays the target's own.
    from specviz.core.plain import autoregressive_decode

    drafter = HybridDrafter([PromptLookupDrafter(), small_head(target, VOCAB)])
    head = drafter.components[-1]
    proposals = recorded_proposals(drafter)
    policy = HybridPolicy(PassCosts({w: 1.0 + 1.0 * w for w in range(0, 65)}, learn=False),
                          {"head": DraftCosts(1e-4, learn=False)}, probe_after=2, max_probe_after=2)
    prompt = torch.tensor([[5, 9, 13, 2, 31, 7, 22, 18]])         # nothing for prompt lookup to copy
    cycles = list(speculative_decode(target, drafter, prompt, max_new_tokens=30, k=4, temperature=temperature,
                                     seed=3, policy=policy))
    plain = [s.token for s in autoregressive_decode(target, prompt, 30, temperature=temperature, seed=3)]
    assert [t for c in cycles for t in c.emitted] == plain
    probed = [key for key in proposals if key[0] == "head"]
    assert len(probed) >= 3                                  # the head drafted (every few paused cycles) ...
    for cycle in cycles:
        if cycle.drafter == "head":                        # ... and whatever it drafted for verification paid
            offer = next(o for o in cycle.offers if o["drafter"] == "head")
            assert offer["length"] and offer["gain"] >= 1.02
    part = policy.parts["head"]
    assert part.states[0].acceptance.reached                  # what it learned from being scored
    assert head.states[0].count == prompt.shape[1] + len(plain) - 1


@pytest.mark.parametrize("head_cost", [1e-4, 10.0], ids=["head-cheap", "head-dear"])
def test_invariant_sampled_auto_writes_plain_samplings_text(target, head_cost):
    # Drafter-invariant sampling: whichever drafter each cycle chose, the text is plain sampling's.
    from specviz.core.plain import autoregressive_decode

    chosen = set()
    for seed in range(3):
        policy = fixed_policy(head_cost, probe_after=1000, max_probe_after=1000)
        cycles = list(speculative_decode(target, hybrid(target), PROMPT, max_new_tokens=30, k=4, temperature=0.8,
                                         seed=seed, policy=policy))
        chosen |= {c.drafter for c in cycles if c.drafted}
        plain = [s.token for s in autoregressive_decode(target, PROMPT, 30, temperature=0.8, seed=seed)]
        assert [t for c in cycles for t in c.emitted] == plain
    assert chosen                                           # something drafted


def sample_with_auto(prompt, policy, sampling, runs=1000):
    """A 3-layer target over 5 tokens, four new tokens, drafted by prompt lookup and a head under `policy()`:
    the target, each output's count, and every run's cycles."""
    target = make_llama(3, layers=3, vocab=HEAD_VOCAB, hidden=32)
    head = small_head(target, HEAD_VOCAB - 2)
    counts, cycles = np.zeros(HEAD_VOCAB ** HEAD_LENGTH), []
    for seed in range(runs):
        drafter = HybridDrafter([PromptLookupDrafter(), head])
        run = list(speculative_decode(target, drafter, prompt, max_new_tokens=HEAD_LENGTH, k=2, temperature=1.0,
                                      seed=seed, policy=policy(), sampling=sampling))
        cycles += run
        out = [t for c in run for t in c.emitted]
        counts[int(np.ravel_multi_index(out, (HEAD_VOCAB,) * HEAD_LENGTH))] += 1
    return target, counts, cycles


def assert_follows_the_target(target, prompt, counts):
    """The counts follow the target's distribution, and are told apart from another one (power)."""
    assert pooled_chisquare(counts, exact_joint(target, prompt, Sampler(1.0), HEAD_LENGTH, HEAD_VOCAB)) > 1e-3
    assert pooled_chisquare(counts, exact_joint(target, prompt, Sampler(2.0), HEAD_LENGTH, HEAD_VOCAB)) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["invariant", "classic"])
def test_sampling_with_auto_follows_the_target_distribution(sampling):
    # The hybrid copies and drafts with the head in turn (the head drafts with its distribution, a copy
    # one-hot), and the counts must follow the target.
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    target, counts, cycles = sample_with_auto(prompt, lambda: HybridPolicy(
        PassCosts({w: 1.0 + 0.01 * w for w in range(9)}, learn=False), {"head": DraftCosts(0.01, learn=False)}),
        sampling)
    assert {c.drafter for c in cycles if c.drafted} == {"ngram", "head"}
    assert_follows_the_target(target, prompt, counts)


# ----------------------------------------------------------------------------- one tree, two drafters' branches

def flat_policy(**options) -> HybridPolicy:
    """Costs under which a second branch always pays: every pass costs one plain step whatever its width,
    the head drafts for nothing."""
    return HybridPolicy(PassCosts({w: 1.0 for w in range(0, 65)}, learn=False),
                        {"head": DraftCosts(0.0, learn=False)}, **options)


def test_merged_gain_adds_the_second_branch_where_the_first_misses():
    from specviz.core.hybrid import merged_gain

    cost = [1.0, 1.1, 1.2, 1.3, 1.4]
    # Depth 1 reached by either branch: 0.5 + 0.4 x (1 - 0.5); depth 2 by the first only.
    expected, gain = merged_gain([0.5, 0.25], [0.4], 3, cost, 0.1)
    assert expected == pytest.approx(1 + 0.7 + 0.25)
    assert gain == pytest.approx(1.95 / 1.4)


def test_merge_branches_shares_what_the_tree_already_holds():
    from specviz.core.hybrid import merge_branches

    tokens, parents, shared = merge_branches([5, 6, 7], [-1, 0, 1], [5, 9])
    assert (tokens, parents, shared) == ([5, 6, 7, 9], [-1, 0, 1, 0], 1)
    assert merge_branches([5, 6], [-1, 0], [8, 9]) == ([5, 6, 8, 9], [-1, 0, -1, 2], 0)


def test_one_tree_holds_the_copy_and_the_head_and_greedy_still_equals_generate(target):
    drafter = hybrid(target)
    proposals = recorded_proposals(drafter)
    cycles = list(speculative_decode(target, drafter, PROMPT, max_new_tokens=40, k=4, policy=flat_policy()))
    assert [t for c in cycles for t in c.emitted] == greedy_reference(target, PROMPT, 40)
    merged = [c for c in cycles if c.drafted_by is not None]
    assert merged, "a flat pass cost makes the head's branch worth adding wherever a copy drafts"
    length = PROMPT.shape[1]
    for cycle in cycles:
        if cycle.drafted_by is not None:
            assert cycle.is_tree and len(cycle.drafted_by) == len(cycle.drafted)
            writers = set(cycle.drafted_by)
            assert writers == {cycle.drafter, "head"}, writers
            # Each writer's nodes are its own proposal's tokens; the head's form a chain of at most 2 from the root.
            for name in writers:
                mine = [t for t, w in zip(cycle.drafted, cycle.drafted_by) if w == name]
                assert set(mine) <= set(proposals[(name, length)])
            assert sum(w == "head" for w in cycle.drafted_by) <= 2
            offer = next(o for o in cycle.offers if o.get("with"))
            assert offer["with"] == "head" and offer["drafter"] == cycle.drafter
            assert offer["gain"] > max(o["gain"] for o in cycle.offers if not o.get("with"))
        length += len(cycle.emitted)
    # The counts split each tree between its writers and still sum to the run's.
    stats = summarize(cycles)
    for key, total in (("num_draft_tokens", stats.drafted), ("num_accepted_tokens", stats.accepted)):
        assert sum(counts[key] for counts in stats.drafters.values()) == total
    # merge=False: never two branches; the same text.
    single = list(speculative_decode(target, HybridDrafter(hybrid(target).components, merge=False), PROMPT,
                                     max_new_tokens=40, k=4, policy=flat_policy()))
    assert all(c.drafted_by is None for c in single)
    assert [t for c in single for t in c.emitted] == greedy_reference(target, PROMPT, 40)


def test_a_model_drafting_aside_never_keeps_a_token_the_target_did_not_write(target):
    # Early exit (a draft model) keeps a cache of the tokens it drafted. Drafting a branch of a tree of two
    # (or a probe that is scored), it must forget its own tokens after the pass, even where the pass kept
    # that many positions (the copy's tokens were accepted there): else its next draft reads its own token
    # where the target wrote another.
    from specviz.core.drafters import DraftModelDrafter, early_exit_model
    from specviz.core.request import Request

    model = early_exit_model(target, 2)
    sequence = PROMPT[0].tolist()
    # Not aside (the chosen drafter's own verified draft), it keeps what the pass kept.
    for aside, kept in ((True, len(sequence)), (False, len(sequence) + 2)):
        exit_layers = DraftModelDrafter(model, name="self:2")
        drafter = HybridDrafter([PromptLookupDrafter(), exit_layers])
        drafter.begin(PROMPT)
        request = Request(0, list(sequence), Sampler(), 40, 4, budget=3)
        draft = drafter.propose_with(exit_layers, request, aside=aside)
        assert exit_layers.cache.lengths() == [len(sequence) + 2]       # it fed its first two drafted tokens
        # The pass accepted two tokens of another branch (one the drafter did not write at the first).
        other = [(draft.tokens[0].item() + 1) % VOCAB, 5]
        drafter.keep_path(len(sequence) + 2, [0, 1])
        assert exit_layers.cache.lengths() == [kept]
        request.tokens += other + [7]
        fresh = DraftModelDrafter(model, name="fresh")
        fresh.begin(torch.tensor([request.tokens]))
        again = exit_layers.propose(torch.tensor([request.tokens]), 3, Sampler()).tokens.tolist()
        same = again == fresh.propose(torch.tensor([request.tokens]), 3, Sampler()).tokens.tolist()
        if aside:
            assert same, "drafting aside, it drafts as a fresh drafter would"
    # End to end: trees of two branches with early exit as the model stay lossless.
    drafter = HybridDrafter([PromptLookupDrafter(), SuffixDrafter(), DraftModelDrafter(model, name="self:2")])
    policy = HybridPolicy(PassCosts({w: 1.0 for w in range(0, 65)}, learn=False), {"self:2": DraftCosts(0.0)})
    cycles = list(speculative_decode(target, drafter, PROMPT, max_new_tokens=40, k=4, policy=policy))
    assert [t for c in cycles for t in c.emitted] == greedy_reference(target, PROMPT, 40)
    assert any(c.drafted_by and "self:2" in c.drafted_by for c in cycles)


def writes_plain_samplings_text(target, decode, prompt=PROMPT, n=30, seeds=3) -> list:
    """Every cycle of `decode(seed)` (a sampled run of `n` tokens after `prompt` at temperature 0.8,
    invariant sampling) over `seeds` seeds, each run's text asserted equal to plain sampling's."""
    from specviz.core.plain import autoregressive_decode

    every = []
    for seed in range(seeds):
        cycles = decode(seed)
        plain = [s.token for s in autoregressive_decode(target, prompt, n, temperature=0.8, seed=seed)]
        assert [t for c in cycles for t in c.emitted] == plain
        every += cycles
    return every


def test_invariant_sampled_trees_of_two_branches_write_plain_samplings_text(target):
    cycles = writes_plain_samplings_text(target, lambda seed: list(speculative_decode(
        target, hybrid(target), PROMPT, max_new_tokens=30, k=4, temperature=0.8, seed=seed, policy=flat_policy())))
    assert any(c.drafted_by is not None for c in cycles)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["invariant", "classic"])
def test_sampling_with_trees_of_two_branches_follows_the_target_distribution(sampling):
    # As the test above, with every pass costing the same: wherever prompt lookup drafts, the head's chain
    # joins it in one tree (one-hot candidates; under classic sampling the head's chain is its greedy one).
    prompt = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0]])      # prompt lookup finds a copy in most cycles
    target, counts, cycles = sample_with_auto(prompt, flat_policy, sampling)
    assert sum(c.drafted_by is not None for c in cycles) >= 1000 // 2
    assert_follows_the_target(target, prompt, counts)


def test_a_tree_of_two_branches_is_shown_and_recorded_with_both_writers(target, tmp_path):
    from specviz.runs.recording_checks import check_hybrid
    from specviz.views.charts import tokens_per_pass_figure
    from specviz.views.drafter_marks import choice_text, marks_html

    cycles = list(speculative_decode(target, hybrid(target), PROMPT, max_new_tokens=40, k=4, policy=flat_policy()))
    cycle = next(c for c in cycles if c.drafted_by is not None)
    assert choice_text(cycle).endswith("drafted one tree, verified in one pass.")
    assert "one tree of" in choice_text(cycle)
    marks = marks_html(cycle)
    assert marks.count('class="sv-by" data-drafter=') == 2 and 'data-drafter="head"' in marks
    figure = tokens_per_pass_figure(cycles, summarize(cycles))
    names = {trace.name for trace in figure.data}
    assert any(name.endswith(" + head") for name in names), names
    # The timeline has a lane per drafter; a tree of two branches is in both lanes.
    from specviz.views.charts import timeline_figure
    lanes = {trace.name: trace for trace in timeline_figure(cycles, []).data if trace.name.startswith("drafted by")}
    assert "drafted by head" in lanes and len(lanes) >= 2
    assert cycle.index + 1 in [row[0] for row in lanes["drafted by head"].customdata]
    check_hybrid(cycle, "cycle")
    import dataclasses
    with pytest.raises(ValueError, match="one name per drafted token"):
        check_hybrid(dataclasses.replace(cycle, drafted_by=cycle.drafted_by[:-1]), "cycle")


# ----------------------------------------------------------------------------- counted and shown

def test_per_drafter_counts_sum_to_the_runs(target):
    cycles = list(speculative_decode(target, hybrid(target), PROMPT, max_new_tokens=40, k=4,
                                     policy=fixed_policy(0.02)))
    stats = summarize(cycles)
    assert stats.drafters and len(stats.drafters) >= 2
    for key, total in (("num_drafts", stats.num_drafts), ("num_draft_tokens", stats.drafted),
                       ("num_accepted_tokens", stats.accepted)):
        assert sum(counts[key] for counts in stats.drafters.values()) == total
    for counts in stats.drafters.values():
        assert counts["mean_acceptance_length"] == 1 + counts["num_accepted_tokens"] / counts["num_drafts"]
        assert sum(counts["accepted_per_position"]) == counts["num_accepted_tokens"]
        assert counts["acceptance_rate_per_position"] == [a / counts["num_drafts"]
                                                         for a in counts["accepted_per_position"]]
    assert summarize([c for c in cycles if c.drafter is None]).drafters is None


def test_the_chart_and_teach_say_which_drafter_each_cycle_chose_and_why(target):
    from specviz.views.charts import tokens_per_pass_figure
    from specviz.views.drafter_marks import choice_text

    cycles = list(speculative_decode(target, hybrid(target), PROMPT, max_new_tokens=40, k=4,
                                     policy=fixed_policy(0.02)))
    figure = tokens_per_pass_figure(cycles, summarize(cycles))
    marked = {trace.name: list(trace.x) for trace in figure.data if trace.name.startswith("drafted by ")}
    assert sum(len(x) for x in marked.values()) == sum(1 for c in cycles if c.drafted)
    assert len(marked) >= 2, marked          # more than one drafter drafted, each its own trace
    drafted = next(c for c in cycles if c.drafter == "ngram")
    assert choice_text(drafted).endswith("So copy drafted.") and "copy offered" in choice_text(drafted)
    paused = next(c for c in cycles if c.planned == 0)
    assert choice_text(paused).endswith("none drafted: a plain step.")


def test_cli_json_has_per_drafter_counts_and_each_cycles_drafter(tmp_path, capsys):
    from specviz.cli import entry

    out = tmp_path / "run.json"
    assert entry(["run", "--target", "tiny", "--draft", "auto", "--max-new-tokens", "24", "--json", str(out),
                 "the cat sat on the mat and the dog sat on the mat and the cat sat on the"]) == 0
    data = json.loads(out.read_text())
    summary, cycles = data["summary"], data["cycles"]
    assert all("drafter" in c and "offers" in c for c in cycles)
    drafters = summary["drafters"] or {}
    assert sum(d["num_draft_tokens"] for d in drafters.values()) == summary["drafted"]
    assert {c["drafter"] for c in cycles if c["drafted"]} == set(drafters)
    printed = capsys.readouterr()
    # Whether copy drafts follows this machine's measured pass costs on the tiny target (a busy host can
    # make every draft look dear): what it printed must say what the JSON says.
    if "ngram" in drafters:
        assert "drafted by: c: copy" in printed.out + printed.err         # the terminal's letters
        assert "drafters: copy (ngram)" in printed.out + printed.err      # and the summary's counts
    else:
        assert "drafters: copy" not in printed.out + printed.err


def test_the_token_view_marks_each_drafted_token_with_its_drafter(tiny):
    from specviz.runs.run import execute
    from specviz.views import render
    from specviz.views.run_view import RunRenderer

    settings = validate(RunSettings(target="tiny", draft="auto", max_new_tokens=24))
    run = execute(settings, "the cat sat on the mat and the dog sat on the mat and the cat sat on the",
                  tiny.loader(settings), warm_up=False)
    drafted = [c for c in run.cycles if c.drafter is not None and c.drafted]
    assert drafted, "the copies find this prompt's repeats"
    from specviz.views.drafter_marks import drafter_word
    word = drafter_word(drafted[0].drafter)
    html = render.cycle_html(drafted[0], run.texts[run.cycles.index(drafted[0])])
    assert f'data-drafter="{word}"' in html and '<sup class="sv-by"' in html
    view = RunRenderer().view(run, "done", final=True, with_charts=False)
    assert f"drafted by {word}" in view.tokens
    assert "drafted by" not in render.token_view_html([])        # a run of one drafter: no drafter legend


def test_a_race_with_a_head_in_the_hybrid_calibrates_its_drafting_and_stays_lossless(tiny):
    # The tiny target ships no head: one is given, as a library user would compose a hybrid.
    import dataclasses

    from specviz.runs.run import execute

    settings = validate(RunSettings(target="tiny", draft="auto", k=4, max_new_tokens=24))
    pair = tiny.loader(settings)
    vocab = pair.target.config.vocab_size
    drafter = HybridDrafter([PromptLookupDrafter(), SuffixDrafter(), small_head(pair.target, vocab, seed=3)])
    pair = dataclasses.replace(pair, draft=drafter, draft_name="auto")
    run = execute(settings, "the cat sat on the mat and the dog ran in the park", pair, baseline=True)
    assert "head's drafting after 128 tokens" in run.calibrated  # its own cost, under its own name
    assert run.identical
    assert all(c.offers for c in run.cycles[1:]) and {o["drafter"] for o in run.cycles[1].offers} >= {"head"}


def test_auto_with_early_exit_drafts_with_it_too_and_stays_lossless(tiny):
    from specviz.runs.run import execute

    settings = validate(RunSettings(target="tiny", draft="auto:self:2", k=4, max_new_tokens=24))
    pair = tiny.loader(settings)
    assert [str(c.name) for c in pair.draft.components] == ["ngram", "suffix", "self:2"]
    run = execute(settings, "the cat sat on the mat and the dog ran in the park", pair, baseline=True)
    assert "self:2's drafting after 128 tokens" in run.calibrated and run.identical
    assert {o["drafter"] for o in run.cycles[1].offers} >= {"self:2"}
    for bad in ("auto:ngram", "auto:org/model", "auto:"):
        with pytest.raises(SpecvizError, match="'auto' takes early exit or a head"):
            parse_draft(bad)


def test_recordings_keep_the_choice_and_older_ones_still_load(tiny, tmp_path):
    from specviz.runs import recording
    from specviz.runs.run import execute

    settings = validate(RunSettings(target="tiny", draft="auto", max_new_tokens=16))
    run = execute(settings, "the cat sat on the mat and the cat sat on the", tiny.loader(settings), warm_up=False)
    path = recording.save(tmp_path / "auto.json", [run])
    loaded = recording.load(path).runs[0]
    assert [c.drafter for c in loaded.cycles] == [c.drafter for c in run.cycles]
    assert [c.offers for c in loaded.cycles] == [json.loads(json.dumps(c.offers)) for c in run.cycles]
    # A recording from before hybrid drafting: no drafter, no offers, no drafter per token.
    data = json.loads(path.read_text())
    for cycle in data["runs"][0]["cycles"]:
        del cycle["drafter"], cycle["offers"]
        cycle.pop("drafted_by", None)
    old = recording.loads(json.dumps(data)).runs[0]
    assert all(c.drafter is None and c.offers == [] for c in old.cycles)
    # A forged offer is refused at load.
    data["runs"][0]["cycles"][0]["offers"] = [{"drafter": "ngram", "length": 10 ** 9, "expected_tokens": 1.0,
                                               "gain": 1.0}]
    with pytest.raises(SpecvizError):
        recording.loads(json.dumps(data))


def test_the_leaderboard_has_a_row_per_method_and_a_column_per_category():
    from specviz.views.bench_table import leaderboard, leaderboard_csv, leaderboard_markdown

    from specviz.runs.bench import SUMMARY_KEYS

    def entry(draft, category, speedup, per_pass, hf=None):
        # Every key the benchmark's summary has (runs.bench.SUMMARY_KEYS), so a renamed one fails here.
        figures = dict.fromkeys(SUMMARY_KEYS)
        figures.update(specviz_speedup=speedup, tokens_per_cycle=per_pass, transformers_speedup=hf,
                       transformers_tokens_per_pass=None if hf is None else 1.5)
        assert figures.keys() == set(SUMMARY_KEYS)
        return {"draft": draft, "category": category, **figures}

    summary = [entry("ngram", "qa", 0.98, 1.1, 0.9), entry("ngram", "overall", 1.1, 1.4, 1.0),
               entry("auto", "qa", 1.05, 1.3), entry("auto", "overall", 1.2, 1.6)]
    rows = leaderboard(summary)
    assert [r["method"] for r in rows] == ["plain decoding", "specviz ngram", "specviz auto", "transformers ngram"]
    assert rows[2]["cells"]["qa"] == {"speedup": 1.05, "mean_accepted_tokens": 1.3}
    table = leaderboard_markdown(rows)
    assert table.splitlines()[0] == "| method | qa | overall |"
    assert "| specviz auto | 1.05x (1.30) | 1.20x (1.60) |" in table
    assert leaderboard_csv(rows).splitlines()[0] == ("method,qa speedup,qa mean_accepted_tokens,overall speedup,"
                                                     "overall mean_accepted_tokens")


# ----------------------------------------------------------------------------- refused where it cannot run

def test_auto_is_parsed_and_refused_where_it_cannot_run():
    assert parse_draft(" AUTO ").kind == "auto"
    for flags in ({"fixed_k": True}, {"dynamic_k": True}):
        with pytest.raises(SpecvizError, match="cost-aware policy"):
            validate(RunSettings(draft="auto", **flags))
    with pytest.raises(SpecvizError, match="tree branch"):
        validate(RunSettings(draft="auto", branch=2))
    from specviz.engines.configs import speculative_config
    with pytest.raises(SpecvizError, match="specviz's own"):
        speculative_config(parse_draft("auto"), 4)
    from specviz.runs.compare import iter_sweep
    with pytest.raises(SpecvizError, match="k sweep"):         # before anything loads
        next(iter_sweep(validate(RunSettings(draft="auto")), "a prompt"))


def test_auto_for_a_target_without_a_shipped_head_copies_and_suffixes(target):
    from specviz.models.pairs import make_drafter

    drafter = make_drafter("auto", target, target_name="tiny")
    assert [c.name for c in drafter.components] == ["ngram", "suffix"]
    with pytest.raises(ValueError, match="distinct names"):
        HybridDrafter([PromptLookupDrafter(), PromptLookupDrafter()])
    from specviz.core.decoding import batched_speculative_decode
    with pytest.raises(ValueError, match="one request at a time"):
        batched_speculative_decode(target, drafter, [PROMPT[0].tolist(), PROMPT[0, :5].tolist()])
