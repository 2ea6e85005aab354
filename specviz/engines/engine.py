"""vLLM as the engine a sweep measures: one server per configuration, started when its turn comes and
stopped after it (or an already-running one, at `urls[k]`), and what the sweep records about it.

What a sweep asks of a serving engine (vLLM's here; llama.cpp's server can answer the same):
- `check(configs)`: find the engine before anything else (a clear message when it is missing or old);
- `describe(configs)` and `environment()`: the engine, its version and arguments, and the machine it
  runs on, for the JSON;
- `serve(config)`: a context manager that yields a `Served` (url, the model name to send, the log);
  on leaving it, by return, error, Ctrl-C or a closed generator, a server it started is stopped and
  waited for. Servers run one at a time (`SERVERS`): on a GPU two would each claim most of its memory;
- one request: `vllm_client.send`/`closed_loop` over the OpenAI API, whose `Response.spec` carries the
  engine's acceptance figures for that request (`runs.engine_load.acceptance` sums them);
- the config to copy: `configs.recommended_config`.
`stop_all()` stops every server still running (the app's Stop, atexit).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .configs import EngineConfig, vllm_dtype
from .vllm_client import served_model, server_version
from .vllm_server import SERVED_NAME, START_TIMEOUT, ServerHandle, VllmInstall, default_args, find_vllm, start_server

_running: set[ServerHandle] = set()
_lock = threading.Lock()


def stop_all() -> None:
    """Stop every server this process started that is still running."""
    with _lock:
        handles = list(_running)
    for handle in handles:
        handle.stop()
        with _lock:
            _running.discard(handle)


atexit.register(stop_all)


SERVERS = "one at a time (plain, then each k)"


@dataclass(frozen=True)
class Served:
    url: str
    model: str
    log: Path | None       # None for a server given by URL
    config: EngineConfig


@dataclass
class VllmEngine:
    model: str                                  # what vLLM's --model gets (`configs.model_location`)
    vllm_python: str | None = None              # --vllm-python, else SPECVIZ_VLLM_PYTHON
    dtype: str = "auto"
    engine_args: Sequence[str] = ()             # passed to every server started (--tensor-parallel-size=2, ...)
    urls: dict[int, str] = field(default_factory=dict)   # k -> an already-running server with that configuration
    log_dir: Path | None = None
    start_timeout: float = START_TIMEOUT
    say: Callable[[str], None] | None = None
    stopped: Callable[[], bool] = lambda: False
    install: VllmInstall | None = None

    def check(self, configs: Sequence[EngineConfig]) -> None:
        """Find vLLM before anything else, unless every configuration is served at a given URL."""
        if self.install is None and any(c.k not in self.urls for c in configs):
            self.install = find_vllm(self.vllm_python)

    def describe(self, configs: Sequence[EngineConfig]) -> dict:
        version = self.install.version if self.install else next(
            (v for v in (server_version(url) for url in self.urls.values()) if v), None)
        return {"name": "vllm", "version": version,
                "device": self.install.device if self.install else None,
                "python": self.install.python if self.install else None, "model": self.model,
                "dtype": vllm_dtype(self.dtype), "engine_args": list(self.engine_args),
                "default_args": default_args(self.install.device, self.engine_args) if self.install else [],
                "servers": SERVERS,
                "configs": [dict(c.to_dict(), url=self.urls.get(c.k)) for c in configs]}

    def environment(self) -> dict:
        """The machine vLLM runs on (its own environment's view), or what is known of given servers."""
        if self.install is not None:
            return self.install.environment()
        return {"device": "unknown: servers given by URL", "urls": sorted(set(self.urls.values()))}

    @contextmanager
    def serve(self, config: EngineConfig) -> Iterator[Served]:
        if config.k in self.urls:
            url = self.urls[config.k].rstrip("/")
            yield Served(url, served_model(url), None, config)
            return
        self.check([config])
        handle = start_server(self.install, self.model, label=config.label, dtype=self.dtype,
                              speculative_config=config.speculative_config, engine_args=self.engine_args,
                              log_dir=self.log_dir)
        with _lock:
            _running.add(handle)
        try:
            if self.say:
                self.say(f"starting vLLM ({config.label}) on {handle.url}; log: {handle.log}")
            handle.wait_ready(self.start_timeout, self.say, self.stopped)
            yield Served(handle.url, SERVED_NAME, handle.log, config)
        finally:
            handle.stop()
            with _lock:
                _running.discard(handle)
