"""Trained draft heads on disk (core.head): a folder with `head.safetensors` (the head's own weights and
its draft vocabulary) and `head.json` (its shape, the target it was trained for, how it was trained,
the draft length it drafts best at). `load_head` refuses a head made for another target (hidden size,
vocabulary, layer count), a corrupt or partial file, and says which. `save_head` writes both files
(the weights first, the config last, each through a temporary name: an interrupted save leaves the
previous head whole). The head shipped for the built-in target lives under assets/heads/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from ..catalog import ASSETS
from ..core.head import DraftHead, HeadConfig, HeadDrafter
from ..errors import SpecvizError

FORMAT = "specviz-draft-head"
VERSION = 1
WEIGHTS, CONFIG = "head.safetensors", "head.json"
SHIPPED_HEADS = ASSETS / "heads"
DEFAULT_K = 2                       # best measured for the shipped head (README: Trained draft heads)


def shipped_head(target_name: str) -> Path:
    """The folder of the head shipped for a built-in target (refused if there is none)."""
    folder = SHIPPED_HEADS / target_name
    if not (folder / CONFIG).is_file():
        shipped = sorted(p.parent.name for p in SHIPPED_HEADS.glob(f"*/{CONFIG}"))
        raise SpecvizError(f"No draft head ships for {target_name}: 'head' alone is the head shipped for "
                           f"{', '.join(shipped) or 'no target'}; train one with `python -m specviz train-draft "
                           "--target ... --out DIR` and use 'head:DIR'.")
    return folder


def default_k(spec, target_name: str) -> int:
    """The draft length a head found best (its config's k): the shipped head's for 'head', DIR's for
    'head:DIR'; the shipped default when the config cannot be read (loading then says why)."""
    try:
        folder = spec.folder or shipped_head(target_name)
        return int(read_config(folder).get("k", DEFAULT_K))
    except (SpecvizError, ValueError, TypeError):
        return DEFAULT_K


def target_shape(target: PreTrainedModel) -> dict:
    config = target.config.get_text_config()
    return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size, "layers": config.num_hidden_layers}


def read_config(folder: Path | str) -> dict:
    folder = Path(folder)
    path = folder / CONFIG
    if not folder.is_dir():
        raise SpecvizError(f"Draft head {folder}: no such folder.")
    if not path.is_file():
        raise SpecvizError(f"Draft head {folder}: it has no {CONFIG} (a head folder holds {CONFIG} and {WEIGHTS}, "
                           "written by `python -m specviz train-draft`).")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise SpecvizError(f"Draft head {folder}: {CONFIG} is corrupt (not JSON: {error}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecvizError(f"Draft head {folder}: {CONFIG} is not a specviz draft head's config.")
    if data.get("version") != VERSION:
        raise SpecvizError(f"Draft head {folder}: format version {data.get('version')!r}, this specviz reads "
                           f"version {VERSION}.")
    try:
        data["head"] = HeadConfig(**data["head"])
    except (KeyError, TypeError) as error:
        raise SpecvizError(f"Draft head {folder}: {CONFIG} lacks the head's shape ({error}).") from None
    return data


def check_target(data: dict, target: PreTrainedModel, folder, target_name: str) -> None:
    trained_for = data.get("target", {})
    actual = target_shape(target)
    labels = {"hidden_size": "hidden size", "vocab_size": "vocabulary", "layers": "layer count"}
    differ = [f"{labels[key]} {trained_for.get(key)} (the target's: {actual[key]})"
              for key in labels if trained_for.get(key) != actual[key]]
    if differ:
        raise SpecvizError(f"Draft head {folder} was trained for {trained_for.get('name', 'another target')}, not "
                           f"{target_name}: {', '.join(differ)}. Train a head for this target with "
                           "`python -m specviz train-draft`.")


def load_head(folder: Path | str, target: PreTrainedModel, *, target_name: str = "the target",
              name: str | None = None) -> HeadDrafter:
    """The drafter of the head in `folder`, bound to `target` (its embedding and LM head rows shared)."""
    folder = Path(folder)
    data = read_config(folder)
    check_target(data, target, folder, target_name)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise SpecvizError(f"Draft head {folder}: {WEIGHTS} is missing.")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as error:
        raise SpecvizError(f"Draft head {folder}: {WEIGHTS} is corrupt or partial ({error}).") from None
    head = DraftHead(data["head"])
    expected = head.state_dict()
    missing, unknown = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = sorted(key for key in set(expected) & set(state) if expected[key].shape != state[key].shape)
    if missing or wrong or unknown:
        raise SpecvizError(f"Draft head {folder}: {WEIGHTS} is partial or for another shape "
                           f"(missing: {', '.join(missing) or 'none'}; wrong shape: {', '.join(wrong) or 'none'}; "
                           f"unknown: {', '.join(unknown) or 'none'}).")
    vocab = state["vocab"]
    if vocab.numel() and (int(vocab.min()) < 0 or int(vocab.max()) >= data["head"].target_vocab_size):
        raise SpecvizError(f"Draft head {folder}: its draft vocabulary maps to ids outside the target's.")
    head.load_state_dict(state)
    head = head.to(device=target.device, dtype=target.dtype).bind(target)
    drafter = HeadDrafter(head, name=name or f"head:{folder}")
    drafter.default_k = int(data.get("k", DEFAULT_K))
    drafter.trained = data.get("trained", {})
    return drafter


def save_head(head: DraftHead, folder: Path | str, *, target: PreTrainedModel, target_name: str, trained: dict,
              k: int = DEFAULT_K) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu").contiguous() for key, value in head.state_dict().items()}
    state = {key: value if key == "vocab" else value.to(torch.bfloat16) for key, value in state.items()}
    temporary = folder / (WEIGHTS + ".tmp")
    save_file(state, str(temporary))
    os.replace(temporary, folder / WEIGHTS)
    config = {"format": FORMAT, "version": VERSION, "head": head.config.to_dict(),
              "target": {"name": target_name, **target_shape(target)}, "k": k, "trained": trained}
    temporary = folder / (CONFIG + ".tmp")
    temporary.write_text(json.dumps(config, indent=1), encoding="utf-8")
    os.replace(temporary, folder / CONFIG)
