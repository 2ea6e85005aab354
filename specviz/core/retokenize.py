"""Text between two tokenizers, for drafting across them (core.cross_tokenizer): the text after
some tokens, the target-token candidates a drafted text re-tokenizes into (aligned with what the
target has seen), the target's output read as text and encoded in draft tokens incrementally
(`OutputText`, `TextEncoding`), and the table of tokens both vocabularies share, built once per pair
of tokenizers (`shared_tokens`, for token-level intersection)."""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch

LOOKBEHIND = 8          # target tokens re-encoded with the drafted text, to align at a token boundary
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
