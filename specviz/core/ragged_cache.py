"""KV caches that decoding can roll back, and the batch cache whose rows hold different numbers of tokens.

Rolling back (`new_cache`): speculative decoding drops the rejected drafts from every cache after each
pass. transformers' sliding-window layers (Gemma 2/3, Mistral-style configs, Phi-3) keep only the last
`sliding_window` positions and cannot be cropped once the window is full, so every cache here keeps
every position in every layer (a plain `DynamicCache`, no per-layer types), and a sliding layer sees
its window through its attention mask instead: the model builds that mask itself when it gets none
(a single request), and `attention_masks` builds it for the batch layout. Layers whose state is not
a list of positions (linear attention, state-space layers) cannot be rolled back at all: `new_cache`
refuses them, before any work.

The batch cache (`RaggedCache`): one batched DynamicCache whose columns are slots, and a (B, C)
`valid` mask saying which slots hold a row's tokens. New tokens go in as a block, right-aligned per
row (left padding); each row's position ids count its own valid slots, and a float 4D mask lets a
query see only its row's valid slots and the earlier real tokens of its block (and, in a sliding
layer, only those within its window). After verification a row's rejected slots are marked invalid,
not removed; trailing slots no row uses are cropped. What this costs: every pass attends over the
holes and the padding too (reported per pass as `padded_slots`), and the block is as wide as the
longest row's. When the cache is more than twice as long as its longest row, it is re-gathered (each
row's valid slots moved, left-padded, to the front: one copy of the whole cache, reported as
`regathered`). A cache of one row never has holes or padding (its rejected slots are always the
last ones, cropped): it runs as a plain cache, the model building its own causal mask.

Row lengths and the `valid` mask live on the host (the loop knows what each row accepted), so rolling
back, leaving and deciding to re-gather read nothing back from the device; a forward sends its new
ids and the mask to the device in one copy, and a draft model's drafting steps (one device token per
row) send nothing. Host syncs per pass are counted by scripts/host_syncs.py."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, PreTrainedModel

MAX_HOLES = 0.5             # re-gather a cache when more than this share of its slots could be won back
POSITIONAL = {"full_attention", "sliding_attention"}     # layer types whose cache is a list of positions


def _text_config(model: PreTrainedModel):
    return model.config.get_text_config(decoder=True)


# The first transformers release whose models take the KV cache as `cache=` (5.23 and older take it in
# **kwargs and ignore it: every pass recomputes the whole sequence, outputs right, timings meaningless).
# Checked by installing 5.23.0 and 5.24.0 and reading their Llama forward; see requirements.txt.
FIRST_TRANSFORMERS = (5, 24)


def check_transformers(version: str | None = None) -> None:
    """Refuse a transformers older than FIRST_TRANSFORMERS (the installed one unless `version` is given)."""
    version = version or transformers.__version__
    if Version(version).release[:2] < FIRST_TRANSFORMERS:
        first = ".".join(map(str, FIRST_TRANSFORMERS))
        raise ValueError(f"transformers {version} is too old for specviz: its models ignore the KV cache specviz "
                         f"passes (`cache=`), so every pass would recompute the whole sequence. Install "
                         f"transformers>={first},<6 (pip install -U 'transformers>={first},<6').")


def check_rollback(model: PreTrainedModel) -> None:
    """Refuse a model whose cache cannot be rolled back to an earlier length (with why), or that the
    installed transformers would run without a cache."""
    check_transformers()
    types = set(getattr(_text_config(model), "layer_types", None) or ())
    other = sorted(types - POSITIONAL)
    if other:
        raise ValueError(f"{type(model).__name__} has {', '.join(other)} layers: their cached state is not a list "
                         "of positions, so it cannot be rolled back after a rejected draft. Speculative decoding "
                         "here needs attention layers only (full or sliding-window).")


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """A KV cache of `model` that keeps every position in every layer, so it can be cropped to any
    length (sliding layers included: see the module docstring)."""
    check_rollback(model)
    return DynamicCache()


def sliding_window(model: PreTrainedModel) -> tuple[int | None, bool]:
    """(the window of the model's sliding layers or None, whether the model takes one mask per layer type)."""
    config = _text_config(model)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:                         # one mask per layer type ({"full_attention": ..., ...})
        return (window if "sliding_attention" in types else None), True
    return window, False                           # Mistral-style: every layer slides when a window is set


def attention_masks(model: PreTrainedModel, seen: torch.Tensor, query_positions: torch.Tensor,
                    key_positions: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
    """The additive mask(s) the model's layers take for a (B, Q, K) "may attend" matrix, where query q
    sits at position query_positions[b, q] and key slot j holds position key_positions[b, j]: one
    (B, 1, Q, K) float mask, or one per layer type when the model has sliding layers (those also
    drop keys at or beyond the window behind the query, as transformers' sliding masks do)."""
    window, per_type = sliding_window(model)
    dtype = model.dtype

    def additive(may: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(may.shape, dtype=dtype, device=may.device)
        return mask.masked_fill_(~may, torch.finfo(dtype).min)[:, None]

    if window is None:
        return additive(seen)
    near = (query_positions[:, :, None] - key_positions[:, None, :]) < window
    # A query always sees itself (its own slot is at distance 0), so no row of the sliding mask is empty.
    sliding = additive(seen & near)
    return {"full_attention": additive(seen), "sliding_attention": sliding} if per_type else sliding


def hidden_request(layers: Sequence[int]) -> dict:
    """The target forward's keyword asking for these hidden states (none when `layers` is empty)."""
    return {"output_hidden_states": list(layers)} if layers else {}


def hidden_features(out, layers: Sequence[int]) -> torch.Tensor:
    """The requested hidden states of a forward's output, concatenated on the last dimension."""
    states = [out.hidden_states[i] for i in layers]
    return states[0] if len(states) == 1 else torch.cat(states, dim=-1)



class RaggedCache:
    """A batched KV cache over rows of different lengths (see the module docstring)."""

    def __init__(self, model: PreTrainedModel, batch: int):
        self.model = model
        self.cache = new_cache(model)
        self.batch = batch
        # One row: no mask needed (None). Several: which slots hold each row's tokens, on the host, and
        # its copy on the device as the last forward sent it (None once the host's has changed since).
        self.valid = None if batch == 1 else torch.zeros(batch, 0, dtype=torch.bool)
        self._device_valid = None if batch == 1 else torch.zeros(batch, 0, dtype=torch.bool, device=model.device)
        self._lengths = [0] * batch
        self._hidden = None         # (last hidden states, tokens fed per row) of the last forward asked for them

    def lengths(self) -> list[int]:
        """Tokens each row holds."""
        if self.valid is None:
            return [self.cache.get_seq_length()]   # a single row may also be edited in place (trees)
        return list(self._lengths)

    def forward(self, blocks: Sequence[Sequence[int]], keep: int, tail: torch.Tensor | None = None,
                tail_lengths: Sequence[int] | None = None,
                hidden_layers: Sequence[int] = ()) -> tuple[torch.Tensor, int, int]:
        """Feed row r the tokens `blocks[r]` (host ids) followed by `tail[r, :tail_lengths[r]]` (ids
        already on the device, such as drafted tokens), right-aligned in one (B, W) input (a row with
        nothing to feed: one padding slot). Returns the logits of the last `keep` positions (B, keep,
        V; row r's own are its last len(blocks[r]) + tail_lengths[r]), the pass's key slots (B x
        (C + W)) and how many of them are padding or holes (computed and attended over, then
        masked: the ragged layout's waste). With `hidden_layers`, the target's hidden states of those
        layers (concatenated) of the fed tokens are kept for `fed_hidden` (for a drafter that drafts
        from them: core.head)."""
        tail_lengths = list(tail_lengths) if tail is not None else [0] * len(blocks)
        if self.valid is None:
            return self._forward_one(blocks[0], keep, tail, tail_lengths[0], hidden_layers)
        device, batch = self.model.device, len(blocks)
        sizes = [len(block) + extra for block, extra in zip(blocks, tail_lengths)]
        width = max(1, max(sizes))
        cached = self.valid.shape[1]
        host_real = torch.zeros(batch, width, dtype=torch.bool)
        for row, size in enumerate(sizes):
            host_real[row, width - size:] = size > 0
        host_columns = torch.cat([self.valid, host_real], dim=1)              # (B, C + W)
        if self._device_valid is not None and min(sizes) == width == min(tail_lengths):
            # Every row takes `width` device tokens and nothing else (a draft model's drafting step):
            # nothing to send.
            ids = tail[:, :width]
            columns = torch.cat([self._device_valid, torch.ones(batch, width, dtype=torch.bool, device=device)], dim=1)
        else:
            ids, columns = self._send(blocks, sizes, width, host_columns, tail, tail_lengths)
        # Each row's tokens sit at positions counted from its own tokens, holes and padding skipped.
        key_positions = columns.cumsum(dim=1) - 1
        positions = key_positions[:, cached:].clamp(min=0)
        causal = torch.ones(width, cached + width, dtype=torch.bool, device=device).tril(cached)
        seen = columns[:, None, :] & causal[None]
        # A padding query sees itself, so that no row of the mask is empty (its output is unused).
        arange = torch.arange(width, device=device)
        seen[:, arange, cached + arange] = True
        key_positions[:, cached:] = positions
        masks = attention_masks(self.model, seen, positions, key_positions)
        out = self.model(ids, cache=self.cache, attention_mask=masks, position_ids=positions,
                         logits_to_keep=keep, **hidden_request(hidden_layers))
        logits = out.logits
        self._hidden = (hidden_features(out, hidden_layers), sizes) if hidden_layers else None
        self.valid, self._device_valid = host_columns, columns
        self._lengths = [have + size for have, size in zip(self._lengths, sizes)]
        slots = host_columns.shape[0] * host_columns.shape[1]
        return logits, slots, slots - sum(self._lengths)

    def _send(self, blocks, sizes, width, host_columns, tail, tail_lengths) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass's (B, W) input ids and (B, C + W) valid slots on the device, in one copy from the
        host: the host ids of each row's block, the mask, and where each row's device tokens start
        (those are then written in on the device)."""
        batch, device = len(blocks), self.model.device
        span = max(tail_lengths) if tail is not None else 0
        host_ids = torch.zeros(batch, width, dtype=torch.long)
        for row, (block, size) in enumerate(zip(blocks, sizes)):
            if block:
                host_ids[row, width - size:width - size + len(block)] = torch.tensor(list(block))
        starts = torch.tensor([span - n for n in tail_lengths])[:, None]
        sent = torch.cat([host_ids, host_columns.long(), starts], dim=1).to(device)
        ids, columns = sent[:, :width], sent[:, width:-1].bool()
        if span:
            # The device tokens end each row: row r's last tail_lengths[r] slots hold tail[r, :tail_lengths[r]].
            offset = torch.arange(span, device=device)[None] - sent[:, -1:]
            ids = ids.clone()
            ids[:, width - span:] = torch.where(offset >= 0, tail[:, :span].gather(1, offset.clamp(min=0)),
                                                ids[:, width - span:])
        return ids, columns

    def _forward_one(self, block: Sequence[int], keep: int, tail: torch.Tensor | None,
                     tail_length: int, hidden_layers: Sequence[int]) -> tuple[torch.Tensor, int, int]:
        device = self.model.device
        parts = [torch.tensor([list(block)], dtype=torch.long, device=device)] if block else []
        if tail is not None and tail_length:
            parts.append(tail[:1, :tail_length])
        ids = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        out = self.model(ids, cache=self.cache, logits_to_keep=keep, **hidden_request(hidden_layers))
        self._hidden = (hidden_features(out, hidden_layers), [ids.shape[1]]) if hidden_layers else None
        slots = self.cache.get_seq_length()
        return out.logits, slots, 0

    def fed_hidden(self, counts: Sequence[int]) -> list[torch.Tensor]:
        """After a `forward(..., hidden_layers=...)`: per row, the hidden states (counts[r], n * H) of
        the first counts[r] tokens it was fed (rows are right-aligned in the pass's input)."""
        states, sizes = self._hidden
        width = states.shape[1]
        return [states[row, width - size:width - size + count] for row, (size, count) in enumerate(zip(sizes, counts))]

    def keep(self, lengths: Sequence[int]) -> bool:
        """Row r keeps only its first lengths[r] tokens (the rest become holes); slots no row uses at
        the end are cropped. Re-gathers when that wins slots back (see `_compact_if_sparse`); returns
        whether it did."""
        if self.valid is None:
            excess = self.cache.get_seq_length() - lengths[0]
            if excess > 0:
                self.cache.crop(-excess)
            return False
        lengths = [min(length, have) for length, have in zip(lengths, self._lengths)]
        if lengths == self._lengths:
            return False
        rank = self.valid.cumsum(dim=1)
        self.valid &= rank <= torch.tensor(lengths)[:, None]
        self._device_valid = None                       # sent with the next forward
        self._lengths = lengths
        # The last slot any row uses: rows are right-aligned blocks, so the trailing columns hold each
        # row's newest tokens; crop those no row still uses.
        used = self.valid.any(dim=0)
        end = self.valid.shape[1] - int(used.flip(0).to(torch.int8).argmax()) if max(lengths) else 0
        if end < self.valid.shape[1]:
            self.cache.crop(end - self.valid.shape[1])
            self.valid = self.valid[:, :end]
        return self._compact_if_sparse()

    def select(self, rows: Sequence[int]) -> bool:
        """Keep only `rows` (finished rows leave the batch); returns whether it re-gathered."""
        if self.valid is None:
            return False
        index = torch.tensor(list(rows), dtype=torch.long)
        on_device = index.to(self.model.device)
        self.cache.batch_select_indices(on_device)
        self.valid = self.valid[index]
        self._device_valid = None if self._device_valid is None else self._device_valid[on_device]
        self._lengths = [self._lengths[row] for row in rows]
        self.batch = len(rows)
        return self._compact_if_sparse()

    def _compact_if_sparse(self) -> bool:
        # Compacting pads every row to the longest one, so only the slots beyond the longest row's
        # count can be won back: re-gather when they are more than MAX_HOLES of the cache (a batch of
        # very different prompt lengths is mostly padding, and no re-gather would shrink it).
        if not self.valid.numel():
            return False
        width = max(self._lengths)
        if self.valid.shape[1] - width <= MAX_HOLES * self.valid.shape[1]:
            return False
        # Row r's valid slots in order, left-padded (with slot 0, masked) to the longest row's count.
        # The slot of row r's i-th token: the first column where its running count reaches i + 1.
        # Computed on the host from its mask, sent in one copy.
        counts = torch.tensor(self._lengths)
        rank = self.valid.cumsum(dim=1)
        targets = torch.arange(1, width + 1)[None] - (width - counts)[:, None]
        order = torch.searchsorted(rank.contiguous(), targets.clamp(min=1).contiguous())
        order = torch.where(targets >= 1, order, torch.zeros_like(order)).to(self.model.device)
        for layer in self.cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
        self.valid = torch.arange(width)[None] >= (width - counts)[:, None]
        self._device_valid = None
        return True
