"""Which copy drafts when two pay (core.copy_record): each offer scored against the output at its own
plan's length and width; the preferred copy drafts unless another has given clearly more over enough
cycles; a hybrid with a preference stays lossless and drafts with the preferred copy where both pay, and
prompt lookup takes over on a request where suffix decoding, made short-sighted, clearly gives less."""

import copy

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
