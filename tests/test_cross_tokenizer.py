"""Drafting across tokenizers (core.cross_tokenizer): tiny tokenizers built here with different
vocabularies (word-level, SentencePiece-style character BPE with merges, byte-level BPE; a BOS on
one side only) and tiny models built from a config. Greedy output must equal `target.generate`'s,
sampled output must follow the target's distribution, and the alignment must cut and re-encode
text as promised."""

from __future__ import annotations

import functools
import importlib.util
import random

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from conftest import make_llama, reference, reordered_copy
from specviz.core.cross_tokenizer import CrossTokenizerDrafter
from specviz.core.retokenize import (
    OutputText,
    TextEncoding,
    draft_prompt,
    ends_inside_a_character,
    in_target_vocabulary,
    intersect,
    shared_tokens,
    target_candidates,
    text_after,
    token_texts,
)
from specviz.core.decoding import speculative_decode
from specviz.core.sampling import Sampler
from specviz.errors import SpecvizError
from specviz.metrics import summarize
from specviz.models import make_drafter
from specviz.models.pairs import CROSS_TOKENIZER_NOTE, shared_vocabulary
from specviz.models.sources import BUILTINS, builtin_source
from test_sampling import LENGTH, exact_joint, pooled_chisquare

WORDS = ("<unk> <eos> the a cat dog sat ran on in mat park and then big small red blue sun sea "
         "sky tree bird sang flew over under near far old new day night . ,").split()
PROMPT = "the cat sat on the mat and the dog"


def word_tokenizer(words=WORDS, bos: bool = False, special: bool = True) -> PreTrainedTokenizerFast:
    """Word-level, words split at spaces (decoded joined by spaces); optionally a BOS it adds, and
    without `special`, '<unk>' and '<eos>' as plain words (text that survives decoding)."""
    vocab = {w: i for i, w in enumerate(words + (["<bos>"] if bos else []))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra = {}
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                               special_tokens=[("<bos>", vocab["<bos>"])])
        extra = {"bos_token": "<bos>"}
    if special:
        extra.update(unk_token="<unk>", eos_token="<eos>")
    return PreTrainedTokenizerFast(tokenizer_object=backend, **extra)


def char_tokenizer(bos: bool = True) -> PreTrainedTokenizerFast:
    """SentencePiece-style: '▁' marks a word start, characters merged by a few BPE merges."""
    chars = sorted({c for w in WORDS[2:] for c in w})
    merges = [("t", "h"), ("th", "e"), ("\u2581", "the"), ("a", "t"), ("\u2581", "c"), ("s", "a"), ("o", "n")]
    vocab = {t: i for i, t in enumerate(["<unk>", "</s>", "<s>", "\u2581", *chars, *("".join(m) for m in merges)])}
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    if bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", bos_token="<s>")


BYTE_MERGES = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("a", "t"), ("\u0120", "c")]


def byte_tokenizer(merges=BYTE_MERGES) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style): 256 byte symbols and a few merges, 'Ġ' for a space."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", *sorted(alphabet), *("".join(m) for m in merges)])}
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


PAIRS = {   # name: (target tokenizer, draft tokenizer)
    "words <- characters (BOS on the draft side)": (lambda: word_tokenizer(), lambda: char_tokenizer(bos=True)),
    "characters <- words (BOS on the target side)": (lambda: char_tokenizer(bos=True), lambda: word_tokenizer()),
    "words with a BOS <- bytes": (lambda: word_tokenizer(bos=True), byte_tokenizer),
    "bytes <- characters": (byte_tokenizer, lambda: char_tokenizer(bos=False)),
}


@pytest.fixture(scope="module", params=list(PAIRS))
def cross_pair(request):
    torch.set_grad_enabled(False)
    target_tokenizer, draft_tokenizer = (make() for make in PAIRS[request.param])
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    draft = make_llama(3, layers=1, vocab=len(draft_tokenizer))
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    return target, CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer), prompt


def emitted(target, drafter, prompt, **kw):
    cycles = list(speculative_decode(target, drafter, prompt, **kw))
    return [t for c in cycles for t in c.emitted], cycles


# ----------------------------------------------------------------------------- lossless greedy

@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_equals_generate(cross_pair, k):
    target, drafter, prompt = cross_pair
    expected = reference(target, prompt, n=24)
    out, cycles = emitted(target, drafter, prompt, max_new_tokens=24, k=k)
    assert out == expected
    vocab = target.config.vocab_size
    assert all(0 <= t < vocab for c in cycles for t in c.drafted) and all(len(c.drafted) <= k for c in cycles)
    assert sum(len(c.drafted) for c in cycles) > 0          # the draft really proposes


def test_greedy_equals_generate_with_the_cost_aware_policy_pausing_and_probing(cross_pair):
    # Paused cycles feed the draft nothing; a probe (or a draft again) re-reads what it missed.
    from specviz.core.draft_policy import CostAwarePolicy, PassCosts

    target, drafter, prompt = cross_pair
    policy = CostAwarePolicy(PassCosts({0: 1.0, 1: 1.4, 4: 1.8}, learn=False), probe_after=1)
    out, cycles = emitted(target, drafter, prompt, max_new_tokens=24, k=4, policy=policy)
    assert out == reference(target, prompt, n=24)
    planned = [c.planned for c in cycles]
    assert 0 in planned and any(planned), planned


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_stops_on_eos_like_generate(cross_pair, k):
    target, drafter, prompt = cross_pair
    eos = reference(target, prompt, n=24)[9]     # a token greedy decoding reaches
    expected = reference(target, prompt, eos=eos, n=24)
    assert expected[-1] == eos
    out, _ = emitted(target, drafter, prompt, max_new_tokens=24, k=k, eos_token_id=eos)
    assert out == expected


@pytest.mark.parametrize("cut_last", [False, True])
@pytest.mark.parametrize("k", [2, 5])
def test_the_same_model_under_another_vocabulary_drafts_what_the_target_picks(k, cut_last):
    # Same words, other ids: the draft is the target with its rows permuted, so every candidate
    # is the target's own next token and is accepted. (No special tokens: a special token the
    # target emits mid-output has no text, so the draft would not see it.)
    target_tokenizer = word_tokenizer(special=False)
    draft_tokenizer = word_tokenizer(list(reversed(WORDS)), special=False)
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    drafter = CrossTokenizerDrafter(reordered_copy(target, target_tokenizer, draft_tokenizer), draft_tokenizer,
                                    target_tokenizer, cut_last=cut_last)
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    out, cycles = emitted(target, drafter, prompt, max_new_tokens=30, k=k)
    assert out == reference(target, prompt, n=30)
    assert all(c.num_accepted == len(c.drafted) for c in cycles)
    assert sum(c.num_accepted for c in cycles) >= 30 * (k - 1) / k - k   # nearly every token drafted
    # One draft token per target word here, plus (cut_last) the cut one per cycle.
    stats = summarize(cycles)
    assert stats.draft_model_tokens == sum(len(c.draft_pieces or []) for c in cycles) >= stats.drafted
    assert stats.draft_tokens_per_target_token == stats.draft_model_tokens / stats.drafted and stats.shared_mass is None
    # Each cycle records the draft's own tokens and what the alignment cut: the candidates' text,
    # then the cut, is the text the draft wrote. With cut_last the cut is the word after the k
    # candidates, drafted to learn whether the k-th word was whole; without it nothing is cut and
    # the draft runs exactly one of its tokens per candidate.
    sequence = prompt[0].tolist()
    for cycle in cycles[:-1]:            # the last cycle, with no room left to draft, proposes nothing
        assert cycle.is_cross_tokenizer and cycle.shared_mass is None     # greedy: no token-level intersection
        candidates_text = text_after(target_tokenizer, sequence + cycle.drafted, len(sequence))
        assert (candidates_text + cycle.cut_text).split() == "".join(cycle.draft_pieces).split()
        if cut_last:
            assert len(cycle.cut_text.split()) == 1 and len(cycle.draft_pieces) == len(cycle.drafted) + 1
        else:
            assert cycle.cut_text == "" and len(cycle.draft_pieces) == len(cycle.drafted)
        sequence += cycle.emitted


# ----------------------------------------------------------------------------- the draft's own cache

def test_draft_cache_and_positions_match_a_fresh_forward():
    # After cycles of rollback and re-encoding, the draft's next proposal must be what the draft
    # model itself generates from its context with no cache (wrong positions would change it).
    target_tokenizer, draft_tokenizer = word_tokenizer(), char_tokenizer(bos=True)
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    draft = make_llama(3, layers=1, vocab=len(draft_tokenizer))
    drafter = CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer)
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    out, _ = emitted(target, drafter, prompt, max_new_tokens=12, k=3)
    sequence = torch.cat([prompt, torch.tensor([out])], dim=1)
    drafter.propose(sequence, 3, Sampler())
    text = text_after(target_tokenizer, sequence[0].tolist(), prompt.shape[1])
    context = draft_tokenizer.encode(target_tokenizer.decode(prompt[0])) + draft_tokenizer.encode(
        text, add_special_tokens=False)
    assert drafter.cached_ids[:len(context)] == context
    assert context.count(draft_tokenizer.bos_token_id) == 1 and context[0] == draft_tokenizer.bos_token_id
    fresh = draft.generate(torch.tensor([context]), do_sample=False, max_new_tokens=16, pad_token_id=0)[0]
    drafted = drafter.cached_ids[len(context):]
    assert drafted == fresh[len(context):len(context) + len(drafted)].tolist() and drafted


# ----------------------------------------------------------------------------- alignment

def test_alignment_cuts_the_last_token_and_adds_no_bos():
    tokenizer = word_tokenizer(bos=True)
    sequence = tokenizer("the cat sat").input_ids
    assert sequence[0] == tokenizer.bos_token_id
    ids = tokenizer.convert_tokens_to_ids
    # The drafted text may end inside a longer word: its last target token is dropped...
    assert target_candidates(tokenizer, sequence, len(sequence), " on the ma", complete=False) == ids(["on", "the"])
    # ...unless the draft ended its text (its EOS).
    assert target_candidates(tokenizer, sequence, len(sequence), " on the mat", complete=True) == ids(
        ["on", "the", "mat"])
    # Re-encoding never adds a BOS (transformers #46124), not even from the start of the sequence.
    assert tokenizer.bos_token_id not in target_candidates(tokenizer, sequence[:1], 1, "the cat sat", complete=True)


def test_alignment_with_subword_tokens():
    tokenizer = char_tokenizer(bos=False)
    sequence = tokenizer.encode("the cat")
    # Re-encoded after the seen tokens; the last piece ('o' of '▁on') cut.
    candidates = target_candidates(tokenizer, sequence, len(sequence), " sat o", complete=False)
    assert tokenizer.convert_ids_to_tokens(candidates) == ["\u2581", "s", "at", "\u2581"]


def test_alignment_when_the_drafted_text_merges_with_the_last_target_token():
    # The target has seen 'Ġt'; the draft adds 'he cat', and ' the cat' re-encodes as 'Ġthe', 'Ġc',
    # 'at', which does not continue 'Ġt': the text after the seen tokens is encoded on its own.
    tokenizer = byte_tokenizer()
    sequence = tokenizer.encode("a t")
    assert tokenizer.convert_ids_to_tokens(sequence)[-1] == "\u0120t"
    candidates = target_candidates(tokenizer, sequence, len(sequence), "he cat", complete=True)
    assert tokenizer.convert_ids_to_tokens(candidates) == ["he", "\u0120c", "at"]
    assert tokenizer.decode(sequence + candidates) == "a the cat"


def test_the_merge_fallback_adds_no_word_start_with_a_sentencepiece_tokenizer():
    # SentencePiece-style tokenizers put a word start ('▁') before a text encoded on its own: the
    # fallback's text 'he cat' (after the seen '▁', 't') must continue the word, not start one.
    tokenizer = char_tokenizer(bos=False)
    sequence = tokenizer.encode("t")
    candidates = target_candidates(tokenizer, sequence, len(sequence), "he cat", complete=True)
    assert tokenizer.convert_ids_to_tokens(candidates) == ["h", "e", "\u2581c", "at"]
    assert tokenizer.decode(sequence + candidates) == "the cat"


def test_the_draft_prompt_has_one_bos_and_only_shared_special_tokens():
    # The target's BOS is not in the draft's vocabulary: dropped; the draft's own BOS leads, once.
    target_tokenizer, draft_tokenizer = word_tokenizer(bos=True), char_tokenizer(bos=True)
    prompt = target_tokenizer("the cat").input_ids
    ids = draft_prompt(target_tokenizer, draft_tokenizer, prompt)
    assert ids == draft_tokenizer("the cat").input_ids and ids.count(draft_tokenizer.bos_token_id) == 1
    # Both know '<s>', and the prompt's text starts with it: still one BOS, not two (transformers #46124).
    other = char_tokenizer(bos=True)
    other.add_tokens(["cat"])
    prompt = draft_tokenizer("the cat").input_ids
    ids = draft_prompt(draft_tokenizer, other, prompt)
    assert ids[0] == other.bos_token_id and ids.count(other.bos_token_id) == 1
    # A chat marker both vocabularies have stays in the draft's prompt.
    target_tokenizer.add_special_tokens({"additional_special_tokens": ["<turn>"]})
    draft_tokenizer.add_special_tokens({"additional_special_tokens": ["<turn>"]})
    ids = draft_prompt(target_tokenizer, draft_tokenizer, target_tokenizer("<turn> the cat").input_ids)
    assert draft_tokenizer.convert_tokens_to_ids("<turn>") in ids


def test_text_after_keeps_a_leading_space():
    tokenizer = char_tokenizer(bos=True)
    ids = tokenizer.encode("the cat sat")
    start = ids.index(tokenizer.convert_tokens_to_ids("\u2581"), 2)     # the word start of ' sat'
    assert text_after(tokenizer, ids, start) == " sat"
    assert tokenizer.decode(ids[start:], skip_special_tokens=True) in ("sat", " sat")   # alone, it may lose it


# ----------------------------------------------------------------------------- sampling

@pytest.mark.slow
def test_sampling_through_a_cross_tokenizer_draft_follows_the_target():
    # Six target words, a character-level draft: one-hot candidates keep speculative sampling exact.
    # (No draft token reads as one of these words, " ab" with its space: TLI would draft nothing.)
    words = ["ab", "ba", "a", "b", "<unk>", "c"]
    target_tokenizer = word_tokenizer(words)
    draft_tokenizer = char_tokenizer(bos=False)
    target = make_llama(0, layers=2, vocab=len(words), hidden=32)
    drafter = CrossTokenizerDrafter(make_llama(5, layers=1, vocab=len(draft_tokenizer), hidden=32), draft_tokenizer,
                                    target_tokenizer, sampling="one-hot")
    prompt = target_tokenizer("ab ba a", return_tensors="pt").input_ids
    sampler = Sampler(1.0)
    counts, proposed = np.zeros(len(words) ** LENGTH), 0
    for seed in range(1500):
        out, cycles = emitted(target, drafter, prompt, max_new_tokens=LENGTH, k=2, temperature=1.0, seed=seed)
        counts[int(np.ravel_multi_index(out, (len(words),) * LENGTH))] += 1
        proposed += sum(len(c.drafted) for c in cycles)
    assert proposed > 300
    assert pooled_chisquare(counts, exact_joint(target, prompt, sampler)) > 1e-3
    # Power check: a wrong distribution (twice the temperature) is rejected by the same counts.
    assert pooled_chisquare(counts, exact_joint(target, prompt, Sampler(2.0))) < 1e-4


# ----------------------------------------------------------------------------- token-level intersection

def mapping(draft_tokenizer, target_tokenizer) -> dict[str, str]:
    shared = shared_tokens(draft_tokenizer, target_tokenizer, draft_vocab_size=len(draft_tokenizer),
                           target_vocab_size=len(target_tokenizer))
    return dict(zip(draft_tokenizer.convert_ids_to_tokens(shared.draft_ids.tolist()),
                    target_tokenizer.convert_ids_to_tokens(shared.target_ids.tolist())))


def test_shared_tokens_map_byte_level_and_sentencepiece_tokens_by_their_text():
    byte_level, sentencepiece = byte_tokenizer(), char_tokenizer(bos=True)
    shared = mapping(byte_level, sentencepiece)
    # Word-start markers read as the space they stand for; a token maps only to one that reads the same.
    assert {"\u0120the": "\u2581the", "\u0120c": "\u2581c", "\u0120": "\u2581", "at": "at", "t": "t"}.items() \
        <= shared.items()
    # 'he' and 'Ġt' are no SentencePiece token (only parts of one or more of them); a byte-level
    # piece of a character (0xC3, 'Ã') has no text of its own; a special token maps only to the same string.
    assert not {"he", "\u0120t", "\u00c3", "<|endoftext|>"} & shared.keys()
    assert mapping(sentencepiece, byte_level).items() >= {"\u2581the": "\u0120the", "\u2581c": "\u0120c"}.items()
    # The same words under other ids: every token maps, each to its own word.
    words, reversed_words = word_tokenizer(special=False), word_tokenizer(list(reversed(WORDS)), special=False)
    shared = mapping(reversed_words, words)
    assert len(shared) == len(WORDS) and all(d == t for d, t in shared.items())
    # A word-level token reads with its leading space: ' cat', not 'cat'.
    assert token_texts(words)[words.convert_tokens_to_ids("cat")] == (False, " cat")


def test_intersection_reports_the_distribution_each_candidate_was_drawn_from():
    # After a few sampled cycles, each proposed row must be the draft's warped distribution after
    # exactly its context and the draft tokens before it (a fresh forward, no cache), restricted
    # to the shared tokens, renormalised and summed into the target's vocabulary (transformers #47932).
    target_tokenizer, draft_tokenizer = char_tokenizer(bos=False), byte_tokenizer()
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    draft = make_llama(3, layers=1, vocab=len(draft_tokenizer))
    drafter = CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer)
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    # The decoding loop runs in inference mode; the proposal below runs outside it, autograd on.
    out, cycles = emitted(target, drafter, prompt, max_new_tokens=12, k=3, temperature=1.0, seed=1)
    # Nothing of the draft's text is cut (the loop's own last cycle, with no room to draft, has no record).
    assert any(c.drafted for c in cycles) and {c.cut_text for c in cycles} <= {"", None}
    sequence = torch.cat([prompt, torch.tensor([out])], dim=1)
    sampler = Sampler(0.8, top_k=40, seed=2)       # warping happens before the restriction
    proposal = drafter.propose(sequence, 4, sampler)
    text = text_after(target_tokenizer, sequence[0].tolist(), prompt.shape[1])
    context = draft_prompt(target_tokenizer, draft_tokenizer, prompt[0].tolist()) + draft_tokenizer.encode(
        text, add_special_tokens=False)
    fed = drafter.cached_ids[len(context):]        # the draft tokens drawn, but the last
    assert drafter.cached_ids[:len(context)] == context and len(proposal.tokens) == len(fed) + 1 >= 2
    shared = drafter.shared
    target_texts = token_texts(target_tokenizer)
    for i, candidate in enumerate(proposal.tokens.tolist()):
        with torch.no_grad():
            fresh = draft(torch.tensor([context + fed[:i]])).logits[0, -1:]
            restricted, mass = intersect(sampler.probs(fresh)[0], shared)
        assert torch.allclose(proposal.probs[i], in_target_vocabulary(restricted, shared), atol=1e-5)
        assert proposal.shared_mass[i] == pytest.approx(mass, abs=1e-5) and 0 < mass < 1
        assert proposal.probs[i, candidate] > 0 and float(proposal.probs[i].sum()) == pytest.approx(1.0, abs=1e-5)
        # Each candidate is the one target token its draft token reads as.
        assert target_texts[candidate] == (False, proposal.draft_pieces[i])
        if i < len(fed):
            assert shared.target_ids[shared.draft_ids.tolist().index(fed[i])] == candidate


def sentencepiece_tokenizer_of_six() -> PreTrainedTokenizerFast:
    """A six-token SentencePiece-style vocabulary: '▁', 'a', 'b', '▁a', '▁b' and '<unk>'."""
    merges = [("\u2581", "a"), ("\u2581", "b")]
    vocab = {t: i for i, t in enumerate(["<unk>", "\u2581", "a", "b", "\u2581a", "\u2581b"])}
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.mark.slow
def test_sampling_with_token_level_intersection_follows_the_target():
    # A six-token SentencePiece-style target drafted by a byte-level model: five of the draft's 262
    # tokens read as target tokens ('Ġ', 'a', 'b', 'Ġa', 'Ġb'), the rest never can, so the
    # restriction and its renormalisation decide the draft probabilities that verification reads.
    target_tokenizer = sentencepiece_tokenizer_of_six()
    draft_tokenizer = byte_tokenizer([("\u0120", "a"), ("\u0120", "b"), ("a", "b")])
    assert len(mapping(draft_tokenizer, target_tokenizer)) == 5
    target = make_llama(0, layers=2, vocab=len(target_tokenizer), hidden=32)
    drafter = CrossTokenizerDrafter(make_llama(5, layers=1, vocab=len(draft_tokenizer), hidden=32), draft_tokenizer,
                                    target_tokenizer)
    prompt = target_tokenizer("a b a", return_tensors="pt").input_ids
    # 800 runs: a sampler at 1.25 times the temperature (subtler than the power check's twice) is
    # rejected at p < 1e-4 in 2,000 of 2,000 simulated sets of 800 draws from the exact distribution.
    counts, proposed, masses = np.zeros(len(target_tokenizer) ** LENGTH), 0, []
    for seed in range(800):
        out, cycles = emitted(target, drafter, prompt, max_new_tokens=LENGTH, k=2, temperature=1.0, seed=seed)
        counts[int(np.ravel_multi_index(out, (len(target_tokenizer),) * LENGTH))] += 1
        proposed += sum(len(c.drafted) for c in cycles)
        masses += [m for c in cycles for m in c.shared_mass or []]
    assert proposed > 1000 and len(masses) == proposed and all(0 < m < 0.5 for m in masses)
    assert pooled_chisquare(counts, exact_joint(target, prompt, Sampler(1.0))) > 1e-3
    # Power check: a wrong distribution (twice the temperature) is rejected by the same counts.
    assert pooled_chisquare(counts, exact_joint(target, prompt, Sampler(2.0))) < 1e-4


def test_the_shared_token_table_is_built_once_per_pair_of_tokenizers():
    # Mapping the vocabularies decodes both of them (seconds for Gemma-3's 262k tokens): a second
    # drafter for the same pair, as each run of the app builds, must reuse the first one's table.
    target_tokenizer, draft_tokenizer = char_tokenizer(bos=True), byte_tokenizer()
    target = make_llama(0, layers=1, vocab=len(target_tokenizer), hidden=32)
    draft = make_llama(3, layers=1, vocab=len(draft_tokenizer), hidden=32)
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    first, second = (CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer) for _ in range(2))
    for drafter in (first, second):
        _, cycles = emitted(target, drafter, prompt, max_new_tokens=8, k=3, temperature=1.0, seed=0)
        assert any(c.shared_mass for c in cycles)       # drafted by token-level intersection
    assert second.shared.draft_ids is first.shared.draft_ids and second.shared.target_ids is first.shared.target_ids
    # Another tokenizer, or the same one given a new token, has a table of its own.
    table = first.shared.draft_ids
    assert shared_tokens(byte_tokenizer(), target_tokenizer, draft_vocab_size=len(draft_tokenizer),
                         target_vocab_size=len(target_tokenizer)).draft_ids is not table
    draft_tokenizer.add_tokens(["on"])         # a target token's text
    grown = CrossTokenizerDrafter(make_llama(3, layers=1, vocab=len(draft_tokenizer), hidden=32), draft_tokenizer,
                                  target_tokenizer)
    assert grown._shared_tokens().draft_ids is not table
    assert grown._shared_tokens().draft_ids.tolist()[-1] == draft_tokenizer.convert_tokens_to_ids("on")


def test_the_same_model_under_another_vocabulary_samples_with_all_its_mass_shared():
    # Every draft token reads as a target word and the draft is the target itself: each shared mass
    # is 1 and each candidate is drawn from the target's own distribution, so nearly all are accepted
    # (one-hot candidates would be accepted with probability target(x) only).
    target_tokenizer = word_tokenizer(special=False)
    draft_tokenizer = word_tokenizer(list(reversed(WORDS)), special=False)
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    draft = reordered_copy(target, target_tokenizer, draft_tokenizer)
    prompt = target_tokenizer(PROMPT, return_tensors="pt").input_ids
    accepted = {}
    for sampling in CrossTokenizerDrafter.SAMPLING:
        drafter = CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer, sampling=sampling)
        runs = [emitted(target, drafter, prompt, max_new_tokens=24, k=4, temperature=1.0, seed=seed)[1]
                for seed in range(4)]
        stats = summarize([c for cycles in runs for c in cycles])
        accepted[sampling] = stats.draft_acceptance_rate
        if sampling == "intersection":
            assert stats.shared_mass == pytest.approx(1.0, abs=1e-5)
            assert all(c.cut_text == "" and len(c.draft_pieces) == len(c.drafted)
                       for cycles in runs for c in cycles if c.draft_pieces is not None)
    assert accepted["intersection"] > 0.95 > accepted["one-hot"]


def test_an_unknown_sampling_mode_is_refused():
    with pytest.raises(ValueError, match="sampling must be one of intersection, one-hot"):
        CrossTokenizerDrafter(make_llama(3, layers=1, vocab=8), word_tokenizer(), char_tokenizer(), sampling="tli")


# ----------------------------------------------------------------------------- selection

def test_make_drafter_picks_cross_tokenizer_only_when_vocabularies_differ():
    target_tokenizer = word_tokenizer()
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    draft = make_llama(3, layers=1, vocab=len(target_tokenizer))
    same = make_drafter("d", target, draft_model=draft, target_tokenizer=target_tokenizer,
                        draft_tokenizer=word_tokenizer())
    assert not isinstance(same, CrossTokenizerDrafter)
    # Same size, other ids: sizes alone would miss it.
    shuffled = make_drafter("d", target, draft_model=draft, target_tokenizer=target_tokenizer,
                            draft_tokenizer=word_tokenizer(list(reversed(WORDS))))
    assert isinstance(shuffled, CrossTokenizerDrafter)
    assert 0 < shared_vocabulary(target_tokenizer, char_tokenizer()) < 1
    assert "across tokenizers" in CROSS_TOKENIZER_NOTE


def test_a_draft_with_no_token_string_in_common_is_refused():
    target_tokenizer = word_tokenizer()
    digits = word_tokenizer(["<unk>", "<eos>", "0", "1"])    # only special tokens in common
    target = make_llama(0, layers=2, vocab=len(target_tokenizer))
    with pytest.raises(SpecvizError, match="no token string in common"):
        make_drafter("digits", target, draft_model=make_llama(1, layers=1, vocab=4), target_tokenizer=target_tokenizer,
                     draft_tokenizer=digits)


# ----------------------------------------------------------------------------- a real tokenizer

@pytest.mark.slow
def test_greedy_equals_plain_with_the_builtin_target_and_a_character_draft():
    # The built-in SmolLM2-135M-Instruct (byte-level BPE, a chat template with special tokens) drafted
    # by a tiny model with a SentencePiece-style character vocabulary: its text is aligned with a
    # real tokenizer's tokens, the chat markers included in the look-behind.
    from specviz.core.plain import autoregressive_decode
    from specviz.models import encode_prompt, load_pair

    pair = load_pair(dtype="float32", device="cpu")
    draft_tokenizer = char_tokenizer(bos=True)
    drafter = CrossTokenizerDrafter(make_llama(3, layers=1, vocab=len(draft_tokenizer)), draft_tokenizer,
                                    pair.tokenizer)
    ids = encode_prompt(pair.tokenizer, "Tell me about the cat that sat on the mat.")
    eos = pair.eos_token_ids
    plain = [s.token for s in autoregressive_decode(pair.target, ids, 24, eos_token_id=eos)]
    out, cycles = emitted(pair.target, drafter, ids, max_new_tokens=24, k=4, eos_token_id=eos)
    assert out == plain and sum(len(c.drafted) for c in cycles) > 0


def test_the_command_line_says_it_drafts_across_tokenizers(tmp_path, capsys):
    from specviz.cli import entry

    target_tokenizer, draft_tokenizer = word_tokenizer(), char_tokenizer(bos=True)
    for name, model, tokenizer in (("target", make_llama(0, layers=2, vocab=len(target_tokenizer)), target_tokenizer),
                                   ("draft", make_llama(3, layers=1, vocab=len(draft_tokenizer)), draft_tokenizer)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    code = entry(["run", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--dtype",
                  "float32", "--device", "cpu", "--max-new-tokens", "12", "--baseline", "--raw", "--no-color", PROMPT])
    captured = capsys.readouterr()
    assert code == 0 and CROSS_TOKENIZER_NOTE in captured.err
    assert "identical: yes" in captured.out


def test_the_benchmark_measures_transformers_universal_assisted_decoding_on_the_same_pair(cross_pair):
    # bench's peer for a cross-tokenizer draft is transformers' UAD (tokenizer= and assistant_tokenizer=):
    # greedy, both must write the target's own greedy output.
    from specviz.core.timing import Clock
    from specviz.models import ModelPair
    from specviz.runs import bench
    from specviz.settings import RunSettings

    target, drafter, prompt = cross_pair
    if len(drafter.draft_tokenizer) == len(drafter.target_tokenizer):
        pytest.skip("transformers tells tokenizers apart by vocabulary size only")
    pair = ModelPair(target=target, tokenizer=drafter.target_tokenizer, draft=drafter, target_name="t",
                     draft_name="d", target_parameters=0, draft_parameters=0, device=target.device,
                     dtype=target.dtype, eos_token_ids=[])
    setup = bench.Setup(RunSettings(draft="./draft", k=4, max_new_tokens=16), pair)
    kwargs, _, described = bench.transformers_settings(setup)
    assert kwargs["assistant_tokenizer"] is drafter.draft_tokenizer and "assistant_tokenizer" in described
    timed = bench.run_transformers(setup, prompt, Clock(target.device))
    assert timed.tokens == reference(target, prompt, n=16)


# ----------------------------------------------------------------------------- chat templates

def test_each_model_formats_the_conversation_with_its_own_chat_template(tiny, monkeypatch):
    from specviz.runs import execute
    from specviz.settings import RunSettings
    from tiny_pair import PROMPT as TINY_PROMPT
    settings = RunSettings(draft="other-tokenizer", k=4, max_new_tokens=16, chat=True)
    pair = tiny.pair(draft="other-tokenizer")
    drafter = pair.draft
    # Only the target has a template: the draft reads the target's formatted prompt as text.
    result = execute(settings, TINY_PROMPT, pair, warm_up=False)
    target_text = tiny.tokenizer.apply_chat_template([{"role": "user", "content": TINY_PROMPT}], tokenize=False,
                                                     add_generation_prompt=True)
    assert drafter.draft_prompt == tiny.other_tokenizer.encode(target_text)
    plain = reference(tiny.target, tiny.tokenizer(target_text, return_tensors="pt").input_ids, n=16)
    assert result.tokens == plain
    # Both have one: the draft reads the conversation in its own template (here without the
    # assistant marker), and the output is still exactly the target's.
    monkeypatch.setattr(tiny.other_tokenizer, "chat_template",
                        "{% for m in messages %}<user> {{ m['content'] }} {% endfor %}")
    result = execute(settings, TINY_PROMPT, pair, warm_up=False)
    assert drafter.draft_prompt == tiny.other_tokenizer.encode(f"<user> {TINY_PROMPT} ")
    assert result.tokens == plain


# ----------------------------------------------------------------------------- incremental re-tokenization

# Prose, code, digits, runs of spaces and newlines, accents, CJK and emoji (several tokens each in a
# byte-level BPE, byte-fallback tokens or one token in SentencePiece).
CORPUS = (
    "Speculative decoding drafts a few tokens with a small model, then the target verifies all of them "
    "in one pass: 1987 tokens at 12.5 tok/s, or 3,141,592 in total.\n\n"
    "def squares(xs):\n    return [x ** 2 for x in xs]   # two spaces, then    four\n\t\ttabs\n"
    "Caf\u00e9, na\u00efve, Z\u00fcrich \u2014 \u00abquotes\u00bb and \u2018curly\u2019 marks; "
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \U0001f916\U0001f680\U0001f9ea emoji, "
    "\u0928\u092e\u0938\u094d\u0924\u0947 and \u0645\u0631\u062d\u0628\u0627.\n"
    "The quick brown fox jumps over the lazy dog; unbelievably, photosynthesis isn't antidisestablishment.\n"
)

REAL_TOKENIZERS = {   # name: builtin model whose tokenizer it is
    "SmolLM2 (byte-level BPE)": "SmolLM2-135M-Instruct",
    "Gemma-3 (SentencePiece, byte fallback)": "gemma-3-270m",
}


@functools.cache
def real_tokenizer(builtin_name: str):
    """A built-in model's own tokenizer (skips the test where its package is not installed)."""
    builtin = BUILTINS[builtin_name]
    if importlib.util.find_spec(builtin.module) is None:
        pytest.skip(f"{builtin.name} is not installed ({builtin.install})")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(builtin_source(builtin, None).location)


@pytest.fixture(scope="module", params=[*(pytest.param(name, marks=pytest.mark.slow) for name in REAL_TOKENIZERS),
                                        "tiny byte-level BPE"])
def any_tokenizer(request):
    return real_tokenizer(REAL_TOKENIZERS[request.param]) if request.param in REAL_TOKENIZERS else byte_tokenizer()


def random_outputs(tokenizer, rng: random.Random, trials: int):
    """(ids, prompt length, whether corrupted): the corpus from a random place, a fifth of its
    tokens replaced by random ids (byte pieces, byte-fallback bytes and special tokens among them)
    in half of them."""
    corpus = tokenizer.encode(CORPUS * 3, add_special_tokens=False)
    for trial in range(trials):
        start = rng.randrange(len(corpus) // 2)
        ids = corpus[start:]
        if trial % 2:
            ids = [rng.randrange(len(tokenizer)) if rng.random() < 0.2 else i for i in ids]
        yield ids, rng.randint(1, 12), bool(trial % 2)


def test_the_output_text_read_incrementally_is_the_whole_decode(any_tokenizer):
    # The drafter reads the target's output each cycle, a few tokens longer each time: the text it
    # keeps and grows must be exactly what decoding the whole output gives, and so must the test
    # of whether it ends inside a character, read from the last tokens only.
    tokenizer, rng = any_tokenizer, random.Random(0)
    reused = calls = 0        # on outputs not corrupted, cut as the drafter cuts (after whole characters)
    for ids, prompt_length, corrupted in random_outputs(tokenizer, rng, trials=16):
        output_text, last_whole = OutputText(tokenizer), ""
        length = prompt_length + rng.randint(0, 4)
        while length <= len(ids):
            sequence = ids[:length]
            whole = text_after(tokenizer, sequence, prompt_length)
            if not corrupted and not whole.endswith("\ufffd") and not last_whole.endswith("\ufffd"):
                reused += output_text._reused(sequence, prompt_length) is not None
                calls += 1
            assert output_text(sequence, prompt_length) == whole
            assert ends_inside_a_character(tokenizer, sequence, prompt_length) == whole.endswith("\ufffd")
            length, last_whole = length + rng.randint(1, 6), whole
    assert reused > 0.9 * calls          # the incremental path is the one really taken


def byte_symbol(byte: int) -> str:
    """GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others are
    shifted past 255, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    return chr(byte) if byte in printable else chr(256 + sorted(set(range(256)) - set(printable)).index(byte))


def byte_tokens(tokenizer, data: bytes) -> list[int]:
    """`data` one byte a token: byte-fallback tokens (<0x9F>) where the tokenizer has them, else
    byte-level symbols."""
    vocab = tokenizer.get_vocab()
    return [vocab.get(f"<0x{byte:02X}>", vocab.get(byte_symbol(byte))) for byte in data]


def test_the_output_read_incrementally_handles_characters_written_byte_by_byte(any_tokenizer):
    # A target may write characters byte by byte: byte-level pieces, or SentencePiece byte-fallback
    # tokens, whose run decodes whole (or as one U+FFFD per byte if any of it is not UTF-8). Runs
    # longer than the few tokens read, after a stray byte, or not finished: at every length the text
    # and whether it ends inside a character must be what decoding the whole output says.
    tokenizer = any_tokenizer
    words = tokenizer.encode(" and then", add_special_tokens=False)
    sequence = tokenizer.encode("A prompt:", add_special_tokens=False)
    prompt_length = len(sequence)
    runs = ("\u20ac\u20ac\u20ac\u00e9", b"\x9f" + "\u20ac\u20ac\u00e9\u20ac".encode(),
            "\u65e5\u672c\u8a9e\u30c6\u30ad".encode() + b"\xe2\x82", "\U0001f916\U0001f680\U0001f916\u00e9")
    for run in runs:
        run = run if isinstance(run, bytes) else run.encode()
        sequence += byte_tokens(tokenizer, run) + words
    for step in (1, 2, 5):
        output_text = OutputText(tokenizer)
        for length in range(prompt_length, len(sequence) + 1, step):
            whole = text_after(tokenizer, sequence[:length], prompt_length)
            assert ends_inside_a_character(tokenizer, sequence[:length], prompt_length) == whole.endswith("\ufffd")
            assert output_text(sequence[:length], prompt_length) == whole, length


def test_the_output_encoded_incrementally_is_the_whole_encoding(any_tokenizer):
    # The output's text grows a few characters each cycle, and sometimes its last characters change
    # (an unfinished character completed, a cut moved): its tokens, kept and extended, must be
    # exactly the whole text's encoding.
    tokenizer, rng = any_tokenizer, random.Random(1)
    reused = calls = 0
    for _ in range(12):
        text = (CORPUS * 3)[rng.randrange(len(CORPUS)):]
        encoding, end = TextEncoding(tokenizer), rng.randint(0, 8)
        while end <= len(text):
            piece = text[:end]
            if rng.random() < 0.2:       # the end rewritten
                piece = piece[:max(end - rng.randint(1, 6), 0)] + rng.choice([" ", "x", "\u00e9", "\n", "9", "ing "])
            reused += encoding._reused(piece) is not None
            calls += 1
            assert encoding(piece) == tokenizer.encode(piece, add_special_tokens=False), repr(piece[-40:])
            end += rng.randint(1, 24)
    assert reused > 0.7 * calls


# ----------------------------------------------------------------------------- a draft that writes the target's text

def replay_model(sequence: list[int], vocab: int, eos: int, hidden: int = 64):
    """A one-layer Llama whose greedy continuation of any start of `sequence` is the rest of it, then
    `eos`: attention and MLP write nothing, each token of `sequence` embeds as a direction of its own,
    and the LM head scores the token that follows it along that direction (a bigram: every token of
    `sequence` must be distinct)."""
    assert len(set(sequence)) == len(sequence) and eos not in sequence
    model = make_llama(0, layers=1, vocab=vocab, hidden=hidden, eos=eos)
    directions = torch.nn.functional.normalize(torch.randn(len(sequence), hidden), dim=1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, token in enumerate(sequence):
            model.model.embed_tokens.weight[token] = directions[i]
            model.lm_head.weight[(sequence + [eos])[i + 1]] = 10 * directions[i]
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


REPLAYS = {   # target's tokenizer <- draft's: (target, draft, prompt, the target's greedy text)
    # The draft's tokens are finer than the target's ('Ġw', 'izards' for '▁wizards'), and it writes
    # the emoji the target writes as one token in three byte pieces.
    "SentencePiece (Gemma-3) <- byte-level (SmolLM2)": (
        "gemma-3-270m", "SmolLM2-135M-Instruct", "Write one sentence:",
        " The quick brown fox jumps over a lazy dog, while seven wizards quietly photosynthesize near Mount "
        "Everest in 1987!\nCaf\u00e9 owners applaud\U0001f916."),
    # The target writes the emoji in three byte pieces: the draft reads only whole characters.
    "byte-level (SmolLM2) <- SentencePiece (Gemma-3)": (
        "SmolLM2-135M-Instruct", "gemma-3-270m", "Write one sentence:",
        " The quick brown fox jumps over a lazy dog, while seven old men sing near the river in 1987!\n"
        "They smile\U0001f916 and"),
}


@pytest.mark.slow
@pytest.mark.parametrize("cut_last", [True, False])
@pytest.mark.parametrize("pair", list(REPLAYS))
def test_a_draft_that_writes_the_targets_own_text_is_accepted_across_real_tokenizers(pair, cut_last):
    # The draft writes, in its own tokens, exactly the text the target writes greedily, so every
    # candidate the alignment makes of it is the target's own next token, unless the alignment is
    # wrong. Equal outputs cannot tell (a wrong candidate is rejected and costs only time); the
    # acceptance can.
    target_name, draft_name, prompt_text, text = REPLAYS[pair]
    target_tokenizer, draft_tokenizer = real_tokenizer(target_name), real_tokenizer(draft_name)
    prompt = target_tokenizer(prompt_text).input_ids
    output = target_tokenizer.encode(text, add_special_tokens=False)
    draft_output = draft_tokenizer.encode(text, add_special_tokens=False)
    # So that the draft can replay its tokens as a bigram, the text it reads at every token the target
    # ends a cycle on must encode to the start of them (as it does at word ends).
    for end in range(1, len(output) + 1):
        written = text_after(target_tokenizer, prompt + output[:end], len(prompt)).rstrip("\ufffd")
        encoded = draft_tokenizer.encode(written, add_special_tokens=False)
        assert encoded == draft_output[:len(encoded)]
    target_eos, draft_eos = target_tokenizer.eos_token_id, draft_tokenizer.eos_token_id
    target = replay_model(prompt + output, len(target_tokenizer), target_eos)
    draft = replay_model(draft_prompt(target_tokenizer, draft_tokenizer, prompt) + draft_output,
                         len(draft_tokenizer), draft_eos)
    ids = torch.tensor([prompt])
    assert reference(target, ids, eos=target_eos, n=len(output) + 1) == output + [target_eos]

    drafter = CrossTokenizerDrafter(draft, draft_tokenizer, target_tokenizer, cut_last=cut_last)
    out, cycles = emitted(target, drafter, ids, max_new_tokens=len(output) + 1, k=4, eos_token_id=target_eos)
    assert out == output + [target_eos]
    drafted, accepted = sum(len(c.drafted) for c in cycles), sum(c.num_accepted for c in cycles)
    assert accepted >= 0.95 * drafted and accepted >= 0.7 * len(out)
