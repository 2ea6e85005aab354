"""Which device and dtype a run uses: 'auto' resolved for this machine, and clear refusals."""

from __future__ import annotations

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


def auto_dtype(device_type: str, *, fits: bool = True, cuda_bf16: bool = False) -> torch.dtype:
    """The dtype "auto" means: float32 wherever the model fits in it (`fits`), because it keeps
    greedy speculative decoding's promise, the target's own output token for token. In bf16 a
    one-token step and a multi-token verification pass round differently, and at a near-tie of the
    top two logits the argmax flips: measured on two CPUs with native bf16, ~1% of positions on an
    AMD EPYC and the app's default race parting at token 31 on an Intel Xeon (identical in fp32).
    Where fp32 weights would not fit a GPU: bf16 (fp16 on GPUs without it), and outputs may part."""
    if fits or device_type != "cuda":
        return torch.float32
    return torch.bfloat16 if cuda_bf16 else torch.float16


def smaller_dtype(device: torch.device) -> torch.dtype:
    """What "auto" falls back to on `device` when float32 weights do not fit (`auto_dtype`)."""
    return auto_dtype(device.type, fits=False,
                      cuda_bf16=device.type == "cuda" and torch.cuda.is_bf16_supported())


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
    if name == "auto":      # float32; the loader falls back to `smaller_dtype` where it does not fit a GPU
        return auto_dtype(device.type)
    if name not in DTYPES:
        raise SpecvizError(f"Unknown dtype {dtype!r}: use 'auto', 'float32'/'fp32', 'bfloat16'/'bf16' "
                             "or 'float16'/'fp16'.")
    return DTYPES[name]


def needs_device_map(model_bytes: int, free_bytes: int, headroom: float = 0.85) -> bool:
    """Whether a model too large for the GPU's free memory (keeping some for the KV cache and
    activations) should be spread by accelerate's device_map="auto"."""
    return model_bytes > headroom * free_bytes



# ----------------------------------------------------------------------------- torch's CPU threads

# One default for every surface (the app, every command, the library's `runs.race`): one torch
# thread on a CPU. Then all of a forward's work runs on the calling thread and `core.timing.Clock`
# times it by that thread's CPU time, which other programs on the machine cannot inflate (torch's
# own default, every core, is timed by the wall clock: the same race measured 1.95x to 7.67x here
# as a neighbour came and went). More threads are a choice (`use_threads(N)`, `--threads N`,
# SPECVIZ_THREADS): faster, and timed by the wall clock, which load can move.
DEFAULT_CPU_THREADS = 1
_threads_chosen = False         # whether this process has set torch's threads through use_threads


def use_threads(threads: int | None = None) -> str:
    """Set torch's CPU threads for this process: `threads`, or with None the default (one, unless a
    GPU is here: its runs are timed on the device and keep torch's threads for their host work).
    Returns a line for a log."""
    global _threads_chosen
    if threads is not None:
        if threads < 1:
            raise SpecvizError(f"threads must be at least 1, got {threads}.")
        torch.set_num_threads(threads)
    elif not torch.cuda.is_available():
        torch.set_num_threads(DEFAULT_CPU_THREADS)
    _threads_chosen = True
    count = torch.get_num_threads()
    return f"torch uses {count} CPU thread{'s' if count != 1 else ''}"


def default_threads(device: str | torch.device = "auto") -> None:
    """Before a run on `device`: on a CPU, unless this process chose torch's threads already
    (`use_threads`), the default of one. Every run path calls this (loading a pair, `runs.race`, the
    load sweep), so that the library times as the app and the command line do."""
    global _threads_chosen
    if _threads_chosen or resolve_device(device).type != "cpu":
        return
    torch.set_num_threads(DEFAULT_CPU_THREADS)
    _threads_chosen = True
