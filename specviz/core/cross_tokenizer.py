"""Drafting across tokenizers, greedy-lossless: string-level exact match (SLEM; Timor et al., ICML
2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"; transformers' `AssistedCandidateGeneratorDifferentTokenizers`).

The draft model continues the text in its own tokens; the text it adds is re-tokenized with the
target's tokenizer, aligned with the tokens the target has already seen, and proposed as one-hot
target-token candidates (probs None). Greedy verification then keeps exactly the target's greedy
output; speculative sampling stays exact too, because a one-hot candidate x is accepted with
probability target(x) and rejected into the target's distribution without x. (Token-level
intersection, TLI, which proposes the draft's probabilities restricted to the shared vocabulary,
is not here.)

Both tokenizers are passed in (any object with transformers' `encode` / `decode`): this layer knows
no model loading. Two faults of the reference implementation are avoided on purpose: re-encoding
never adds special tokens (no extra BOS mid-text, transformers #46124), and the draft's positions
come from its own cache, cropped to exactly the draft tokens still valid (#46936)."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .drafters import Draft, Drafter
from .sampling import Sampler

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
    before = max(start - DECODE_WINDOW, 0)
    base = _decode(tokenizer, ids[before:start], skip_special)
    full = _decode(tokenizer, ids[before:], skip_special)
    return full[len(base):] if full.startswith(base) else _decode(tokenizer, ids[start:], skip_special)


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


class CrossTokenizerDrafter(Drafter):
    """A causal LM with its own tokenizer drafting for a target with another one.

    The draft's context is re-encoded each cycle from the target's text (the prompt as
    `draft_prompt` encodes it, then the target's output so far in draft tokens);
    its KV cache is kept for the longest prefix of draft tokens that did not change and cropped
    to it. It drafts until the re-tokenized text gives k target candidates after the cut (or
    `draft_tokens_per_candidate` * (k + 1) draft tokens, or its EOS)."""

    def __init__(self, model: PreTrainedModel, draft_tokenizer, target_tokenizer, *, name: str | None = None,
                 draft_tokens_per_candidate: int = 4):
        self.model = model
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.name = name or getattr(model.config, "name_or_path", "") or type(model).__name__
        self.parameters = sum(p.numel() for p in model.parameters())
        self.draft_tokens_per_candidate = draft_tokens_per_candidate
        eos = getattr(model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(draft_tokenizer, "eos_token_id", None)
        self.draft_eos = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
        self.cache: DynamicCache | None = None
        self.cached_ids: list[int] = []           # the draft tokens the cache holds, in order
        self.prompt_length = 0                    # target tokens of the prompt
        self.draft_prompt: list[int] = []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        prompt = prompt_ids[0].tolist()
        self.prompt_length = len(prompt)
        self.draft_prompt = draft_prompt(self.target_tokenizer, self.draft_tokenizer, prompt)
        if not self.draft_prompt:
            raise ValueError("the prompt's text encodes to no draft tokens: the draft has nothing to continue")
        self.cache, self.cached_ids = DynamicCache(config=self.model.config), []
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
            if not text_after(self.target_tokenizer, sequence[:length], self.prompt_length).endswith("\ufffd"):
                return length
        return self.prompt_length

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        ids = sequence[0].tolist()
        clean = self._clean_length(ids)
        output_text = text_after(self.target_tokenizer, ids[:clean], self.prompt_length)
        context = self.draft_prompt + _encode(self.draft_tokenizer, output_text)
        logits = self._sync(context)
        drafted, candidates = [], []
        for _ in range(self.draft_tokens_per_candidate * (k + 1)):
            token = int(logits.argmax(dim=-1)) if sampler.greedy else int(sampler.sample(sampler.probs(logits)))
            complete = token in self.draft_eos
            if not complete:
                drafted.append(token)
            text = text_after(self.draft_tokenizer, context + drafted, len(context))
            # A draft ending inside a character has an unfinished tail: leave it for the next token.
            text = text.rstrip("\ufffd")
            candidates = target_candidates(self.target_tokenizer, ids, clean, text, complete=complete) if text else []
            if complete or len(candidates) >= k:
                break
            logits = self._feed([token])
        candidates = candidates[:k]
        # What to show: the draft's own tokens as text, and the end of its text the candidates leave out.
        pieces = [text_after(self.draft_tokenizer, context + drafted[:i + 1], len(context) + i)
                  for i in range(len(drafted))]
        whole = target_candidates(self.target_tokenizer, ids, clean, text, complete=True) if text else []
        cut = whole[len(candidates):] if whole[:len(candidates)] == candidates else []
        cut = text_after(self.target_tokenizer, ids + whole[:len(candidates) + len(cut)], len(ids) + len(candidates))
        return Draft(torch.tensor(candidates, dtype=torch.long, device=sequence.device), None,
                     draft_pieces=pieces, cut_text=cut)
