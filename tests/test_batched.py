"""Batched decoding (core.decoding, core.plain) is lossless per row: every row's greedy output equals that prompt
decoded alone by `speculative_decode` and by `target.generate` (fp32), for batch sizes 1-8 with
prompts of different lengths; sampled rows follow the target's exact distribution (chi-square with a
power check); a seeded row reproduces independently of the other rows."""

import numpy as np
import pytest
import torch
from conftest import make_gpt2, make_llama, make_qwen2, reference, truncated_copy
from test_sampling import LENGTH, V, exact_joint, pooled_chisquare

from specviz.core.plain import batched_autoregressive_decode
from specviz.core.decoding import batched_speculative_decode
from specviz.core.events import row_outputs
from specviz.core.request import row_seed
from specviz.core import ragged_cache
from specviz.core.ragged_cache import RaggedCache
from specviz.core.plain import autoregressive_decode
from specviz.core.decoding import speculative_decode
from specviz.core.drafters import Draft, Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model, no_draft
from specviz.core.lookup_trees import SuffixDrafter
from specviz.core.sampling import Sampler, sample_from

EOS = 3
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models():
    target = make_llama(0, layers=4, eos=EOS)
    return target, {"model": truncated_copy(target, 1), "self:2": DraftModelDrafter(early_exit_model(target, 2)),
                    "ngram": PromptLookupDrafter()}


def ragged_prompts(count: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` prompts of different lengths (2 to 30 tokens), each with a repeated stretch so that
    prompt lookup finds matches; none contains the EOS token."""
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        length = 2 + (7 * i + 5) % 29
        ids = torch.randint(4, 97, (length,), generator=g)
        if length > 8:
            ids[length // 2:length // 2 + 4] = ids[:4]
        prompts.append(ids[None])
    return prompts


def alone(target, draft, prompt, **kw) -> list[int]:
    return [t for c in speculative_decode(target, draft, prompt, **kw) for t in c.emitted]


# ----------------------------------------------------------------------------- greedy: lossless per row

@pytest.mark.parametrize("draft", ["model", "self:2", "ngram"])
@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8])
def test_greedy_rows_equal_each_prompt_decoded_alone(models, draft, batch):
    target, drafts = models
    prompts = ragged_prompts(batch, seed=batch)
    events = list(batched_speculative_decode(target, drafts[draft], prompts, max_new_tokens=NEW_TOKENS, k=3))
    out = row_outputs(events)
    for row, prompt in enumerate(prompts):
        expected = reference(target, prompt, eos=EOS, n=NEW_TOKENS)
        assert out[row] == expected, f"row {row} (prompt of {prompt.shape[1]} tokens)"
        assert out[row] == alone(target, drafts[draft], prompt, max_new_tokens=NEW_TOKENS, k=3)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["model", "self:2", "ngram"])
@pytest.mark.parametrize("batch", [4, 6, 7])
@pytest.mark.parametrize("k", [1, 5])
def test_greedy_rows_equal_alone_more_sizes(models, draft, batch, k):
    target, drafts = models
    prompts = ragged_prompts(batch, seed=10 + batch)
    out = row_outputs(batched_speculative_decode(target, drafts[draft], prompts, max_new_tokens=40, k=k))
    assert [out[r] for r in range(batch)] == [reference(target, p, eos=EOS, n=40) for p in prompts]


def test_rows_that_end_leave_the_batch(models):
    # Rows end at their own times (an EOS, or their token budget reached after their own number of
    # passes). A row that ended is in no later pass, and a pass computes only the live rows' tokens.
    target, drafts = models
    prompts = ragged_prompts(6, seed=3)
    events = list(batched_speculative_decode(target, drafts["model"], prompts, max_new_tokens=NEW_TOKENS, k=3))
    out = row_outputs(events)
    for row in out:
        # What a row wrote, not only how much: its prompt's own continuation, to its EOS or its budget.
        assert out[row] == reference(target, prompts[row], eos=EOS, n=NEW_TOKENS), f"row {row}"
        last_pass = max(e.index for e in events if row in e.requests)
        ended_on_eos = out[row][-1] == EOS
        assert ended_on_eos or len(out[row]) == NEW_TOKENS
        assert all(row not in e.requests for e in events if e.index > last_pass)
    assert any(tokens[-1] == EOS and len(tokens) < NEW_TOKENS for tokens in out.values())
    live = [len(e.requests) for e in events]
    assert live == sorted(live, reverse=True) and live[0] == len(prompts) > live[-1]
    for event in events[1:]:
        assert event.tokens == sum(1 + len(c.drafted) for c in event.cycles)


def test_regathered_cache_keeps_outputs(models, monkeypatch):
    # Re-gather whenever any slot could be won back (every few passes here): outputs must not change.
    monkeypatch.setattr(ragged_cache, "MAX_HOLES", 0.0)
    target, drafts = models
    prompts = ragged_prompts(5, seed=4)
    events = list(batched_speculative_decode(target, drafts["model"], prompts, max_new_tokens=NEW_TOKENS, k=4))
    assert sum(e.regathered for e in events) >= len(events) // 3
    out = row_outputs(events)
    assert [out[r] for r in range(5)] == [reference(target, p, eos=EOS, n=NEW_TOKENS) for p in prompts]


def test_padding_from_prompt_lengths_is_not_re_gathered(models):
    # Two short prompts beside a long one: most slots are left padding, which no re-gather can win
    # back (every row is padded to the longest), so none may happen; outputs stay exact.
    target, drafts = models
    prompts = [torch.tensor([[5, 6]]), torch.tensor([[7, 8]]), torch.tensor([list(range(10, 50))])]
    events = list(batched_speculative_decode(target, drafts["model"], prompts, max_new_tokens=8, k=2))
    assert not any(e.regathered for e in events)
    out = row_outputs(events)
    assert [out[r] for r in range(3)] == [reference(target, p, eos=EOS, n=8) for p in prompts]


def test_padding_is_reported_and_masked(models):
    target, drafts = models
    prompts = [torch.tensor([[5, 6]]), torch.tensor([list(range(10, 40))])]
    events = list(batched_speculative_decode(target, drafts["ngram"], prompts, max_new_tokens=4, k=2))
    # The short prompt is left-padded to the long one: 28 padding slots at least ...
    assert events[0].padded_slots >= 28 and events[0].slots >= 2 * 30
    # ... which no row sees: each writes its prompt's own continuation.
    out = row_outputs(events)
    assert [out[r] for r in range(2)] == [reference(target, p, eos=EOS, n=4) for p in prompts]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batched_plain_decoding_equals_generate(models, batch):
    target, _ = models
    prompts = ragged_prompts(batch, seed=20 + batch)
    out = row_outputs(batched_autoregressive_decode(target, prompts, max_new_tokens=NEW_TOKENS))
    assert [out[r] for r in range(batch)] == [reference(target, p, eos=EOS, n=NEW_TOKENS) for p in prompts]


def test_ragged_cache_positions_skip_padding_and_holes(models):
    target, _ = models
    cache = RaggedCache(target, 2)
    cache.forward([[5, 6, 7], [8]], keep=1)
    assert cache.lengths() == [3, 1]
    cache.forward([[9, 10], [11, 12]], keep=2)
    cache.keep([4, 2])                 # row 0 rejected its last token, row 1 its last
    assert cache.lengths() == [4, 2]
    assert cache.valid.shape[1] <= 5


# ----------------------------------------------------------------------------- sampling: exact per row

@pytest.fixture(scope="module")
def small_models():
    target = make_llama(0, layers=2, vocab=V, hidden=32)
    return target, {"model": truncated_copy(target, 1), "self:1": DraftModelDrafter(early_exit_model(target, 1)),
                    "ngram": PromptLookupDrafter()}


SAMPLING_PROMPTS = [torch.tensor([[1, 2, 3, 1, 2]]), torch.tensor([[4]]), torch.tensor([[0, 5, 0, 5, 0, 5, 2, 1]])]


@pytest.mark.parametrize("draft", ["model", "ngram", "self:1"])
@pytest.mark.slow
def test_each_sampled_row_follows_its_target_distribution(small_models, draft):
    target, drafts = small_models
    kw = {"k": 2, "temperature": 1.0}
    runs = 1000         # each row rejects a 1.25x temperature at 1,000 (scripts/sampling_power.py)
    counts = np.zeros((len(SAMPLING_PROMPTS), V ** LENGTH))
    for seed in range(runs):
        out = row_outputs(batched_speculative_decode(target, drafts[draft], SAMPLING_PROMPTS, max_new_tokens=LENGTH,
                                                 seed=seed, **kw))
        for row, tokens in out.items():
            counts[row, int(np.ravel_multi_index(tokens, (V,) * LENGTH))] += 1
    for row, prompt in enumerate(SAMPLING_PROMPTS):
        exact = exact_joint(target, prompt, Sampler(1.0))
        assert pooled_chisquare(counts[row], exact) > 1e-3, f"row {row}"
        # Power: the same counts against the target at another temperature are rejected.
        wrong = exact_joint(target, prompt, Sampler(2.0))
        assert pooled_chisquare(counts[row], wrong) < 1e-4, f"row {row}"


class FirstRowWithout(Drafter):
    """A batch drafter whose first request never drafts (as a draft head's request with no budget
    left, or before its first features) while the others draw `budget` tokens from a stated
    distribution: which acceptance rule each row got can be checked against it."""

    batchable = True

    def __init__(self, vocab: int):
        self.distribution = torch.softmax(torch.linspace(0.0, 3.0, vocab), dim=0)    # known draft probabilities

    def propose(self, sequence, k, sampler):
        raise AssertionError("drafts through propose_batch")

    def propose_batch(self, requests):
        drafts = []
        for r in requests:
            if r.index == 0 or not r.budget:
                drafts.append(no_draft())
                continue
            probs = self.distribution.expand(r.budget, -1)
            drafts.append(Draft(sample_from(probs, r.sampler.generator), probs))
        return drafts


def test_each_row_of_a_batch_is_verified_by_its_own_draft_rule(models):
    # The first row drafts nothing; every other row's draft comes with its distribution, so each of
    # its tokens x must be accepted with probability min(1, target(x) / draft(x)) (uniform * draft(x)
    # < target(x)), never with target(x) as if it were one-hot.
    target, _ = models
    drafter = FirstRowWithout(target.config.vocab_size)
    events = list(batched_speculative_decode(target, drafter, ragged_prompts(3, seed=8), max_new_tokens=NEW_TOKENS,
                                             k=3, temperature=1.0, seed=3))
    checked = 0
    for event in events:
        for row, cycle in zip(event.requests, event.cycles):
            if row == 0:
                assert not cycle.drafted
                continue
            draft = [float(drafter.distribution[t]) for t in cycle.drafted]
            assert cycle.draft_probs == pytest.approx(draft, rel=1e-5)
            by_rule = [u * q < p for u, q, p in zip(cycle.uniforms, draft, cycle.target_probs)]
            expected = by_rule.index(False) if False in by_rule else len(by_rule)
            assert cycle.num_accepted == expected
            checked += len(cycle.drafted)
    assert checked >= 20


@pytest.mark.parametrize("draft", ["model", "self:2", "ngram"])
def test_a_seeded_row_reproduces_whatever_the_other_rows_do(models, draft):
    target, drafts = models
    prompts = ragged_prompts(4, seed=5)
    kw = {"max_new_tokens": NEW_TOKENS, "k": 3, "temperature": 1.0, "top_k": 20}
    out = row_outputs(batched_speculative_decode(target, drafts[draft], prompts, seed=11, **kw))
    # Each row is that prompt decoded alone with the row's own seed ...
    for row, prompt in enumerate(prompts):
        assert out[row] == alone(target, drafts[draft], prompt, seed=row_seed(11, row), **kw)
    # ... so another batch around it (other rows, other acceptances) leaves it alone.
    other = [prompts[0], *ragged_prompts(3, seed=6)]
    assert row_outputs(batched_speculative_decode(target, drafts[draft], other, seed=11, **kw))[0] == out[0]
    assert row_outputs(batched_speculative_decode(target, drafts[draft], prompts, seed=12, **kw)) != out


def test_sampled_plain_rows_equal_each_prompt_alone(models):
    target, _ = models
    prompts = ragged_prompts(3, seed=7)
    out = row_outputs(batched_autoregressive_decode(target, prompts, max_new_tokens=NEW_TOKENS, temperature=0.9,
                                                    seed=2))
    for row, prompt in enumerate(prompts):
        steps = autoregressive_decode(target, prompt, NEW_TOKENS, temperature=0.9, seed=row_seed(2, row))
        assert out[row] == [s.token for s in steps]


# ----------------------------------------------------------------------------- refusals

def test_bad_batches_are_refused(models):
    target, drafts = models
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        batched_speculative_decode(target, drafts["ngram"], [torch.tensor([[1]]), torch.tensor([[]], dtype=torch.long)])
    with pytest.raises(ValueError, match="no prompts"):
        batched_autoregressive_decode(target, [])
    with pytest.raises(ValueError, match="one request at a time"):
        batched_speculative_decode(target, SuffixDrafter(), [torch.tensor([[1, 2]]), torch.tensor([[3, 4]])])
    # A batch of one is a single request: a drafter of one request at a time (trees) runs there.
    prompt = torch.tensor([[5, 6, 7, 5, 6]])
    one = row_outputs(batched_speculative_decode(target, SuffixDrafter(), [prompt], max_new_tokens=8))[0]
    assert one == alone(target, SuffixDrafter(), prompt, max_new_tokens=8) == reference(target, prompt, eos=EOS, n=8)
    with pytest.raises(ValueError, match="k"):
        batched_speculative_decode(target, drafts["ngram"], [torch.tensor([[1, 2]])], k=0)


# ----------------------------------------------------------------------------- the ragged cache itself

def test_ragged_cache_logits_equal_each_row_alone(models):
    # Not only the counts: every row's logits, pass after pass (rows fed different amounts, some
    # rolled back to holes), equal that row's own plain forward over its tokens so far.
    target = models[0]
    prompts = [p[0].tolist() for p in ragged_prompts(3, seed=7)]
    cache = RaggedCache(target, 3)
    sequences = [list(p) for p in prompts]
    blocks = [list(p) for p in prompts]
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for step in range(5):
            logits, _, _ = cache.forward(blocks, keep=4)
            for row, seq in enumerate(sequences):
                fed = len(blocks[row])
                alone_logits = target(torch.tensor([seq])).logits[0, -min(fed, 4):]
                assert torch.allclose(logits[row, -min(fed, 4):], alone_logits, atol=1e-4), (step, row)
            # Keep a different prefix of what each row was fed (the rest become holes), then feed anew.
            kept = [len(seq) - int(torch.randint(0, len(b), (1,), generator=g)) for seq, b in zip(sequences, blocks)]
            cache.keep(kept)
            sequences = [seq[:n] for seq, n in zip(sequences, kept)]
            blocks = [torch.randint(4, 97, (1 + row,), generator=g).tolist() for row in range(3)]
            sequences = [seq + b for seq, b in zip(sequences, blocks)]


@pytest.mark.parametrize("make", [make_gpt2, make_qwen2])
@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_batched_rows_equal_generate_on_other_architectures(make, draft):
    target = make(0, eos=EOS)
    drafter = DraftModelDrafter(truncated_copy(target, 1)) if draft == "model" else PromptLookupDrafter()
    prompts = ragged_prompts(4, seed=2)
    out = row_outputs(batched_speculative_decode(target, drafter, prompts, max_new_tokens=NEW_TOKENS, k=3))
    assert [out[r] for r in range(4)] == [reference(target, p, eos=EOS, n=NEW_TOKENS) for p in prompts]


def test_a_drafted_eos_accepted_in_a_batch_ends_the_row_with_no_bonus():
    # The target as its own draft accepts everything: a drafted EOS is accepted and ends that row's
    # output there, with no token after it (no bonus), while the other rows go on.
    target = make_llama(0, layers=2)
    prompts = ragged_prompts(3, seed=4)
    plain = [reference(target, p, n=NEW_TOKENS) for p in prompts]
    eos = plain[0][5]                    # the first row's sixth token: drafted inside a cycle (k = 4)
    events = list(batched_speculative_decode(target, DraftModelDrafter(target), prompts, max_new_tokens=NEW_TOKENS,
                                             k=4, eos_token_id=eos))
    out = row_outputs(events)
    assert out[0] == plain[0][:6]
    last = [c for e in events for r, c in zip(e.requests, e.cycles) if r == 0][-1]
    assert last.emitted[-1] == eos and last.correction is None and last.num_accepted == len(last.drafted)
    for row in (1, 2):
        assert out[row] == reference(target, prompts[row], eos=eos, n=NEW_TOKENS)


# ----------------------------------------------------------------------------- host crossings

def test_a_batched_pass_reads_back_once_and_rolls_back_on_the_host(models):
    # On a GPU every read back and every upload from pageable memory waits for the device. A pass
    # with a draft model reads its verdicts back in one copy, and rolling back both caches (rows
    # lengths and slot masks on the host) reads nothing; uploads: each cache's new ids and mask in
    # one copy when it is fed host tokens (the draft's drafting steps send nothing), plus a leaving
    # row's index.
    from crossings import CountCrossings

    target, drafts = models
    events = batched_speculative_decode(target, drafts["model"], ragged_prompts(4, seed=3),
                                        max_new_tokens=NEW_TOKENS, k=4)
    reads, uploads = [], []
    while True:
        with CountCrossings() as crossings:
            event = next(events, None)
        if event is None:
            break
        reads.append(crossings.reads)
        uploads.append(crossings.uploads)
    assert len(reads) > 5
    assert reads[1:] == [1] * (len(reads) - 1)
    assert sum(uploads[1:]) / (len(uploads) - 1) <= 3
