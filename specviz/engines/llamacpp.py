"""llama.cpp as the engine a sweep measures: its own HTTP server (`llama-server`), one per
configuration, started in turn under the watchdog and stopped after it, or a running one by URL.

- Where the server comes from: xllamacpp (the `specviz[llamacpp]` extra; prebuilt wheels of
  llama.cpp's server) run by `llamacpp_server.py` in a process of its own, or a `llama-server` binary
  (`--llama-server PATH`). Both get the same `llama-server` flags, which are also the config to copy.
- The model is a GGUF file as it is (the built-in model's own GGUF from its package; no conversion).
- Every server gets `--threads` (default: every core), `--parallel` = the sweep's largest batch (one
  slot per concurrent request), `--cont-batching`, `--metrics` and `--no-cache-prompt`: the prompt
  set is cycled, and a prompt whose prefix a slot kept is prefilled from its cache in a batch of
  another shape, which flipped the first greedy token of an answer here (plain vs speculative server).
- Drafters: specviz's `ngram` is llama.cpp's `ngram-simple` looking up the last `NGRAM_SIZE_N`
  tokens and drafting k (`--spec-ngram-simple-size-m k`); a draft model (a GGUF) is `draft-simple`;
  the other types (`ngram-map-k`, `ngram-mod`, ...) through `--speculative-config` JSON
  ({"type": "ngram-mod", "n_match": 8}). k is `--spec-draft-n-max`.
- Acceptance: per request llama.cpp reports `timings.draft_n` / `draft_n_accepted` (the client maps
  them to `num_draft_tokens` / `num_accepted_draft_tokens`); the number of speculative steps and the
  acceptance by draft position exist only as server counters at /metrics
  (`llamacpp:spec_decode_num_drafts_total`, `..._accepted_tokens_per_pos_total{position="i"}`), read
  before and after each point and differenced (`point_acceptance`). Per request there is no step count.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecvizError
from ..models.sources import BUILTINS, DEFAULT_TARGET, cache_folder, resolve_source
from ..settings import DraftSpec
from .configs import EngineConfig, load_json
from . import gpu
from .engine import SERVERS, Served, StartsServers
from .vllm_server import SERVED_NAME, START_TIMEOUT, ServerHandle, free_port, start_watched

INSTALL_HINT = ("Install llama.cpp's server for Python with `pip install 'specviz[llamacpp]'` (or `pip install "
                "xllamacpp`), or give a llama-server binary with --llama-server PATH.")
TESTED_VERSION = "2026.10"
NGRAM_TYPE, NGRAM_SIZE_N = "ngram-simple", 3      # specviz's prompt lookup matches the last 3 tokens first
CONTEXT_PER_SLOT = 1024         # --ctx-size is this times --parallel: every slot holds a prompt and its answer
SERVER_SCRIPT = Path(__file__).with_name("llamacpp_server.py")
# --speculative-config keys -> the llama-server flag, per speculative type
TYPE_FLAGS = {"ngram-simple": ("size_n", "size_m", "min_hits"), "ngram-map-k": ("size_n", "size_m", "min_hits"),
              "ngram-mod": ("n_match", "n_min", "n_max")}


@dataclass(frozen=True)
class LlamaCppInstall:
    command: tuple[str, ...]    # what runs a server, before its flags
    version: str
    kind: str                   # "xllamacpp" or "llama-server"
    system_info: str = ""
    devices: tuple = ()         # the build's devices (`llamacpp_server.devices`, `parse_device_list`)

    @property
    def gpus(self) -> list[dict]:
        return gpu_devices(self.devices)

    @property
    def device(self) -> str:
        """Where its servers run: "cuda" (a CUDA build with a GPU), "gpu" (another GPU backend), or "cpu"."""
        if not self.gpus:
            return "cpu"
        return "cuda" if self.gpus[0]["name"].upper().startswith("CUDA") else "gpu"

    def environment(self, threads: int) -> dict:
        build = {"threads": threads, "llamacpp": self.kind, "version": self.version, "system_info": self.system_info}
        if not self.gpus:
            return {"device": "cpu", "device_name": _cpu_name(), **build}
        return {"device": self.device, "device_name": self.gpus[0]["description"], "device_count": len(self.gpus),
                "devices": [d["name"] for d in self.gpus], "gpu_layers": "all", "cpu_name": _cpu_name(), **build}


def gpu_devices(devices) -> list[dict]:
    """The GPUs among a build's devices (a discrete or an integrated one): where its layers go."""
    return [d for d in devices if d.get("type") in ("GPU", "IGPU")]


_LISTED = re.compile(r"^\s*([^\s:]+):\s*(.*?)\s*\((\d+) MiB, (\d+) MiB free\)\s*$")


def parse_device_list(text: str) -> list[dict]:
    """`llama-server --list-devices`' lines ("  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80443 MiB free)"): the
    GPU backends' devices (it lists no CPU)."""
    found = []
    for line in text.splitlines():
        match = _LISTED.match(line)
        if match:
            name, description, total, _free = match.groups()
            found.append({"name": name, "description": description, "type": "GPU", "memory_total": int(total) << 20})
    return found


def server_threads() -> int:
    """Threads for a llama.cpp server: SPECVIZ_LLAMACPP_THREADS, else every core. Its threads wait for
    each other by spinning, so on a machine shared with other work fewer threads than cores keep
    every step from waiting on a thread that is not running."""
    given = os.environ.get("SPECVIZ_LLAMACPP_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else (os.cpu_count() or 1)


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def find_llamacpp(server: str | None = None) -> LlamaCppInstall:
    """xllamacpp in specviz's interpreter (checked in a child: its speculative-params API must be the
    one specviz drives), or the llama-server binary `server` names."""
    if server:
        path = shutil.which(server)
        if path is None:
            raise SpecvizError(f"No llama-server at {server!r}. {INSTALL_HINT}")
        try:
            said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SpecvizError(f"{path} --version failed ({error}). {INSTALL_HINT}") from None
        version = next((line for line in (said.stdout + said.stderr).splitlines() if "version" in line), "unknown")
        return LlamaCppInstall((path,), version.strip(), "llama-server", devices=tuple(_listed_devices(path)))
    probe = subprocess.run([sys.executable, str(SERVER_SCRIPT), "--probe"], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecvizError(f"xllamacpp does not import here ({last}). {INSTALL_HINT}")
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    check_api(info)
    return LlamaCppInstall((sys.executable, str(SERVER_SCRIPT)), info["version"], "xllamacpp",
                           info.get("system_info", ""), tuple(info.get("devices", ())))


def _listed_devices(path: str) -> list[dict]:
    """A llama-server binary's GPUs (none when it is a CPU build or too old for --list-devices)."""
    try:
        said = subprocess.run([path, "--list-devices"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_device_list(said.stdout + said.stderr)


def check_api(info: dict) -> None:
    """Refuse an xllamacpp whose speculative-params API is not the 2026 one (`.types`, `.draft`)."""
    if info["api"] != "types":
        raise SpecvizError(
            f"xllamacpp {info['version']} has a speculative-params API specviz does not drive "
            f"({info['api']!r}: CommonParams().speculative has {', '.join(info['fields']) or 'no fields'}); specviz "
            f"sets `speculative.types` and `speculative.draft` (xllamacpp {TESTED_VERSION} on). Install that with "
            f"`pip install -U 'xllamacpp>={TESTED_VERSION}'`, or give a llama-server binary with --llama-server.")


# ----------------------------------------------------------------------------- what a server runs

def gguf_location(spec: str | None) -> str:
    """The GGUF file llama.cpp loads for a specviz model string: the built-in model's own file, or a
    .gguf (or a folder with one). Other formats are refused: llama.cpp reads GGUF only."""
    source = resolve_source(spec or DEFAULT_TARGET)
    if source.kind == "builtin":
        builtin = BUILTINS[source.location]
        scratch = cache_folder() / "gguf"
        scratch.mkdir(parents=True, exist_ok=True)
        return str(builtin.find_gguf(scratch))
    if source.kind == "gguf":
        return str(Path(source.location) / source.gguf_file)
    raise SpecvizError(f"llama.cpp runs GGUF files: {spec!r} is a {source.kind}. Give a .gguf file (or convert the "
                       "model with llama.cpp's convert_hf_to_gguf.py).")


def speculative_config(spec: DraftSpec | None, k: int, given: dict | None = None) -> dict | None:
    """llama.cpp's speculative settings for a specviz drafter (or `given`) at draft length k; None for k = 0."""
    if k <= 0:
        return None
    if given is not None:
        config = dict(given, draft_n_max=k)
        if config.get("type") in ("ngram-simple", "ngram-map-k"):
            config.setdefault("size_m", k)
        if config.get("type") == "ngram-mod":
            # ngram-mod drafts n_min to n_max tokens whatever --spec-draft-n-max says (its defaults, 48
            # to 64, drafted up to 44 tokens a step at "k = 4" here): its n_max is the sweep's k, and it
            # drafts whatever it finds up to k, as specviz's prompt lookup does, unless n_min is given.
            config["n_max"] = k
            config["n_min"] = min(int(config.get("n_min", 1)), k)
        return config
    if spec.kind == "ngram":
        return {"type": NGRAM_TYPE, "size_n": NGRAM_SIZE_N, "size_m": k, "draft_n_max": k}
    if spec.kind == "model":
        return {"type": "draft-simple", "model": gguf_location(spec.text), "draft_n_max": k}
    raise SpecvizError(f"llama.cpp has no drafter like {spec.name!r}: use ngram, a draft model (a GGUF file), or "
                       "--speculative-config JSON for llama.cpp's other types ({\"type\": \"ngram-mod\"}, ...).")


def engine_configs(spec: DraftSpec | None, ks, given: dict | None = None) -> list[EngineConfig]:
    """The plain server first, then one speculative server per k > 0 (`spec`: parsed at the edge, None with
    `given`)."""
    return [EngineConfig(0, None)] + [EngineConfig(k, speculative_config(spec, k, given)) for k in ks if k > 0]


def parse_speculative_config(text: str | None) -> dict | None:
    """--speculative-config on llama.cpp: a speculative type and its sizes (None when not given)."""
    config = load_json(text, '\'{"type": "ngram-mod", "n_match": 8}\'')
    if config is None:
        return None
    if not isinstance(config, dict) or not config.get("type"):
        raise SpecvizError('On llama.cpp, --speculative-config is a JSON object with a "type" (ngram-simple, '
                           'ngram-map-k, ngram-mod, draft-simple with "model", ...) and its sizes, e.g. '
                           '\'{"type": "ngram-mod", "n_match": 8}\'.')
    return config


def spec_flags(config: dict | None) -> list[str]:
    """llama-server's flags for one speculative config (none for the plain server)."""
    if config is None:
        return []
    kind = config["type"]
    flags = ["--spec-type", kind, "--spec-draft-n-max", str(config["draft_n_max"])]
    if config.get("model"):
        flags += ["--model-draft", str(config["model"])]
    for key in TYPE_FLAGS.get(kind, ()):
        if key in config:
            flags += [f"--spec-{kind}-{key.replace('_', '-')}", str(config[key])]
    return flags


# ----------------------------------------------------------------------------- the per-point counters

_COUNTER = re.compile(r'^llamacpp:(spec_decode_num_drafts_total|spec_decode_num_accepted_tokens_per_pos_total)'
                      r'(?:\{position="(\d+)"\})?\s+([0-9.eE+-]+)$')


def parse_metrics(text: str) -> dict:
    """The speculative counters of llama.cpp's Prometheus text: steps (`drafts`) and the drafts accepted
    at each position (`per_position[i]`: steps whose draft was accepted at least to position i + 1)."""
    drafts, per_position = 0.0, {}
    for line in text.splitlines():
        match = _COUNTER.match(line.strip())
        if match is None:
            continue
        name, position, value = match.groups()
        if position is None:
            drafts = float(value)
        else:
            per_position[int(position)] = float(value)
    return {"drafts": drafts, "per_position": [per_position.get(i, 0.0) for i in range(max(per_position, default=-1)
                                                                                      + 1)]}


def counted_acceptance(before: dict, after: dict) -> dict:
    """The counters' difference as `acceptance`'s steps and histogram (steps that accepted exactly 0,
    1, ... drafts), with the accepted count per position."""
    steps = round(after["drafts"] - before["drafts"])
    width = max(len(after["per_position"]), len(before["per_position"]))
    at = [round(after["per_position"][i] - (before["per_position"][i] if i < len(before["per_position"]) else 0))
          if i < len(after["per_position"]) else 0 for i in range(width)]
    while at and at[-1] == 0:
        at.pop()
    reached = [steps, *at]      # steps that got at least this far: all of them, then past position 1, 2, ...
    histogram = [reached[i] - (reached[i + 1] if i + 1 < len(reached) else 0) for i in range(len(reached))]
    return {"num_spec_steps": steps, "acceptance_histogram": histogram, "accepted_per_position": at}


# ----------------------------------------------------------------------------- the engine

@dataclass
class LlamaCppEngine(StartsServers):
    model: str                                  # a GGUF file (`gguf_location`)
    server: str | None = None                   # a llama-server binary; None: xllamacpp
    threads: int = field(default_factory=server_threads)
    parallel: int = 1                           # slots: the sweep's largest batch
    engine_args: Sequence[str] = ()             # more llama-server flags for every server started
    urls: dict[int, str] = field(default_factory=dict)
    log_dir: Path | None = None
    start_timeout: float = START_TIMEOUT
    say: Callable[[str], None] | None = None
    stopped: Callable[[], bool] = lambda: False
    install: LlamaCppInstall | None = None
    requested_device: str = "auto"              # --device: "cuda:N" pins the servers to that GPU (`engines.gpu`)
    name = "llamacpp"
    title = "llama.cpp"

    @property
    def device(self) -> str:
        return self.install.device if self.install else "server"

    @property
    def on_gpu(self) -> bool:
        return self.install is not None and bool(self.install.gpus)

    def check(self, configs: Sequence[EngineConfig]) -> None:
        if self.install is None and any(c.k not in self.urls for c in configs):
            self.install = find_llamacpp(self.server)

    def server_flags(self, config: EngineConfig | None = None) -> list[str]:
        """Every flag a server gets but its port: the flags to copy."""
        return (["--model", self.model, "--alias", SERVED_NAME, "--threads", str(self.threads),
                 "--parallel", str(self.parallel), "--ctx-size", str(CONTEXT_PER_SLOT * self.parallel),
                 "--cont-batching", "--no-cache-prompt", "--metrics"]
                + spec_flags(config.speculative_config if config else None)
                + gpu.llamacpp_gpu_args(self.on_gpu, self.engine_args) + list(self.engine_args))

    def describe(self, configs: Sequence[EngineConfig]) -> dict:
        return {"name": self.name, "version": self.install.version if self.install else None,
                "server": self.install.kind if self.install else "given by URL", "model": self.model,
                "dtype": "as the GGUF stores it", "threads": self.threads, "parallel": self.parallel,
                "engine_args": list(self.engine_args), "servers": SERVERS, "ngram": f"{NGRAM_TYPE}, size_n "
                f"{NGRAM_SIZE_N}, size_m = k", "configs": [dict(c.to_dict(), url=self.urls.get(c.k),
                                                               flags=spec_flags(c.speculative_config))
                                                          for c in configs]}

    def environment(self) -> dict:
        if self.install is not None:
            return self.install.environment(self.threads)
        return {"device": "unknown: servers given by URL", "urls": sorted(set(self.urls.values()))}

    def start(self, config: EngineConfig) -> ServerHandle:
        port = free_port()
        command = [*self.install.command, *self.server_flags(config), "--port", str(port)]
        env = None
        if self.on_gpu:     # the own loop's models let go, and cuda:N pinned (`engines.gpu`); a CPU build: as ever
            gpu.free_own_models()
            where = gpu.Gpu(gpu.device_index(self.requested_device), None, None, len(self.install.gpus))
            env = dict(os.environ, **gpu.server_env(where, self.engine_args, os.environ))
        return start_watched(command, port, label=config.label, name=self.title, log_dir=self.log_dir, env=env)

    def counters(self, served: Served) -> dict | None:
        if served.config.speculative_config is None:
            return None
        try:
            with urllib.request.urlopen(served.url + "/metrics", timeout=10) as answer:
                return parse_metrics(answer.read().decode())
        except (urllib.error.URLError, OSError):
            return None         # a server given by URL without --metrics: the per-request figures remain

    def point_acceptance(self, before: dict | None, after: dict | None) -> dict | None:
        return counted_acceptance(before, after) if before is not None and after is not None else None

    def recommended_config(self, configs: Sequence[EngineConfig], recommended_k: dict[int, int]) -> dict | None:
        """The largest k that paid as llama-server flags, with the batch sizes where it paid: llama.cpp
        has one draft length per server, not one per batch size."""
        paying = {k for k in recommended_k.values() if k > 0}
        if not paying:
            return None
        best = max(paying)
        config = next(c for c in configs if c.k == best)
        flags = ["llama-server", *self.server_flags(config)]
        return {"flags": " ".join(flags), "k": best,
                "pays_at_batch": [b for b, k in sorted(recommended_k.items()) if k > 0],
                "off_at_batch": [b for b, k in sorted(recommended_k.items()) if k == 0]}
