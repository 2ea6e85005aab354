"""One GPU memory budget for a pair: the target's and the draft's weights and their KV caches, against
what the card has for specviz, decided before any weight loads.

The budget is the card's total less a reserve (CUDA's context, activations, the allocator's slack)
less what other programs hold; what specviz itself holds (its cached models, the allocator's cached
free blocks) counts as available, because it can be given back. So the same pair gets the same
answer on the same card every time, whether or not an earlier copy of it is still cached (reading
the free memory alone made a 12-14B model load in fp32, then bf16, then fp32). A pair that does not
fit is refused with the sizes and what to do: nothing is spread onto the CPU (accelerate's
`device_map="auto"` would, and a pass that crosses PCIe for its weights times transfers, not
speculation)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

from ..errors import SpecvizError
from .cache import collect, model_cache

RESERVE_SHARE = 0.10        # of the card's total: CUDA's context, activations, fragmentation
PLANNED_TOKENS = 4096       # each model's KV cache is budgeted for one sequence of this many tokens
GB = 1e9


@dataclass(frozen=True)
class GpuMemory:
    """What a card has, in bytes: `free` as the driver reports it, `held` what specviz itself holds
    there and could give back (its cached models, torch's cached free blocks)."""
    name: str
    total: int
    free: int
    held: int

    @property
    def others(self) -> int:
        """What other programs (another engine's server, another process) hold on the card."""
        return max(0, self.total - self.free - self.held)

    @property
    def budget(self) -> int:
        """What a pair may take: the total less the reserve and less what others hold."""
        return max(0, int(self.total * (1 - RESERVE_SHARE)) - self.others)


@dataclass(frozen=True)
class Need:
    """One model's share of the budget."""
    name: str
    weights: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


def read_gpu_memory(device: torch.device) -> GpuMemory:
    """The card behind `device` as the driver and this process's allocator see it now."""
    free, total = torch.cuda.mem_get_info(device)
    cached_free_blocks = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    held = min(total - free, model_cache.bytes_on(device) + max(0, cached_free_blocks))
    return GpuMemory(torch.cuda.get_device_name(device), total, free, held)


def bits_per_weight(config) -> float | None:
    """What a quantized checkpoint stores per weight of its linear layers, in bits, from its
    `quantization_config` (their scales included); None when it is not quantized, or by a method not
    known here (then its dtype's size is assumed). bitsandbytes: 4 bits with a 32-bit scale per 64
    weights, or 8; GPTQ and AWQ: their `bits`, with a 16-bit scale and a zero point per `group_size`
    weights; fp8: 8; compressed-tensors: its weights' `num_bits`."""
    quantization = getattr(config, "quantization_config", None)
    if quantization is None:
        return None
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict() if hasattr(quantization, "to_dict") else vars(quantization)
    method = str(quantization.get("quant_method", "")).lower()
    if method == "bitsandbytes" or "load_in_4bit" in quantization or "load_in_8bit" in quantization:
        return 4.5 if quantization.get("load_in_4bit") else 8.0 if quantization.get("load_in_8bit") else None
    if "fp8" in method:
        return 8.0
    if method == "compressed-tensors":
        bits = [group.get("weights", {}).get("num_bits") for group in quantization.get("config_groups", {}).values()
                if isinstance(group, dict) and isinstance(group.get("weights"), dict)]
        return float(max(bits)) if bits and all(isinstance(b, int) for b in bits) else None
    bits = quantization.get("bits") or quantization.get("w_bit")          # GPTQ, AWQ (and AutoAWQ's own name)
    if not isinstance(bits, int) or bits <= 0:
        return None
    group = quantization.get("group_size") or quantization.get("q_group_size") or 128
    return bits + ((16 + bits) / group if group > 0 else 0.0)           # group_size -1: one scale per row


def weight_bytes(model: torch.nn.Module, config, dtype: torch.dtype) -> int:
    """The weights of `model` (built on the meta device from `config`) as the checkpoint loads them: in
    `dtype`, but a quantized checkpoint's linear layers at its bits per weight (`bits_per_weight`; the
    output head, the embeddings and the norms stay in `dtype`, as the quantizers leave them)."""
    total = sum(p.numel() for p in model.parameters())
    bits = bits_per_weight(config)
    if bits is None:
        return total * dtype.itemsize
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    quantized = sum(module.weight.numel() for module in model.modules()
                    if isinstance(module, torch.nn.Linear) and module is not head)
    return int(quantized * bits / 8) + (total - quantized) * dtype.itemsize


def kv_cache_bytes(config, dtype: torch.dtype, tokens: int = PLANNED_TOKENS) -> int:
    """Keys and values of every layer for `tokens` positions (one sequence) in `dtype`."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None) or 1
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * tokens * dtype.itemsize


def check_fits(needs: list[Need], gpu: GpuMemory, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, with the sizes and the ways out, a pair whose weights and KV caches exceed the budget."""
    need = sum(item.total for item in needs)
    if need <= gpu.budget:
        return
    parts = " + ".join(f"{item.name} {item.weights / GB:.1f} GB" for item in needs)
    kv = sum(item.kv_cache for item in needs)
    others = f", {gpu.others / GB:.1f} GB held by other programs" if gpu.others >= 0.5 * GB else ""
    name = str(dtype).removeprefix("torch.")
    ways = ["a smaller target or draft"]
    if dtype == torch.float32:
        ways.insert(0, "dtype auto (the checkpoint's half precision)")
    if others:
        ways.append("stopping what else uses the card (an engine's server?)")
    ways.append("device cpu")
    raise SpecvizError(
        f"Does not fit {device} ({gpu.name}, {gpu.total / GB:.0f} GB{others}): in {name} the weights ({parts}) "
        f"and the KV cache for {PLANNED_TOKENS:,} tokens ({kv / GB:.1f} GB) need ~{need / GB:.1f} GB, and "
        f"specviz may use ~{gpu.budget / GB:.1f} GB ({RESERVE_SHARE:.0%} of the card is kept for activations). "
        f"Nothing was loaded; specviz does not spread a model onto the CPU (its passes would time the "
        f"transfers, not speculation). Try {', '.join(ways[:-1])} or {ways[-1]}.")


def make_room(needs: list[Need], device: torch.device, dtype: torch.dtype, keep: set[Hashable]) -> GpuMemory:
    """Check the pair against the card's budget (`check_fits`), then evict specviz's other cached
    models on the card where the pair would not fit beside them. Evicting frees a model's memory only
    if nothing else still holds it (a run decoding with it in another session): the card is read again,
    and a pair that still does not fit is refused before it loads. Returns the card as first read."""
    gpu = read_gpu_memory(device)
    if sum(item.total for item in needs) > gpu.budget:
        # A model let go of but not yet collected (a model's modules refer to each other) still holds
        # its memory, and would count as another program's: collect, give the blocks back, read again.
        collect()
        torch.cuda.empty_cache()
        gpu = read_gpu_memory(device)
    check_fits(needs, gpu, dtype, device)
    still_to_load = sum(item.total for item in needs) - model_cache.bytes_of(keep)
    reusable = gpu.free + gpu.held - model_cache.bytes_on(device)      # free, and torch's cached free blocks
    if still_to_load > reusable:
        model_cache.evict_from(device, keep)
        after = read_gpu_memory(device)
        room = after.free + after.held - model_cache.bytes_on(device)
        if still_to_load > room:
            in_use = max(0, after.others - gpu.others)
            raise SpecvizError(
                f"Does not fit {device} ({gpu.name}) yet: specviz let go of its other cached models there, but "
                f"{in_use / GB:.1f} GB of them are still in use (a run with an earlier pair, in another tab or "
                f"session?), and ~{still_to_load / GB:.1f} GB are needed where {room / GB:.1f} GB are free. "
                f"Nothing was loaded; try again when that run has finished.")
    return gpu
