"""llama.cpp's own HTTP server through xllamacpp, as a process of its own: `python llamacpp_server.py
FLAGS...`, where FLAGS are `llama-server`'s own flags (the subset in `FLAGS`), so that the command
specviz runs and the one it tells a user to copy are the same words.

Why a process and not a thread of specviz: xllamacpp's `Server` stops when the object is deleted,
which Ctrl-C in the middle of a request, a Gradio worker thread that is gone, or a crash may never
do; as a process under `watchdog.py` it is killed with its group whatever happens to specviz, as
vLLM's servers are. The server runs until it is killed (SIGTERM ends it cleanly).

`probe` (no flags, `--probe`) prints what the installed xllamacpp offers as one JSON line: its
version and which speculative-params API it has (see `speculative_api`).

Standard library and xllamacpp only: this file runs without importing specviz.
"""

import json
import signal
import sys
import threading

# llama-server flag -> (attributes of xllamacpp's CommonParams it sets, the type of its value, or for
# a flag without a value the value it sets). `--spec-type` is handled by `set_spec_type` (its API changed in 2026).
FLAGS = {
    "--model": (("model.path",), str),
    "--alias": (("model_alias",), lambda name: {name}),     # xllamacpp keeps a set of names
    "--port": (("port",), int),
    "--threads": (("cpuparams.n_threads", "cpuparams_batch.n_threads"), int),
    "--parallel": (("n_parallel",), int),
    "--ctx-size": (("n_ctx",), int),
    "--batch-size": (("n_batch",), int),
    "--metrics": (("endpoint_metrics",), True),
    "--n-gpu-layers": (("n_gpu_layers",), int),
    "--cont-batching": (("cont_batching",), True),
    "--no-cache-prompt": (("cache_prompt",), False),
    "--model-draft": (("speculative.draft.mparams.path",), str),
    "--spec-draft-n-max": (("speculative.draft.n_max",), int),
    "--spec-draft-n-min": (("speculative.draft.n_min",), int),
    "--spec-ngram-simple-size-n": (("speculative.ngram_simple.size_n",), int),
    "--spec-ngram-simple-size-m": (("speculative.ngram_simple.size_m",), int),
    "--spec-ngram-simple-min-hits": (("speculative.ngram_simple.min_hits",), int),
    "--spec-ngram-map-k-size-n": (("speculative.ngram_map_k.size_n",), int),
    "--spec-ngram-map-k-size-m": (("speculative.ngram_map_k.size_m",), int),
    "--spec-ngram-map-k-min-hits": (("speculative.ngram_map_k.min_hits",), int),
    "--spec-ngram-mod-n-match": (("speculative.ngram_mod.n_match",), int),
    "--spec-ngram-mod-n-min": (("speculative.ngram_mod.n_min",), int),
    "--spec-ngram-mod-n-max": (("speculative.ngram_mod.n_max",), int),
}


def speculative_api(speculative) -> str:
    """Which speculative-params API an xllamacpp has: "types" (2026 on: a list of types, the draft
    model's settings under `.draft`, each n-gram type's under its own name), "type" (before: one
    type, flat fields), or "unknown"."""
    if hasattr(speculative, "types") and hasattr(speculative, "draft"):
        return "types"
    if hasattr(speculative, "type"):
        return "type"
    return "unknown"


def probe() -> dict:
    import importlib.metadata

    import xllamacpp

    try:
        version = importlib.metadata.version("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(xllamacpp, "__version__", "unknown")
    speculative = xllamacpp.CommonParams().speculative
    return {"version": version, "api": speculative_api(speculative), "system_info": xllamacpp.get_system_info(),
            "fields": sorted(n for n in dir(speculative) if not n.startswith("_")), "devices": devices(xllamacpp)}


def devices(xllamacpp) -> list:
    """The backends' devices this build of llama.cpp has (a CPU build: the CPU alone), with their type
    ("CPU", "GPU", "IGPU", "ACCEL") and memory."""
    listing = xllamacpp.get_device_info() if hasattr(xllamacpp, "get_device_info") else []
    return [{"name": d.get("name", ""), "description": d.get("description", ""),
             "type": getattr(d.get("type"), "name", str(d.get("type"))).removeprefix("GGML_BACKEND_DEVICE_TYPE_"),
             "memory_total": d.get("memory_total")} for d in listing]


def _set(params, path: str, value) -> None:
    *owners, name = path.split(".")
    target = params
    for owner in owners:
        target = getattr(target, owner)
    setattr(target, name, value)


def set_spec_type(params, names: str) -> None:
    import xllamacpp

    if speculative_api(params.speculative) != "types":
        raise SystemExit(f"xllamacpp's speculative-params API is not the one specviz drives (found "
                         f"{speculative_api(params.speculative)!r}): install xllamacpp 2026.10 or newer.")
    kinds = xllamacpp.common_speculative_type
    types = []
    for name in names.split(","):
        member = "COMMON_SPECULATIVE_TYPE_" + name.strip().upper().replace("-", "_")
        if not hasattr(kinds, member):
            raise SystemExit(f"--spec-type {name!r}: this xllamacpp has no such type")
        types.append(getattr(kinds, member))
    params.speculative.types = types


def params_from(flags: list[str]):
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.port = 0
    words = list(flags)
    while words:
        flag, _, inline = words.pop(0).partition("=")
        if flag == "--spec-type":
            set_spec_type(params, inline or words.pop(0))
            continue
        if flag not in FLAGS:
            raise SystemExit(f"llamacpp_server: flag {flag!r} is not one specviz maps to xllamacpp "
                             f"(known: {', '.join(sorted(FLAGS))}, --spec-type)")
        paths, kind = FLAGS[flag]
        value = kind(inline or words.pop(0)) if callable(kind) else kind
        for path in paths:
            _set(params, path, value)
    return params


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe()), flush=True)
        return 0
    import xllamacpp

    params = params_from(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(f"llamacpp_server: listening on {server.listening_address}", flush=True)
    while not stop.wait(0.5):
        pass
    del server          # its destructor stops llama.cpp's loop and HTTP threads
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
