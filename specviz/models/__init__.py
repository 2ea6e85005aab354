"""Models for a run: where they come from (hub ids, folders, .gguf files, the built-in offline
models), loading and caching them, the drafter a draft spec names, and prompts as token ids.

    sources   what a model string names; the built-in models, converted once from GGUF
    devices   'auto' device and dtype for this machine
    memory    one GPU memory budget for a pair's weights and KV caches, decided before loading
    host      the machine: its description, software versions and load (the only reader of /proc)
    cache     loaded models kept in memory, least recently used first out
    loading   one model and its tokenizer, with errors a user can act on
    pairs     a target and its drafter (`load_pair`, `make_drafter`)
    tokens    prompts as token ids, context checks, the text of each generated token
    tiny      tiny random-weight Llama pairs built in-process (benchmarks without model files, tests)

The names below are imported on first use (lazy_loader), so that importing one module of this
package does not import all of them (`python -m specviz --help` starts without torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "devices": ["DTYPES", "auto_dtype", "checkpoint_dtype", "cpu_has_native_bf16", "default_threads", "resolve_device",
                "resolve_dtype", "threads_for_run", "use_threads"],
    "loading": ["LoadedModel", "load_model", "model_bytes"],
    "pairs": ["ModelPair", "end_of_turn_id", "eos_token_ids", "load_pair", "make_drafter", "vocabulary_mismatch"],
    "sources": ["BUILTINS", "DEFAULT_TARGET", "Source", "cache_folder", "convert_once", "display_name",
                "resolve_source"],
    "tokens": ["Detokenizer", "check_context", "encode_prompt"],
})

if TYPE_CHECKING:      # what the names are, for readers and type checkers
    from .devices import (DTYPES, auto_dtype, checkpoint_dtype, cpu_has_native_bf16, default_threads, resolve_device,
                          resolve_dtype, threads_for_run, use_threads)
    from .loading import LoadedModel, load_model, model_bytes
    from .pairs import ModelPair, end_of_turn_id, eos_token_ids, load_pair, make_drafter, vocabulary_mismatch
    from .sources import BUILTINS, DEFAULT_TARGET, Source, cache_folder, convert_once, display_name, resolve_source
    from .tokens import Detokenizer, check_context, encode_prompt
