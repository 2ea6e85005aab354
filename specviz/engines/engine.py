"""The engines a sweep measures (`Engine`), and vLLM's: one server per configuration, started when its
turn comes and stopped after it (or an already-running one, at `urls[k]`).

What a sweep asks of a serving engine is the `Engine` protocol below; `VllmEngine` (here) and
`llamacpp.LlamaCppEngine` implement it, and the runs take an `Engine`. Both servers speak the OpenAI
API, so one request is the shared client's (`vllm_client.send`/`closed_loop`), whose
`Response.spec` carries the engine's acceptance figures for that request (`runs.engine_load.acceptance`
sums them). `stop_all()` stops every server still running (the app's Stop, atexit).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from . import gpu
from .configs import EngineConfig, recommended_config, vllm_dtype
from .vllm_client import served_model, server_version
from .vllm_install import VllmInstall, find_vllm
from .vllm_server import SERVED_NAME, START_TIMEOUT, ServerHandle, default_args, start_server

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


@contextmanager
def watched(handle: ServerHandle) -> Iterator[ServerHandle]:
    """Keep a started server in `stop_all`'s reach while the block runs, and stop it on leaving."""
    with _lock:
        _running.add(handle)
    try:
        yield handle
    finally:
        handle.stop()
        with _lock:
            _running.discard(handle)


SERVERS = "one at a time (plain, then each k)"
TITLES = {"vllm": "vLLM", "llamacpp": "llama.cpp"}      # an engine's name (the JSON's) -> how messages write it


@dataclass(frozen=True)
class Served:
    url: str
    model: str
    log: Path | None       # None for a server given by URL
    config: EngineConfig


@contextmanager
def serving(engine, config: EngineConfig, start: Callable[[], ServerHandle]) -> Iterator[Served]:
    """An engine's `serve`: the server at `engine.urls[config.k]` when given, else the one `start()`
    starts, watched (`stop_all`) while it is in use, waited for, and stopped on leaving."""
    if config.k in engine.urls:
        url = engine.urls[config.k].rstrip("/")
        yield Served(url, served_model(url), None, config)
        return
    engine.check([config])
    with watched(start()) as handle:
        if engine.say:
            engine.say(f"starting {engine.title} ({config.label}) on {handle.url}; log: {handle.log}")
        handle.wait_ready(engine.start_timeout, engine.say, engine.stopped)
        yield Served(handle.url, SERVED_NAME, handle.log, config)


class StartsServers:
    """The `serve` of an engine that starts its own servers: `serving` around the engine's
    `start(config) -> ServerHandle` (the one thing that differs: the command)."""

    def serve(self, config: EngineConfig) -> AbstractContextManager[Served]:
        return serving(self, config, lambda: self.start(config))


class Engine(Protocol):
    """What a sweep (`runs.engine_load`, `runs.engine_compare`) asks of a serving engine."""

    name: str       # "vllm", "llamacpp": the JSON's settings.engine
    title: str      # "vLLM", "llama.cpp": in messages

    @property
    def device(self) -> str:
        """Where the servers run ("cpu", "cuda", or "server" for servers given by URL)."""

    def check(self, configs: Sequence[EngineConfig]) -> None:
        """Find the engine before anything else: a clear message when it is missing, old or unknown."""

    def describe(self, configs: Sequence[EngineConfig]) -> dict:
        """The engine, its version and arguments and the configurations, for the JSON."""

    def environment(self) -> dict:
        """The machine the engine runs on, as the JSON records it."""

    def serve(self, config: EngineConfig) -> AbstractContextManager[Served]:
        """Yield a running server for `config`; on leaving (return, error, Ctrl-C, a closed generator) a
        server it started is stopped and waited for. Servers run one at a time (`SERVERS`)."""

    def counters(self, served: Served) -> dict | None:
        """The server's acceptance counters now (None: it keeps none the sweep uses)."""

    def point_acceptance(self, before: dict | None, after: dict | None) -> dict | None:
        """What the counters say about the requests between two readings, in `acceptance`'s names
        (num_spec_steps, acceptance_histogram, ...); None when the responses say it all."""

    def recommended_config(self, configs: Sequence[EngineConfig], recommended_k: dict[int, int]):
        """The configuration to copy for this traffic (None when speculation paid nowhere)."""


@dataclass
class VllmEngine(StartsServers):
    model: str                                  # what vLLM's --model gets (`configs.model_location`)
    vllm_python: str | None = None              # --vllm-python, else SPECVIZ_VLLM_PYTHON
    dtype: str = "auto"
    gpu_dtype: str | None = None                # served instead of `dtype` on a GPU ("all three": see `serving_dtype`)
    requested_device: str = "auto"              # --device: "cuda:N" pins the servers to that GPU (`engines.gpu`)
    engine_args: Sequence[str] = ()             # passed to every server started (--tensor-parallel-size=2, ...)
    urls: dict[int, str] = field(default_factory=dict)   # k -> an already-running server with that configuration
    log_dir: Path | None = None
    start_timeout: float = START_TIMEOUT
    say: Callable[[str], None] | None = None
    stopped: Callable[[], bool] = lambda: False
    install: VllmInstall | None = None
    name = "vllm"
    title = "vLLM"

    placements: dict[str, dict] = field(default_factory=dict)   # each started server's GPU arguments and variables

    @property
    def device(self) -> str:
        return self.install.device if self.install else "server"

    @property
    def serving_dtype(self) -> str:
        """What the servers run in: `dtype`, or on a GPU `gpu_dtype` when given. The Load tab's "all
        three" asks for the own loop's dtype (float32 on a CPU: both do the same arithmetic) with "auto"
        on a GPU: vLLM's fast attention backends refuse float32 there."""
        on_gpu = self.install is not None and not self.install.cpu
        return self.gpu_dtype if on_gpu and self.gpu_dtype else self.dtype

    def placement(self) -> tuple[list[str], dict[str, str]]:
        """The next server's GPU arguments and variables (`engines.gpu`), read now: the own loop's cached
        models are let go first, and the memory share is what is free after that. Nothing on a CPU."""
        if self.install is None or self.install.cpu:
            return [], {}
        gpu.free_own_models()
        facts = gpu.read_gpu(self.requested_device)
        return gpu.vllm_gpu_args(facts, self.engine_args), gpu.server_env(facts, self.engine_args, os.environ)

    def counters(self, served: Served) -> dict | None:
        return None         # vLLM's responses carry every figure the sweep uses

    def point_acceptance(self, before: dict | None, after: dict | None) -> dict | None:
        return None

    def recommended_config(self, configs: Sequence[EngineConfig], recommended_k: dict[int, int]) -> dict | None:
        return recommended_config(list(configs), recommended_k)

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
                "dtype": vllm_dtype(self.serving_dtype), "engine_args": list(self.engine_args),
                "default_args": default_args(self.install.device, self.engine_args) if self.install else [],
                "servers": SERVERS,
                "configs": [dict(c.to_dict(), url=self.urls.get(c.k)) for c in configs],
                **self.gpu_record()}

    def gpu_record(self) -> dict:
        """On a GPU, the JSON's `gpu`: the device asked for, and each server's arguments and variables as
        it starts (the same dict, filled in during the sweep). Nothing on a CPU: its JSON stays as it was."""
        if self.install is None or self.install.cpu:
            return {}
        return {"gpu": {"requested_device": self.requested_device, "policy": gpu.VLLM_POLICY,
                        "servers": self.placements}}

    def environment(self) -> dict:
        """The machine vLLM runs on (its own environment's view), or what is known of given servers."""
        if self.install is not None:
            return self.install.environment()
        return {"device": "unknown: servers given by URL", "urls": sorted(set(self.urls.values()))}

    def start(self, config: EngineConfig) -> ServerHandle:
        args, env = self.placement()
        if args or env:
            self.placements[config.label] = {"args": args, "env": env}
        return start_server(self.install, self.model, label=config.label, dtype=self.serving_dtype,
                            speculative_config=config.speculative_config, engine_args=[*self.engine_args, *args],
                            log_dir=self.log_dir, env=env)
