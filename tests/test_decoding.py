"""Greedy losslessness against `target.generate`, cache reuse, event invariants and argument checks."""

import pytest
import torch

from conftest import make_gpt2, make_llama, reference, truncated_copy
from specviz import DraftModelDrafter, PromptLookupDrafter, autoregressive_decode, early_exit_model, speculative_decode

N = 40


def run(target, draft, prompt, **kw):
    cycles = list(speculative_decode(target, draft, prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


def check_invariants(cycles, max_new_tokens, eos=None):
    for c in cycles:
        assert 0 <= c.num_accepted <= len(c.drafted) <= max(c.k, 0)
        assert len(c.draft_probs) == len(c.target_probs) == len(c.drafted)
        if c.correction is None:  # only an accepted EOS ends a cycle without the target's token
            assert c.emitted == c.drafted and c.drafted[-1] == eos
        else:
            assert c.emitted == c.drafted[: c.num_accepted] + [c.correction]
            assert c.correction_kind == ("bonus" if c.num_accepted == len(c.drafted) else "resampled")
        assert c.verdicts == ["accepted"] * c.num_accepted + ["rejected"] * (len(c.drafted) - c.num_accepted)
    total = sum(len(c.emitted) for c in cycles)
    assert total <= max_new_tokens
    if eos is None:
        assert total == max_new_tokens


@pytest.fixture(scope="module")
def pairs():
    """(target, {name: draft}) for a Llama-like and a GPT-2 target: the same model (all accepted),
    an unrelated model (almost nothing accepted) and a smaller model sharing the first layers."""
    llama, gpt2 = make_llama(0), make_gpt2(0)
    return {
        "llama": (llama, {"same": llama, "unrelated": make_llama(1, layers=2),
                          "smaller": truncated_copy(llama, 2)}),
        "gpt2": (gpt2, {"same": gpt2, "unrelated": make_gpt2(1, layers=1),
                        "smaller": truncated_copy(gpt2, 1)}),
    }


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_name", ["same", "unrelated", "smaller", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_greedy_equals_generate(pairs, prompt, arch, draft_name, k):
    target, drafts = pairs[arch]
    draft = PromptLookupDrafter() if draft_name == "ngram" else drafts[draft_name]
    out, cycles = run(target, draft, prompt, max_new_tokens=N, k=k)
    assert out == reference(target, prompt)
    check_invariants(cycles, N)
    if draft_name == "same":  # a draft identical to the target is always accepted
        assert all(c.num_accepted == len(c.drafted) for c in cycles)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_name", ["same", "unrelated", "smaller", "ngram"])
def test_greedy_stops_on_eos_like_generate(pairs, prompt, arch, draft_name):
    target, drafts = pairs[arch]
    draft = PromptLookupDrafter() if draft_name == "ngram" else drafts[draft_name]
    plain = reference(target, prompt)
    eos = plain[12]  # a token greedy decoding reaches (maybe earlier than position 12)
    expected = reference(target, prompt, eos=eos)
    assert expected[-1] == eos and len(expected) <= 13
    for k in (1, 4, 8):
        out, cycles = run(target, draft, prompt, max_new_tokens=N, k=k, eos_token_id=eos)
        assert out == expected
        check_invariants(cycles, N, eos)


def test_eos_from_generation_config(prompt):
    target = make_llama(0)
    eos = reference(target, prompt)[7]
    target.generation_config.eos_token_id = eos
    out, _ = run(target, make_llama(0), prompt, max_new_tokens=N, k=4)
    assert out == reference(target, prompt, eos=eos)
    steps = list(autoregressive_decode(target, prompt, max_new_tokens=N))
    assert [s.token for s in steps] == out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_name", ["same", "smaller", "ngram"])
def test_dynamic_k_greedy_equals_generate(pairs, prompt, arch, draft_name):
    target, drafts = pairs[arch]
    draft = PromptLookupDrafter() if draft_name == "ngram" else drafts[draft_name]
    out, cycles = run(target, draft, prompt, max_new_tokens=N, k=2, dynamic_k=True, max_k=8)
    assert out == reference(target, prompt)
    check_invariants(cycles, N)
    ks = [c.k for c in cycles]
    assert all(1 <= k <= 8 for k in ks)
    if draft_name == "same":  # everything accepted: k grows by 2 up to its bound
        assert ks[:4] == [2, 4, 6, 8]


def test_early_exit_draft_greedy_equals_generate(prompt):
    target = make_llama(0, layers=4)
    out, cycles = run(target, early_exit_model(target, 2), prompt, max_new_tokens=N, k=4)
    assert out == reference(target, prompt)
    # The view shares the target's weights: no new parameters.
    view = early_exit_model(target, 2)
    assert view.lm_head.weight is target.lm_head.weight
    assert len(view.model.layers) == 2 and len(target.model.layers) == 4


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_autoregressive_equals_generate(pairs, prompt, arch):
    target, _ = pairs[arch]
    steps = list(autoregressive_decode(target, prompt, max_new_tokens=N))
    assert [s.token for s in steps] == reference(target, prompt)
    assert all(s.seconds > 0 and 0 < s.prob <= 1 for s in steps)


def test_single_token_prompt(pairs):
    target, drafts = pairs["llama"]
    prompt = torch.tensor([[7]])
    for draft in (drafts["smaller"], PromptLookupDrafter()):
        out, _ = run(target, draft, prompt, max_new_tokens=20, k=3)
        assert out == reference(target, prompt, n=20)


def test_max_new_tokens_is_exact(pairs, prompt):
    target, drafts = pairs["llama"]
    for n in (1, 2, 3, 7):
        out, cycles = run(target, drafts["same"], prompt, max_new_tokens=n, k=8)
        assert out == reference(target, prompt, n=n)
        assert len(out) == n


def test_caches_are_reused_not_recomputed(pairs, prompt):
    """The target sees every prompt token once, then [last] + drafted per cycle: no recomputation."""
    target, drafts = pairs["llama"]
    draft = drafts["smaller"]
    seen = {"target": 0, "draft": 0}

    def counter(name):
        def hook(module, args, kwargs):
            seen[name] += kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1]
        return hook

    handles = [target.register_forward_pre_hook(counter("target"), with_kwargs=True),
               draft.register_forward_pre_hook(counter("draft"), with_kwargs=True)]
    try:
        _, cycles = run(target, draft, prompt, max_new_tokens=N, k=4)
    finally:
        for h in handles:
            h.remove()
    T = prompt.shape[1]
    assert seen["target"] == (T - 1) + sum(len(c.drafted) + 1 for c in cycles)
    # The draft feeds one token per drafted token, plus one extra after each fully accepted
    # cycle (its last drafted token, which it never saw).
    full = sum(1 for c in cycles[:-1] if c.num_accepted == len(c.drafted) and c.drafted)
    assert seen["draft"] == (T - 1) + sum(len(c.drafted) for c in cycles) + full


def test_garbage_collection_waits_outside_the_timed_work(pairs, prompt):
    """A full collection under the web app costs ~0.3 s: it must never land inside a timed pass or
    step. The collector is off in every forward (target and draft) and back on between events."""
    import gc

    target, drafts = pairs["llama"]
    draft = drafts["smaller"]
    seen = []
    handles = [m.register_forward_pre_hook(lambda module, args: seen.append(gc.isenabled())) for m in (target, draft)]
    between = []
    try:
        assert gc.isenabled()
        for _ in speculative_decode(target, draft, prompt, max_new_tokens=12, k=3):
            between.append(gc.isenabled())
        for _ in autoregressive_decode(target, prompt, max_new_tokens=4):
            between.append(gc.isenabled())
    finally:
        for h in handles:
            h.remove()
    assert seen and not any(seen)
    assert between and all(between) and gc.isenabled()


def test_collector_pauses_nest_across_threads():
    """Two overlapping timed regions: the collector stays off until the last one closes."""
    import gc
    import threading

    from specviz.core.timing import collector_paused

    inside, release = threading.Event(), threading.Event()

    def other():
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()        # the other thread's region is still open
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_padded_draft_vocabulary(prompt):
    target = make_llama(0, vocab=97)
    padded = make_llama(0, vocab=128)  # same seed, different embedding size: not the same model
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_decode(target, padded, prompt)
    out, _ = run(target, DraftModelDrafter(padded, vocab_size=97), prompt, max_new_tokens=N, k=4)
    assert out == reference(target, prompt)
    # Sampling: the draft's extra (padding) entries are cut off its distribution.
    out, _ = run(target, DraftModelDrafter(make_llama(2, vocab=128), vocab_size=97), prompt,
                 max_new_tokens=N, k=4, temperature=1.0, seed=0)
    assert len(out) == N and max(out) < 97


@pytest.mark.parametrize("kwargs, message", [
    ({"k": 0}, "k"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_bad_arguments_raise_before_model_work(pairs, prompt, kwargs, message):
    target, drafts = pairs["llama"]
    calls = []
    handle = target.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=message):
            speculative_decode(target, drafts["smaller"], prompt, **kwargs)
        if "k" not in kwargs:
            with pytest.raises(ValueError, match=message):
                autoregressive_decode(target, prompt, **kwargs)
    finally:
        handle.remove()
    assert not calls


def test_empty_prompt_and_bad_draft(pairs):
    target, _ = pairs["llama"]
    with pytest.raises(ValueError, match="empty"):
        speculative_decode(target, PromptLookupDrafter(), torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        autoregressive_decode(target, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_decode(target, make_gpt2(0, vocab=50), torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="draft"):
        speculative_decode(target, "ngram", torch.tensor([[1, 2]]))


def test_prompt_lookup_proposes_what_transformers_prompt_lookup_proposes():
    import random

    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    for _ in range(500):
        sequence = torch.tensor([[rng.randrange(4) for _ in range(rng.randint(1, 20))]])
        k, max_ngram = rng.randint(1, 6), rng.randint(1, 3)
        theirs = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=max_ngram,
                                                max_length=10_000).get_candidates(sequence)[0]
        ours = PromptLookupDrafter(max_ngram=max_ngram).propose(sequence, k, None)
        assert ours.tokens.tolist() == theirs[0, sequence.shape[1]:].tolist(), (sequence, k, max_ngram)
        assert ours.probs is None                  # one-hot: no draft distribution


@pytest.mark.parametrize("draft_name", ["same", "unrelated", "smaller"])
def test_dynamic_k_follows_transformers_heuristic(pairs, prompt, draft_name):
    """The k of each cycle is what transformers' assisted generation (num_assistant_tokens_schedule
    "heuristic") would ask for next, fed the same acceptances."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    target, drafts = pairs["llama"]
    draft = drafts[draft_name]
    # max_k out of reach: transformers' heuristic has no upper bound.
    _, cycles = run(target, draft, prompt, max_new_tokens=N, k=2, dynamic_k=True, max_k=4 * N)
    config = draft.generation_config
    saved = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = 2, "heuristic"
    config.assistant_confidence_threshold = 0          # transformers' other adaptation, off
    try:
        theirs = AssistedCandidateGenerator(prompt, draft, GenerationConfig(), {})
        expected = []
        for cycle in cycles:
            expected.append(theirs.num_assistant_tokens)
            scores = torch.zeros(1, len(cycle.drafted) + 1, target.config.vocab_size)   # one row per candidate + 1
            theirs.update_candidate_strategy(prompt, scores, cycle.num_accepted)
    finally:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold = saved
    assert [c.k for c in cycles] == expected
    # The rule was exercised: k grew after full acceptances, shrank after rejections, stayed at 1.
    moves = {after - before for before, after in zip(expected, expected[1:])}
    assert moves == ({2} if draft_name == "same" else {-1, 0, 2})


def test_early_exit_bounds():
    target = make_llama(0, layers=4)
    for bad in (0, 4, 5):
        with pytest.raises(ValueError, match="between 1 and 3"):
            early_exit_model(target, bad)
    with pytest.raises(ValueError, match="model.layers"):
        early_exit_model(make_gpt2(0), 1)


def test_a_drafter_must_say_how_it_proposes():
    from specviz.core.drafters import Drafter

    class Silent(Drafter):                      # forgot `propose`
        name = "silent"

    with pytest.raises(TypeError, match="propose"):
        Silent()


def test_a_transformers_that_ignores_the_cache_is_refused_before_any_work(pairs, prompt, monkeypatch):
    # transformers 5.23 and older take `cache=` in **kwargs and drop it: outputs stay right, but every
    # pass recomputes the whole sequence, so every timing would be meaningless. Refused, saying what to install.
    from specviz.core import ragged_cache
    from specviz.errors import SpecvizError
    from specviz.models import load_model

    # The module object the check reads: transformers 5 puts a new one in sys.modules on first use
    # (`from transformers import LlamaConfig` replaced it), so `import transformers` here may be another.
    transformers = ragged_cache.transformers
    target, drafts = pairs["llama"]
    monkeypatch.setattr(transformers, "__version__", "5.23.0")
    for run in (lambda: speculative_decode(target, drafts["smaller"], prompt),
                lambda: autoregressive_decode(target, prompt)):
        with pytest.raises(ValueError, match=r"transformers 5\.23\.0 is too old.*transformers>=5\.24,<6"):
            run()
    with pytest.raises(SpecvizError, match=r"transformers 5\.23\.0 is too old"):
        load_model("tiny")
    monkeypatch.setattr(transformers, "__version__", "5.24.0.dev0")     # a build of the first that works
    assert len(list(speculative_decode(target, drafts["smaller"], prompt, max_new_tokens=4))) >= 1


def test_plain_steps_along_another_text(prompt):
    """`core.plain.follow`: plain decoding's steps along a greedy text from a position on are plain
    decoding's own where the text is its own (its tokens, its probabilities); a token more than a
    near-tie below its argmax stops them there."""
    from specviz.core.plain import follow

    target = make_llama(0)
    plain = reference(target, prompt)
    own = list(autoregressive_decode(target, prompt, max_new_tokens=len(plain)))
    for start in (0, 5):
        followed = follow(target, prompt, plain, start)
        assert [s.index for s in followed.steps] == list(range(start, len(plain)))
        assert [s.token for s in followed.steps] == plain[start:]
        assert [s.prob for s in followed.steps] == pytest.approx([s.prob for s in own[start:]], rel=1e-4)
        assert (followed.start, followed.near_ties, followed.stopped_at) == (start, (), None)
    other = plain[:8] + [(plain[8] + 1) % target.config.vocab_size] + plain[9:]
    followed = follow(target, prompt, other, 5)
    assert (followed.stopped_at, len(followed.steps), followed.near_ties) == (8, 3, ())


def test_a_near_tie_is_within_two_roundings_of_the_dtype():
    from specviz.core.plain import near_tie

    # bf16: one step of 0.125 at a logit of 23 is a near-tie, four are not; fp32 rounds 65,536 times finer.
    assert near_tie(0.125, 23.1, torch.bfloat16) and not near_tie(0.5, 23.1, torch.bfloat16)
    assert not near_tie(0.125, 23.1, torch.float32) and near_tie(1e-6, 23.1, torch.float32)
