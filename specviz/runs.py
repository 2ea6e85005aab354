"""One prompt, one configuration: load the pair, decode speculatively (and, for a baseline, plainly),
and collect what the command line and exports print. The app streams its own interleaved race;
this module is the simple sequential path used by `run`, `compare` and `bench`."""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass, field

import torch

from .decoding import autoregressive_decode, speculative_decode
from .events import Cycle, Step
from .metrics import PlainStats, SpecStats, first_divergence, speedup, summarize, summarize_plain
from .render import Detokenizer, Piece, cycle_pieces
from .sampling import validate_sampling

log = logging.getLogger(__name__)


class RunFailed(Exception):
    """A run could not be done; the message is meant for the user."""


@dataclass(frozen=True)
class RunConfig:
    target: str | None = None       # None: the built-in default
    draft: str | None = None        # None: prompt lookup
    k: int = 4
    dynamic_k: bool = False
    max_k: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 128
    dtype: str = "auto"
    device: str = "auto"
    chat: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides) -> "RunConfig":
        fields = {name: getattr(args, name) for name in cls.__dataclass_fields__ if hasattr(args, name)}
        fields["chat"] = not getattr(args, "raw", False)
        fields.update(overrides)
        return cls(**fields)

    def validate(self) -> None:
        """Bad settings fail with a clear message before any model is loaded."""
        try:
            validate_sampling(self.temperature, self.top_k, self.top_p)
        except ValueError as exc:
            raise RunFailed(str(exc)) from None
        if self.k < 1:
            raise RunFailed(f"k (draft length) must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise RunFailed(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def decoding(self) -> dict:
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                    top_p=self.top_p, seed=self.seed)


@dataclass
class RunResult:
    config: RunConfig
    target_name: str
    draft_name: str
    target_parameters: int
    draft_parameters: int
    prompt_tokens: int
    cycles: list[Cycle]
    pieces: list[list[Piece]]       # per cycle, in reading order (render.cycle_pieces)
    text: str
    stats: SpecStats
    steps: list[Step] = field(default_factory=list)
    plain: PlainStats | None = None
    baseline_text: str | None = None

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.cycles for t in c.emitted]

    @property
    def speedup(self) -> float | None:
        return speedup(self.stats, self.plain) if self.plain else None

    @property
    def divergence(self) -> int | None:
        return first_divergence(self.tokens, [s.token for s in self.steps]) if self.steps else None

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.steps else None

    def summary(self) -> dict:
        summary = {"target": self.target_name, "draft": self.draft_name,
                   "target_parameters": self.target_parameters, "draft_parameters": self.draft_parameters,
                   "prompt_tokens": self.prompt_tokens, **self.stats.to_dict()}
        if self.plain:
            summary.update(baseline_tokens_per_second=self.plain.tokens_per_second,
                           baseline_seconds=self.plain.seconds, speedup=self.speedup,
                           identical=self.identical, first_divergence=self.divergence)
        return summary

    def to_json(self) -> dict:
        return {"config": asdict(self.config), "text": self.text,
                "cycles": [{**c.to_dict(), "drafted_text": [p.text for p in pieces[: len(c.drafted)]]}
                           for c, pieces in zip(self.cycles, self.pieces)],
                "summary": self.summary()}

    def summary_lines(self) -> list[str]:
        s = self.stats
        lines = [f"{self.target_name} drafted by {self.draft_name}: {s.tokens} tokens in {s.cycles} target passes",
                 f"acceptance: {s.draft_acceptance_rate:.1%} of drafted tokens (alpha {s.alpha:.2f}), "
                 f"{s.mean_acceptance_length:.2f} tokens per target pass, mean k {s.mean_k:.1f}",
                 f"cost ratio c = {s.cost_ratio:.3f}; theoretical speedup {s.expected_speedup:.2f}x "
                 f"(best k for this alpha and c: {s.best_k})",
                 f"speculative: {s.tokens_per_second:.1f} tokens/s"]
        if self.plain:
            lines.append(f"plain:       {self.plain.tokens_per_second:.1f} tokens/s")
            lines.append(f"measured speedup: {self.speedup:.2f}x")
            if self.config.temperature == 0:
                if self.identical:
                    lines.append("greedy outputs identical: yes")
                else:
                    lines.append(f"greedy outputs identical: no, they diverge at token {self.divergence} "
                                 "(reduced precision such as bf16 can flip near-tied logits; use --dtype float32 for exact equality)")
        return lines


def load(config: RunConfig, progress=None):
    from .models import ModelLoadError, load_pair
    try:
        return load_pair(config.target, config.draft, device=config.device, dtype=config.dtype, progress=progress)
    except ModelLoadError as exc:
        raise RunFailed(str(exc)) from None


def execute(config: RunConfig, prompt: str, *, baseline: bool = False, pair=None, progress=None) -> RunResult:
    """Decode `prompt` with `config` (speculatively, then plainly when `baseline`)."""
    from .models import ModelLoadError, check_context, encode_prompt

    config.validate()
    pair = pair or load(config, progress)
    try:
        input_ids = encode_prompt(pair.tokenizer, prompt, chat=config.chat).to(pair.device)
        check_context(pair, input_ids.shape[1], config.max_new_tokens)
    except (ModelLoadError, ValueError) as exc:
        raise RunFailed(str(exc)) from None
    kwargs = dict(config.decoding(), eos_token_id=pair.eos_token_ids)
    try:
        if baseline:  # a short warm-up so neither method pays one-time costs
            _drain(autoregressive_decode(pair.target, input_ids, **dict(kwargs, max_new_tokens=2)))
        cycles = list(speculative_decode(pair.target, pair.draft, input_ids, k=config.k, dynamic_k=config.dynamic_k,
                                         max_k=config.max_k, **kwargs))
        steps = list(autoregressive_decode(pair.target, input_ids, **kwargs)) if baseline else []
    except ValueError as exc:
        raise RunFailed(str(exc)) from None
    except torch.OutOfMemoryError:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise RunFailed("out of memory: try a smaller model pair, a lower max new tokens, or --dtype bfloat16") from None
    detok = Detokenizer(pair.tokenizer, input_ids[0].tolist())
    pieces = [cycle_pieces(c, detok) for c in cycles]
    tokens = [t for c in cycles for t in c.emitted]
    result = RunResult(config=config, target_name=pair.target_name, draft_name=pair.draft_name,
                       target_parameters=pair.target_parameters, draft_parameters=pair.draft_parameters,
                       prompt_tokens=input_ids.shape[1], cycles=cycles, pieces=pieces,
                       text=pair.tokenizer.decode(tokens, skip_special_tokens=True), stats=summarize(cycles))
    if baseline:
        result.steps, result.plain = steps, summarize_plain(steps)
        result.baseline_text = pair.tokenizer.decode([s.token for s in steps], skip_special_tokens=True)
    return result


def _drain(iterator) -> None:
    for _ in iterator:
        pass
