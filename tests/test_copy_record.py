"""Which copy drafts when two pay (core.copy_record): each offer scored against the output at its own
plan's length and width; the preferred copy drafts unless another has given clearly more over enough
cycles; a hybrid with a preference stays lossless and drafts with the preferred copy where both pay, and
prompt lookup takes over on a request where suffix decoding, made short-sighted, clearly gives less."""

import copy
import dataclasses

import pytest
import torch
from conftest import make_llama

from specviz import speculative_decode
from specviz.core.copy_record import CLEAR, MIN_COMPARED, CopyRecord, Offered
from specviz.core.drafters import PromptLookupDrafter
from specviz.core.hybrid import HybridDrafter, HybridPolicy
from specviz.core.lookup_trees import SuffixDrafter
from specviz.core.pass_costs import PassCosts

VOCAB = 40
PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]])
PASSES = {w: 1.0 + 0.05 * w for w in range(0, 65)}


def flat(width: int) -> list[float]:
    """A pass that costs one plain step at any width."""
    return [1.0] * (width + 1)


def test_an_offer_is_matched_along_its_chain_or_tree_up_to_its_planned_length():
    chain = Offered("ngram", [5, 6, 7], [-1, 0, 1], length=2, start=1)
    assert chain.matched([9]) is None                     # the output has not reached it yet
    assert chain.matched([9, 5]) is None                  # matched so far, its next position not yet written
    assert chain.matched([9, 5, 6, 8]) == 2               # its plan cut it at 2: the third is not counted
    assert chain.matched([9, 4]) == 0
    assert chain.width() == 2
    # A tree: two children of the root (5, 8), 8's child 1; the output follows 8 then 1.
    tree = Offered("suffix", [5, 8, 1], [-1, -1, 1], length=2, start=0)
    assert tree.matched([8, 1, 3]) == 2
    assert tree.matched([8, 2]) == 1
    assert tree.width() == 3


def comparisons(record: CopyRecord, gains: list[int]) -> None:
    """One cycle per entry: the preferred suffix decoding matches nothing, prompt lookup matches `gain`."""
    output = []
    for gain in gains:
        start = len(output)
        record.offer([Offered("suffix", [99], [-1], 1, start),
                      Offered("ngram", [7] * max(gain, 1), list(range(-1, max(gain, 1) - 1)), max(gain, 1), start)])
        output += [7] * gain + [50]
        record.observe(output, flat)


def test_the_preferred_copy_drafts_until_another_has_given_clearly_more_over_enough_cycles():
    record = CopyRecord("suffix")
    assert record.leader(["ngram", "suffix"]) == "suffix"          # nothing compared yet
    comparisons(record, [2] * (MIN_COMPARED - 1))
    assert record.leader(["ngram", "suffix"]) == "suffix"          # clearly ahead, but not over enough cycles
    comparisons(record, [2])
    assert record.against["ngram"][0] == MIN_COMPARED
    assert record.leader(["ngram", "suffix"]) == "ngram"
    assert record.leader(["suffix"]) == "suffix"


def test_a_copy_ahead_by_less_than_the_noise_does_not_take_over():
    record = CopyRecord("suffix")
    # Prompt lookup gives a token more in one cycle of five, none in the others: ahead on average by
    # 0.2 a cycle, with a spread that keeps it within CLEAR standard errors (0.27) over 10 cycles.
    comparisons(record, [1, 0, 0, 0, 0] * 2)
    n, total, squares = record.against["ngram"]
    mean = total / n
    spread = (squares / n - mean ** 2) ** 0.5
    assert mean > 0 and mean < CLEAR * spread / (n - 1) ** 0.5
    assert record.leader(["ngram", "suffix"]) == "suffix"


def test_a_preference_must_be_a_free_drafter():
    with pytest.raises(ValueError, match="preferred drafter"):
        HybridDrafter([PromptLookupDrafter(), SuffixDrafter()], prefer="head")


@pytest.fixture(scope="module")
def target():
    torch.set_grad_enabled(False)
    return make_llama(0, layers=4, vocab=VOCAB)


def greedy_reference(target, prompt, n):
    return target.generate(prompt, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(prompt),
                           pad_token_id=0)[0, prompt.shape[1]:].tolist()


def run(target, suffix: SuffixDrafter, prompt=PROMPT, n=48):
    drafter = HybridDrafter([PromptLookupDrafter(), suffix], prefer="suffix", merge=False)
    policy = HybridPolicy(PassCosts(PASSES, learn=False))
    cycles = list(speculative_decode(target, drafter, prompt, max_new_tokens=n, k=4, policy=policy))
    assert [t for c in cycles for t in c.emitted] == greedy_reference(target, prompt, n)
    return cycles, policy.records.get(0)


def both_paid(cycle) -> bool:
    return sum(1 for o in cycle.offers if o["length"]) == 2


def test_where_both_copies_pay_the_preferred_one_drafts_and_greedy_still_equals_generate(target):
    cycles, record = run(target, SuffixDrafter())
    compared = [c for c in cycles if both_paid(c)]
    assert compared, "the repeating prompt has both copies pay in some cycle"
    # Here prompt lookup never gave clearly more (the target does not copy much), so suffix decoding
    # drafted every one of them, whatever either expected (prompt lookup expected more in some).
    assert record.leader(["ngram", "suffix"]) == "suffix"
    assert all(c.drafter == "suffix" for c in compared)
    assert any(c.drafter != max((o for o in c.offers if o["length"]), key=lambda o: o["gain"])["drafter"]
               for c in compared)


def writing_phrase(model, phrase: list[int]):
    """`model` (a copy) that, after any token of `phrase`, writes the phrase's next token (its logit
    raised by 20 at every position, one position or many): a target whose text repeats the phrase."""
    model = copy.deepcopy(model)
    following = torch.full((VOCAB,), -1)
    following[torch.tensor(phrase)] = torch.tensor(phrase[1:] + phrase[:1])

    def hook(_module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        logits = output.logits.clone()
        nxt = following[ids[:, ids.shape[1] - logits.shape[1]:]]       # the positions it returns logits for
        rows, cols = torch.nonzero(nxt >= 0, as_tuple=True)
        logits[rows, cols, nxt[rows, cols]] += 20.0
        output.logits = logits
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def test_prompt_lookup_takes_over_where_it_clearly_gives_more(target):
    # The target repeats a phrase: prompt lookup follows it 4 deep, suffix decoding made to draft one
    # token (its tree is at most one node) gives at most 2 tokens a pass.
    phrase = [3, 9, 14, 22, 5, 17, 30, 11, 8, 26]
    copying = writing_phrase(target, phrase)
    prompt = torch.tensor([phrase * 2 + phrase[:3]])
    cycles, record = run(copying, SuffixDrafter(spec_factor=1.0, budget=1), prompt=prompt, n=64)
    assert record is not None and record.leader(["ngram", "suffix"]) == "ngram", record
    compared = [c for c in cycles if both_paid(c)]
    assert compared[0].drafter == "suffix" and compared[-1].drafter == "ngram"
    taken_over = next(i for i, c in enumerate(compared) if c.drafter == "ngram")
    assert taken_over >= MIN_COMPARED and all(c.drafter == "ngram" for c in compared[taken_over:])


def test_the_comparison_is_said_in_teach_and_explain_and_kept_and_checked_in_recordings(target, tmp_path):
    import dataclasses

    from specviz.runs.recording_checks import check_hybrid
    from specviz.views.drafter_marks import choice_text

    phrase = [3, 9, 14, 22, 5, 17, 30, 11, 8, 26]
    cycles, _ = run(writing_phrase(target, phrase), SuffixDrafter(spec_factor=1.0, budget=1),
                    prompt=torch.tensor([phrase * 2 + phrase[:3]]), n=64)
    compared = [c for c in cycles if both_paid(c)]
    first, last = compared[0], compared[-1]
    assert "where copy and suffix both pay, suffix drafts unless copy has clearly given more on this request: " \
           "not compared yet" in choice_text(first) and choice_text(first).endswith("So suffix drafted.")
    versus = next(o["versus"] for o in last.offers if o["drafter"] == "ngram")
    assert versus["clearly"] and versus["cycles"] >= MIN_COMPARED and versus["ahead"] > 0
    assert "clearly more" in choice_text(last) and "not clearly" not in choice_text(last)
    assert choice_text(last).endswith("So copy drafted.")
    for cycle in compared:
        check_hybrid(cycle, "cycle")
    forged = [dict(o, versus=dict(o["versus"], cycles=-1)) if "versus" in o else o for o in last.offers]
    with pytest.raises(ValueError, match="comparison with the preferred copy"):
        check_hybrid(dataclasses.replace(last, offers=forged), "cycle")
    emptied = [dict(o, versus={}) if "versus" in o else o for o in last.offers]
    with pytest.raises(ValueError, match="comparison with the preferred copy"):
        check_hybrid(dataclasses.replace(last, offers=emptied), "cycle")


# ----------------------------------------------------------------------------- one tree of both copies

def test_a_tree_of_both_holds_each_offer_cut_to_its_length_once_where_they_share():
    from specviz.core.copy_record import union

    chain = Offered("suffix", [5, 6, 7], [-1, 0, 1], length=2, start=0)     # its plan cut it at 2: 5 6
    tree = Offered("ngram", [5, 9, 8], [-1, 0, -1], length=2, start=0)      # 5 9 and 8
    both = union([chain, tree])
    assert both.tokens == [5, 6, 9, 8] and both.parents == [-1, 0, 0, -1]
    assert both.sources == [(0, 0), (0, 1), (1, 1), (1, 2)]                # 5 once, as the first offer's
    assert both.depth() == 2


def test_what_the_other_copys_nodes_add_is_recorded_where_it_offers_nodes_the_preferred_did_not():
    # Suffix decoding matches 2 in one cycle, prompt lookup in the next: a tree of both would have given
    # 2 tokens more than suffix decoding's draft in every other cycle.
    record = CopyRecord("suffix", both=True)
    assert record.added() == 0                                           # a request starts expecting nothing
    output = []
    for turn in range(2 * MIN_COMPARED):
        start = len(output)
        record.offer([Offered("suffix", [7, 7] if turn % 2 else [8, 8], [-1, 0], 2, start),
                      Offered("ngram", [8, 8] if turn % 2 else [7, 7], [-1, 0], 2, start)])
        output += [7, 7, 50]
        record.observe(output, flat)
    assert record.extra == [2 * MIN_COMPARED, 2 * MIN_COMPARED]
    assert record.added() == pytest.approx(2 * MIN_COMPARED / (3 * MIN_COMPARED))   # shrunk towards none
    assert record.tokens_added() == dict(cycles=2 * MIN_COMPARED, tokens=record.added())
    assert record.leader(["ngram", "suffix"]) == "suffix"               # neither copy alone is clearly ahead


def test_nothing_is_recorded_where_the_copies_agree_or_without_trees_of_both():
    agreeing = [Offered(name, [7, 7], [-1, 0], 2, 0) for name in ("suffix", "ngram")]
    for both in (True, False):
        record = CopyRecord("suffix", both=both)
        record.offer(agreeing)
        record.observe([7, 7, 50], flat)
        assert record.extra == [0, 0] and record.added() == 0


def for_both(record_of) -> None:
    """`record_of` (a policy's records) with request 0's record already expecting prompt lookup's extra
    nodes to add half a token (what a request where they were right in half the cycles leaves), so that a
    tree of both drafts from the first cycle the copies differ."""
    record = CopyRecord("suffix", both=True)
    record.extra = [float(2 * MIN_COMPARED), float(2 * MIN_COMPARED)]
    record_of[0] = record


def run_both(target, prompt, n, suffix=None, seeded=True, **sampling):
    drafter = HybridDrafter([PromptLookupDrafter(), suffix or SuffixDrafter()], prefer="suffix", merge=False,
                            both=True)
    policy = HybridPolicy(PassCosts({w: 1.0 for w in range(65)}, learn=False))
    if seeded:
        for_both(policy.records)
    return list(speculative_decode(target, drafter, prompt, max_new_tokens=n, k=4, policy=policy, **sampling))


def of_both(cycle) -> bool:
    return any(o.get("with") for o in cycle.offers)


def test_a_tree_of_both_drafts_once_the_other_copys_nodes_have_added_and_greedy_still_equals_generate(target):
    from specviz.runs.recording_checks import check_hybrid
    from specviz.views.drafter_marks import choice_text

    # The target repeats a phrase; suffix decoding, made to draft one token, leaves prompt lookup's deeper
    # nodes to add: where passes cost the same at any width, a tree of both drafts once they have added
    # on this request (not before), until prompt lookup alone is clearly ahead.
    phrase = [3, 9, 14, 22, 5, 17, 30, 11, 8, 26]
    copying = writing_phrase(target, phrase)
    prompt = torch.tensor([phrase * 2 + phrase[:3]])
    cycles = run_both(copying, prompt, 64, suffix=SuffixDrafter(spec_factor=1.0, budget=1), seeded=False)
    assert [t for c in cycles for t in c.emitted] == greedy_reference(copying, prompt, 64)
    compared = [c for c in cycles if sum(1 for o in c.offers if o["length"] and not o.get("with")) == 2]
    trees = [c for c in compared if of_both(c)]
    assert trees and not of_both(compared[0])                            # nothing added yet in the first
    for cycle in trees:
        assert cycle.drafter == "suffix" and set(cycle.drafted_by) == {"suffix", "ngram"}
        assert cycle.drafted_by[0] == "suffix"                          # the preferred draft, then what ngram adds
        check_hybrid(cycle, "cycle")
        offer = next(o for o in cycle.offers if o.get("with"))
        assert offer["with"] == "ngram" and offer["added"]["cycles"] >= 1 and offer["added"]["tokens"] > 0
        assert "copy's nodes beyond suffix's draft are expected to add" in choice_text(cycle)
        assert choice_text(cycle).endswith("suffix and copy drafted one tree, verified in one pass.")
    forged = [dict(o, added=dict(o["added"], tokens=-1.0)) if "added" in o else o for o in trees[0].offers]
    with pytest.raises(ValueError, match="what the others added"):
        check_hybrid(dataclasses.replace(trees[0], offers=forged), "cycle")


def test_invariant_sampled_trees_of_both_copies_write_plain_samplings_text(target):
    from test_hybrid import writes_plain_samplings_text

    cycles = writes_plain_samplings_text(target, lambda seed: run_both(target, PROMPT, 30, temperature=0.8, seed=seed),
                                         PROMPT)
    assert any(of_both(c) for c in cycles)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["invariant", "classic"])
def test_sampling_with_trees_of_both_copies_follows_the_target_distribution(sampling):
    import numpy as np
    from test_head import HEAD_LENGTH, HEAD_VOCAB
    from test_hybrid import assert_follows_the_target

    # Where the text reads "0 1" after other than "3", prompt lookup copies what followed its first "0 1"
    # (4), suffix decoding what followed most (2): the tree of both holds both branches.
    prompt = torch.tensor([[0, 1, 4, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])
    target = make_llama(3, layers=3, vocab=HEAD_VOCAB, hidden=32)
    counts, trees, two = np.zeros(HEAD_VOCAB ** HEAD_LENGTH), 0, 0
    for seed in range(1000):
        cycles = run_both(target, prompt, HEAD_LENGTH, temperature=1.0, seed=seed, sampling=sampling)
        trees += sum(of_both(c) for c in cycles)
        two += sum(of_both(c) and len(set(c.drafted_by)) > 1 for c in cycles)
        out = [t for c in cycles for t in c.emitted]
        counts[int(np.ravel_multi_index(out, (HEAD_VOCAB,) * HEAD_LENGTH))] += 1
    assert trees >= 500 and two >= 50, (trees, two)
    assert_follows_the_target(target, prompt, counts)
