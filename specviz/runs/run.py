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
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TypeVar

import torch

from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..core.plain import autoregressive_decode, following
from ..core.decoding import speculative_decode
from ..core.draft_policy import CostAwarePolicy
from ..core.pass_costs import PassCosts
from ..core.timing import Clock
from ..core.draft_trees import DraftTreeDrafter
from ..core.drafters import DraftModelDrafter, Drafter
from ..core.head import HeadDrafter, HeadTreeDrafter
from ..core.hybrid import HybridDrafter, HybridPolicy, components
from ..core.events import Cycle, interleave
from ..errors import SpecvizError
from ..models import Detokenizer, ModelPair, check_context, default_threads, encode_prompt, load_pair, threads_for_run
from ..models.host import HostLoad, read_cpu_times
from ..models.sources import TINY_TARGET, Progress
from ..models.tiny import tiny_pair
from ..settings import RunSettings
from .cost_tables import drafting_costs, drafting_untimed, pass_costs, untimed_widths
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


load_models = load      # the name `specviz.runs` exports: there `load` is the load sweep's module (`runs.load`)


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
    for each in components(drafter):       # a hybrid's drafters each (alone, it drafts with the first)
        for _ in speculative_decode(pair.target, each.without_memory(), input_ids, k=k, **warm):
            pass
    for _ in autoregressive_decode(pair.target, input_ids, **dict(warm, max_new_tokens=2)):
        pass


def new_policy(drafter: Drafter) -> CostAwarePolicy:
    """A cost-aware policy for this drafter (a hybrid's chooses among its drafters), costs still unknown."""
    return HybridPolicy(PassCosts()) if isinstance(drafter, HybridDrafter) else CostAwarePolicy(PassCosts())


def race(settings: RunSettings, prompt: str, pair: ModelPair, *, baseline: bool = False,
         warm_up: bool = True, progress: Progress | None = None, seed: int | None = None) -> Iterator[Run]:
    """Decode `prompt` (speculatively, and plainly too with `baseline`), yielding the run after each
    event. `settings` must have passed `settings.validate`; errors a user can cause raise SpecvizError.
    A sampled run without a seed samples with `seed` (a comparison's runs share their baseline's), or a
    fresh one, and its settings record it. The cost-aware policy's first run of a target (or of a
    drafter on it) calibrates first: the run is yielded once with its `status` saying so, and
    `progress` (if given) hears it too.
    On a CPU it runs on one torch thread, timed by its CPU time, unless this process chose otherwise
    (`models.devices.use_threads`: more threads are timed by the wall clock); torch's threads are as
    it found them again when it ends or is closed."""
    if settings.seed is None and settings.temperature > 0:
        # Both methods sample with one seed: with drafter-invariant sampling they then write the same
        # text, as greedy runs do.
        settings = replace(settings, seed=secrets.randbits(31) if seed is None else seed)
    with threads_for_run(pair.device):
        yield from _race(settings, prompt, pair, baseline, warm_up, progress)


def _race(settings: RunSettings, prompt: str, pair: ModelPair, baseline: bool, warm_up: bool,
          progress: Progress | None) -> Iterator[Run]:
    input_ids = encode(settings, prompt, pair)
    drafter = drafter_for(settings, pair)
    eos = list(pair.eos_token_ids or [])
    options = dict(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                   seed=settings.seed, eos_token_id=eos)
    policy = new_policy(drafter) if settings.cost_aware else None
    try:
        # Both loops check their arguments when called, before any work.
        cycles = speculative_decode(pair.target, drafter, input_ids, settings.max_new_tokens, k=settings.k,
                                    dynamic_k=settings.dynamic_k, max_k=settings.max_k, policy=policy,
                                    sampling=settings.sampling, **options)
        steps = autoregressive_decode(pair.target, input_ids, settings.max_new_tokens, **options) if baseline else None
    except ValueError as error:
        raise SpecvizError(str(error)) from None
    prompt_ids = input_ids[0].tolist()
    draft_name = pair.draft_name + (f" tree (top-{settings.branch}, {settings.tree_budget} nodes)"
                                    if drafter is not pair.draft else "")
    run = Run(settings=settings, prompt=prompt, target_name=pair.target_name, draft_name=draft_name,
              target_parameters=pair.target_parameters, draft_parameters=pair.draft_parameters,
              dtype=str(pair.dtype).removeprefix("torch."), device=str(pair.device), clock=Clock(pair.device).name,
              prompt_tokens=len(prompt_ids), eos_token_ids=eos, baseline=baseline, note=pair.note,
              _decode=functools.partial(pair.tokenizer.decode, skip_special_tokens=True))
    began = time.perf_counter()
    if warm_up:
        _warm_up(settings, pair, drafter, input_ids, options)
    if policy is not None:      # timed like the warm-up: before either method's clock starts
        widest = max(2 * settings.k, settings.tree_budget, getattr(drafter, "budget", 0) or 0) \
            if drafter.drafts_trees else settings.k           # a tree's pass verifies its nodes
        yield from _calibrated(run, settings, pair, drafter, input_ids, options, policy, widest, progress)
    spec_text, plain_text = Detokenizer(pair.tokenizer, prompt_ids), Detokenizer(pair.tokenizer, prompt_ids)
    limit, ends = settings.max_new_tokens, set(eos)
    spec_tokens = 0
    started, wall_started = read_cpu_times(), time.perf_counter()
    try:
        for event in interleave(cycles, steps):
            run.elapsed_wall_seconds = time.perf_counter() - wall_started
            if isinstance(event, Cycle):
                if not run.cycles:     # the first token as a user waits for it: warm-up and calibration included
                    run.first_token_wall_seconds = time.perf_counter() - began
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
        run.elapsed_wall_seconds = time.perf_counter() - wall_started
    if baseline:
        yield from follow_parted(run, pair, input_ids)
    yield run


def follow_parted(run: Run, pair: ModelPair, input_ids: torch.Tensor | None = None) -> Iterator[Run]:
    """Where a finished greedy run's output parted from its baseline's (a near-tie in reduced precision):
    plain decoding's steps along the speculative text from there (`core.plain.following`, into
    `run.followed` as they come: the run is yielded every few steps, so that a consumer that stops
    iterating stops them), so that the speedup compares the same text (`equal_work.equal_work`). A race
    with its own baseline does it as it ends; a run given another's baseline (`Run.attach_baseline`: a
    comparison's configurations share one) is followed after that."""
    if not (run.steps and run.settings.temperature == 0 and run.divergence is not None):
        return
    if input_ids is None:
        input_ids = encode(run.settings, run.prompt, pair)
    with threads_for_run(pair.device):
        for followed in following(pair.target, input_ids, run.tokens, run.divergence):
            run.followed = followed
            yield run


def _calibrated(run: Run, settings: RunSettings, pair: ModelPair, drafter: Drafter, input_ids: torch.Tensor,
                options: dict, policy: CostAwarePolicy, widest: int, progress: Progress | None) -> Iterator[Run]:
    """Give the policy the cost tables for this target and drafter, measuring what was never measured
    in this process (yielding `run` once first, its status saying what is timed); the seconds it took
    (wall clock) go to `run.calibration_seconds`: before either method's clock, so in neither's
    figures, but in the time to the first token."""
    contexts = untimed_widths(pair, widest, input_ids.shape[1])
    needs_passes = bool(contexts)
    # Each drafter's own drafting cost (a hybrid's components each, under their own names).
    named = {run.draft_name: drafter} if not isinstance(drafter, HybridDrafter) else \
        {str(each.name): each for each in drafter.components}
    drafting = {name: drafting_untimed(pair, each, name, input_ids.shape[1], settings) for name, each in named.items()}
    unmeasured = [name for name, contexts in drafting.items() if contexts]
    needs_drafting = bool(unmeasured)
    drafting_contexts = sorted({c for name in unmeasured for c in drafting[name]})
    if needs_passes or needs_drafting:
        what = " and ".join(part for part, needed in (
            (f"target passes verifying 0 to {widest} drafted tokens after {_joined(contexts)} tokens", needs_passes),
            (f"{', '.join(unmeasured)}'s drafting after {_joined(drafting_contexts)} tokens", needs_drafting))
            if needed)
        run.status = (f"Calibrating: timing {what} on this machine (once per process; excluded from both "
                      f"methods' figures)\u2026")
        if progress is not None:
            progress(0.0, run.status)
        yield run
    started = time.perf_counter()
    policy.costs, timed = pass_costs(pair, input_ids, widest)
    measured = {}
    for name, each in named.items():
        costs, contexts = drafting_costs(settings, pair, each, name, input_ids, options)
        if isinstance(policy, HybridPolicy):
            policy.component_costs[name] = costs
        else:
            policy.draft_costs = costs
        if contexts:
            measured[name] = contexts
    table = policy.costs
    drafters = policy.component_costs if isinstance(policy, HybridPolicy) else {run.draft_name: policy.draft_costs}
    run.decided_on = {
        "step_seconds": table.step,
        "pass_steps": [round(steps, 4) for steps in table.relative(widest)],     # by width 0..widest
        # The same after each context timed (tokens before the pass): a pass is priced between the two
        # nearest its own.
        "pass_steps_by_context": {str(context): [round(steps, 4) for steps in table.at(context).relative(widest)]
                                  for context in table.contexts},
        "drafting_steps_per_token": {name: round(costs.per_token / table.step, 4)
                                     for name, costs in drafters.items() if costs is not None and costs.known},
        # The same after each context timed, in plain steps after it, where more than one was.
        "drafting_steps_by_context": {name: {str(c): round(costs.at(c) / table.step_after(c), 4)
                                             for c in costs.contexts}
                                      for name, costs in drafters.items()
                                      if costs is not None and len(costs.contexts) > 1}}
    oriented = getattr(pair.target, "_specviz_oriented", None)      # models.cpu_linear, measured at load
    if oriented:
        run.decided_on["transposed_rows"] = {f"{out}x{into}": rows for (out, into), rows in oriented.items()}
    if timed or measured:
        run.calibration_seconds = time.perf_counter() - started
        widths = sorted({w for each in timed.values() for w in each})
        run.calibrated = ([f"target passes of {', '.join(map(str, widths))} drafted tokens after {_joined(timed)} "
                           f"tokens"] if timed else []) + \
                         [f"{name}'s drafting after {_joined(contexts)} tokens" for name, contexts in measured.items()]
    run.status = ""


def _joined(numbers) -> str:
    """1, 2 and 3."""
    words = [str(n) for n in sorted(numbers)]
    return "".join(words) if len(words) <= 1 else f"{', '.join(words[:-1])} and {words[-1]}"


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
            warm_up: bool = True, progress: Progress | None = None) -> Run:
    """`race` drained: the finished run."""
    return last(race(settings, prompt, pair, baseline=baseline, warm_up=warm_up, progress=progress))
