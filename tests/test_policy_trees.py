"""Tree drafters (prompt lookup as a tree, suffix decoding) under the cost-aware policy: it plans after
they propose, cuts each tree to the depth that pays (the widths of the cut tree priced by the pass-cost
table) or pauses (a plain step), and none of that may change the output: greedy output equals
`target.generate`'s, sampled output follows the target's distribution.

The targets are tiny Llamas with small vocabularies, whose greedy text repeats, so that lookup trees
are accepted often enough for the policy to draft at several depths; the tables are fixed
(`learn=False`) so each run's decisions depend on the text alone."""

import itertools

import pytest
import torch

from conftest import make_llama, reference
from specviz import speculative_decode
from specviz.core import tree_shape
from specviz.core.draft_policy import CostAwarePolicy, PassCosts
from specviz.core.lookup_trees import NgramTreeDrafter, SuffixDrafter
from test_sampling import RUNS, V, assert_follows_target, observed_joint

N, K = 40, 8
PROMPT = torch.tensor([[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]])
DRAFTERS = {"ngram-tree": NgramTreeDrafter, "suffix": lambda: SuffixDrafter(spec_factor=4.0)}
# Seconds of a pass by the drafted tokens it verifies (0: a plain step): wide passes nearly free (trees
# drafted deep), dearer by the token (cut shallow), a CPU in float32 (a pass ~1.7 steps: drafts only
# where acceptance is high), and passes of 3-4 steps (paused but where nearly everything is accepted).
TABLES = {"cheap": {0: 1.0, 1: 1.02, 4: 1.05, 8: 1.1, 16: 1.15, 32: 1.2},
          "by the token": {0: 1.0, 1: 1.2, 2: 1.3, 4: 1.45, 8: 1.8, 16: 2.6, 32: 4.0},
          "fp32 cpu": {0: 1.0, 1: 1.6, 2: 1.7, 4: 1.75, 8: 1.9, 16: 2.2, 32: 3.0},
          "dear": {0: 1.0, 1: 3.0, 32: 4.0}}
# The sampling algorithms verification offers; each test below runs under every one.
SAMPLING_ALGORITHMS = ["classic", "invariant"]


def sampling_options(algorithm: str) -> dict:
    """speculative_decode's arguments for `algorithm`."""
    return {"sampling": algorithm}


def recording(drafter) -> dict:
    """Notes the depth of each tree `drafter` proposes, by the sequence length it proposed at."""
    depths, propose = {}, drafter.propose

    def recorded(sequence, k, sampler):
        draft = propose(sequence, k, sampler)
        if draft.parents is not None:
            depths[sequence.shape[1]] = max(tree_shape.depths(list(draft.parents)), default=0)
        return draft

    drafter.propose = recorded
    return depths


def check_cycles(cycles, proposed: dict, prompt_length: int, n: int) -> list[tuple[int, int]]:
    """What each cycle's plan did to its proposal, checked: (proposed depth, planned depth) per cycle
    that planned. A cycle verifies at most its plan's depth of a tree, nothing on a pause."""
    seen = []
    starts = itertools.accumulate((len(c.emitted) for c in cycles), initial=prompt_length)
    for c, start in zip(cycles, starts):
        if c.planned is None:                   # nothing proposed
            assert not c.drafted
            continue
        assert 0 <= c.planned <= K
        if c.planned == 0:
            assert not c.drafted and len(c.emitted) == 1
        else:
            assert c.is_tree and tree_shape.draft_reach(c) <= c.planned
        if start - prompt_length < n - 1:       # room to draft: the plan was made for this proposal
            seen.append((proposed[start], c.planned))
    return seen


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("vocab, seed", [(6, 0), (8, 1), (12, 2)])
def test_greedy_tree_drafters_under_the_policy_equal_generate(drafter, vocab, seed):
    target = make_llama(seed, layers=2, vocab=vocab, hidden=32)
    expected = reference(target, PROMPT, n=N)
    plans = []
    for table in TABLES.values():
        draft = DRAFTERS[drafter]()
        proposed = recording(draft)
        policy = CostAwarePolicy(PassCosts(table, learn=False))
        cycles = list(speculative_decode(target, draft, PROMPT, N, k=K, policy=policy))
        assert [t for c in cycles for t in c.emitted] == expected, table
        plans += check_cycles(cycles, proposed, PROMPT.shape[1], N)
    # Over the tables the policy paused, drafted whole trees, and cut trees at more than one depth.
    assert any(planned == 0 < depth for depth, planned in plans)
    assert any(planned == depth > 0 for depth, planned in plans)
    cuts = {planned for depth, planned in plans if 0 < planned < depth}
    assert len(cuts) >= 2, plans


# Passes of up to two drafted tokens nearly free, wider ones dear: prompt lookup's first tree (three
# siblings under the root) is not worth its width, a paused step; its later, narrower trees are drafted,
# cut to depth 1 with their siblings. Wide passes nearly free: suffix decoding's first tree is drafted
# with its siblings, cut to depth 1; after its rejection the next cycle pauses.
NARROW_CHEAP = {0: 1.0, 1: 1.01, 2: 1.02, 3: 1.3, 8: 1.6}
CHEAP = {0: 1.0, 1: 1.0, 2: 1.01, 4: 1.05, 8: 1.2}


@pytest.mark.parametrize("sampling", SAMPLING_ALGORITHMS)
@pytest.mark.parametrize("drafter, kw, table", [
    ("ngram-tree", dict(k=3, temperature=1.0), NARROW_CHEAP),
    ("ngram-tree", dict(k=3, temperature=0.8, top_k=4), NARROW_CHEAP),
    ("suffix", dict(k=3, temperature=1.0), CHEAP),
    ("suffix", dict(k=3, temperature=0.8, top_k=4), CHEAP),
])
@pytest.mark.slow
def test_sampling_with_tree_drafters_under_the_policy_matches_target_distribution(drafter, kw, table, sampling):
    # The plan is made from the past only (what earlier cycles' proposals and verdicts showed), so
    # cutting a tree or pausing may not bend the distribution; "1 2" was followed by 3, 4 and 5: the
    # trees have siblings.
    target = make_llama(0, layers=2, vocab=V, hidden=32)         # test_sampling's target: its joint is enumerated
    cycles = []
    counts = observed_joint(target, DRAFTERS[drafter](), PROMPT, RUNS, cycles_seen=cycles,
                            policy=lambda: CostAwarePolicy(PassCosts(table, learn=False)),
                            **kw, **sampling_options(sampling))
    planned = [c.planned for c in cycles if c.planned is not None]
    assert 0 in planned and any(planned)                    # it paused and drafted
    cut = [c for c in cycles if c.planned and len(c.drafted) > tree_shape.draft_reach(c) == c.planned]
    assert len(cut) > RUNS / 4                              # trees cut to their plan, siblings verified
    assert_follows_target(counts, target, PROMPT, kw)
