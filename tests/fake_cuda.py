"""torch.cuda faked as a card and torch's caching allocator behave, for tests of specviz's GPU decisions
on a machine without one (tests/test_gpu_policy.py, tests/test_engine_gpu.py).

What is faked is the hardware and the allocator, honestly: `allocate` stands for the tensors of a model
loaded on a card and returns an object that holds them; while anything references that object its
bytes are allocated (and like a model it holds reference cycles: only a garbage collection frees it).
Once freed, its blocks stay reserved (torch's cache keeps them) until `empty_cache`, which returns to
the driver the reserved blocks nothing allocates, and nothing else: a model that something still
references stays on the card however often the cache is emptied. The driver's free memory
(`mem_get_info`) is the card's total less what this process reserved and what other programs hold. An
allocation that finds no room is torch's out-of-memory error, after torch's own retry with the cache
emptied."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

GiB = 2**30


@dataclass
class Card:
    total: int
    other: int = 0          # held by other programs (another engine's server)
    allocated: int = 0      # this process's live tensors
    reserved: int = 0       # this process's blocks, live or cached (>= allocated)

    @property
    def free(self) -> int:
        return self.total - self.other - self.reserved


class Weights:
    """A stand-in for a loaded model's tensors on a card: allocated while referenced. It refers to
    itself, as a model's modules do (parent and child), so that only the garbage collector frees it."""

    def __init__(self, card: Card, nbytes: int):
        self.nbytes, self.me = nbytes, self
        weakref.finalize(self, Weights._release, card, nbytes)

    @staticmethod
    def _release(card: Card, nbytes: int) -> None:
        card.allocated -= nbytes        # the blocks stay reserved: torch's cache keeps them


class FakeCuda:
    """`cards`: (total, held by other programs) in bytes, one pair per card."""

    def __init__(self, monkeypatch, *cards: tuple[int, int], bf16: bool = True, name: str = "Fake GPU"):
        self.cards = [Card(total, other) for total, other in cards]
        self.bf16, self.name = bf16, name
        self.asked: list = []           # the device argument of every mem_get_info call
        self.emptied = 0                # empty_cache calls
        for attribute in ("is_available", "device_count", "current_device", "mem_get_info", "is_bf16_supported",
                          "get_device_name", "memory_reserved", "memory_allocated", "empty_cache"):
            monkeypatch.setattr(torch.cuda, attribute, getattr(self, attribute))

    def card(self, device=None) -> Card:
        if device is None:
            return self.cards[0]
        return self.cards[(device if isinstance(device, int) else torch.device(device).index) or 0]

    def add(self, total: int, other: int = 0) -> Card:
        self.cards.append(Card(total, other))
        return self.cards[-1]

    # ------------------------------------------------------------------ the allocator

    def allocate(self, nbytes: int, device=0) -> Weights:
        """`nbytes` of tensors on `device`, held by the returned object (cached blocks reused first)."""
        card = self.card(device)
        needed = card.allocated + nbytes - card.reserved       # beyond the cached free blocks
        if needed > card.free:
            self.empty_cache()                                  # torch retries once with its cache emptied
            needed = card.allocated + nbytes - card.reserved
            if needed > card.free:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes / GiB:.2f} GiB")
        card.reserved += max(0, needed)
        card.allocated += nbytes
        return Weights(card, nbytes)

    def empty_cache(self) -> None:
        """Every card's cached blocks that nothing allocates go back to the driver; live ones stay."""
        self.emptied += 1
        for card in self.cards:
            card.reserved = card.allocated

    # ------------------------------------------------------------------ torch.cuda's answers

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.cards)

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, device=None) -> tuple[int, int]:
        self.asked.append(device)
        card = self.card(device)
        return card.free, card.total

    def is_bf16_supported(self, *args, **kwargs) -> bool:
        return self.bf16

    def get_device_name(self, device=None) -> str:
        return self.name

    def memory_reserved(self, device=None) -> int:
        return self.card(device).reserved

    def memory_allocated(self, device=None) -> int:
        return self.card(device).allocated
