"""One request being decoded: its tokens so far, its own sampler and its budget. The decoding loops
keep one record per request (a single request is a batch of one) instead of parallel lists."""

from __future__ import annotations

from dataclasses import dataclass

from .sampling import Sampler


@dataclass
class Request:
    index: int                  # its place among the prompts of the call (0 for a single request)
    tokens: list[int]           # the prompt, then every token emitted so far
    sampler: Sampler            # its own rule and generator (a batch shares the rule)
    max_new_tokens: int
    k: int                      # the draft length of its next cycle (dynamic k moves it)
    generated: int = 0          # tokens emitted so far
    budget: int = 0             # what the drafter may propose this cycle (set before each draft)

    def draft_budget(self) -> int:
        """Up to k tokens, never past the length budget: the pass adds one more."""
        return min(self.k, self.max_new_tokens - self.generated - 1)
