"""One request being decoded: its tokens so far, its own sampler and its budget. The decoding loops
keep one record per request (a single request is a batch of one) instead of parallel lists. Also
what both loops check and build before any work: the prompts, the settings, the samplers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .ragged_cache import check_rollback
from .sampling import INVARIANT, Sampler, validate_sampling


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


def eos_ids(target: PreTrainedModel, eos_token_id: int | Iterable[int] | None) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(target.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)


def row_seed(seed: int | None, row: int) -> int | None:
    """The seed of the generator of request `row` in a batch seeded with `seed` (None: unseeded)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1        # below 2**63: any generator takes it


def prompt_lists(prompts: Sequence[torch.Tensor | Sequence[int]]) -> list[list[int]]:
    if not prompts:
        raise ValueError("no prompts: a batch needs at least one")
    lists = []
    for i, prompt in enumerate(prompts):
        ids = prompt.reshape(-1).tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not ids:
            raise ValueError(f"prompt {i} is empty: it has no tokens" if len(prompts) > 1
                             else "the prompt is empty: input_ids has no tokens")
        lists.append([int(t) for t in ids])
    return lists


def single_prompt(input_ids: torch.Tensor) -> list[list[int]]:
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape (1, T), got {tuple(input_ids.shape)}")
    return prompt_lists([input_ids])


def check_settings(target: PreTrainedModel, max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    validate_sampling(temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_rollback(target)


def make_samplers(count: int, temperature: float, top_k: int, top_p: float, seed: int | None, device,
                  single: bool, rule: str = INVARIANT) -> list[Sampler]:
    # A single request is seeded with `seed` itself; a batch's requests with `row_seed(seed, place)`.
    return [Sampler(temperature, top_k, top_p, seed if single else row_seed(seed, row), device, rule)
            for row in range(count)]
