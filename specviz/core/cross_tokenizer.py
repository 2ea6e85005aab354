"""Drafting across tokenizers, greedy-lossless: string-level exact match (SLEM; Timor et al., ICML
2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"; transformers' `AssistedCandidateGeneratorDifferentTokenizers`).

The draft model continues the text in its own tokens; the text it adds is re-tokenized with the
target's tokenizer, aligned with the tokens the target has already seen, and proposed as one-hot
target-token candidates (probs None). Greedy verification then keeps exactly the target's greedy
output.

Sampling has two exact ways. Token-level intersection (TLI, the default; transformers'
`UniversalSpeculativeDecodingGenerator`): the draft samples from its warped distribution restricted
to the shared tokens (draft tokens whose text is exactly one target token's text) and renormalised,
each sample is proposed as that target token with the restricted distribution as its draft
probabilities, and speculative sampling keeps the target's distribution exact. One-hot candidates
(`sampling="one-hot"`): the draft samples freely and its text is re-tokenized as when greedy; a
one-hot candidate x is accepted with probability target(x) and rejected into the target's
distribution without x, exact too, but it accepts less: Gemma-3-270M drafted by SmolLM2-135M,
k = 4, accepted 27% of TLI's candidates against 6% of one-hot ones at temperature 1 (2.0 against
1.2 tokens per pass), 27% against 18% at 0.7 (2.0 against 1.6).

Both tokenizers are passed in (any object with transformers' `encode` / `decode` / `batch_decode`): this layer knows
no model loading. Three faults of the reference implementation are avoided on purpose: re-encoding
never adds special tokens (no extra BOS mid-text, transformers #46124), the draft's positions come
from its own cache, cropped to exactly the draft tokens still valid (#46936), and under TLI each
candidate's reported distribution is the one it was drawn from: warped, restricted, renormalised,
after exactly the draft tokens the draft conditioned on (#47932)."""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
from transformers import DynamicCache, PreTrainedModel

from .drafters import Draft, Drafter
from .ragged_cache import new_cache
from .sampling import Sampler, to_host

LOOKBEHIND = 8          # target tokens re-encoded with the drafted text, to align at a token boundary
OWN_PROMPTS_KEPT = 8    # prompts remembered in the draft's own chat template (a prompt set's turns)
DECODE_WINDOW = 4       # tokens decoded before a piece, so a leading space survives (SentencePiece)
CONTINUATION_ANCHORS = ("\n", ".", "|")   # texts that end a token in most vocabularies


def _decode(tokenizer, ids: list[int], skip_special: bool) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)


def _encode(tokenizer, text: str) -> list[int]:
    # Never special tokens: a re-encoded piece of text mid-sequence gets no BOS (transformers #46124).
    return tokenizer.encode(text, add_special_tokens=False)


def text_after(tokenizer, ids: list[int], start: int, *, skip_special: bool = True) -> str:
    """The text `ids[start:]` adds after `ids[:start]`: the growth of a decoded window, because a
    SentencePiece token decoded alone loses its leading space."""
    growth = _growth(tokenizer, ids, start, skip_special)
    return growth if growth is not None else _decode(tokenizer, ids[start:], skip_special)


def _growth(tokenizer, ids: list[int], start: int, skip_special: bool) -> str | None:
    """What decoding `ids[start:]` after the few tokens before `start` adds to their text; None where
    that text is not a prefix of the longer one (`start` splits a character)."""
    before = max(start - DECODE_WINDOW, 0)
    base = _decode(tokenizer, ids[before:start], skip_special)
    full = _decode(tokenizer, ids[before:], skip_special)
    return full[len(base):] if full.startswith(base) else None


def _shared_prefix(a, b) -> int:
    """The length of the longest common prefix of two strings or two lists, by halving (each
    comparison runs in C: faster than a Python loop over a few thousand items)."""
    if b[:len(a)] == a:
        return len(a)
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def ends_inside_a_character(tokenizer, ids: list[int], start: int) -> bool:
    """Whether the text `ids[start:]` adds ends with U+FFFD (the bytes of a character not finished),
    read from the last few tokens instead of the whole text. A window is trusted where its text
    starts with a whole character (no U+FFFD) and one more token before it only adds text in front
    (it did not start inside a character or a run of byte-fallback tokens); otherwise it is widened,
    up to the whole text."""
    window = len(ids)
    while window - LOOKBEHIND > start:
        window -= LOOKBEHIND
        text = _decode(tokenizer, ids[window:], True)
        if text and not text.startswith("\ufffd") and _decode(tokenizer, ids[window - 1:], True).endswith(text):
            return text.endswith("\ufffd")
    return text_after(tokenizer, ids, start).endswith("\ufffd")


def target_candidates(tokenizer, sequence: list[int], clean: int, drafted_text: str, *, complete: bool) -> list[int]:
    """Target tokens that continue `sequence` with `drafted_text`, the text drafted after the text of
    `sequence[:clean]` (`clean` < len(sequence) when the last tokens end inside a character).

    The last few tokens' text plus the drafted text is re-encoded; where that reproduces the tokens
    the target has seen, what follows them is the candidates (the longest such window first). When
    the drafted text merges with the target's last token (`jump` + `ed` re-encodes as `jumped`),
    the text after the seen tokens is encoded on its own. Unless the draft ended its text
    (`complete`: it emitted its EOS), the last candidate is dropped: its text is cut at the end of
    the draft and may be a prefix of a longer target token (`jump` of `jumped`)."""
    seen_from = max(clean - LOOKBEHIND, 0)
    candidates = None
    for start in range(seen_from, clean):
        seen = sequence[start:]
        ids = _encode(tokenizer, _decode(tokenizer, sequence[start:clean], False) + drafted_text)
        if ids[:len(seen)] == seen:
            candidates = ids[len(seen):]
            break
    if candidates is None:
        joined = _decode(tokenizer, sequence[seen_from:clean], False) + drafted_text
        seen_text = _decode(tokenizer, sequence[seen_from:], False)
        if not joined.startswith(seen_text):
            return []
        candidates = _continuation(tokenizer, sequence, joined[len(seen_text):])
    return candidates if complete else candidates[:-1]


def _continuation(tokenizer, sequence: list[int], text: str) -> list[int]:
    """Target tokens whose text continues `sequence` with exactly `text`. Encoded on its own, a text
    gets a word start from SentencePiece-style tokenizers that prepend one ('he' -> '▁he'), so
    it is encoded after an anchor that ends a token and the anchor's tokens are dropped."""
    candidates = _encode(tokenizer, text)
    if text_after(tokenizer, sequence + candidates, len(sequence), skip_special=False) == text:
        return candidates
    for anchor in CONTINUATION_ANCHORS:
        lead, ids = _encode(tokenizer, anchor), _encode(tokenizer, anchor + text)
        if ids[:len(lead)] == lead and text_after(tokenizer, sequence + ids[len(lead):], len(sequence),
                                                  skip_special=False) == text:
            return ids[len(lead):]
    return candidates


# ----------------------------------------------------------------------------- incremental re-tokenization
# Each cycle the draft reads the target's whole output as text, in its own tokens. Decoding and
# encoding it whole costs time in proportion to its length; from one cycle to the next, though,
# only its end changes. Both classes below give exactly what the whole-text call gives (checked on
# random texts and cuts with a byte-level BPE and a SentencePiece tokenizer, tests/test_cross_tokenizer.py),
# keeping the last result up to a boundary a few tokens before the first change and re-doing only
# what follows. Where the boundary cannot be trusted, they do the whole call. On Gemma-3-270M
# drafted by SmolLM2-135M (fp32, greedy, k = 4, one thread, scripts/cross_tokenizer_tokenizer_time.py)
# the tokenizers' time per cycle grew from 2.0 ms (output 0-63 tokens) to 2.8 ms (320-383) before,
# and stays at 1.8-2.1 ms with them: small beside a cycle (~420 ms), but no longer growing with the output.

class OutputText:
    """`text_after(tokenizer, ids, start)` for ids that grow from one call to the next: the text of
    the tokens kept since the last call is kept, up to LOOKBEHIND tokens before the first token that
    changed, and only what the tokens after that boundary add is decoded."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start, self.text = 0, ""

    def __call__(self, ids: list[int], start: int) -> str:
        text = self._reused(ids, start)
        if text is None:
            text = text_after(self.tokenizer, ids, start)
        self.ids, self.start, self.text = list(ids), start, text
        return text

    def _reused(self, ids: list[int], start: int) -> str | None:
        boundary = _shared_prefix(self.ids, ids) - LOOKBEHIND
        if start != self.start or boundary <= start:
            return None
        # The last text, split at the boundary: what the tokens after it added. Decoding is local
        # (a token's text depends only on its neighbours), so where the old tokens' text ends with
        # that, the text before the boundary is the same for the new tokens. Except across bytes of
        # unfinished or broken characters: a run of SentencePiece byte-fallback tokens decodes as a
        # whole, and as one U+FFFD per byte wherever any of it is not UTF-8.
        old_tail = _growth(self.tokenizer, self.ids, boundary, True)
        new_tail = _growth(self.tokenizer, ids, boundary, True)
        if (old_tail is None or new_tail is None or "\ufffd" in old_tail or "\ufffd" in new_tail
                or not self.text.endswith(old_tail)):
            return None
        return self.text[:len(self.text) - len(old_tail)] + new_tail


class TextEncoding:
    """`tokenizer.encode(text)` (no special tokens added) for a text that grows from one call to the
    next: the tokens of the last text are kept up to a boundary at least LOOKBEHIND tokens before the
    first character that changed, and the text after it is encoded. The boundary is trusted where
    encoding from it gives back the last text's next LOOKBEHIND tokens, which lie before the change:
    the tokenization did not change across it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text, self.ids = "", []

    def __call__(self, text: str) -> list[int]:
        ids = self._reused(text)
        if ids is None:
            ids = _encode(self.tokenizer, text)
        self.text, self.ids = text, ids
        return ids

    def _reused(self, text: str) -> list[int] | None:
        same = _shared_prefix(self.text, text)
        back = 2 * LOOKBEHIND
        while back <= len(self.ids):     # each try a boundary twice as far back
            keep = len(self.ids) - back
            tail = _decode(self.tokenizer, self.ids[keep:], False)
            overlap = _decode(self.tokenizer, self.ids[keep:keep + LOOKBEHIND], False)
            cut = len(self.text) - len(tail)     # where the tail's text starts, if it is the text's end
            if self.text.endswith(tail) and tail.startswith(overlap) and cut + len(overlap) <= same:
                ids = _encode(self.tokenizer, text[cut:])
                return self.ids[:keep] + ids if ids[:LOOKBEHIND] == self.ids[keep:keep + LOOKBEHIND] else None
            back *= 2
        return None


def draft_prompt(target_tokenizer, draft_tokenizer, prompt: list[int]) -> list[int]:
    """The prompt in draft tokens: its text, keeping the special tokens (chat markers) the draft's
    vocabulary also has and dropping the others, led by whatever the draft's tokenizer puts before
    a text (its BOS), exactly once even when the text already starts with it."""
    text = _decode(target_tokenizer, prompt, False)
    draft_vocab = draft_tokenizer.get_vocab()
    for token in target_tokenizer.all_special_tokens:
        if token not in draft_vocab:
            text = text.replace(token, "")
    ids = _encode(draft_tokenizer, text)
    with_special, plain = draft_tokenizer.encode("a"), _encode(draft_tokenizer, "a")
    start = next((i for i in range(len(with_special)) if with_special[i:i + len(plain)] == plain), 0)
    leading = with_special[:start]
    return ids if ids[:len(leading)] == leading else leading + ids


# ----------------------------------------------------------------------------- token-level intersection

def token_texts(tokenizer) -> dict[int, tuple[bool, str]]:
    """Each token's text as it reads after other text, by id, as (special, text): a special token
    reads as its own string; any other as what it adds to a decoded text, so a word-start marker
    (SentencePiece's `▁`, byte-level BPE's `Ġ`) is the space it stands for and byte-level symbols
    are their characters. Left out: tokens that add no text, and those that are not whole
    characters (a byte-level piece of one, a byte-fallback byte), whose text is not a string."""
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_ids", ())) | {
        i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(token, "special", False)}
    texts = {i: (True, token) for token, i in vocab.items() if i in special}
    ordinary = sorted(i for i in vocab.values() if i not in special)
    # Decoded after an anchor token: alone, a SentencePiece token would lose its leading space.
    anchor = (_encode(tokenizer, "a") or ordinary[:1])[-1:]
    base = _decode(tokenizer, anchor, False)
    decoded = tokenizer.batch_decode([anchor + [i] for i in ordinary], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
    for i, full in zip(ordinary, decoded):
        text = full[len(base):]
        if full.startswith(base) and text and "\ufffd" not in text:
            texts[i] = (False, text)
    return texts


@dataclass(frozen=True)
class SharedTokens:
    """The draft tokens whose text is exactly one target token's text, and that target token: the
    vocabulary token-level intersection drafts in. Two draft tokens may read as one target token."""

    draft_ids: torch.Tensor       # (m,) draft ids, ascending
    target_ids: torch.Tensor      # (m,) the target token each one is
    target_vocab_size: int        # width of the target's distributions

    def to(self, device: torch.device) -> SharedTokens:
        return SharedTokens(self.draft_ids.to(device), self.target_ids.to(device), self.target_vocab_size)


# draft tokenizer -> target tokenizer -> (their lengths, the two vocabulary sizes) -> table. Built
# once per pair of tokenizers, not per drafter or run: it decodes both vocabularies (seconds for
# Gemma-3's 262k tokens). Held weakly, so a table goes with its tokenizers; keyed by their lengths
# too, so a tokenizer given new tokens gets a new table.
_SHARED_TABLES: WeakKeyDictionary = WeakKeyDictionary()


def shared_tokens(draft_tokenizer, target_tokenizer, *, draft_vocab_size: int, target_vocab_size: int) -> SharedTokens:
    """Map draft tokens to target tokens by text (`token_texts`; a special token only to a special
    token of the same string). Ids past a model's vocabulary size (its logits' width) are left out.
    Where several target tokens read the same, the one the target's tokenizer writes for that text
    is taken (else the lowest id), so the draft proposes the target's own spelling. Built once per
    pair of tokenizers and sizes (`_SHARED_TABLES`), on the CPU."""
    tables = _SHARED_TABLES.setdefault(draft_tokenizer, WeakKeyDictionary()).setdefault(target_tokenizer, {})
    key = (len(draft_tokenizer), len(target_tokenizer), draft_vocab_size, target_vocab_size)
    if key not in tables:
        tables[key] = _map_shared_tokens(draft_tokenizer, target_tokenizer, draft_vocab_size=draft_vocab_size,
                                         target_vocab_size=target_vocab_size)
    return tables[key]


def _map_shared_tokens(draft_tokenizer, target_tokenizer, *, draft_vocab_size: int,
                       target_vocab_size: int) -> SharedTokens:
    readings: dict[tuple[bool, str], list[int]] = {}
    for i, key in sorted(token_texts(target_tokenizer).items()):
        if i < target_vocab_size:
            readings.setdefault(key, []).append(i)
    chosen = {}
    for key, ids in readings.items():
        written = [] if key[0] or len(ids) == 1 else _encode(target_tokenizer, key[1])
        chosen[key] = written[0] if len(written) == 1 and written[0] in ids else ids[0]
    pairs = [(i, chosen[key]) for i, key in sorted(token_texts(draft_tokenizer).items())
             if i < draft_vocab_size and key in chosen]
    draft_ids, target_ids = zip(*pairs) if pairs else ((), ())
    return SharedTokens(torch.tensor(draft_ids, dtype=torch.long), torch.tensor(target_ids, dtype=torch.long),
                        target_vocab_size)


def intersect(draft_probs: torch.Tensor, shared: SharedTokens) -> tuple[torch.Tensor, float]:
    """The draft's warped distribution (V_draft,) restricted to the shared tokens and renormalised,
    over `shared.draft_ids` (m,), and the share of its probability they held before (0 to 1)."""
    kept = draft_probs[shared.draft_ids]
    mass = float(kept.sum())
    return (kept / mass if mass > 0 else kept), min(mass, 1.0)


def in_target_vocabulary(restricted: torch.Tensor, shared: SharedTokens) -> torch.Tensor:
    """A distribution over the shared tokens (m,) as one over the target's vocabulary (V_target,):
    the probability of every draft token that reads as a target token, summed there."""
    return restricted.new_zeros(shared.target_vocab_size).index_add_(0, shared.target_ids, restricted)


class CrossTokenizerDrafter(Drafter):
    """A causal LM with its own tokenizer drafting for a target with another one.

    The draft's context is re-read each cycle from the target's text (the prompt as
    `draft_prompt` encodes it, then the target's output so far in draft tokens), decoding and
    encoding again only what follows the last few tokens before the output changed
    (`OutputText`, `TextEncoding`); its KV cache is kept for the longest prefix of draft tokens
    that did not change and cropped to it. Greedy, and sampling with `sampling="one-hot"`, it
    drafts until the re-tokenized text gives k target candidates (or `draft_tokens_per_candidate`
    * (k + 1) draft tokens, or its EOS). Sampling with `sampling="intersection"` (token-level
    intersection), it drafts k shared tokens, each one target token, with their distributions.

    `cut_last`: SLEM's cut. The last candidate's text ends where the draft stopped, so it may be
    the start of a longer target token (`jump` of `jumped`); with the cut it is dropped unless the
    draft ended, and the draft writes one more candidate's worth of text to fill k. Off by default:
    proposed anyway, a partial token costs only its place in the pass (the target rejects it and
    writes the whole token as its correction, as it would have written it after the cut), while
    the extra draft token costs a draft forward. On Gemma-3-270M drafted by SmolLM2-135M (fp32,
    greedy, k = 4, one prompt per benchmark category, 48 tokens, one thread) both wrote the same
    outputs in the same passes but one, with 20% fewer draft tokens, median 1.10x faster without the cut
    (scripts/cross_tokenizer_cut.py).

    `target_vocab_size` is the width of the target's logits (default: the target tokenizer's
    length); a TLI draft's probabilities have that width."""

    SAMPLING = ("intersection", "one-hot")

    def __init__(self, model: PreTrainedModel, draft_tokenizer, target_tokenizer, *, name: str | None = None,
                 draft_tokens_per_candidate: int = 4, sampling: str = "intersection", cut_last: bool = False,
                 target_vocab_size: int | None = None):
        if sampling not in self.SAMPLING:
            raise ValueError(f"sampling must be one of {', '.join(self.SAMPLING)}, got {sampling!r}")
        self.sampling = sampling
        self.target_vocab_size = target_vocab_size or len(target_tokenizer)
        self.shared: SharedTokens | None = None     # on the model's device, from the first TLI draft
        self.model = model
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.name = name or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.parameters = sum(p.numel() for p in model.parameters())
        self.draft_tokens_per_candidate = draft_tokens_per_candidate
        self.cut_last = cut_last
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(draft_tokenizer, "eos_token_id", None)
        self.draft_eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        self.cache: DynamicCache | None = None
        self.own_prompts: dict[tuple[int, ...], list[int]] = {}   # target prompt -> the draft's own formatting
        self.cached_ids: list[int] = []           # the draft tokens the cache holds, in order
        self.prompt_length = 0                    # target tokens of the prompt
        self.draft_prompt: list[int] = []
        # The target's output as text, and that text in draft tokens, re-done each cycle only after
        # the last few tokens before what changed.
        self.output_text = OutputText(target_tokenizer)
        self.output_in_draft_tokens = TextEncoding(draft_tokenizer)

    def read_prompt_as(self, prompt: list[int], draft_ids: list[int]) -> None:
        """Have the draft read the target prompt `prompt` as `draft_ids`: the same conversation in
        the draft's own chat template. `begin` uses it for that prompt only (the last few are kept);
        any other prompt is read as its text (`draft_prompt`)."""
        self.own_prompts.pop(tuple(prompt), None)
        self.own_prompts[tuple(prompt)] = list(draft_ids)
        while len(self.own_prompts) > OWN_PROMPTS_KEPT:
            del self.own_prompts[next(iter(self.own_prompts))]

    def begin(self, prompt_ids: torch.Tensor) -> None:
        prompt = prompt_ids[0].tolist()
        self.prompt_length = len(prompt)
        self.draft_prompt = (self.own_prompts.get(tuple(prompt))
                             or draft_prompt(self.target_tokenizer, self.draft_tokenizer, prompt))
        if not self.draft_prompt:
            raise ValueError("the prompt's text encodes to no draft tokens: the draft has nothing to continue")
        self.cache, self.cached_ids = new_cache(self.model), []
        if len(self.draft_prompt) > 1:
            self._feed(self.draft_prompt[:-1])

    def _feed(self, ids: list[int]) -> torch.Tensor:
        """Run the draft over `ids` after its cache; the logits of the last position."""
        inputs = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        logits = self.model(inputs, cache=self.cache, logits_to_keep=1).logits[0, -1:]
        self.cached_ids += ids
        return logits

    def _sync(self, context: list[int]) -> torch.Tensor:
        """Crop the cache to its longest prefix shared with `context` (at least one token left to
        feed) and feed the rest: the draft's next-token logits after `context`."""
        keep = 0
        limit = min(len(self.cached_ids), len(context) - 1)
        while keep < limit and self.cached_ids[keep] == context[keep]:
            keep += 1
        if len(self.cached_ids) > keep:
            self.cache.crop(keep - len(self.cached_ids))
            del self.cached_ids[keep:]
        return self._feed(context[keep:])

    def _clean_length(self, sequence: list[int]) -> int:
        """How much of `sequence` decodes to whole characters (byte-level tokens split characters)."""
        for length in range(len(sequence), max(len(sequence) - DECODE_WINDOW, self.prompt_length) - 1, -1):
            if not ends_inside_a_character(self.target_tokenizer, sequence[:length], self.prompt_length):
                return length
        return self.prompt_length

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        if not sampler.greedy and self.sampling == "intersection":
            return self._propose_intersection(sequence, k, sampler)
        ids = sequence[0].tolist()
        clean = self._clean_length(ids)
        context = self.draft_prompt + self.output_in_draft_tokens(self.output_text(ids[:clean], self.prompt_length))
        logits = self._sync(context)
        before = context[-DECODE_WINDOW:]      # all that text_after reads of the context
        drafted, candidates = [], []
        for _ in range(self.draft_tokens_per_candidate * (k + 1)):
            token = int(logits.argmax(dim=-1)) if sampler.greedy else int(sampler.sample(sampler.probs(logits)))
            complete = token in self.draft_eos
            if not complete:
                drafted.append(token)
            text = text_after(self.draft_tokenizer, before + drafted, len(before))
            # A draft ending inside a character has an unfinished tail: leave it for the next token.
            text = text.rstrip("\ufffd")
            candidates = target_candidates(self.target_tokenizer, ids, clean, text,
                                           complete=complete or not self.cut_last) if text else []
            if complete or len(candidates) >= k:
                break
            logits = self._feed([token])
        # What to show: the end of the draft's text the proposed candidates leave out (past the k-th,
        # or the last one SLEM's cut dropped), from every target token its text re-tokenized into.
        proposed = candidates[:k]
        whole = candidates if complete or not self.cut_last else (
            target_candidates(self.target_tokenizer, ids, clean, text, complete=True) if text else [])
        left_out = whole[len(proposed):] if whole[:len(proposed)] == proposed else []
        cut = text_after(self.target_tokenizer, ids + proposed + left_out, len(ids) + len(proposed))
        return Draft(torch.tensor(proposed, dtype=torch.long, device=sequence.device), None,
                     draft_pieces=self._pieces(context, drafted), cut_text=cut)

    def _pieces(self, context: list[int], drafted: list[int]) -> list[str]:
        """The draft's own tokens `drafted` (after `context`) as text, one piece each."""
        before = context[-DECODE_WINDOW:]      # all text_after reads of the context
        return [text_after(self.draft_tokenizer, before + drafted[:i + 1], len(before) + i)
                for i in range(len(drafted))]

    def _shared_tokens(self) -> SharedTokens:
        if self.shared is None:
            self.shared = shared_tokens(self.draft_tokenizer, self.target_tokenizer,
                                        draft_vocab_size=self.model.config.get_text_config().vocab_size,
                                        target_vocab_size=self.target_vocab_size).to(self.model.device)
        return self.shared

    # Drafting needs no autograd; without it the shared-token table, built inside the decoding loop's
    # inference mode, can be used by a `propose` called outside it.
    @torch.no_grad()
    def _propose_intersection(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        """Token-level intersection: up to k draft tokens, each drawn from the draft's warped
        distribution restricted to the shared tokens and renormalised, after the draft's context
        and the tokens drawn before it, and proposed as the target token it reads as, with exactly
        that distribution (in the target's vocabulary) as its draft probabilities."""
        ids = sequence[0].tolist()
        shared = self._shared_tokens()
        nothing = Draft(sequence[0, :0], None, draft_pieces=[], cut_text="", shared_mass=[])
        # Each candidate follows the target's last token directly, so the draft must have read all
        # of the target's text; ending inside a character, it cannot have (a cycle with no draft).
        if self._clean_length(ids) < len(ids) or not len(shared.draft_ids):
            return nothing
        context = self.draft_prompt + self.output_in_draft_tokens(self.output_text(ids, self.prompt_length))
        logits = self._sync(context)
        drafted, candidates, rows, masses = [], [], [], []
        for _ in range(k):
            restricted, mass = intersect(sampler.probs(logits)[0], shared)
            if mass == 0:          # the draft puts nothing on a token the target can read: stop here
                break
            pick = sampler.sample(restricted[None])
            (draft_id,), (target_id,) = to_host(shared.draft_ids[pick], shared.target_ids[pick])
            drafted.append(int(draft_id))
            candidates.append(int(target_id))
            rows.append(in_target_vocabulary(restricted, shared))
            masses.append(mass)
            if drafted[-1] in self.draft_eos or len(drafted) == k:
                break
            logits = self._feed([drafted[-1]])
        if not drafted:
            return nothing
        # Each draft token is one whole target token: nothing of the draft's text is cut.
        return Draft(torch.tensor(candidates, dtype=torch.long, device=sequence.device),
                     torch.stack(rows).to(sequence.device), draft_pieces=self._pieces(context, drafted), cut_text="",
                     shared_mass=masses)
