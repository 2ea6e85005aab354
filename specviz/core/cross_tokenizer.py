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


import torch
from transformers import DynamicCache, PreTrainedModel

from .drafters import Draft, Drafter
from .ragged_cache import new_cache
from .retokenize import (DECODE_WINDOW, OutputText, SharedTokens, TextEncoding, draft_prompt, ends_inside_a_character,
                         in_target_vocabulary, intersect, shared_tokens, target_candidates, text_after)
from .sampling import DRAFT, Sampler, to_host

OWN_PROMPTS_KEPT = 8    # prompts remembered in the draft's own chat template (a prompt set's turns)


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
        for step in range(self.draft_tokens_per_candidate * (k + 1)):
            # Sampled: the draft's own noise, keyed by where it drafts (its text re-tokenizes, so no
            # target position is its own): a seeded run repeats.
            token = int(logits.argmax(dim=-1)) if sampler.greedy else int(
                sampler.race(sampler.probs(logits), [f"{clean}+{step}"], DRAFT))
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
        for step in range(k):
            restricted, mass = intersect(sampler.probs(logits)[0], shared)
            if mass == 0:          # the draft puts nothing on a token the target can read: stop here
                break
            # Each candidate is one target token at position len(ids) + step: drawn with the noise
            # of that position, over the shared tokens (core.sampling; the target's own under
            # invariant sampling).
            noise = sampler.noise(len(ids) + step, self.target_vocab_size, restricted.device, sampler.draft_stream)
            pick = (restricted / noise[shared.target_ids]).argmax()[None]
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
