"""One configuration on one prompt: the only way specviz runs anything.

`race` loads nothing and checks nothing twice: it takes validated `RunSettings`, a prompt and a
loaded pair, warms up the kernel shapes the run will use, then decodes the prompt speculatively and,
with `baseline`, plainly too, interleaved event by event (whichever method has used less of its own
measured time goes next, so at any moment both have had the same compute and the one ahead is the
faster). It yields the same `Run` after every event; a consumer that stops iterating stops the
decoding within one cycle. `execute` drains it. The app's tabs, the command line, Compare and the
benchmark all go through here.

Each event is timed by `core.decoding.Clock` on its own: nothing done between events (rendering,
streaming to a browser) is counted.
"""

from __future__ import annotations

import functools
import os
import platform
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..core.decoding import autoregressive_decode, speculative_decode
from ..core.timing import Clock
from ..core.draft_trees import DraftTreeDrafter
from ..core.drafters import DraftModelDrafter, Drafter
from ..core.events import Cycle, Step
from ..errors import SpecvizError
from ..metrics import (PlainStats, SpecStats, Speed, first_divergence, ideal_speedup, measure_speed, summarize,
                       summarize_plain, theory_at_pass_cost)
from ..models import Detokenizer, ModelPair, check_context, encode_prompt, load_pair
from ..models.sources import Progress
from ..settings import RunSettings

Loader = Callable[[RunSettings, Progress | None], ModelPair]


def load(settings: RunSettings, progress: Progress | None = None) -> ModelPair:
    """The pair `settings` names (from the in-memory cache when it is loaded already)."""
    return load_pair(settings.target, settings.draft, device=settings.device, dtype=settings.dtype,
                     progress=progress)


def load_stepwise(settings: RunSettings, loader: Loader | None = None, *, tick: float = 0.25):
    """The pair for `settings`, loaded in a worker thread: yields a progress message (or None) at
    least every `tick` seconds while it works, then the pair. A consumer that stops iterating is not
    held up by a long load (a first conversion, a hub download); the load itself finishes in the
    background and lands in the model cache."""
    messages: list[str] = []
    outcome: dict = {}

    def work():
        try:
            outcome["pair"] = (loader or load)(settings, lambda _fraction, message: messages.append(message))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="specviz-load", daemon=True)
    worker.start()
    shown = 0
    while worker.is_alive():
        worker.join(tick)
        if len(messages) > shown:
            shown = len(messages)
            yield messages[-1]
        else:
            yield None
    if "error" in outcome:
        raise outcome["error"]
    yield outcome["pair"]


@dataclass
class CycleText:
    """How each token of a cycle reads, as the tokenizer decoded it in context."""
    drafted: list[str]
    correction: str | None


@dataclass
class Run:
    """Everything a run has produced so far, and the numbers computed from it."""
    settings: RunSettings
    prompt: str
    target_name: str
    draft_name: str
    target_parameters: int
    draft_parameters: int
    dtype: str
    device: str
    clock: str                      # which clock timed the events (Clock.name)
    prompt_tokens: int
    eos_token_ids: list[int]
    baseline: bool                  # whether plain decoding runs (or was attached) for comparison
    cycles: list[Cycle] = field(default_factory=list)
    texts: list[CycleText] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    step_texts: list[str] = field(default_factory=list)
    spec_done: bool = False
    plain_done: bool = False
    _stats: tuple = (-1, None)
    _speed: tuple = ((-1, -1), None)
    _decode: Callable[[list[int]], str] | None = None   # holds the tokenizer only, never the models

    # --- what was produced
    @property
    def tokens(self) -> list[int]:
        return [t for c in self.cycles for t in c.emitted]

    @property
    def baseline_tokens(self) -> list[int]:
        return [s.token for s in self.steps]

    @property
    def text(self) -> str:
        return self._decode(self.tokens) if self._decode else "".join(self.emitted_texts())

    def emitted_texts(self) -> list[str]:
        out = []
        for cycle, text in zip(self.cycles, self.texts):
            out += [text.drafted[i] for i in cycle.accepted_nodes]
            out += [text.correction] if text.correction is not None else []
        return out

    @property
    def done(self) -> bool:
        return self.spec_done and (self.plain_done or not self.baseline)

    # --- numbers (metrics computes them all; the speculative stats are cached per cycle count)
    @property
    def stats(self) -> SpecStats:
        if self._stats[0] != len(self.cycles):
            self._stats = (len(self.cycles), summarize(self.cycles))
        return self._stats[1]

    @property
    def plain(self) -> PlainStats | None:
        return summarize_plain(self.steps) if self.steps else None

    @property
    def speed(self) -> Speed | None:
        key = (len(self.cycles), len(self.steps))
        if self._speed[0] != key:
            self._speed = (key, measure_speed(self.cycles, self.steps))
        return self._speed[1]

    @property
    def speedup(self) -> float | None:
        speed = self.speed
        return speed.speedup if speed else None

    @property
    def theory_at_pass_cost(self) -> float | None:
        return theory_at_pass_cost(self.stats, self.speed)

    @property
    def divergence(self) -> int | None:
        return first_divergence(self.tokens, self.baseline_tokens) if self.steps else None

    @property
    def identical(self) -> bool | None:
        return (self.divergence is None) if self.steps else None

    def attach_baseline(self, other: Run) -> None:
        """Share another run's plain decoding (same target, prompt and sampling rule)."""
        self.baseline, self.steps, self.step_texts, self.plain_done = True, other.steps, other.step_texts, True

    def summary(self) -> dict:
        summary = {"target": self.target_name, "draft": self.draft_name, "target_parameters": self.target_parameters,
                   "draft_parameters": self.draft_parameters, "prompt_tokens": self.prompt_tokens, "dtype": self.dtype,
                   "device": self.device, "clock": self.clock, **self.stats.to_dict()}
        speed = self.speed
        if self.steps:
            summary.update(baseline_tokens=len(self.steps), baseline_seconds=self.plain.seconds,
                           baseline_tokens_per_second=self.plain.tokens_per_second,
                           identical=self.identical, first_divergence=self.divergence)
        if speed is not None:
            summary.update(speedup=speed.speedup, speedup_low=speed.low, speedup_high=speed.high,
                           speedup_reliable=speed.reliable, compared="decode-only seconds per token",
                           spec_prefill_seconds=speed.spec_prefill_seconds,
                           spec_decode_seconds=speed.spec_decode_seconds,
                           baseline_prefill_seconds=speed.plain_prefill_seconds,
                           baseline_decode_seconds=speed.plain_decode_seconds,
                           verify_pass_cost=speed.pass_cost,
                           expected_speedup_at_pass_cost=theory_at_pass_cost(self.stats, speed),
                           expected_speedup_ideal=ideal_speedup(self.stats, speed))
        return summary

    def cycle_records(self) -> list[dict]:
        """Every cycle's fields and its token texts (for `--json` and recordings)."""
        return [{**c.to_dict(), "drafted_text": t.drafted, "correction_text": t.correction}
                for c, t in zip(self.cycles, self.texts)]

    def to_json(self) -> dict:
        return {"settings": self.settings.to_dict(), "prompt": self.prompt, "text": self.text,
                "cycles": self.cycle_records(), "summary": self.summary(), "environment": environment(self.device)}


def environment(device: str) -> dict:
    import transformers

    from .. import __version__

    name = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else cpu_name()
    return {"device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "specviz": __version__, "torch_threads": torch.get_num_threads()}


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ----------------------------------------------------------------------------- running

def encode(settings: RunSettings, prompt: str, pair: ModelPair) -> torch.Tensor:
    """The prompt's token ids on the pair's device, refused when the run would overflow a context."""
    input_ids = encode_prompt(pair.tokenizer, prompt, chat=settings.chat)
    check_context(pair, input_ids.shape[1], settings.max_new_tokens)
    return input_ids.to(pair.device)


def _interleave(spec: Iterator[Cycle], plain: Iterator[Step] | None) -> Iterator[Cycle | Step]:
    """Always advance the method that has used less of its own time so far."""
    spec_seconds = plain_seconds = 0.0
    spec_live, plain_live = True, plain is not None
    while spec_live or plain_live:
        if spec_live and (not plain_live or spec_seconds <= plain_seconds):
            event = next(spec, None)
            if event is None:
                spec_live = False
                continue
            spec_seconds += event.seconds
        else:
            event = next(plain, None)
            if event is None:
                plain_live = False
                continue
            plain_seconds += event.seconds
        yield event


def drafter_for(settings: RunSettings, pair: ModelPair) -> Drafter:
    """The pair's drafter, drafting EAGLE-2 trees over the draft model when `settings.branch` > 1."""
    if settings.branch <= 1:
        return pair.draft
    if not isinstance(pair.draft, DraftModelDrafter):
        raise SpecvizError(f"A tree branch applies to a draft model or early exit, not to {pair.draft_name}.")
    return DraftTreeDrafter(pair.draft, settings.branch, settings.tree_budget)


def _warm_up(settings: RunSettings, pair: ModelPair, drafter: Drafter, input_ids: torch.Tensor,
             options: dict) -> None:
    """Run the shapes the timed run will use once (a prefill, a one-token step, a (k+1)-token pass),
    so that neither method pays one-time costs (allocator growth, kernel selection) on the clock."""
    k = max(settings.k, settings.max_k or 0)
    warm = dict(options, max_new_tokens=min(settings.max_new_tokens, k + 2), temperature=0.0)
    for _ in speculative_decode(pair.target, drafter.without_memory(), input_ids, k=k, **warm):
        pass
    for _ in autoregressive_decode(pair.target, input_ids, **dict(warm, max_new_tokens=2)):
        pass


def race(settings: RunSettings, prompt: str, pair: ModelPair, *, baseline: bool = False,
         warm_up: bool = True) -> Iterator[Run]:
    """Decode `prompt` (speculatively, and plainly too with `baseline`), yielding the run after each
    event. `settings` must have passed `settings.validate`; errors a user can cause raise SpecvizError."""
    input_ids = encode(settings, prompt, pair)
    drafter = drafter_for(settings, pair)
    eos = list(pair.eos_token_ids or [])
    options = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                   seed=settings.seed, eos_token_id=eos)
    try:
        # Both loops check their arguments when called, before any work.
        cycles = speculative_decode(pair.target, drafter, input_ids, settings.max_new_tokens, k=settings.k,
                                    dynamic_k=settings.dynamic_k, max_k=settings.max_k, **options)
        steps = autoregressive_decode(pair.target, input_ids, settings.max_new_tokens, **options) if baseline else None
    except ValueError as error:
        raise SpecvizError(str(error)) from None
    if warm_up:
        _warm_up(settings, pair, drafter, input_ids, options)
    prompt_ids = input_ids[0].tolist()
    draft_name = pair.draft_name + (f" tree (top-{settings.branch}, {settings.tree_budget} nodes)"
                                    if drafter is not pair.draft else "")
    run = Run(settings=settings, prompt=prompt, target_name=pair.target_name, draft_name=draft_name,
              target_parameters=pair.target_parameters, draft_parameters=pair.draft_parameters,
              dtype=str(pair.dtype).removeprefix("torch."), device=str(pair.device), clock=Clock(pair.device).name,
              prompt_tokens=len(prompt_ids), eos_token_ids=eos, baseline=baseline,
              _decode=functools.partial(pair.tokenizer.decode, skip_special_tokens=True))
    spec_text, plain_text = Detokenizer(pair.tokenizer, prompt_ids), Detokenizer(pair.tokenizer, prompt_ids)
    limit, ends = settings.max_new_tokens, set(eos)
    spec_tokens = 0
    for event in _interleave(cycles, steps):
        if isinstance(event, Cycle):
            run.cycles.append(event)
            run.texts.append(cycle_text(event, spec_text))
            spec_tokens += len(event.emitted)
            run.spec_done = spec_tokens >= limit or event.emitted[-1] in ends
        else:
            run.steps.append(event)
            # The end-of-turn token is not text: the baseline panel shows none (the token view marks it).
            run.step_texts.append("" if event.token in ends else plain_text.push(event.token))
            run.plain_done = len(run.steps) >= limit or event.token in ends
        yield run
    run.spec_done = run.plain_done = True
    yield run


def cycle_text(cycle: Cycle, detok: Detokenizer) -> CycleText:
    """Text of a cycle's drafted tokens and of its correction; advances `detok` over what was emitted.
    Rejected drafts are decoded on forks, where they were proposed (a tree's nodes after their parents)."""
    if cycle.is_tree:
        forks = {-1: detok}
        drafted = []
        for node, (token, parent) in enumerate(zip(cycle.drafted, cycle.parents)):
            forks[node] = forks[parent].fork()
            drafted.append(forks[node].push(token))
        for node in cycle.accepted_nodes:
            detok.push(cycle.drafted[node])
    else:
        accepted = [detok.push(t) for t in cycle.drafted[: cycle.num_accepted]]
        fork = detok.fork()
        drafted = accepted + [fork.push(t) for t in cycle.drafted[cycle.num_accepted:]]
    correction = None if cycle.correction is None else detok.push(cycle.correction)
    return CycleText(drafted, correction)


def execute(settings: RunSettings, prompt: str, pair: ModelPair, *, baseline: bool = False,
            warm_up: bool = True) -> Run:
    """`race` drained: the finished run."""
    run = None
    for run in race(settings, prompt, pair, baseline=baseline, warm_up=warm_up):
        pass
    return run
