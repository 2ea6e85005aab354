"""One description of a run, and one check of it.

`RunSettings` is everything that decides what a run does (target, drafter, k, sampling, length,
prompt format, dtype, device). Every entry point (the app's tabs, the command line, the benchmark)
builds one and passes it through `validate(settings, limits)` before any model is loaded: values
arrive from sliders, an HTTP API or argv, so `validate` also coerces them ("4" and 4.0 are k = 4)
and refuses what is out of range with a `SpecvizError` that names the setting.

`Limits` says what is allowed: `LOCAL` for someone on their own machine, `hosted(...)` for a
public demo (capped lengths, and models only from an allow-list: nothing typed by a visitor ever
reaches the filesystem or the hub). `parse_draft` is the one parser of draft specs: `validate` parses
the draft once, and the settings it returns carry the parsed `DraftSpec` to every consumer.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields, replace

from .core.sampling_rules import CLASSIC, INVARIANT, SAMPLING_RULES  # noqa: F401 - CLASSIC: for the layers above
from .errors import SpecvizError

DEFAULT_DRAFT = "ngram"
MAX_SEED = 2**63 - 1


# ----------------------------------------------------------------------------- the draft spec

class DraftSpec(str):
    """A parsed draft spec. It is the spec's text (stripped; lower case but for a model id or path),
    so settings, labels, recordings and JSON hold and show it as the string it always was, and it
    knows what it names: `kind` and, for 'self:L', `layers`. Made by `parse_draft`, which passes one
    through unchanged: whoever holds a DraftSpec never parses it again."""

    kind: str               # "ngram" (prompt lookup), "ngram-tree" (as a tree), "suffix", "self", "head",
                            # "auto" (the best of several each cycle: core.hybrid) or "model"
    layers: int | None      # L of self:L

    def __new__(cls, text: str, kind: str, layers: int | None = None) -> DraftSpec:
        spec = super().__new__(cls, text)
        spec.kind, spec.layers = kind, layers
        return spec

    def __getnewargs__(self) -> tuple:
        # copy, deepcopy and pickle rebuild a str subclass from these (str's own: the text alone).
        return str(self), self.kind, self.layers

    @property
    def text(self) -> DraftSpec:
        """The spec as given (stripped): the DraftSpec itself."""
        return self

    @property
    def inner(self) -> DraftSpec | None:
        """For 'auto:SPEC', SPEC (early exit or a head, beside prompt lookup and suffix decoding)."""
        return parse_draft(self.split(":", 1)[1]) if self.kind == "auto" and ":" in self else None

    @property
    def folder(self) -> str | None:
        """For 'head:DIR', DIR (as typed); None for 'head' alone (the shipped head) and other kinds."""
        return self.split(":", 1)[1] if self.kind == "head" and ":" in self else None

    @property
    def name(self) -> DraftSpec:
        """The name shown for the drafter: the DraftSpec itself."""
        return self


def parse_draft(spec: str | None) -> DraftSpec:
    """'ngram', 'ngram-tree', 'suffix' (suffix decoding), 'self:L' (the target's first L layers),
    'head' or 'head:DIR' (a trained draft head: the one shipped for the built-in target, or one in DIR),
    'auto' (each cycle the best of prompt lookup, suffix decoding and the target's shipped head: hybrid
    drafting; 'auto:self:L' or 'auto:head:DIR' with early exit or that head instead of the shipped one)
    or anything else as a draft model. A DraftSpec is returned as it is."""
    if isinstance(spec, DraftSpec):
        return spec
    text = (spec or DEFAULT_DRAFT).strip() or DEFAULT_DRAFT
    lowered = text.lower()
    if lowered in ("ngram", "ngram-tree", "suffix", "auto"):
        return DraftSpec(lowered, lowered)
    if lowered.startswith("auto:"):
        inner = parse_draft(text.split(":", 1)[1])
        if inner.kind not in ("self", "head") or not text.split(":", 1)[1].strip():
            raise SpecvizError(f"Draft {text!r}: 'auto' takes early exit or a head beside prompt lookup and suffix "
                               "decoding ('auto:self:L', 'auto:head:DIR'); a draft model joins a hybrid in Python "
                               "(specviz.core.hybrid).")
        return DraftSpec(f"auto:{inner}", "auto", inner.layers)
    if lowered.startswith("self"):
        match = re.fullmatch(r"self:(\d{1,4})", lowered)
        if not match:
            raise SpecvizError(f"Draft {text!r}: an early-exit self-draft is written 'self:L' with L the number "
                               "of the target's layers it runs, e.g. 'self:20'.")
        return DraftSpec(lowered, "self", int(match.group(1)))
    if lowered == "head":
        return DraftSpec(lowered, "head")
    if lowered.startswith("head:"):
        folder = text.split(":", 1)[1].strip()
        if not folder:
            raise SpecvizError(f"Draft {text!r}: a trained head is written 'head' (the shipped one) or 'head:DIR' "
                               "with DIR the folder `python -m specviz train-draft --out DIR` wrote.")
        return DraftSpec(f"head:{folder}", "head")
    return DraftSpec(text, "model")


# ----------------------------------------------------------------------------- settings and limits

MAX_BRANCH = 8                      # children per expanded node of a draft model's tree


@dataclass(frozen=True)
class RunSettings:
    target: str | None = None       # hub id, folder or .gguf; None: the built-in default
    draft: str = DEFAULT_DRAFT      # 'ngram', 'self:L' or a draft model; validated: a DraftSpec
    k: int = 4                      # tokens drafted per cycle (with the cost-aware policy: at most)
    # Draft k tokens every cycle (the classic algorithm). Otherwise, the default, the cost-aware
    # policy drafts 0 to k tokens a cycle, as many as its measured pass costs and this request's
    # acceptance say will pay (core.draft_policy); dynamic k replaces it with transformers' heuristic.
    fixed_k: bool = False
    dynamic_k: bool = False         # +2 after a fully accepted cycle, -1 after a rejection
    max_k: int | None = None        # upper bound for dynamic k (default 2k)
    temperature: float = 0.0        # 0: greedy verification
    top_k: int = 0                  # 0: off
    top_p: float = 1.0
    seed: int | None = None
    # Sampled runs (temperature > 0): "invariant", drafter-invariant sampling (the text is plain
    # sampling's with this seed, whatever the drafter, k or policy), or "classic", Leviathan et al.'s
    # rejection sampling (accepts more of a draft model's tokens; its text can follow the draft lengths).
    sampling: str = INVARIANT
    max_new_tokens: int = 128
    chat: bool = True               # wrap the prompt in the chat template
    dtype: str = "auto"
    device: str = "auto"
    branch: int = 1                 # > 1: a draft model, early exit or head drafts a tree (top-`branch` children)
    tree_budget: int = 16           # ... of at most this many nodes (EAGLE-2's dynamic tree)

    @property
    def cost_aware(self) -> bool:
        """Whether the cost-aware policy chooses each cycle's draft length."""
        return not self.fixed_k and not self.dynamic_k

    @property
    def same_output(self) -> bool:
        """Whether speculative decoding must write exactly plain decoding's text with these settings
        (the same seed): greedy, or sampled with drafter-invariant sampling."""
        return self.temperature == 0 or self.sampling == INVARIANT

    def decoding(self) -> dict:
        """Keyword arguments shared by both decoding loops."""
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                    top_p=self.top_p, seed=self.seed)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int = 4096
    max_k: int = 64
    max_temperature: float = 5.0
    max_prompt_chars: int = 100_000
    max_prompt_tokens: int | None = None    # a prompt as the model reads it (chat template included); None: any
    max_work_tokens: int | None = None      # one request's prompt + new tokens over all its decodes; None: any
    targets: frozenset | None = None    # allowed targets (None in the set: the built-in); None: any
    draft_models: frozenset | None = None   # allowed draft models; None: any
    hosted: bool = False


LOCAL = Limits()
HOSTED_MAX_NEW_TOKENS = 256
# A hosted prompt's cost is in tokens, not characters: 2,900 characters of Chinese are ~7,700 tokens.
# 1,024 tokens hold about 4,000 characters of English, the character cap.
HOSTED_MAX_PROMPT_TOKENS = 1024
# A prompt-set comparison's whole work: every speculative decode and every plain baseline, each its
# prompt's tokens plus its new tokens (a Run is at most 2 x (1,024 + 256) = 2,560 of them).
HOSTED_MAX_WORK_TOKENS = 24_000


def hosted(presets: list[dict]) -> Limits:
    """A public demo's limits: preset models only, short runs, prompts and work capped in tokens."""
    return Limits(max_new_tokens=HOSTED_MAX_NEW_TOKENS, max_k=16, max_temperature=2.0, max_prompt_chars=4000,
                  max_prompt_tokens=HOSTED_MAX_PROMPT_TOKENS, max_work_tokens=HOSTED_MAX_WORK_TOKENS,
                  targets=frozenset({p.get("target") or None for p in presets} | {None}),
                  draft_models=frozenset(p["draft"] for p in presets
                                         if p.get("draft") and parse_draft(p["draft"]).kind == "model"),
                  hosted=True)


def number(name: str, value, low: float, high: float) -> float:
    """`value` (a number or numeric text) as a float in [low, high], or a SpecvizError naming `name`."""
    try:
        result = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        result = math.nan
    if isinstance(value, bool) or not (math.isfinite(result) and low <= result <= high):
        raise SpecvizError(f"{name} must be a number from {low:g} to {high:g}, got {value!r}.")
    return result


def whole_number(name: str, value, low: int, high: int) -> int:
    """`value` as an int in [low, high] (4, 4.0 and "4" are 4), or a SpecvizError naming `name`."""
    if isinstance(value, int) and not isinstance(value, bool):
        result = value                       # exact, however large
    else:
        try:
            result = number(name, value, low, high)
        except SpecvizError:
            result = math.nan
        result = int(result) if math.isfinite(result) and result == int(result) else None
    if result is None or not low <= result <= high:
        raise SpecvizError(f"{name} must be a whole number from {low} to {high}, got {value!r}.")
    return result


def switched_on(variable: str) -> bool:
    """An environment switch that is on unless set to 0 (SPECVIZ_RACE_PROCESSES, SPECVIZ_HEAD_INT8)."""
    return os.environ.get(variable, "1").strip() != "0"


def flag(value) -> bool:
    """A checkbox's value, also as text from a table or an API call ("true", "1", "yes", "x", ...)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "y", "on", "x", "\u2713")
    return bool(value)


def _model(name: str, value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecvizError(f"{name} must be a model name, got {value!r}.")
    return value.strip() or None


def validate(settings: RunSettings, limits: Limits = LOCAL) -> RunSettings:
    """`settings` with every value coerced to its type and checked against `limits`; raises
    SpecvizError naming the first bad setting. Touches no file and loads nothing."""
    k = whole_number("k (tokens drafted per cycle)", settings.k, 1, limits.max_k)
    max_k = None if settings.max_k in (None, "") else whole_number("max k", settings.max_k, k, limits.max_k)
    dynamic_k = flag(settings.dynamic_k)
    if dynamic_k and max_k is None:   # dynamic k grows to 2k by default: never past the limit
        max_k = min(2 * k, limits.max_k)
    temperature = number("temperature", settings.temperature, 0.0, limits.max_temperature)
    top_k = whole_number("top-k", settings.top_k, 0, 1_000_000)
    top_p = number("top-p", settings.top_p, 0.0, 1.0)
    if top_p == 0.0:
        raise SpecvizError("top-p must be above 0 (1 turns it off).")
    seed = None if settings.seed in (None, "") else whole_number("seed", settings.seed, 0, MAX_SEED)
    sampling = settings.sampling.strip().lower() if isinstance(settings.sampling, str) else settings.sampling
    if sampling not in SAMPLING_RULES:
        raise SpecvizError(f"sampling must be {' or '.join(SAMPLING_RULES)}, got {settings.sampling!r}.")
    max_new_tokens = whole_number("max new tokens", settings.max_new_tokens, 1, limits.max_new_tokens)
    target = _model("target", settings.target)
    # The one parse of the draft spec (settings validated again keep theirs).
    draft = settings.draft if isinstance(settings.draft, DraftSpec) else parse_draft(_model("draft", settings.draft))
    if target is not None and parse_draft(target).kind != "model":
        raise SpecvizError(f"{target!r} is a kind of draft, not a model: the target must be a model.")
    in_demo = " in this hosted demo" if limits.hosted else ""
    if limits.targets is not None and target not in limits.targets:
        raise SpecvizError(f"This hosted demo only runs the preset models; {target!r} is not one of them.")
    if (draft.kind == "model" and limits.draft_models is not None and draft not in limits.draft_models):
        raise SpecvizError(f"This hosted demo only runs the preset draft models; {draft!r} is not one of them.")
    if (draft.folder is not None or (draft.inner is not None and draft.inner.folder is not None)) and limits.hosted:
        raise SpecvizError("This hosted demo only runs the shipped draft head ('head'), not one from a folder.")
    for name in ("dtype", "device"):
        value = getattr(settings, name)
        if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9:]{1,16}", value.strip().lower()):
            raise SpecvizError(f"{name} must be a name such as 'auto', got {value!r}.")
    if limits.hosted and (settings.dtype, settings.device) != ("auto", "auto"):
        raise SpecvizError(f"dtype and device are chosen by the server{in_demo}.")
    branch = whole_number("tree branch", settings.branch, 1, MAX_BRANCH)
    tree_budget = whole_number("tree budget (nodes)", settings.tree_budget, 1, limits.max_k * MAX_BRANCH)
    if branch > 1 and draft.kind not in ("model", "self", "head"):
        raise SpecvizError(f"A tree branch applies to a draft model, early exit or a draft head; {draft!r} drafts "
                           "its own way (ngram-tree and suffix draft trees already).")
    if draft.kind == "auto" and (flag(settings.fixed_k) or dynamic_k):
        raise SpecvizError("Draft 'auto' chooses a drafter and its draft length each cycle by the cost-aware "
                           "policy: it runs without a fixed k or dynamic k.")
    return replace(settings, target=target, draft=draft, k=k, fixed_k=flag(settings.fixed_k), dynamic_k=dynamic_k,
                   branch=branch,
                   tree_budget=tree_budget,
                   max_k=max_k, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   sampling=sampling, max_new_tokens=max_new_tokens, chat=flag(settings.chat),
                   dtype=settings.dtype.strip().lower(), device=settings.device.strip().lower())


def check_prompt(prompt, limits: Limits = LOCAL) -> str:
    """The prompt as text, refused when empty, not text, or longer than the limits allow."""
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecvizError("The prompt is not valid UTF-8 text.") from None
    if not isinstance(prompt, str):
        raise SpecvizError(f"The prompt must be text, got {type(prompt).__name__}.")
    if not prompt.strip():
        raise SpecvizError("The prompt is empty: type a question, or text for the model to continue.")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:   # lone surrogates, e.g. from undecodable command-line bytes
        raise SpecvizError("The prompt is not valid UTF-8 text (it holds bytes that are not characters).") from None
    if len(prompt) > limits.max_prompt_chars:
        raise SpecvizError(f"The prompt has {len(prompt)} characters; at most {limits.max_prompt_chars} "
                           f"are allowed{' in this hosted demo' if limits.hosted else ''}.")
    return prompt


def whole_numbers(name: str, text, low: int, high: int) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, without repeats), each between low and high, or a SpecvizError
    naming `name` (a flag or a field): the batch sizes and draft lengths of a load sweep."""
    values = set()
    for part in str(text if text is not None else "").split(","):
        part = part.strip()
        if not part.isdigit():
            raise SpecvizError(f"{name} takes whole numbers separated by commas, such as 1,2,4; got {text!r}.")
        if not low <= int(part) <= high:
            raise SpecvizError(f"{name}: {part} is outside {low}..{high}.")
        values.add(int(part))
    return sorted(values)
