"""The cost tables the cost-aware policy decides from, measured once per process: what a target pass
costs on this machine (per model, its device and dtype, and torch thread count; after each context a
request is priced between) and what each drafter spends drafting for it. `runs.run` measures what a
run needs before its race (`pass_costs`, `drafting_costs`); a race in a child process sends its tables
back (`costs_for`, `adopt_costs`)."""

from __future__ import annotations

import statistics
import weakref

import torch

from ..core.decoding import speculative_decode
from ..core.drafters import Drafter
from ..core.pass_costs import DraftCosts, PassCosts, calibrate, calibration_widths, context_tokens, contexts_for
from ..core.timing import Clock
from ..models import ModelPair
from ..settings import RunSettings


# What a target pass costs on this machine, per model (its device and dtype) and torch thread count,
# and what each drafter spends drafting for it: measured before the first cost-aware run that needs
# them (`pass_costs`, `drafting_costs`: medians) and then fixed for the process (`learn=False`): no
# run's own cycles move them, so a configuration decides the same whatever ran before it. A drafter's
# drafting cost is its own: one drafter's measurement never prices another's drafts.
_PASS_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DRAFT_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
CALIBRATION_DRAFT = 2       # tokens a drafter drafts per cycle while its drafting is timed


def _pass_table(pair: ModelPair) -> PassCosts:
    return _PASS_COSTS.setdefault(pair.target, {}).setdefault(torch.get_num_threads(), PassCosts(learn=False))


def _draft_table(pair: ModelPair, draft_name: str) -> DraftCosts:
    tables = _DRAFT_COSTS.setdefault(pair.target, {})
    return tables.setdefault((torch.get_num_threads(), draft_name), DraftCosts(learn=False))


def costs_for(pair: ModelPair) -> tuple[dict, dict]:
    """The cost tables measured for the pair's target in this process (its passes by thread count, each
    drafter's drafting by thread count and name): what a race in a child process sends back."""
    return dict(_PASS_COSTS.get(pair.target, {})), dict(_DRAFT_COSTS.get(pair.target, {}))


def adopt_costs(pair: ModelPair, tables: tuple[dict, dict]) -> None:
    """Keep tables measured elsewhere (a race's child process) for the pair's target, where this
    process has none of its own: a table, once measured, is fixed for the process."""
    passes, drafting = tables
    for kept, measured in ((_PASS_COSTS, passes), (_DRAFT_COSTS, drafting)):
        own = kept.setdefault(pair.target, {})
        for key, table in measured.items():
            mine = own.setdefault(key, table)
            if isinstance(mine, PassCosts) and mine is not table:    # widths timed there only
                for context in table.contexts or [None]:
                    theirs, kept_here = (table, mine) if context is None else (table.at(context), mine.at(context))
                    for width in set(theirs.seconds) - set(kept_here.seconds):
                        kept_here.seed(width, theirs.seconds[width])
            elif isinstance(mine, DraftCosts) and mine is not table:        # contexts timed there only
                for context in set(table.contexts) - set(mine.contexts):
                    mine.set(context, table.at(context))


def _contexts(pair: ModelPair, prompt_length: int, widest: int) -> list[int]:
    """The contexts a request of `prompt_length` tokens is priced between (`pass_costs.contexts_for`)."""
    limit = getattr(pair.target.config, "max_position_embeddings", None) or 1 << 20
    return contexts_for(prompt_length, limit, widest)


def untimed_widths(pair: ModelPair, max_length: int, prompt_length: int) -> dict[int, list[int]]:
    """The pass widths up to `max_length` that `pass_costs` would time now, by the context they follow
    (`pass_costs.contexts_for`: those a request of `prompt_length` tokens is priced between)."""
    costs = _pass_table(pair)
    missing = {}
    for context in _contexts(pair, prompt_length, max_length):
        table = costs.timed_after(context)
        widths = [w for w in calibration_widths(max_length) if table is None or w not in table.seconds]
        if widths:
            missing[context] = widths
    return missing


def pass_costs(pair: ModelPair, input_ids: torch.Tensor, max_length: int) -> tuple[PassCosts, dict[int, list[int]]]:
    """The pass costs kept for the pair's target, with every width up to `max_length` timed after each
    context this request is priced between (those not yet timed are timed now, after the prompt cycled
    to that length), and the widths timed now by context."""
    prompt = input_ids[0].tolist()
    costs, missing = _pass_table(pair), untimed_widths(pair, max_length, len(prompt))
    for context, widths in missing.items():
        calibrate(pair.target, context_tokens(prompt, context), widths, costs.at(context), Clock(pair.device))
    return costs, missing


def _drafting_run(settings: RunSettings) -> tuple[int, int]:
    """Drafting is timed over a short greedy run: (tokens drafted a cycle, new tokens)."""
    k = min(settings.k, CALIBRATION_DRAFT)      # drafting's cost per token hardly depends on k: short drafts
    return k, min(settings.max_new_tokens, 3 * (k + 1) + 1)


def drafting_untimed(pair: ModelPair, drafter: Drafter, draft_name: str, prompt_length: int,
                     settings: RunSettings) -> list[int]:
    """The contexts `drafting_costs` would time this drafter's drafting after now (of those a request of
    `prompt_length` tokens is priced between); none for a drafter that proposes for free."""
    if drafter.free_to_propose:
        return []
    timed = _draft_table(pair, draft_name).contexts
    return [c for c in _contexts(pair, prompt_length, sum(_drafting_run(settings))) if c not in timed]


def drafting_costs(settings: RunSettings, pair: ModelPair, drafter: Drafter, draft_name: str,
                   input_ids: torch.Tensor, options: dict) -> tuple[DraftCosts, list[int]]:
    """This drafter's drafting seconds per token for the pair's target (nothing for a drafter that
    proposes for free), measured now after each context this request is priced between that was never
    timed: a short greedy run drafting `CALIBRATION_DRAFT` tokens a cycle after the prompt cycled to that
    length, the median over its cycles after the first (whose drafting also read the prompt). Returns
    the costs and the contexts timed now."""
    costs = _draft_table(pair, draft_name)
    prompt = input_ids[0].tolist()
    missing = drafting_untimed(pair, drafter, draft_name, len(prompt), settings)
    k, new_tokens = _drafting_run(settings)
    short = dict(options, max_new_tokens=new_tokens, temperature=0.0)
    for context in missing:
        ids = torch.tensor([context_tokens(prompt, context)], device=input_ids.device)
        per_token = [cycle.draft_seconds / len(cycle.drafted)
                     for cycle in speculative_decode(pair.target, drafter.without_memory(), ids, k=k, **short)
                     if cycle.index > 0 and cycle.drafted]
        if per_token:
            costs.set(context, statistics.median(per_token))
    return costs, missing
