"""One configuration on one prompt: the only way specviz runs anything.

`race` loads nothing and checks nothing twice: it takes validated `RunSettings`, a prompt and a
loaded pair, warms up the kernel shapes the run will use, then decodes the prompt speculatively and,
with `baseline`, plainly too, interleaved event by event (whichever method has used less of its own
measured time goes next, so at any moment both have had the same compute and the one ahead is the
faster). It yields the same `Run` after every event; a consumer that stops iterating stops the
decoding within one cycle. `execute` drains it. The app's tabs, the command line, Compare and the
benchmark all go through here.

Each event is timed by `core.decoding.Clock` on its own: nothing done between events (rendering,
streaming to a browser) is counted. A busy host still inflates those times (see `models.host`): the
race records the host's load over its events in `Run.host_load`.

The result model, `Run`, is in `runs.result`.
"""

from __future__ import annotations

import collections
import functools
import secrets
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TypeVar

import torch

from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..core.plain import autoregressive_decode
from ..core.decoding import speculative_decode
from ..core.draft_policy import CostAwarePolicy, PassCosts, calibrate, calibration_widths
from ..core.timing import Clock
from ..core.draft_trees import DraftTreeDrafter
from ..core.drafters import DraftModelDrafter, Drafter
from ..core.head import HeadDrafter, HeadTreeDrafter
from ..core.events import Cycle, interleave
from ..errors import SpecvizError
from ..models import Detokenizer, ModelPair, check_context, default_threads, encode_prompt, load_pair
from ..models.host import HostLoad, read_cpu_times
from ..models.sources import TINY_TARGET, Progress
from ..models.tiny import tiny_pair
from ..settings import RunSettings
from .result import CycleText, Run

Loader = Callable[[RunSettings, Progress | None], ModelPair]
T = TypeVar("T")


def load(settings: RunSettings, progress: Progress | None = None) -> ModelPair:
    """The pair `settings` names (from the in-memory cache when it is loaded already); the target
    'tiny' builds the tiny in-process pair (`models.tiny`). Every command and the page load here. On a
    CPU, torch's threads take specviz's default first unless this process chose them (`models.devices`)."""
    default_threads(settings.device)
    if settings.target == TINY_TARGET:
        return tiny_pair(settings.draft, device=settings.device, dtype=settings.dtype)
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


# ----------------------------------------------------------------------------- running

def encode(settings: RunSettings, prompt: str, pair: ModelPair) -> torch.Tensor:
    """The prompt's token ids on the pair's device, refused when the run would overflow a context."""
    input_ids = encode_prompt(pair.tokenizer, prompt, chat=settings.chat)
    check_context(pair, input_ids.shape[1], settings.max_new_tokens)
    drafter = pair.draft
    # Across tokenizers, each model formats the conversation with its own chat template where both
    # have one; otherwise the draft reads the target's prompt as text (see CrossTokenizerDrafter).
    if (settings.chat and isinstance(drafter, CrossTokenizerDrafter)
            and getattr(pair.tokenizer, "chat_template", None)
            and getattr(drafter.draft_tokenizer, "chat_template", None)):
        drafter.read_prompt_as(input_ids[0].tolist(),
                               encode_prompt(drafter.draft_tokenizer, prompt, chat=True)[0].tolist())
    return input_ids.to(pair.device)


def drafter_for(settings: RunSettings, pair: ModelPair) -> Drafter:
    """The pair's drafter, drafting EAGLE-2 trees over the draft model or head when `settings.branch` > 1."""
    if settings.branch <= 1:
        return pair.draft
    if isinstance(pair.draft, HeadDrafter):
        return HeadTreeDrafter(pair.draft, settings.branch, settings.tree_budget)
    if not isinstance(pair.draft, DraftModelDrafter):
        raise SpecvizError(f"A tree branch applies to a draft model, early exit or a draft head, not to "
                           f"{pair.draft_name}.")
    try:
        return DraftTreeDrafter(pair.draft, settings.branch, settings.tree_budget)
    except ValueError as error:     # a sliding-window draft model: said before any work
        raise SpecvizError(str(error)) from None


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


# What a target pass costs on this machine, per model and torch thread count: measured before the
# first cost-aware run of a model (`pass_costs`), then refreshed by every run's own passes.
_PASS_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pass_costs(pair: ModelPair, input_ids: torch.Tensor, max_length: int) -> PassCosts:
    """The pass costs kept for the pair's target, with every width up to `max_length` timed (the
    widths not yet timed are timed now, after the prompt: one untimed pass and two timed each)."""
    costs = _PASS_COSTS.setdefault(pair.target, {}).setdefault(torch.get_num_threads(), PassCosts())
    missing = [w for w in calibration_widths(max_length) if w not in costs.seconds]
    if missing:
        calibrate(pair.target, input_ids[0].tolist(), missing, costs, Clock(pair.device))
    return costs


def race(settings: RunSettings, prompt: str, pair: ModelPair, *, baseline: bool = False,
         warm_up: bool = True, seed: int | None = None) -> Iterator[Run]:
    """Decode `prompt` (speculatively, and plainly too with `baseline`), yielding the run after each
    event. `settings` must have passed `settings.validate`; errors a user can cause raise SpecvizError.
    A sampled run without a seed samples with `seed` (a comparison's runs share their baseline's), or a
    fresh one, and its settings record it.
    On a CPU it runs on one torch thread, timed by its CPU time, unless this process chose otherwise
    (`models.devices.use_threads`: more threads are timed by the wall clock)."""
    default_threads(pair.device)
    if settings.seed is None and settings.temperature > 0:
        # Both methods sample with one seed: with drafter-invariant sampling they then write the same
        # text, as greedy runs do.
        settings = replace(settings, seed=secrets.randbits(31) if seed is None else seed)
    input_ids = encode(settings, prompt, pair)
    drafter = drafter_for(settings, pair)
    eos = list(pair.eos_token_ids or [])
    options = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                   seed=settings.seed, eos_token_id=eos)
    policy = CostAwarePolicy(PassCosts()) if settings.cost_aware else None
    try:
        # Both loops check their arguments when called, before any work.
        cycles = speculative_decode(pair.target, drafter, input_ids, settings.max_new_tokens, k=settings.k,
                                    dynamic_k=settings.dynamic_k, max_k=settings.max_k, policy=policy,
                                    sampling=settings.sampling, **options)
        steps = autoregressive_decode(pair.target, input_ids, settings.max_new_tokens, **options) if baseline else None
    except ValueError as error:
        raise SpecvizError(str(error)) from None
    if warm_up:
        _warm_up(settings, pair, drafter, input_ids, options)
    if policy is not None:      # timed like the warm-up: before either method's clock starts
        widest = max(2 * settings.k, settings.tree_budget, getattr(drafter, "budget", 0) or 0) \
            if drafter.drafts_trees else settings.k           # a tree's pass verifies its nodes
        policy.costs = pass_costs(pair, input_ids, widest)
    prompt_ids = input_ids[0].tolist()
    draft_name = pair.draft_name + (f" tree (top-{settings.branch}, {settings.tree_budget} nodes)"
                                    if drafter is not pair.draft else "")
    run = Run(settings=settings, prompt=prompt, target_name=pair.target_name, draft_name=draft_name,
              target_parameters=pair.target_parameters, draft_parameters=pair.draft_parameters,
              dtype=str(pair.dtype).removeprefix("torch."), device=str(pair.device), clock=Clock(pair.device).name,
              prompt_tokens=len(prompt_ids), eos_token_ids=eos, baseline=baseline, note=pair.note,
              _decode=functools.partial(pair.tokenizer.decode, skip_special_tokens=True))
    spec_text, plain_text = Detokenizer(pair.tokenizer, prompt_ids), Detokenizer(pair.tokenizer, prompt_ids)
    limit, ends = settings.max_new_tokens, set(eos)
    spec_tokens = 0
    started = read_cpu_times()
    try:
        for event in interleave(cycles, steps):
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
    finally:
        # Also when the consumer stops early (a Stop closes this generator): a stopped run's summary
        # says how busy the host was too.
        run.host_load = HostLoad.since(started)
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


def last(items: Iterable[T]) -> T | None:
    """Iterate `items` to the end and return the last one (None when there was none): the result of a
    generator that yields its growing result, such as `race`."""
    tail = collections.deque(items, maxlen=1)
    return tail[0] if tail else None


def execute(settings: RunSettings, prompt: str, pair: ModelPair, *, baseline: bool = False,
            warm_up: bool = True) -> Run:
    """`race` drained: the finished run."""
    return last(race(settings, prompt, pair, baseline=baseline, warm_up=warm_up))
