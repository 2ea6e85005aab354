"""A draft head's files, read without torch: their names, the heads shipped in assets/, a folder or
hub id made a folder, and its config.json (speculators' EAGLE-3 format, checked) with its draft length.
`models.heads` loads and saves the weights."""

from __future__ import annotations

import json
from pathlib import Path

from ..catalog import ASSETS
from ..errors import SpecvizError
from .sources import BUILTINS, cache_folder, hub_offline

CONFIG, WEIGHTS, NOTES = "config.json", "model.safetensors", "specviz.json"
FIRST_CONFIG = "head.json"          # the first specviz heads (EAGLE-1 shaped): refused, to be retrained
SHIPPED_HEADS = ASSETS / "heads"
DEFAULT_K = 2                       # best measured for the shipped head (README: Trained draft heads)
UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")   # vLLM variants this loop does not run


def shipped_head(target_name: str) -> Path:
    """The folder of the head shipped for a built-in target (refused if there is none)."""
    folder = SHIPPED_HEADS / target_name
    if not has_shipped_head(target_name):
        shipped = sorted(p.parent.name for p in SHIPPED_HEADS.glob(f"*/{CONFIG}"))
        raise SpecvizError(f"No draft head ships for {target_name}: 'head' alone is the head shipped for "
                           f"{', '.join(shipped) or 'no target'}; train one with `python -m specviz train-draft "
                           "--target ... --out DIR` and use 'head:DIR'.")
    return folder


def has_shipped_head(target_name: str) -> bool:
    """Whether a head ships for the built-in target of this display name."""
    return (SHIPPED_HEADS / target_name / CONFIG).is_file()


def builtin_name(model: str) -> str | None:
    """The built-in model a model string names, by its name, its hub id or its converted copy here; None
    for any other model."""
    text = str(model or "").strip().rstrip("/")
    for builtin in BUILTINS.values():
        if text.lower() in (builtin.name.lower(), (builtin.hub_id or builtin.name).lower()):
            return builtin.name
        if text and Path(text).expanduser().resolve() == (cache_folder() / "models" / builtin.name).resolve():
            return builtin.name
    return None


def shipped_head_for(target: str) -> Path:
    """The head shipped for the model string `target`: the one whose config names it (`is_made_for`: a
    built-in by its name, hub id or converted copy). Refused for any other model, even one of the same
    shape."""
    for config in sorted(SHIPPED_HEADS.glob(f"*/{CONFIG}")):
        if is_made_for(_json(config, config.parent), target):
            return config.parent
    name = builtin_name(target)
    if name is None:
        shipped = sorted(p.parent.name for p in SHIPPED_HEADS.glob(f"*/{CONFIG}"))
        raise SpecvizError(f"'head' alone is the draft head shipped for the built-in {', '.join(shipped)}, and the "
                           f"target is {target}: a head drafts for the model it was trained on. Train one for it with "
                           f"`python -m specviz train-draft --target {target} --out DIR` and use 'head:DIR'.")
    return shipped_head(name)


def made_for(data: dict) -> str:
    """The target a head's config.json names (`speculators_config.verifier.name_or_path`): a hub id or a
    folder; specviz's first EAGLE-3 heads wrote the built-in's display name ('SmolLM2-135M-Instruct')."""
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    return str(verifier.get("name_or_path") or "")


def is_made_for(data: dict, target: str) -> bool:
    """Whether a head's config names `target` (a model string): the same string or folder, or the same
    built-in by its display name, hub id or converted copy."""
    def canonical(model: str) -> str:
        text = str(model).strip().rstrip("/")
        path = Path(text).expanduser()
        return builtin_name(text) or (str(path.resolve()) if path.exists() else text)

    return bool(made_for(data)) and canonical(made_for(data)) == canonical(target)


def head_folder(location: Path | str) -> Path:
    """A head's folder: `location` itself, or a hub id (ORG/NAME) fetched with huggingface_hub (its
    config.json and safetensors only)."""
    folder = Path(location).expanduser()
    text = str(location)
    if folder.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        if not folder.is_dir():
            raise SpecvizError(f"Draft head {location}: no such folder.")
        return folder
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(text, allow_patterns=[CONFIG, "*.safetensors", NOTES]))
    except Exception as error:  # noqa: BLE001 - the hub raises many kinds; each becomes one message
        offline = " HF_HUB_OFFLINE is set: only heads already in the local hub cache load." if hub_offline() else ""
        raise SpecvizError(f"Draft head {text!r}: not a folder here, and fetching it from the Hugging Face hub "
                           f"failed ({str(error).splitlines()[0][:200]}).{offline} Download it elsewhere and "
                           "pass its folder, or check the id.") from None


def _json(path: Path, folder: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise SpecvizError(f"Draft head {folder}: {path.name} is corrupt (not JSON: {error}).") from None
    if not isinstance(data, dict):
        raise SpecvizError(f"Draft head {folder}: {path.name} is not a JSON object.")
    return data


def read_config(folder: Path | str) -> dict:
    """The head's config.json (speculators), with its default k and specviz's notes."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecvizError(f"Draft head {folder}: no such folder.")
    if not (folder / CONFIG).is_file():
        if (folder / FIRST_CONFIG).is_file():
            raise SpecvizError(f"Draft head {folder} is a first specviz head ({FIRST_CONFIG}, EAGLE-1 shaped, a format "
                               "only older specviz read): this specviz reads EAGLE-3 heads in the speculators format, "
                               "which vLLM serves too. Train it again with `python -m specviz train-draft --target "
                               "... --out DIR`.")
        raise SpecvizError(f"Draft head {folder}: it has no {CONFIG} (a head folder holds {CONFIG} and {WEIGHTS} in "
                           "the speculators format, written by `python -m specviz train-draft`).")
    data = _json(folder / CONFIG, folder)
    kind = data.get("speculators_model_type")
    if kind != "eagle3":
        raise SpecvizError(f"Draft head {folder}: {CONFIG} is not an EAGLE-3 head in the speculators format "
                           f"(speculators_model_type {kind!r}; specviz runs 'eagle3').")
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict) or layer.get("model_type", "llama") != "llama":
        raise SpecvizError(f"Draft head {folder}: its transformer_layer_config is missing or not a Llama layer.")
    used = [key for key in UNSUPPORTED if data.get(key)]
    if used:
        raise SpecvizError(f"Draft head {folder}: it uses {', '.join(used)}, which specviz's loop does not run yet.")
    notes = _json(folder / NOTES, folder) if (folder / NOTES).is_file() else {}
    try:
        proposal = data["speculators_config"]["proposal_methods"][0]
        k = int(proposal.get("speculative_tokens", DEFAULT_K))
    except (KeyError, IndexError, TypeError, ValueError):
        k = DEFAULT_K
    return {**data, "k": k, "notes": notes}


def spec_location(spec, target_name: str) -> Path | str:
    """Where a head spec points: DIR_OR_ID for 'head:DIR_OR_ID', the folder of the head shipped for
    `target_name` for 'head' (refused when none ships)."""
    return spec.folder or shipped_head(target_name)


def default_k(spec, target_name: str) -> int:
    """The draft length a head found best (its config's): the shipped head's for 'head', DIR's for
    'head:DIR'; the shipped default when the config cannot be read (loading then says why)."""
    try:
        folder = spec_location(spec, target_name)
        return int(read_config(folder).get("k", DEFAULT_K)) if Path(folder).is_dir() else DEFAULT_K
    except (SpecvizError, ValueError, TypeError):
        return DEFAULT_K
