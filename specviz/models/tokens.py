"""Between text and token ids: prompts encoded (through the chat template or raw) and checked against
the models' context windows, and the text of each generated token as it extends a sequence."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import SpecvizError


def check_context(pair, prompt_length: int, max_new_tokens: int) -> None:
    """Refuse a run that would go past a model's context window."""
    models = [("target", pair.target), ("draft", getattr(pair.draft, "model", pair.draft))]
    for role, model in models:
        config = getattr(model, "config", None)
        if config is None:
            continue
        limit = getattr(config.get_text_config(), "max_position_embeddings", None)
        if limit and prompt_length + max_new_tokens > limit:
            raise SpecvizError(
                f"The prompt ({prompt_length} tokens) plus {max_new_tokens} new tokens exceeds the {role} "
                f"model's context of {limit} tokens. Shorten the prompt or lower max new tokens.")


def encode_prompt(tokenizer, prompt: str, *, chat: bool = True) -> torch.LongTensor:
    """Token ids (1, T) of a prompt: as one user turn through the chat template (with the
    assistant's turn opened) when `chat` and the tokenizer has a template, else as raw text."""
    if not prompt or not prompt.strip():
        raise SpecvizError("The prompt is empty: type a question, or text for the model to continue.")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids  # the template adds BOS
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise SpecvizError("The prompt encodes to no tokens.")
    return ids


class Detokenizer:
    """Text of each token as it extends a sequence.

    Byte-level BPE splits one character over several tokens, and SentencePiece drops a leading
    space when a token is decoded alone, so a token's text is the growth of the decoded text of a
    short window ending at it (as vLLM does). While the window ends inside a character the growth
    is held back, and the token that completes the character carries all of it."""

    def __init__(self, tokenizer, context: Sequence[int] = (), window: int = 6):
        self.tokenizer = tokenizer
        self.ids = list(context)[-window:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        """Append one token; return the text it adds ("" while a character is incomplete)."""
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix_offset:self.read_offset])
        after = self._decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return after[len(before):]
        return ""

    def fork(self) -> Detokenizer:
        """An independent copy (to decode rejected drafts without disturbing the real sequence)."""
        other = Detokenizer.__new__(Detokenizer)
        other.tokenizer, other.ids = self.tokenizer, list(self.ids)
        other.prefix_offset, other.read_offset = self.prefix_offset, self.read_offset
        return other
