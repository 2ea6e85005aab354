"""What vLLM is asked to run: specviz's model strings as something vLLM loads, and specviz's drafters
as vLLM's `--speculative-config`.

- The built-in model is the folder specviz converts it into once (its cache); a folder, a .gguf file or
  a hub id passes through as given (vLLM downloads a hub id itself, unless HF_HUB_OFFLINE is set).
- `ngram` (prompt lookup) maps to vLLM's ngram proposer with specviz's match lengths (1 to 3 tokens),
  a draft model to `draft_model`; `suffix` to vLLM's suffix decoding (which needs `arctic-inference` in
  vLLM's environment: vLLM says so if it is missing); a draft head (`head`, `head:DIR`, `head:ORG/NAME`,
  in the speculators format: models.heads) to `eagle3` with that folder or hub id (the first specviz
  heads, head.json, are EAGLE-1 shaped and specviz's own: refused); bare `head` only for the built-in
  target it ships for (another --target would be served a head trained on another model). Early exit
  and trees have no vLLM counterpart and are refused. Any other method (eagle, eagle3, mtp, ...) passes
  through as JSON (`--speculative-config`), its draft length set per k measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecvizError
from ..models.head_files import CONFIG, shipped_head_for
from ..models.sources import BUILTINS, DEFAULT_TARGET, Progress, builtin_source, resolve_source
from ..settings import DraftSpec

NGRAM_MIN, NGRAM_MAX = 1, 3      # specviz's PromptLookupDrafter matches the last 3..1 tokens
# specviz's dtype names (models.devices.DTYPES) -> vLLM's --dtype choices (it refuses "bf16", "fp32").
VLLM_DTYPES = {"auto": "auto", "float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "half": "float16"}


def vllm_dtype(name: str) -> str:
    """vLLM's --dtype for one of specviz's dtype names."""
    key = (name or "auto").strip().lower()
    if key not in VLLM_DTYPES:
        raise SpecvizError(f"Unknown dtype {name!r}: use auto, float32 (fp32), bfloat16 (bf16) or float16 (fp16).")
    return VLLM_DTYPES[key]


@dataclass(frozen=True)
class EngineConfig:
    """One server's configuration: k = 0 is the plain server."""

    k: int
    speculative_config: dict | None

    @property
    def label(self) -> str:
        if self.speculative_config is None:
            return "plain"
        # vLLM's "method", llama.cpp's "type" (engines.llamacpp)
        method = self.speculative_config.get("method") or self.speculative_config.get("type", "speculative")
        model = self.speculative_config.get("model")
        return f"{method} {str(model).rstrip('/').rsplit('/', 1)[-1]} k={self.k}" if model else f"{method} k={self.k}"

    def to_dict(self) -> dict:
        return {"k": self.k, "label": self.label, "speculative_config": self.speculative_config}


def model_location(spec: str | None, progress: Progress | None = None) -> str:
    """What vLLM's --model gets for a specviz model string."""
    source = resolve_source(spec or DEFAULT_TARGET)
    if source.kind == "builtin":
        return builtin_source(BUILTINS[source.location], progress).location
    if source.kind == "gguf":
        return f"{source.location}/{source.gguf_file}"
    return source.location


def head_location(spec, target: str | None = None) -> str:
    """What vLLM's eagle3 `model` gets for 'head:DIR' (DIR), or for 'head' the head shipped for `target` (a
    model string; the built-in default when None): refused when `target` is not the built-in it ships for."""
    location = spec.folder or str(shipped_head_for(target or DEFAULT_TARGET))
    folder = Path(location).expanduser()
    if folder.is_dir():
        if not (folder / CONFIG).is_file():
            raise SpecvizError(f"Draft head {location}: vLLM serves heads in the speculators format (config.json + "
                               "model.safetensors, written by `python -m specviz train-draft`); this one is an "
                               "older specviz head only specviz's own loop runs.")
        return str(folder.resolve())
    return location


def load_json(text: str | None, example: str) -> object:
    """--speculative-config's JSON (None when not given); `example` ends the message for bad JSON."""
    if text is None or not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise SpecvizError(f"--speculative-config is not JSON ({error}): give an object such as {example}.") from None


def parse_server_urls(values, given_as: str) -> dict[int, str]:
    """Running servers by draft length, from "K=URL" items (`given_as`: the flag or variable, for the
    message): 0 the plain server, 4 the speculative one at k = 4."""
    urls = {}
    for value in values:
        k, sep, url = value.strip().partition("=")
        if not sep or not k.strip().isdigit() or not url.strip().startswith(("http://", "https://")):
            raise SpecvizError(f"{given_as} {value!r}: write K=URL, e.g. 0=http://127.0.0.1:8000 for the plain "
                               "server and 4=http://127.0.0.1:8001 for the speculative one at k = 4.")
        urls[int(k)] = url.strip()
    return urls


def parse_speculative_config(text: str | None) -> dict | None:
    """--speculative-config's JSON object (None when not given)."""
    config = load_json(text, '\'{"method": "eagle3", "model": "ORG/NAME", "num_speculative_tokens": 4}\'')
    if config is None:
        return None
    if not isinstance(config, dict) or not config.get("method") and not config.get("model"):
        raise SpecvizError("--speculative-config must be a JSON object with a \"method\" (ngram, suffix, draft_model, "
                           "eagle, eagle3, mtp, ...).")
    return config


def speculative_config(spec: DraftSpec | None, k: int, given: dict | None = None,
                       progress: Progress | None = None, target: str | None = None) -> dict | None:
    """vLLM's speculative config for a specviz drafter (or the given JSON) at draft length k, for the target
    model string `target` (None: the built-in default); None for k = 0. `spec` is parsed once, where the
    settings are validated (`settings.parse_draft`), and passed down."""
    if k <= 0:
        return None
    if given is not None:
        return dict(given, num_speculative_tokens=k)
    if spec.kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": NGRAM_MIN,
                "prompt_lookup_max": NGRAM_MAX}
    if spec.kind == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if spec.kind == "model":
        return {"method": "draft_model", "model": model_location(spec.text, progress), "num_speculative_tokens": k}
    if spec.kind == "head":
        return {"method": "eagle3", "model": head_location(spec, target), "num_speculative_tokens": k}
    if spec.kind == "auto":
        raise SpecvizError(HYBRID_ON_ENGINES.format(engine="vLLM"))
    raise SpecvizError(f"vLLM has no drafter like {spec.name!r} (early exit and trees are specviz's own): use "
                       "ngram, suffix, a draft model, or --speculative-config JSON for eagle3, mtp and the others.")


# Neither engine chooses a drafter per cycle: what deploys there today is the best single drafter.
HYBRID_ON_ENGINES = ("{engine} drafts with one drafter: 'auto' (a drafter chosen each cycle) is specviz's own. "
                     "Serve the drafter that measured best on your prompts (ngram, suffix or a head).")


def engine_configs(spec: DraftSpec | None, ks, given: dict | None = None,
                   progress: Progress | None = None, target: str | None = None) -> list[EngineConfig]:
    """The plain server first, then one speculative server per k > 0 (`spec`: None with `given`), for the
    target model string `target` (None: the built-in default)."""
    return [EngineConfig(0, None)] + [EngineConfig(k, speculative_config(spec, k, given, progress, target))
                                      for k in ks if k > 0]


def per_batch_schedule(recommended_k: dict[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` for a {batch size: best k} map: inclusive ranges
    [start, end, k], the first from 1, each measured size's k up to the next size measured (vLLM
    carries the last range's k on to larger batches)."""
    batches = sorted(recommended_k)
    schedule = []
    for i, batch in enumerate(batches):
        start = 1 if i == 0 else batch
        end = batches[i + 1] - 1 if i + 1 < len(batches) else batch
        schedule.append([start, end, recommended_k[batch]])
    return schedule


def recommended_config(configs: list[EngineConfig], recommended_k: dict[int, int]) -> dict | None:
    """The object to pass to vLLM's --speculative-config for this traffic: the measured config at the
    largest k that paid, with a per-batch-size draft length when the best k differs between sizes
    (0 = off at that size); None when speculation paid at no batch size."""
    paying = {k for k in recommended_k.values() if k > 0}
    if not paying:
        return None
    by_k = {c.k: c.speculative_config for c in configs if c.speculative_config is not None}
    config = dict(by_k[max(paying)])
    if len(set(recommended_k.values())) > 1:
        config["num_speculative_tokens_per_batch_size"] = per_batch_schedule(recommended_k)
    return config
