"""Draft heads on disk, in the `speculators` format that vLLM serves (`{"method": "eagle3", "model": DIR}`): a
folder (or a hub id) with `config.json` and `model.safetensors`.

config.json: `speculators_model_type: "eagle3"`, `transformer_layer_config` (a one-layer Llama config of the
target's width and vocabulary), `draft_vocab_size`, `target_hidden_size`, `norm_before_residual` (written
always: vLLM assumes true when it is absent), `eagle_aux_hidden_state_layer_ids` (transformers'
`output_hidden_states` indices: distinct, each below the target's layer count), `speculators_config`
(`proposal_methods[0].speculative_tokens`: the draft length; `verifier.name_or_path`: the target as the
`speculators` library loads it, a hub id or a folder: `verifier_location`). The weights: `fc.weight`,
`layers.0.*`, `norm.weight`, `lm_head.weight`, `d2t` (target id = draft id + d2t), `t2d`; no embedding (the
target's is shared).
specviz's own notes (how it was trained, what it measured) sit beside them in `specviz.json`.

The files (names, the shipped heads, reading config.json) are `models.head_files`. `load_head` refuses a
head for another target (width, vocabulary, layers), a corrupt or partial file, a variant this loop does not
run (fc norms, normed outputs), and says which. The first specviz heads (`head.json` + `head.safetensors`,
EAGLE-1 shaped, in a format only specviz read) are refused with a message to retrain them. `save_head`
writes the weights first and the config last, each through a temporary name: an interrupted save leaves the
previous head whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PreTrainedModel

from ..core.eagle3 import Eagle3Head, default_layer_ids, layer_ids_problem
from ..core.head import HeadDrafter
from ..errors import SpecvizError
from ..settings import switched_on
from .head_files import CONFIG, DEFAULT_K, NOTES, WEIGHTS, head_folder, made_for, read_config
from .sources import BUILTINS, cache_folder

INT8_ENV = "SPECVIZ_HEAD_INT8"      # 0: a head on a CPU drafts in its float dtype (`load_head`)
LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "attention_bias",
              "mlp_bias", "tie_word_embeddings", "bos_token_id", "eos_token_id")


def target_shape(target: PreTrainedModel) -> dict:
    config = target.config.get_text_config()
    return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size, "layers": config.num_hidden_layers}


def _refuse_mismatch(folder, trained_for: dict, actual: dict, target_name: str, made_for: str) -> None:
    labels = {"hidden_size": "hidden size", "vocab_size": "vocabulary", "layers": "layer count"}
    differ = [f"{labels[key]} {trained_for.get(key)} (the target's: {actual[key]})"
              for key in labels if key in trained_for and trained_for[key] != actual[key]]
    if differ:
        raise SpecvizError(f"Draft head {folder} was trained for {made_for}, not {target_name}: {', '.join(differ)}. "
                           "Train a head for this target with `python -m specviz train-draft`.")


def _weights(folder: Path, names: list[str]) -> dict[str, torch.Tensor]:
    files = [folder / n for n in names if (folder / n).is_file()] or sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpecvizError(f"Draft head {folder}: {names[0]} is missing.")
    state = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as error:
            raise SpecvizError(f"Draft head {folder}: {path.name} is corrupt or partial ({error}).") from None
    return state


def _check_keys(folder: Path, expected: dict, state: dict, file: str) -> None:
    missing, unknown = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = sorted(key for key in set(expected) & set(state) if expected[key].shape != state[key].shape)
    if missing or wrong or unknown:
        raise SpecvizError(f"Draft head {folder}: {file} is partial or for another shape "
                           f"(missing: {', '.join(missing) or 'none'}; wrong shape: {', '.join(wrong) or 'none'}; "
                           f"unknown: {', '.join(unknown) or 'none'}).")


def eagle3_head(data: dict, target: PreTrainedModel | None = None) -> Eagle3Head:
    """An (untrained) head of the shape config.json describes."""
    layer = LlamaConfig(**{key: value for key, value in data["transformer_layer_config"].items()
                           if key not in ("architectures", "model_type")})
    layers = data.get("eagle_aux_hidden_state_layer_ids")
    if not layers:
        if target is None:
            raise SpecvizError("A head without eagle_aux_hidden_state_layer_ids needs its target to default them.")
        try:
            layers = default_layer_ids(target_shape(target)["layers"])
        except ValueError as error:
            raise SpecvizError(str(error)) from None
    return Eagle3Head(layer, draft_vocab_size=int(data.get("draft_vocab_size") or layer.vocab_size),
                      target_hidden_size=int(data.get("target_hidden_size") or layer.hidden_size),
                      layer_ids=tuple(int(i) for i in layers),
                      norm_before_residual=bool(data.get("norm_before_residual", True)))


def _speculators_state(state: dict, head: Eagle3Head) -> dict:
    """Other writers' names to the speculators ones ('model.' prefixes, EAGLE's 'midlayer.'); no
    embedding (the target's is used); d2t / t2d made when a full-vocabulary head has none."""
    renamed = {}
    for key, value in state.items():
        key = key.removeprefix("model.").replace("midlayer.", "layers.0.")
        if key != "embed_tokens.weight":
            renamed[key] = value
    if "d2t" not in renamed and head.draft_vocab_size == head.target_vocab_size:
        renamed["d2t"] = torch.zeros(head.draft_vocab_size, dtype=torch.long)
    if "t2d" not in renamed and "d2t" in renamed:
        t2d = torch.zeros(head.target_vocab_size, dtype=torch.bool)
        t2d[torch.arange(head.draft_vocab_size) + renamed["d2t"].long()] = True
        renamed["t2d"] = t2d
    return renamed


def load_head(location: Path | str, target: PreTrainedModel, *, target_name: str = "the target",
              name: str | None = None, dtype: torch.dtype | None = None, int8: bool | None = None) -> HeadDrafter:
    """The drafter of the head in `location` (a folder or a hub id), bound to `target`, in the target's
    dtype or `dtype` (training goes on in float32 from the weights as saved). int8: whether it drafts
    with int8 products (`eagle3.int8_copy`); by default on a CPU unless SPECVIZ_HEAD_INT8=0."""
    folder = head_folder(location)
    data = read_config(folder)
    head = _load_eagle3(folder, data, target, target_name, dtype or target.dtype)
    if int8 is None:
        int8 = head.device.type == "cpu" and switched_on(INT8_ENV)
    drafter = HeadDrafter(head, name=name or f"head:{location}", int8=int8)
    drafter.default_k = int(data.get("k", DEFAULT_K))
    drafter.trained = data.get("notes", {}).get("trained", {})
    return drafter


def _load_eagle3(folder: Path, data: dict, target: PreTrainedModel, target_name: str, dtype: torch.dtype
                 ) -> Eagle3Head:
    head = eagle3_head(data, target)
    actual = target_shape(target)
    _refuse_mismatch(folder, {"hidden_size": head.target_hidden_size, "vocab_size": head.target_vocab_size},
                     actual, target_name, made_for(data) or "another target")
    problem = layer_ids_problem(head.hidden_layers, actual["layers"])
    if problem:
        raise SpecvizError(f"Draft head {folder} cannot read {target_name}'s hidden states: {problem}. Train a head "
                           "with `python -m specviz train-draft` (it picks valid ones).")
    state = _speculators_state(_weights(folder, [WEIGHTS]), head)
    _check_keys(folder, head.state_dict(), state, WEIGHTS)
    d2t = state["d2t"].long()
    ids = torch.arange(d2t.numel()) + d2t
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= head.target_vocab_size):
        raise SpecvizError(f"Draft head {folder}: its draft vocabulary (d2t) maps to ids outside the target's.")
    head.load_state_dict({**state, "d2t": d2t})
    head = head.to(device=target.device, dtype=dtype).refresh_vocab().bind(target)
    return head


def verifier_location(target: PreTrainedModel, target_name: str) -> str:
    """What a head's `verifier.name_or_path` says: where the `speculators` library (and a person) finds
    the target. A built-in's hub id (its copy here is converted from a GGUF file of the same model), else
    where the target was loaded from (a hub id or a folder), else its name."""
    loaded_from = str(getattr(target.config, "name_or_path", "") or "")
    builtin = BUILTINS.get(target_name)
    if builtin is not None and builtin.hub_id and (
            not loaded_from or loaded_from == builtin.hub_id
            or Path(loaded_from).expanduser().resolve() == (cache_folder() / "models" / builtin.name).resolve()):
        return builtin.hub_id
    return loaded_from or target_name


def speculators_config(head: Eagle3Head, *, verifier: str, k: int, dtype: torch.dtype) -> dict:
    """config.json for `head` (module docstring)."""
    dtype_name = str(dtype).removeprefix("torch.")
    full = head.layer_config.to_dict()
    layer = {key: full[key] for key in LAYER_KEYS if key in full}
    layer.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"], model_type="llama", dtype=dtype_name,
                 rope_theta=full.get("rope_parameters", {}).get("rope_theta", 10000.0))   # for older readers
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0", "torch_dtype": dtype_name,
            "transformer_layer_config": layer, "draft_vocab_size": head.draft_vocab_size,
            "target_hidden_size": head.target_hidden_size, "norm_before_residual": head.norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": list(head.hidden_layers),
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
                                   "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}}}


def _write(path: Path, write) -> None:
    temporary = path.with_name(path.name + ".tmp")
    write(temporary)
    os.replace(temporary, path)


def save_head(head: Eagle3Head, folder: Path | str, *, target_name: str, trained: dict, k: int = DEFAULT_K,
              verifier: str | None = None) -> None:
    """Write the head in the speculators format, its weights in the dtype they have (the dtype trained)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu").contiguous() for key, value in head.state_dict().items()}
    dtype = head.dtype
    _write(folder / WEIGHTS, lambda path: save_file(state, str(path)))
    notes = {"target": target_name, "k": k, "trained": trained}
    _write(folder / NOTES, lambda path: path.write_text(json.dumps(notes, indent=1), encoding="utf-8"))
    config = speculators_config(head, verifier=verifier or target_name, k=k, dtype=dtype)
    _write(folder / CONFIG, lambda path: path.write_text(json.dumps(config, indent=1), encoding="utf-8"))
