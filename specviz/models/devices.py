"""Which device and dtype a run uses: 'auto' resolved for this machine, and clear refusals."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..errors import SpecvizError
from .host import parse_cpuinfo, read_cpuinfo

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes in bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated
    and slower than fp32. `cpuinfo`: /proc/cpuinfo's text (default: this machine's)."""
    info = read_cpuinfo() if cpuinfo is None else parse_cpuinfo(cpuinfo)
    return bool(info.flags & {"avx512_bf16", "amx_bf16"})


def auto_dtype(device_type: str, *, checkpoint: torch.dtype | None = None, cuda_bf16: bool = True) -> torch.dtype:
    """The dtype "auto" means on a device type.

    On a CPU (and MPS): float32. It keeps greedy speculative decoding's promise, the target's own
    output token for token: in bf16 a one-token step and a multi-token verification pass round
    differently, and at a near-tie of the top two logits the argmax flips (measured on two CPUs with
    native bf16: ~1% of positions on an AMD EPYC, and the app's default race parting at token 31 on an
    Intel Xeon; identical in fp32).

    On a CUDA GPU: the dtype the model is served in, by vLLM's rule for "auto" (transformers' keeps a
    float32 checkpoint in float32, and otherwise agrees): a bf16 or fp16 checkpoint in its own dtype, a
    float32 (or unknown) one in bf16; bf16 becomes fp16 on a GPU without bf16 (`cuda_bf16`, before
    Ampere). A speedup measured in float32 on a GPU answers a question nobody serving asks (half the
    speed, and a different batch size where verification stops being nearly free), and float32 is not
    bit-exact across shapes on a GPU either. Exact equality is `dtype="float32"` away; where greedy
    outputs part, the run says where and why. The choice depends on the checkpoint and the card only,
    never on free memory, so the same model gets the same dtype every time (`models.memory` then
    refuses, with the sizes, a pair that does not fit)."""
    if device_type != "cuda":
        return torch.float32
    half = torch.bfloat16 if cuda_bf16 else torch.float16
    if checkpoint == torch.float16 or (checkpoint == torch.bfloat16 and cuda_bf16):
        return checkpoint
    return half


def checkpoint_dtype(config) -> torch.dtype | None:
    """The dtype a checkpoint's config says its weights are in (`dtype`, formerly `torch_dtype`); None
    when it says nothing usable."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = DTYPES.get(value.strip().lower())
    return value if isinstance(value, torch.dtype) and value.is_floating_point else None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        device = str(device)
    device = device.strip().lower()
    if device == "auto":
        if torch.cuda.is_available():
            device = "cuda"
        elif torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise SpecvizError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecvizError(f"Device {device!r} asked for, but CUDA is not available here "
                                 f"(torch {torch.__version__}); use device='cpu' or 'auto'.")
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if index >= torch.cuda.device_count():
            raise SpecvizError(f"Device {device!r} asked for, but only {torch.cuda.device_count()} GPU(s) are visible.")
        return torch.device("cuda", index)
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise SpecvizError("Device 'mps' asked for, but Apple MPS is not available here; use 'cpu' or 'auto'.")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise SpecvizError(f"Unsupported device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.strip().lower()
    if name == "auto":      # on a GPU the loader reads the checkpoint's dtype first (`loading.pick_dtype`)
        return auto_dtype(device.type, cuda_bf16=device.type == "cuda" and torch.cuda.is_bf16_supported())
    if name not in DTYPES:
        raise SpecvizError(f"Unknown dtype {dtype!r}: use 'auto', 'float32'/'fp32', 'bfloat16'/'bf16' "
                             "or 'float16'/'fp16'.")
    return DTYPES[name]



# ----------------------------------------------------------------------------- torch's CPU threads

# One default for every surface (the app, every command, the library's `runs.race`): one torch
# thread on a CPU. Then all of a forward's work runs on the calling thread and `core.timing.Clock`
# times it by that thread's CPU time, which other programs on the machine cannot inflate (torch's
# own default, every core, is timed by the wall clock: the same race measured 1.95x to 7.67x here
# as a neighbour came and went). More threads are a choice (`use_threads(N)`, `--threads N`,
# SPECVIZ_THREADS): faster, and timed by the wall clock, which load can move.
DEFAULT_CPU_THREADS = 1
_threads_chosen = False         # whether this process chose torch's threads (`use_threads(N)`)


def use_threads(threads: int | None = None) -> str:
    """Set torch's CPU threads for this process: `threads`, kept by every run after it; or with None
    specviz's default, which each run on a CPU takes for itself (`default_threads`: one thread, on a
    host with a GPU too; a GPU's runs keep torch's threads for their host work). Returns a line for a log."""
    global _threads_chosen
    if threads is not None:
        if threads < 1:
            raise SpecvizError(f"threads must be at least 1, got {threads}.")
        torch.set_num_threads(threads)
    elif not torch.cuda.is_available():
        torch.set_num_threads(DEFAULT_CPU_THREADS)
    _threads_chosen = threads is not None
    count = torch.get_num_threads()
    per_run = threads is None and torch.cuda.is_available()     # a CPU run here still takes the default
    return (f"torch uses {count} CPU thread{'s' if count != 1 else ''}"
            + (f" ({DEFAULT_CPU_THREADS} for a run on the CPU)" if per_run else ""))


def default_threads(device: str | torch.device = "auto") -> None:
    """Before a run on `device`: on a CPU, unless this process chose torch's threads (`use_threads(N)`),
    the default of one. Every run path calls this (loading a pair, `runs.race`, the load sweep), so
    that the library times as the app and the command line do."""
    if not _threads_chosen and resolve_device(device).type == "cpu":
        torch.set_num_threads(DEFAULT_CPU_THREADS)


@contextmanager
def threads_for_run(device: str | torch.device) -> Iterator[None]:
    """torch's threads for one run on `device` (`default_threads`), and afterwards the count it found:
    a library call leaves the process's threads as they were. Around a generator's body, the count
    comes back when the generator finishes or is closed."""
    found = torch.get_num_threads()
    default_threads(device)
    try:
        yield
    finally:
        if torch.get_num_threads() != found:
            torch.set_num_threads(found)
