"""The KV cache of a batch whose rows hold different numbers of tokens.

Ragged caches (`RaggedCache`): one batched DynamicCache whose columns are slots, and a (B, C) `valid`
mask saying which slots hold a row's tokens. New tokens go in as a block, right-aligned per row (left
padding); each row's position ids count its own valid slots, and a float 4D mask (B, 1, W, C + W)
lets a query see only its row's valid slots and the earlier real tokens of its block. After
verification a row's rejected slots are marked invalid, not removed; trailing slots no row uses are
cropped. What this costs: every pass attends over the holes and the padding too (reported per pass as
`padded_slots`), and the block is as wide as the longest row's, so a row that drafted little pays for
the row that drafted most. When the cache is more than twice as long as its longest row (holes that
compaction could win back), it is re-gathered (each row's valid slots moved, left-padded, to the
front: one copy of the whole cache, reported as `regathered`). Padding from prompts of different
lengths stays: compaction pads every row to the longest."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

MAX_HOLES = 0.5             # re-gather a cache when more than this share of its slots could be won back


class RaggedCache:
    """A batched KV cache over rows of different lengths (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, batch: int):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=model.device)

    def lengths(self) -> list[int]:
        """Tokens each row holds."""
        return self.valid.sum(dim=1).tolist()

    def forward(self, blocks: Sequence[Sequence[int]], keep: int) -> tuple[torch.Tensor, int, int]:
        """Feed row r the tokens `blocks[r]` (an empty block: one padding slot), right-aligned in one
        (B, W) input. Returns the logits of the last `keep` positions (B, keep, V; row r's own are its
        last len(blocks[r])), the pass's key slots (B x (C + W)) and how many of them are padding or
        holes (computed and attended over, then masked: the ragged layout's waste)."""
        device, batch = self.valid.device, len(blocks)
        width = max(1, max(len(block) for block in blocks))
        ids = torch.zeros(batch, width, dtype=torch.long)
        real = torch.zeros(batch, width, dtype=torch.bool)
        for row, block in enumerate(blocks):
            if block:
                ids[row, width - len(block):] = torch.tensor(list(block))
                real[row, width - len(block):] = True
        ids, real = ids.to(device), real.to(device)
        # Each row's tokens sit at positions counted from its own tokens, holes and padding skipped.
        positions = (self.valid.sum(dim=1, keepdim=True) + real.cumsum(dim=1) - 1).clamp_(min=0)
        cached = self.valid.shape[1]
        columns = torch.cat([self.valid, real], dim=1)                        # (B, C + W)
        causal = torch.ones(width, cached + width, dtype=torch.bool, device=device).tril(cached)
        seen = columns[:, None, :] & causal[None]
        # A padding query sees itself, so that no row of the mask is empty (its output is unused).
        seen[:, torch.arange(width, device=device), cached + torch.arange(width, device=device)] = True
        dtype = self.model.dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)
        logits = self.model(ids, cache=self.cache, attention_mask=mask[:, None], position_ids=positions,
                            logits_to_keep=keep).logits
        self.valid = columns
        return logits, columns.numel(), columns.numel() - int(columns.sum())

    def keep(self, lengths: Sequence[int]) -> bool:
        """Row r keeps only its first lengths[r] tokens (the rest become holes); slots no row uses at
        the end are cropped. Re-gathers when that wins slots back (see `_compact_if_sparse`); returns
        whether it did."""
        rank = self.valid.cumsum(dim=1)
        self.valid &= rank <= torch.tensor(list(lengths), device=self.valid.device)[:, None]
        used = self.valid.any(dim=0).nonzero()
        end = int(used[-1]) + 1 if used.numel() else 0
        if end < self.valid.shape[1]:
            self.cache.crop(end - self.valid.shape[1])
            self.valid = self.valid[:, :end]
        return self._compact_if_sparse()

    def select(self, rows: Sequence[int]) -> bool:
        """Keep only `rows` (finished rows leave the batch); returns whether it re-gathered."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.valid.device)
        self.cache.batch_select_indices(index)
        self.valid = self.valid[index]
        return self._compact_if_sparse()

    def _compact_if_sparse(self) -> bool:
        # Compacting pads every row to the longest one, so only the slots beyond the longest row's
        # count can be won back: re-gather when they are more than MAX_HOLES of the cache (a batch of
        # very different prompt lengths is mostly padding, and no re-gather would shrink it).
        if not self.valid.numel():
            return False
        counts = self.valid.sum(dim=1)
        width = int(counts.max())
        if self.valid.shape[1] - width <= MAX_HOLES * self.valid.shape[1]:
            return False
        # Row r's valid slots in order, left-padded (with slot 0, masked) to the longest row's count.
        order = torch.zeros(self.valid.shape[0], width, dtype=torch.long, device=self.valid.device)
        for row in range(self.valid.shape[0]):
            slots = self.valid[row].nonzero()[:, 0]
            order[row, width - slots.numel():] = slots
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        self.valid = torch.arange(width, device=self.valid.device)[None] >= (width - counts)[:, None]
        return True
