"""Where a serving engine's server runs on a GPU that specviz's own loop may hold too: small pure
decisions from the facts (the device asked for, the memory free and total on it, how many devices
there are, the user's own server arguments), and `read_gpu`, the one place the facts are read.

- Pinning: `--device cuda:N` gives the server `CUDA_VISIBLE_DEVICES` naming that one GPU (vLLM and
  llama.cpp otherwise start on the first visible one, which may be the GPU the own loop holds). N counts
  as specviz counts, among the GPUs specviz sees: when specviz's own environment narrows them with
  `CUDA_VISIBLE_DEVICES`, the server gets the N-th entry of that list. "auto" and "cuda" pin nothing:
  the server sees what specviz sees (tensor parallelism over several GPUs keeps working).
- vLLM's share: `--gpu-memory-utilization` is the fraction of the device's whole memory one vLLM
  instance may take, and vLLM refuses to start when less than that is free. Its default (0.9) assumes
  the GPU to itself; next to the own loop's models it would not start. So before a server starts the
  own loop's cached models are let go (`free_own_models`), and the share is what is really free then,
  less `MARGIN` (the server's own CUDA context and allocator slack), at most vLLM's default. A share
  the user gives in their server arguments is theirs.
- llama.cpp on a GPU build: every layer offloaded (`GPU_LAYERS_ALL`); a CPU build gets no flag.

On a CPU nothing here runs: no torch import, no flag, no variable, the servers start as they always did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import SpecvizError

GIB = 1 << 30
MARGIN = 1 * GIB              # left free beside vLLM's share: its processes' CUDA contexts, allocator slack
MAX_UTILIZATION = 0.9         # vLLM's own default share, for a GPU it has to itself
MIN_SERVER_BYTES = 2 * GIB    # below this (after the margin) a server cannot hold a model and a KV cache
GPU_LAYERS_ALL = "999"        # llama.cpp's --n-gpu-layers for "all": clamped to the model's layers, and every
                              # version takes a number (newer ones also "all"; -1 now means "as many as fit")
VLLM_POLICY = ("own loop's cached models let go before each server; --gpu-memory-utilization = min(0.9, (free - 1 "
               "GiB) / total) unless given; cuda:N pinned with CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Gpu:
    """The facts about the GPU a server will run on: `index` as specviz counts (None: not asked for by
    number), its memory in bytes now (None when specviz's own torch cannot see it), and `count`, the
    GPUs specviz sees."""

    index: int | None
    free: int | None
    total: int | None
    count: int | None


def device_index(device: str) -> int | None:
    """N for "cuda:N"; None for "auto", "cuda" and anything else."""
    kind, _, index = (device or "auto").strip().lower().partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else None


# vLLM's short names for its flags (`vllm serve --help`): the same flag, read alike.
SHORT_FLAGS = {"--tensor-parallel-size": ("-tp",), "--pipeline-parallel-size": ("-pp",)}


def given(flag: str, engine_args: Sequence[str]) -> str | None:
    """The value the user's server arguments give `flag` or its short name ("--flag=V", "--flag V",
    "-tp=2", "-tp 2"), else None."""
    names = (flag, *SHORT_FLAGS.get(flag, ()))
    words = list(engine_args)
    for i, word in enumerate(words):
        if word in names:
            return words[i + 1] if i + 1 < len(words) else ""
        name, equals, value = word.partition("=")
        if equals and name in names:
            return value
    return None


def visible_devices(index: int, count: int | None, parent: str | None) -> str:
    """`CUDA_VISIBLE_DEVICES` for a server on specviz's GPU `index`, given specviz's own (`parent`);
    `count`: the GPUs specviz sees (None: unknown, its torch has no CUDA)."""
    if count is not None and not 0 <= index < count:
        raise SpecvizError(f"Device cuda:{index} asked for, but only {count} GPU(s) are visible.")
    entries = [entry.strip() for entry in (parent or "").split(",") if entry.strip()]
    return entries[index] if entries else str(index)


def memory_utilization(free: int, total: int, margin: int = MARGIN) -> float:
    """vLLM's --gpu-memory-utilization for what is free now: min(0.9, (free - margin) / total), rounded
    down to a hundredth (vLLM checks free >= share x total at start)."""
    usable = free - margin
    if usable < MIN_SERVER_BYTES:
        raise SpecvizError(
            f"Only {free / GIB:.1f} GiB of the GPU's {total / GIB:.1f} GiB are free (specviz's own models were let go "
            f"first); a vLLM server needs {(MIN_SERVER_BYTES + margin) / GIB:.0f} GiB or more. Free the GPU (another "
            "program holds it), pick another with --device cuda:N, or give the share yourself with "
            "--engine-arg=--gpu-memory-utilization=F.")
    return min(MAX_UTILIZATION, int(100 * usable / total) / 100)


def server_env(gpu: Gpu | None, engine_args: Sequence[str], parent: Mapping[str, str]) -> dict[str, str]:
    """The variables a server gets on top of specviz's environment: the pin for cuda:N, else none."""
    if gpu is None or gpu.index is None:
        return {}
    parallel = [given(flag, engine_args) for flag in ("--tensor-parallel-size", "--pipeline-parallel-size")]
    if any(value not in (None, "", "1") for value in parallel):
        raise SpecvizError(f"--device cuda:{gpu.index} pins the server to one GPU; tensor or pipeline parallelism "
                           "needs several: leave --device out (or set CUDA_VISIBLE_DEVICES to the GPUs to use).")
    return {"CUDA_VISIBLE_DEVICES": visible_devices(gpu.index, gpu.count, parent.get("CUDA_VISIBLE_DEVICES"))}


def vllm_gpu_args(gpu: Gpu | None, engine_args: Sequence[str]) -> list[str]:
    """vLLM's arguments for the GPU: its memory share from what is free, unless the user gave one, or
    specviz's torch cannot see the memory (then vLLM's default applies, and vLLM says if it cannot start)."""
    if gpu is None or gpu.free is None or gpu.total is None:
        return []
    if given("--gpu-memory-utilization", engine_args) is not None:
        return []
    return ["--gpu-memory-utilization", f"{memory_utilization(gpu.free, gpu.total):.2f}"]


def llamacpp_gpu_args(on_gpu: bool, engine_args: Sequence[str]) -> list[str]:
    """llama-server's arguments for a GPU build: every layer on the GPU, unless the user said otherwise."""
    if not on_gpu or any(given(flag, engine_args) is not None for flag in ("--n-gpu-layers", "-ngl", "--gpu-layers")):
        return []
    return ["--n-gpu-layers", GPU_LAYERS_ALL]


# ----------------------------------------------------------------------------- the facts

def free_own_models() -> None:
    """Let go of the own loop's cached models and return their GPU memory to the driver (the next own
    run loads them again)."""
    from ..models.cache import model_cache      # torch: imported only when a server is to run on a GPU

    model_cache.clear()


def read_gpu(device: str) -> Gpu:
    """The GPU a server on `device` ("auto", "cuda", "cuda:N") runs on, as specviz's torch sees it now.
    Call after `free_own_models`. Without a CUDA torch here only the index is known."""
    import torch

    index = device_index(device)
    if not torch.cuda.is_available():
        return Gpu(index, None, None, None)
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise SpecvizError(f"Device {device!r} asked for, but only {count} GPU(s) are visible.")
    free, total = torch.cuda.mem_get_info(torch.cuda.current_device() if index is None else index)
    return Gpu(index, free, total, count)
