"""Token ids -> display text. Pieces are decoded in context (the previous few tokens), so that
SentencePiece's leading spaces and byte-level BPE characters split across tokens come out right:
a token that only completes a character carries the whole character, the ones before it carry ''."""

from __future__ import annotations

from dataclasses import dataclass

from .events import ACCEPTED, BONUS, REJECTED, RESAMPLED, Cycle

CONTEXT = 6  # tokens of left context used to decode one piece


class PieceDecoder:
    def __init__(self, tokenizer, context: list[int] | None = None):
        self.tokenizer = tokenizer
        self.context = list(context or [])[-CONTEXT:]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def peek(self, token: int) -> str:
        """Text `token` would add after the current context, without committing it."""
        before = self._decode(self.context)
        after = self._decode(self.context + [token])
        if after.endswith("\ufffd"):       # an incomplete multi-byte character: wait for the rest
            return ""
        return after[len(before):] if after.startswith(before) else after

    def push(self, token: int) -> str:
        piece = self.peek(token)
        pending = self.context + [token]
        if piece == "" and self._decode(pending).endswith("\ufffd"):
            self.context = pending[-(CONTEXT + 4):]   # keep the partial character's bytes
        else:
            self.context = pending[-CONTEXT:]
        return piece


@dataclass(frozen=True)
class Piece:
    text: str
    verdict: str                 # accepted, rejected, resampled or bonus
    cycle: int
    token: int
    draft_prob: float | None
    target_prob: float | None


def cycle_pieces(tokenizer, cycles: list[Cycle], prompt_ids: list[int] | None = None) -> list[Piece]:
    """Every drafted token in place (rejected ones where they were proposed), then each cycle's
    correction or bonus token."""
    decoder = PieceDecoder(tokenizer, prompt_ids)
    pieces = []
    for c in cycles:
        for i, token in enumerate(c.drafted[: c.num_accepted]):
            pieces.append(Piece(decoder.push(token), ACCEPTED, c.index, token, c.draft_probs[i], c.target_probs[i]))
        # Rejected drafts are decoded on a branch: they read as proposed, but never enter the text.
        branch = PieceDecoder(tokenizer, decoder.context)
        for i in range(c.num_accepted, len(c.drafted)):
            token = c.drafted[i]
            pieces.append(Piece(branch.push(token), REJECTED, c.index, token, c.draft_probs[i], c.target_probs[i]))
        if c.correction is not None:
            kind = BONUS if c.correction_kind == BONUS else RESAMPLED
            pieces.append(Piece(decoder.push(c.correction), kind, c.index, c.correction, None, c.correction_prob))
    return pieces
