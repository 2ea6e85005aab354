"""What ships: specviz's version, and in assets/ the model-pair presets, the example prompts of the app
and the benchmark's prompt set. Plain data, read once per call; nothing here loads a model."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecvizError
from .files import read_limited

# The one place the version is written: pyproject.toml reads it from here ([tool.setuptools.dynamic]),
# the package exports it as `specviz.__version__`, environments record it.
VERSION = "0.1.0"

ASSETS = Path(__file__).resolve().parent.parent / "assets"
PRESETS_FILE = ASSETS / "presets.json"
EXAMPLES_FILE = ASSETS / "examples.json"
BENCH_PROMPTS_FILE = ASSETS / "bench_prompts.json"
TRAIN_PROMPTS_FILE = ASSETS / "train_prompts.txt"   # chat prompts for training draft heads (none from the sets above)
HUMAN_PROMPTS_FILE = ASSETS / "human_prompts.txt"   # user messages as people type them, written for specviz:
                                                  # the shipped head's fine-tuning (none from the sets above)
# Spec-Bench (Xia et al. 2024, github.com/hemingkx/Spec-Bench, Apache-2.0: LICENSE beside it), its
# question file as published (480 prompts); `load_spec_bench` reads it.
SPEC_BENCH_FILE = ASSETS / "spec_bench" / "question.jsonl"
SPEC_BENCH = "spec-bench"                           # its name where a prompt set is named
PLOTLY_BASIC_JS = ASSETS / "plotly-basic.min.js"     # plotly.js's basic bundle (scatter, bar), MIT
RECORDINGS = ASSETS / "recordings"

PRESET_KEYS = ("name", "target", "draft", "description", "offline", "k", "notes")
# Prompt files are read no further than this: a device or a pipe (/dev/zero) claims size 0 and
# may never end.
MAX_PROMPT_FILE_BYTES = 16 * 1024 * 1024


def plotly_js() -> str:
    """plotly.js for a standalone page: the 1.2 MB basic bundle that ships in assets/ (the charts
    use scatter and bar only), else the 4.8 MB full one the plotly package carries."""
    try:
        return PLOTLY_BASIC_JS.read_text(encoding="utf-8")
    except OSError:
        from plotly.offline import get_plotlyjs

        return get_plotlyjs()


def bundled_recordings() -> dict[str, Path]:
    """The recordings in assets/recordings/, by file name."""
    return {path.name: path for path in sorted(RECORDINGS.glob("*.json"))}


def list_presets(path: Path | str = PRESETS_FILE) -> list[dict]:
    """The model pairs in assets/presets.json, in file order, that can run here: a preset that
    `requires` a package (the optional built-in Gemma-3-270M's) is left out unless it is installed.
    Offline ones need no hub access. The hosted demo's allow-list is made of these (`settings.hosted`)."""
    try:
        presets = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise SpecvizError(f"Could not read the presets file {path}: {error}") from None
    for preset in presets:
        missing = [key for key in PRESET_KEYS if key not in preset]
        if missing:
            raise SpecvizError(f"Preset {preset.get('name', '?')!r} in {path} lacks {', '.join(missing)}.")
        if not isinstance(preset.get("requires", ""), str) or "." in preset.get("requires", ""):
            raise SpecvizError(f"Preset {preset['name']!r} in {path}: \"requires\" must name a top-level package.")
    return [preset for preset in presets if installed(preset.get("requires"))]


def installed(package: str | None) -> bool:
    """Whether a top-level package can be imported, found without importing it (as models.sources
    finds the built-in models' packages: importing one may fail for reasons of its own)."""
    return not package or importlib.util.find_spec(package) is not None


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
    # Earlier turns, decoded first with the same drafter and not timed (repeated work: what a
    # drafter that remembers earlier outputs, like suffix decoding, may draft from).
    earlier: tuple[str, ...] = ()


def load_bench_prompts(path: Path | str = BENCH_PROMPTS_FILE, categories=None,
                       limit: int | None = None) -> list[BenchPrompt]:
    """The benchmark prompts of `categories` (None: the file's "categories", Spec-Bench's six; its
    "extra_categories", such as `repeated`, only when named), in file order; at most `limit` per
    category."""
    try:
        data = json.loads(read_limited(path, MAX_PROMPT_FILE_BYTES, "a prompt set"))
        defaults = data["categories"]
        known = defaults + list(data.get("extra_categories", []))
    except (ValueError, KeyError, TypeError) as error:
        raise SpecvizError(f"Could not read the prompt set {path}: {error}") from None
    wanted = list(defaults) if not categories else list(known) if categories == "all" else list(categories)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise SpecvizError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}: "
                           f"choose from {', '.join(known)}")
    prompts, taken = [], dict.fromkeys(wanted, 0)
    for item in data["prompts"]:
        if item["category"] in taken and (limit is None or taken[item["category"]] < limit):
            prompts.append(BenchPrompt(item["id"], item["category"], item["prompt"], item.get("chat", True),
                                       _earlier(item, f"prompt {item['id']!r} of {path}")))
            taken[item["category"]] += 1
    return prompts


# Spec-Bench's categories as its leaderboard reports them: MT-bench's eight (80 two-turn questions) as
# one, then its five of 80 one-turn prompts each.
SPEC_BENCH_CATEGORIES = {"mt_bench": ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                      "humanities"),
                         "translation": ("translation",), "summarization": ("summarization",), "qa": ("qa",),
                         "math_reasoning": ("math_reasoning",), "rag": ("rag",)}


def load_spec_bench(categories=None, limit: int | None = None, sample_seed: int | None = None,
                    path: Path | str = SPEC_BENCH_FILE) -> list[BenchPrompt]:
    """Spec-Bench's prompts of `categories` (None: all six), at most `limit` per category: the first
    ones in the file, or with `sample_seed` a random draw of them (the same seed, the same draw). A
    two-turn MT-bench question is asked its first turn (single-turn speculation, as measured here)."""
    import random

    wanted = list(SPEC_BENCH_CATEGORIES) if not categories else list(categories)
    unknown = [c for c in wanted if c not in SPEC_BENCH_CATEGORIES]
    if unknown:
        raise SpecvizError(f"unknown Spec-Bench categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}: "
                           f"choose from {', '.join(SPEC_BENCH_CATEGORIES)}")
    text = read_limited(path, MAX_PROMPT_FILE_BYTES, "Spec-Bench's question file").decode("utf-8")
    by_category: dict[str, list[BenchPrompt]] = {c: [] for c in wanted}
    group = {source: name for name, sources in SPEC_BENCH_CATEGORIES.items() for source in sources}
    for line in text.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        name = group.get(item["category"])
        if name in by_category:
            by_category[name].append(BenchPrompt(f"spec-bench-{item['question_id']}", name, item["turns"][0]))
    prompts = []
    for name in wanted:
        chosen = by_category[name]
        if sample_seed is not None and limit is not None:
            chosen = sorted(random.Random(f"{sample_seed}:{name}").sample(chosen, min(limit, len(chosen))),
                            key=chosen.index)
        prompts.extend(chosen[:limit])
    return prompts


# ----------------------------------------------------------------------------- prompt sets

MAX_PROMPT_CHARS = 20_000     # characters of one prompt (not of its JSON line, which quoting lengthens)
MAX_PROMPTS = 1000
MAX_TRAINING_PROMPTS = 100_000  # a draft head's training prompts (read once, not decoded one by one in a table)


def _earlier(item: dict, where: str) -> tuple[str, ...]:
    earlier = item.get("earlier", [])
    if not isinstance(earlier, list) or not all(isinstance(t, str) and t.strip() for t in earlier):
        raise SpecvizError(f"{where}: \"earlier\" must be a list of non-empty prompts.")
    return tuple(earlier)


def read_prompt_file(path: Path | str, max_prompts: int = MAX_PROMPTS) -> list[BenchPrompt]:
    """A user's prompt set: one prompt per line, or JSON Lines with `prompt` and optional
    `category`, `chat` and `earlier` (turns decoded first, untimed). Blank lines are skipped; anything
    else wrong is a SpecvizError. At most `max_prompts` (training takes more: MAX_TRAINING_PROMPTS)."""
    path = Path(path)
    data = read_limited(path, MAX_PROMPT_FILE_BYTES, "a prompt file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecvizError(f"The prompt file {path} is not UTF-8 text (byte {error.start}).") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        raise SpecvizError(f"The prompt file {path} holds no prompts.")
    if len(lines) > max_prompts:
        raise SpecvizError(f"The prompt file {path} holds {len(lines)} prompts; at most {max_prompts} are allowed.")
    jsonl = lines[0][1].lstrip().startswith("{")
    prompts = []
    for n, line in lines:
        if not jsonl:
            _check_length(line.strip(), f"{path}, line {n}")
            prompts.append(BenchPrompt(f"{path.stem}-{n}", "file", line.strip()))
            continue
        try:
            item = json.loads(line)
        except ValueError as error:
            raise SpecvizError(f"{path}, line {n}: not a JSON object ({error.msg}).") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise SpecvizError(f"{path}, line {n}: a JSON line needs a non-empty \"prompt\" string.")
        earlier = _earlier(item, f"{path}, line {n}")
        for text in (item["prompt"], *earlier):
            _check_length(text, f"{path}, line {n}")
        prompts.append(BenchPrompt(str(item.get("id") or f"{path.stem}-{n}"), str(item.get("category") or "file"),
                                   item["prompt"], bool(item.get("chat", True)), earlier))
    return prompts


def _check_length(prompt: str, where: str) -> None:
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SpecvizError(f"{where}: a prompt of {len(prompt)} characters, "
                           f"more than {MAX_PROMPT_CHARS} for one prompt.")


def preset_prompt_sets() -> dict[str, list[BenchPrompt]]:
    """The prompt sets that ship: the app's examples, and each category of the benchmark's set."""
    sets = {"examples": [BenchPrompt(f"example-{i}", e["category"].split("/")[0], e["prompt"], e.get("chat", True))
                         for i, e in enumerate(load_examples())]}
    for prompt in load_bench_prompts(categories="all"):
        sets.setdefault(prompt.category, []).append(prompt)
    return sets


def prompt_set(name: str) -> list[BenchPrompt]:
    """A preset prompt set by name ('examples' or a benchmark category)."""
    sets = preset_prompt_sets()
    if name not in sets:
        raise SpecvizError(f"No prompt set {name!r}: choose from {', '.join(sets)}, or give a file.")
    return sets[name]
