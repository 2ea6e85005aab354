"""Loaded models kept in memory by (source, dtype, device), least recently used first out once their
total size passes a budget (SPECVIZ_MODEL_MEMORY_GB, default 8)."""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

log = logging.getLogger(__name__)

CACHE_BUDGET_ENV = "SPECVIZ_MODEL_MEMORY_GB"   # in-memory model cache budget, GiB
DEFAULT_CACHE_BUDGET_GB = 8.0

def collect() -> None:
    """A full collection that reaches frozen objects too: the app freezes its start-up objects (the
    default pair among them) so that collections skip them, and an evicted pair must still be freed.
    They are unfrozen for good: decoding pauses the collector anyway (`core.timing`)."""
    gc.unfreeze()
    gc.collect()


class ModelCache:
    """Values by key, least recently used first out once the total size passes `budget_bytes`.
    Keys in `keep` (the pair being loaded) are never evicted, nor is the newest entry."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()

    def get(self, key: Hashable) -> Any | None:
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key][0]

    def put(self, key: Hashable, value: Any, nbytes: int, keep: set = frozenset()) -> None:
        self._entries[key] = (value, nbytes)
        self._entries.move_to_end(key)
        self.make_room(0, set(keep) | {key})

    def make_room(self, nbytes: int, keep: set = frozenset()) -> None:
        """Evict least recently used entries until `nbytes` more fit in the budget."""
        evicted = False
        while self.total_bytes + nbytes > self.budget_bytes:
            victim = next((key for key in self._entries if key not in keep), None)
            if victim is None:
                break
            log.info("evicting %s from the model cache", victim)
            del self._entries[victim]
            evicted = True
        if evicted:
            collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def bytes_on(self, device: torch.device | str) -> int:
        """What the cached models on `device` take (keys end with the device, as `loading` writes them)."""
        return sum(nbytes for key, (_, nbytes) in self._entries.items() if key[-1] == str(device))

    def bytes_of(self, keys) -> int:
        """What the cached models among `keys` take."""
        return sum(self._entries[key][1] for key in keys if key in self._entries)

    def evict_from(self, device: torch.device | str, keep: set = frozenset()) -> int:
        """Evict every cached model on `device` but those in `keep`; returns the bytes freed."""
        victims = [key for key in self._entries if key[-1] == str(device) and key not in keep]
        freed = sum(self._entries[key][1] for key in victims)
        for key in victims:
            log.info("evicting %s from the model cache to make room on %s", key, device)
            del self._entries[key]
        if victims:
            collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return freed

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self._entries.values())

    def keys(self) -> list:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __len__(self) -> int:
        return len(self._entries)


def _budget_from_env() -> int:
    value = os.environ.get(CACHE_BUDGET_ENV, "")
    try:
        gib = float(value) if value else DEFAULT_CACHE_BUDGET_GB
    except ValueError:
        log.warning("%s=%r is not a number; using %s GiB", CACHE_BUDGET_ENV, value, DEFAULT_CACHE_BUDGET_GB)
        gib = DEFAULT_CACHE_BUDGET_GB
    return int(gib * 2**30)


model_cache = ModelCache(_budget_from_env())
lock = threading.RLock()   # one load at a time: two UI events must not load the same model twice


