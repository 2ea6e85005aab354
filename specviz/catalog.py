"""What ships in assets/: the model-pair presets, the example prompts of the app and the benchmark's
prompt set. Plain data, read once per call; nothing here loads a model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecvizError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
PRESETS_FILE = ASSETS / "presets.json"
EXAMPLES_FILE = ASSETS / "examples.json"
BENCH_PROMPTS_FILE = ASSETS / "bench_prompts.json"

PRESET_KEYS = ("name", "target", "draft", "description", "offline", "k", "notes")


def list_presets(path: Path | str = PRESETS_FILE) -> list[dict]:
    """The model pairs in assets/presets.json, in file order. Offline ones need no hub access."""
    try:
        presets = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SpecvizError(f"Could not read the presets file {path}: {error}") from None
    for preset in presets:
        missing = [key for key in PRESET_KEYS if key not in preset]
        if missing:
            raise SpecvizError(f"Preset {preset.get('name', '?')!r} in {path} lacks {', '.join(missing)}.")
    return presets


def load_examples(path: Path = EXAMPLES_FILE) -> list[dict]:
    """The app's example prompts as a flat list: category, title, prompt, chat."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [dict(category=c["name"], **e) for c in data["categories"] for e in c["examples"]]


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str
    chat: bool = True


def load_bench_prompts(path: Path | str = BENCH_PROMPTS_FILE, categories=None, limit: int | None = None) -> list[BenchPrompt]:
    """The benchmark prompts of `categories` (all when None), in file order; at most `limit` per category."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        known = data["categories"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SpecvizError(f"Could not read the prompt set {path}: {error}") from None
    wanted = list(known) if not categories else list(categories)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise SpecvizError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}: "
                           f"choose from {', '.join(known)}")
    prompts, taken = [], dict.fromkeys(wanted, 0)
    for item in data["prompts"]:
        if item["category"] in taken and (limit is None or taken[item["category"]] < limit):
            prompts.append(BenchPrompt(item["id"], item["category"], item["prompt"], item.get("chat", True)))
            taken[item["category"]] += 1
    return prompts
