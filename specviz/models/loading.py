"""Loading one causal LM and its tokenizer through `from_pretrained`: a hub id and a local folder take
the same path, a .gguf file adds `gguf_file=`. Only safetensors and GGUF weights load unless the caller
passes `allow_pickle=True`; `trust_remote_code` is never turned on here. Every failure a user can
cause becomes a `SpecvizError` whose message says what to do."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..core.ragged_cache import check_transformers
from ..errors import SpecvizError, is_out_of_memory
from .cache import lock as _lock
from .cache import model_cache
from .memory import Need, kv_cache_bytes, make_room, weight_bytes
from .devices import auto_dtype, checkpoint_dtype, resolve_device, resolve_dtype
from .sources import BUILTINS, DEFAULT_TARGET, Progress, Source, builtin_source, report, resolve_source

log = logging.getLogger(__name__)

class LoadedModel(NamedTuple):
    model: PreTrainedModel
    tokenizer: Any


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _explain(error: Exception, source: Source, allow_pickle: bool) -> SpecvizError:
    """Turn what transformers / huggingface_hub raised into a message a user can act on."""
    text, name = str(error), source.name
    if "trust_remote_code" in text:
        return SpecvizError(f"{name} contains custom modelling code that would run on this machine. "
                              "Pass trust_remote_code=True only if you have read and trust that code; "
                              "specviz never turns it on by itself.")
    if "does not recognize this architecture" in text or "is not supported yet" in text:
        return SpecvizError(f"{name}: transformers {transformers.__version__} cannot load this architecture "
                              f"({_first_line(error)}). Use a model transformers supports, or upgrade it.")
    if "safetensors" in text and ("no file named" in text or "does not appear to have" in text) and not allow_pickle:
        return _pickle_refusal(name)
    if source.kind == "hub":
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        return SpecvizError(
            f"Could not load {source.location!r} from the Hugging Face hub: {_first_line(error)} "
            + ("HF_HUB_OFFLINE is set, so only models already in the local hub cache load. "
               if offline else "If this machine is offline, set HF_HUB_OFFLINE=1 and use a local copy. ")
            + "Check the id's spelling, or pass a local folder or .gguf file instead "
            f"(the built-in offline model is {DEFAULT_TARGET!r}). Gated models (such as Meta's Llama) "
            "need HF_TOKEN set to a token of an account that accepted the model's license.")
    return SpecvizError(f"Could not load {name} from {source.location}: {_first_line(error)}")


def _pickle_refusal(name: str) -> SpecvizError:
    return SpecvizError(f"{name} has no safetensors weights, only pickle files (.bin/.pt). Unpickling can run "
                          "arbitrary code, so specviz loads only safetensors or GGUF weights. Pass "
                          "allow_pickle=True if you trust the files, or convert them to safetensors.")


def _check_weight_format(source: Source, allow_pickle: bool) -> None:
    if source.kind != "folder" or allow_pickle:
        return
    folder = Path(source.location)
    if not any(folder.glob("*.safetensors")) and any(folder.glob(pattern) for pattern in ("*.bin", "*.pt", "*.pth")):
        raise _pickle_refusal(source.name)


def _estimate_bytes(config, dtype: torch.dtype, trust_remote_code: bool) -> int | None:
    """Weight size from the config alone: build the model on the meta device (no memory)."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        return weight_bytes(model, config, dtype)
    except Exception as error:  # noqa: BLE001 - an estimate only: loading reports the real problem
        log.debug("could not estimate the size of %s: %s", type(config).__name__, error)
        return None


_CONFIGS: dict[tuple, Any] = {}     # (source, trust_remote_code) -> config, as the model cache keys sources


def model_config(spec: str, *, trust_remote_code: bool):
    """`spec`'s config (a built-in model's converted copy: converted first if need be), read once per
    source (every GPU load reads it for the dtype and the memory budget: a hub id's would otherwise be
    looked up again at every run), or None where it cannot be read now: loading then reports the
    problem with its own message."""
    source = resolve_source(spec)
    key = (source.key, trust_remote_code)
    if key in _CONFIGS:
        return _CONFIGS[key]
    try:
        if source.kind == "builtin":
            source = builtin_source(BUILTINS[source.location], None)
        config = AutoConfig.from_pretrained(source.location, trust_remote_code=trust_remote_code,
                                            **({"gguf_file": source.gguf_file} if source.gguf_file else {}))
    except (OSError, ValueError, KeyError, TypeError, SpecvizError):
        return None
    _CONFIGS[key] = config
    return config


def pick_dtype(spec: str, device: torch.device, dtype: str | torch.dtype, *, trust_remote_code: bool) -> torch.dtype:
    """`dtype` resolved for `spec` on `device` (`devices.auto_dtype`): "auto" is float32 on a CPU, and
    on a GPU the dtype the checkpoint is served in, read from its config before any weight loads."""
    resolved = resolve_dtype(dtype, device)
    if not (isinstance(dtype, str) and dtype.strip().lower() == "auto") or device.type != "cuda":
        return resolved
    config = model_config(spec, trust_remote_code=trust_remote_code)
    return auto_dtype("cuda", checkpoint=None if config is None else checkpoint_dtype(config),
                      cuda_bf16=torch.cuda.is_bf16_supported())


def estimate_bytes(spec: str, dtype: torch.dtype, *, trust_remote_code: bool) -> tuple[int, int] | None:
    """`spec`'s weights and one sequence's KV cache (`memory.PLANNED_TOKENS`) in `dtype`, in bytes, from
    its config alone; None when the config cannot be read or built."""
    config = model_config(spec, trust_remote_code=trust_remote_code)
    weights = None if config is None else _estimate_bytes(config, dtype, trust_remote_code)
    return None if weights is None else (weights, kv_cache_bytes(config, dtype))


def model_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def cache_key(spec: str, dtype: torch.dtype, device: torch.device) -> Hashable:
    """The model cache's key for `spec` in `dtype` on `device` (the device last: `cache.bytes_on`)."""
    return (resolve_source(spec).key, str(dtype).removeprefix("torch."), str(device))


def load_cached(spec: str, device: torch.device, dtype: torch.dtype, *, allow_pickle: bool, trust_remote_code: bool,
                progress: Progress | None, vet: Callable[[Any, Source], None] | None = None,
                keep: set = frozenset()) -> tuple[LoadedModel, Hashable]:
    """`spec`'s model and tokenizer from the model cache, or loaded into it, and its cache key. The
    caller holds the cache's lock (`load_model`, `pairs.load_pair`); `vet` checks the tokenizer before
    the weights load; `keep` names cache entries that must not be evicted to make room."""
    try:                        # before minutes of loading: a transformers that would run without a cache
        check_transformers()
    except ValueError as error:
        raise SpecvizError(str(error)) from None
    source = resolve_source(spec)
    key = cache_key(spec, dtype, device)
    cached = model_cache.get(key)
    if cached is not None:
        if vet is not None:
            vet(cached.tokenizer, source)
        report(progress, 1.0, f"{source.name} is already loaded")
        return cached, key

    started = time.perf_counter()
    if source.kind == "builtin":
        source = builtin_source(BUILTINS[source.location], progress)
    where = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        report(progress, 0.1, f"Reading {source.name}'s config and tokenizer")
        config = AutoConfig.from_pretrained(source.location, trust_remote_code=trust_remote_code, **where)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code, **where)
        except (OSError, ValueError, TypeError) as error:
            if "trust_remote_code" in str(error):
                raise _explain(error, source, allow_pickle) from error
            raise SpecvizError(f"{source.name} has no usable tokenizer ({_first_line(error)}); specviz needs one "
                               "to encode prompts and to compare a draft's vocabulary with the target's.") from None
        if vet is not None:
            vet(tokenizer, source)
        _check_weight_format(source, allow_pickle)

        estimate = _estimate_bytes(config, dtype, trust_remote_code)
        model_cache.make_room(estimate or 0, keep)
        # On a GPU all of it on the one device (`models.memory` checked it fits); never spread.
        device_map: str | None = None if device.type == "cpu" else str(device)
        size = f" (~{estimate / 1e9:.2f} GB)" if estimate else ""
        report(progress, 0.3, f"Loading {source.name}{size} in {str(dtype).removeprefix('torch.')} on {device}")
        weights = {} if source.gguf_file else {"use_safetensors": None if allow_pickle else True}
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, device_map=device_map,
                                                     trust_remote_code=trust_remote_code, **where, **weights)
    except SpecvizError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as error:
        if is_out_of_memory(error):   # errors.user_message says what to do, and frees the device's cache
            raise
        raise _explain(error, source, allow_pickle) from error
    model.eval()
    loaded = LoadedModel(model, tokenizer)
    model_cache.put(key, loaded, model_bytes(model), keep)
    report(progress, 1.0, f"Loaded {source.name} in {time.perf_counter() - started:.1f} s")
    return loaded, key


def fit_on_gpu(specs: list[str], device: torch.device, dtype: torch.dtype, *, trust_remote_code: bool) -> None:
    """Check that the models `specs` name (a target, and a draft model) fit the card's budget in
    `dtype` with their KV caches, and make room among specviz's own cached models (`models.memory`).
    A model whose size cannot be read from its config is left to loading, which reports why. Nothing
    to do on a CPU."""
    if device.type != "cuda":
        return
    needs = []
    for spec in specs:
        estimate = estimate_bytes(spec, dtype, trust_remote_code=trust_remote_code)
        if estimate is not None:
            needs.append(Need(resolve_source(spec).name, *estimate))
    make_room(needs, device, dtype, keep={cache_key(spec, dtype, device) for spec in specs})


def load_model(spec: str, *, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto",
               allow_pickle: bool = False, trust_remote_code: bool = False,
               progress: Progress | None = None) -> LoadedModel:
    """One causal LM and its tokenizer (cached), from a built-in name, hub id, folder or .gguf file."""
    with _lock:
        resolved = resolve_device(device)
        chosen = pick_dtype(spec, resolved, dtype, trust_remote_code=trust_remote_code)
        fit_on_gpu([spec], resolved, chosen, trust_remote_code=trust_remote_code)
        loaded, _ = load_cached(spec, resolved, chosen, allow_pickle=allow_pickle,
                                trust_remote_code=trust_remote_code, progress=progress)
        return loaded

