"""Engines other than specviz's own loop that a sweep can measure: vLLM's and llama.cpp's
OpenAI-compatible servers, behind one interface (`engine.Engine`).

    vllm_server   where vLLM lives (its own environment), one server as a subprocess, its log
    watchdog      the small process that keeps a server and kills its whole group when specviz stops or dies
    vllm_client   a closed-loop streaming client (standard library only)
    configs       specviz's model strings and drafters as vLLM's --model and --speculative-config
    engine        the Engine protocol; VllmEngine: one server per configuration, started and stopped in turn
    llamacpp      LlamaCppEngine: llama.cpp's server (xllamacpp or a llama-server binary), the same way
    llamacpp_server   xllamacpp's server as a process of its own (llama-server's flags)
    gpu           a server on a GPU beside the own loop: its memory share, its pin, the layers offloaded

This layer sits under the runs (which measure with it) and over the models (whose built-in model it
hands to vLLM as a folder, and whose cached models it lets go before a server starts on a GPU). It
imports neither torch nor transformers itself, but for `gpu`'s reading of a GPU when a server is to run
on one.

The names below are imported on first use (lazy_loader), so that importing one module of this
package does not import all of them (`python -m specviz --help` starts without torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "configs": ["EngineConfig", "engine_configs", "model_location", "parse_speculative_config", "recommended_config",
                "vllm_dtype"],
    "engine": ["SERVERS", "TITLES", "Engine", "Served", "VllmEngine", "stop_all"],
    "llamacpp": ["LlamaCppEngine"],
    "vllm_client": ["Request", "Response", "closed_loop"],
    "vllm_install": ["INSTALL_HINT", "VllmInstall", "find_vllm"],
})

if TYPE_CHECKING:      # what the names are, for readers and type checkers
    from .configs import (EngineConfig, engine_configs, model_location, parse_speculative_config, recommended_config,
                          vllm_dtype)
    from .engine import SERVERS, TITLES, Engine, Served, VllmEngine, stop_all
    from .llamacpp import LlamaCppEngine
    from .vllm_client import Request, Response, closed_loop
    from .vllm_install import INSTALL_HINT, VllmInstall, find_vllm
