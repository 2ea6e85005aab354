"""Hybrid drafting (`--draft auto`): the best drafter for every cycle. A `HybridDrafter` holds several
drafters (prompt lookup, suffix decoding, a trained head, early exit or a draft model) and a
`HybridPolicy` chooses, every cycle, the one whose draft is expected to give the most tokens per unit
of time on this device, or none (a plain step).

Each component is judged by itself, as the cost-aware policy judges a drafter alone
(core.draft_policy): its own acceptance by position on this request (a policy of its own per
component, all sharing the target's pass costs) and its own measured drafting cost (a `DraftCosts` per
component, never another's). A component that proposes for free (prompt lookup, suffix decoding)
proposes every cycle and has its proposal scored against what the target then writes, whether or not
it drafted; any other (a head, a draft model) is planned without proposing and drafts only when
chosen, learning its acceptance from its own verified drafts and from probes. A probe here is scored,
not verified: where the drafter alone would verify a short draft it does not expect to pay for, the
hybrid has it draft that chain and scores it against the output as it scores a free proposal (at its
drafting cost, without the wider pass, which costs ~0.7 of a plain step in fp32 on a CPU). The gains compared are
the policy's own, `expected_tokens / relative cost`, so the choice is the one the policy would make
for each drafter alone, taken across them. Where both copies pay, the preferred one drafts unless the
other has clearly given more on this request, and one tree may hold both copies' drafts where what the
other's nodes have added pays for their width (core.copy_record). Where a copy pays, one tree may also
hold the copy's draft and a model's short chain, verified in one pass, when its expected gain beats
every single drafter's (`HybridPolicy.merged`); each node records its writer.

Components keep their state in every cycle, drafting or not: a head reads the target's hidden states
of every kept position (`observe`) and catches up on its own cache when it next drafts; a draft model
feeds what its cache lacks when it next drafts; suffix decoding sees the whole request. After a tree
cycle only the component that drafted the tree keeps its path, the others roll back to the kept
length.

Lossless as every drafter: the verification rule is the loop's, whatever drafted, and each draft is
exactly its component's (a model's with its distribution, a lookup's one-hot). One request at a time
(suffix decoding keeps one request's state)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from . import tree_shape, trees
from .copy_record import CopyRecord, Offered, union
from .draft_policy import PROBE_LENGTH, CostAwarePolicy, Plan
from .pass_costs import DraftCosts, PassCosts
from .drafters import Draft, Drafter, no_draft
from .events import Cycle
from .request import Request
from .sampling import Sampler

# A tree holding two drafters' branches (`HybridPolicy.merged`): the model's branch drafts at most this
# deep (the shipped head's default k is 2; its third token is kept after two 5-6% of the time).
MERGE_LENGTH = 2
_GREEDY = Sampler()


class HybridDrafter(Drafter):
    """Several drafters as one (module docstring); `chosen` is the component whose draft the loop is
    verifying (None: nothing drafted this cycle). Without a `HybridPolicy` (a warm-up, a fixed k) the
    first component with a proposal drafts."""

    def __init__(self, components: Sequence[Drafter], name: str = "auto", *, merge: bool = True,
                 prefer: str | None = None, both: bool = False):
        components = list(components)
        names = [c.name for c in components]
        if not components or len(set(names)) != len(names):
            raise ValueError(f"a hybrid drafter needs one or more drafters of distinct names, got {names}")
        free = [c.name for c in components if c.free_to_propose]
        if prefer is not None and prefer not in free:
            raise ValueError(f"the preferred drafter must be one of the free ones ({free}), got {prefer}")
        # Where two free drafters pay, this one drafts unless another has clearly paid more on the request
        # (core.copy_record); None: the one with the best expected gain.
        self.prefer = prefer
        readers = [c for c in components if c.hidden_layers]
        if len(readers) > 1:
            raise ValueError("a hybrid drafter takes at most one drafter that reads the target's hidden states")
        self.components, self.name = components, name
        self.parameters = sum(c.parameters for c in components)
        self.hidden_layers = readers[0].hidden_layers if readers else ()
        # One tree may hold a copy's branch and a model's (`HybridPolicy.merged`): with a drafter of each kind.
        self.merges = merge and any(c.free_to_propose for c in components) and \
            any(not c.free_to_propose for c in components)
        self.drafts_trees = any(c.drafts_trees for c in components) or self.merges
        # With a preference and trees: one tree of both copies' offers may draft where what the other's
        # nodes have added on the request pays for their width (core.copy_record).
        self.both = both and prefer is not None and self.drafts_trees
        self.budget = max((getattr(c, "budget", 0) or 0 for c in components), default=0)   # a tree's most nodes
        self.chosen: Drafter | None = None
        self.aside: dict[str, int] = {}     # components that drafted aside this cycle: the length they drafted after

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.chosen, self.aside = None, {}
        for component in self.components:
            component.begin(prompt_ids)

    def propose_with(self, component: Drafter, request: Request, sampler: Sampler | None = None, *,
                     aside: bool = False) -> Draft:
        """`component`'s draft of at most `request.budget` tokens (with `sampler`, default the request's).
        `aside`: a draft the pass will not verify as that component's (a probe that is scored, a branch of
        a tree of two): after the pass the component rolls back to before it, whatever was accepted, so
        that a drafter with a cache of its drafted tokens (a draft model, early exit) never keeps one the
        target did not write there."""
        if request.budget <= 0:
            return no_draft()
        if aside:
            self.aside[component.name] = len(request.tokens)
        return component.propose(torch.tensor([request.tokens]), request.budget, sampler or request.sampler)

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        for component in self.components:
            draft = component.propose(sequence, k, sampler)
            if draft.tokens.numel():
                self.chosen = component
                return draft
        self.chosen = None
        return no_draft()

    def keep_path(self, valid_length: int, path: list[int]) -> None:
        self.rollback(valid_length, keeping=path)

    def rollback(self, valid_length: int, keeping: list[int] | None = None) -> None:
        """Every component back to `valid_length`, one that drafted aside to before its draft; after a tree
        the chosen component keeps its path (`keeping`)."""
        for component in self.components:
            if keeping is not None and component is self.chosen and component.name not in self.aside:
                component.keep_path(valid_length, keeping)
            else:
                component.rollback(min(valid_length, self.aside.get(component.name, valid_length)))
        self.aside = {}

    def observe(self, hidden: Sequence[torch.Tensor]) -> None:
        for component in self.components:
            if component.hidden_layers:
                component.observe(hidden)

    def forget(self) -> None:
        for component in self.components:
            component.forget()

    def without_memory(self) -> HybridDrafter:
        return HybridDrafter([c.without_memory() for c in self.components], self.name, merge=self.merges,
                             prefer=self.prefer, both=self.both)


def components(drafter: Drafter) -> list[Drafter]:
    """The drafters a drafter drafts with: a hybrid's components, else itself."""
    return list(drafter.components) if isinstance(drafter, HybridDrafter) else [drafter]


@dataclass(frozen=True)
class HybridPlan(Plan):
    """A hybrid cycle's plan: the component that drafts (None: none) and what the choice compared, each
    component's offer as {"drafter", "length", "expected_tokens", "gain"} (a tree of two drafters'
    branches: also "with", the second drafter)."""

    drafter: str | None = None
    offers: tuple[dict, ...] = ()

    def fields(self) -> dict:
        return dict(super().fields(), drafter=self.drafter, offers=[dict(offer) for offer in self.offers])


def chain_or_tree(draft: Draft) -> list[int]:
    """A draft's parents: a tree's own, a chain's i - 1."""
    return list(draft.parents) if draft.parents is not None else list(range(-1, draft.tokens.shape[0] - 1))


def merged_gain(first: Sequence[float], second: Sequence[float], nodes: int, pass_cost: Sequence[float],
                drafting: float) -> tuple[float, float]:
    """(expected tokens, gain) of one tree holding two drafters' branches, from each branch's chance of
    reaching and keeping depth d (`first[d - 1]`, `second[d - 1]`), taken as independent: a depth is
    reached when either branch reaches it (1 - (1 - a)(1 - b)). Priced as a pass over `nodes` (the two
    branches' nodes, as if none were shared: a shared node only narrows it) plus `drafting` plain steps."""
    depth = max(len(first), len(second))
    a = list(first) + [0.0] * (depth - len(first))
    b = list(second) + [0.0] * (depth - len(second))
    expected = 1.0 + sum(x + y * (1.0 - x) for x, y in zip(a, b))
    return expected, expected / (pass_cost[nodes] + drafting)


def merge_branches(tokens: list[int], parents: list[int], branch: Sequence[int]) -> tuple[list[int], list[int], int]:
    """A tree (`tokens`, `parents`) with a chain `branch` from the root added as a trie: where the tree
    already has the chain's next token under the same node, the chain follows it. Returns the new
    tokens and parents (the tree's nodes first, as they were) and how many of the chain's were shared."""
    tokens, parents, before = list(tokens), list(parents), len(tokens)
    place = tree_shape.add_tree(tokens, parents, list(branch), list(range(-1, len(branch) - 1)))
    return tokens, parents, sum(node < before for node in place)


@dataclass
class _Offer:
    """One component's offer this cycle: its plan, and its draft when it proposed already (free)."""

    component: Drafter
    plan: Plan
    draft: Draft | None
    budget: int                 # the request's budget for its draft (a tree's depth cut)
    seen: dict | None = None    # a tree of both copies: what the cycle's offers say of it


class HybridPolicy(CostAwarePolicy):
    """The cost-aware policy over a `HybridDrafter`'s components (module docstring). `draft_costs`:
    each component's drafting cost, by its name (a component not in it starts unmeasured)."""

    def __init__(self, costs: PassCosts, draft_costs: Mapping[str, DraftCosts] | None = None, **options):
        super().__init__(costs, **options)
        self.component_costs: dict[str, DraftCosts] = dict(draft_costs or {})
        self.parts: dict[str, CostAwarePolicy] = {}
        self.free: set[str] = set()
        self.records: dict[int, CopyRecord] = {}      # per request: which free drafter pays (core.copy_record)
        self._options = options

    def part(self, component: Drafter) -> CostAwarePolicy:
        """The component's own policy: its acceptance per request, its drafting cost, the shared pass costs."""
        name = component.name
        if name not in self.parts:
            self.parts[name] = CostAwarePolicy(self.costs, **self._options)
            if component.free_to_propose:
                self.free.add(name)
        part = self.parts[name]
        # The target's pass costs and this component's drafting costs, each replaced when calibrated.
        part.costs, part.draft_costs = self.costs, self.component_costs.setdefault(name, DraftCosts())
        return part

    def draft(self, drafter: Drafter, live: Sequence[Request], plans: dict[int, Plan]) -> list[Draft]:
        if not isinstance(drafter, HybridDrafter):
            raise ValueError(f"the hybrid policy chooses among a hybrid drafter's drafters, not {drafter.name}")
        if len(live) != 1:
            raise ValueError("a hybrid drafter drafts for one request at a time")
        (request,) = live
        most = request.budget
        offers = []
        for component in drafter.components:
            part = self.part(component)
            request.budget = most
            if component.free_to_propose:
                # It proposes its most, noted for scoring; its plan cuts it (a tree: `request.budget`).
                planned: dict[int, Plan] = {}
                draft = part.plan_proposal(request, drafter.propose_with(component, request), planned)
                if request.index in planned:
                    offers.append(_Offer(component, planned[request.index], draft, request.budget))
            else:
                plan = part.plan(request.index, most, free=False, tree=component.drafts_trees,
                                 context=len(request.tokens))
                if plan.probe:
                    # Scored, not verified: where it alone would probe (a wider pass that mostly does not
                    # pay, ~0.7 of a plain step in fp32 here), it drafts a short chain that is scored
                    # against the tokens the target writes, as a free drafter's proposal is, at its
                    # drafting cost only; the cycle goes on without it.
                    self.shadow(part, component, drafter, request, min(PROBE_LENGTH, most))
                    plan = Plan(0, plan.gain)
                offers.append(_Offer(component, plan, None, plan.length))
        # The best expected gain among those expected to pay, of two free drafters only the preferred
        # one unless the other has clearly paid more on this request (core.copy_record); else a probe (a
        # drafter that must draft to learn); else a plain step.
        paying, versus = self.copies(drafter, request, [o for o in offers if o.plan.length and not o.plan.probe])
        seen = tuple(dict(drafter=o.component.name, length=o.plan.length, expected_tokens=o.plan.expected,
                          gain=o.plan.gain, **({"versus": versus[o.component.name]} if o.component.name in versus
                                               else {})) for o in offers)
        seen += tuple(o.seen for o in paying if o.seen is not None)
        best = max(paying, key=lambda o: o.plan.gain) if paying else next((o for o in offers if o.plan.probe), None)
        copy = max((o for o in paying if o.draft is not None), key=lambda o: o.plan.gain, default=None) \
            if drafter.merges else None
        if copy is not None:
            merged = self.merged(drafter, request, copy, offers, most, best.plan.gain)
            if merged is not None:
                draft, plan, second = merged
                drafter.chosen = None           # every component rolls back to what the pass kept
                seen += (dict(drafter=copy.component.name, length=plan.length, expected_tokens=plan.expected,
                              gain=plan.gain, **{"with": second}),)
                plans[request.index] = HybridPlan(plan.length, plan.gain, False, plan.expected, offers=seen,
                                                  drafter=copy.component.name)
                return [draft]
        draft = no_draft()
        if best is not None:
            request.budget = best.budget
            draft = best.draft if best.draft is not None else drafter.propose_with(best.component, request)
        drafter.chosen = best.component if best is not None and draft.tokens.numel() else None
        if best is None:
            gain = max((o.plan.gain for o in offers), default=1.0)
            plans[request.index] = HybridPlan(0, gain, offers=seen)
            request.budget = 0
        else:
            plan = best.plan
            plans[request.index] = HybridPlan(plan.length, plan.gain, plan.probe, plan.expected, offers=seen,
                                              drafter=drafter.chosen.name if drafter.chosen is not None else None)
        return [draft]

    def copies(self, drafter: HybridDrafter, request: Request, paying: list[_Offer]) -> tuple[list[_Offer], dict]:
        """`paying` with, where two or more free drafters pay, only one of them: the preferred one unless
        another has clearly paid more on this request (core.copy_record); their offers go on the record.
        Also what the record says of each other free drafter's offer, by name (`CopyRecord.versus`)."""
        free = [o for o in paying if o.draft is not None]
        names = [o.component.name for o in free]
        if len(free) < 2 or drafter.prefer not in names:
            return paying, {}
        record = self.records.setdefault(request.index, CopyRecord(drafter.prefer, both=drafter.both))
        versus = {name: record.versus(name) for name in names if name != drafter.prefer}
        offered = [Offered(o.component.name, o.draft.tokens.tolist(), chain_or_tree(o.draft), o.plan.length,
                           request.generated) for o in free]
        record.offer(offered)
        leader = record.leader(names)
        kept = [o for o in paying if o.draft is None or o.component.name == leader]
        if drafter.both and leader == drafter.prefer:
            tree = self.tree_of_both(drafter, free, offered, record, len(request.tokens))
            preferred = free[names.index(leader)]
            if tree is not None and tree.plan.gain > preferred.plan.gain:
                kept = [tree if o is preferred else o for o in kept]
        return kept, versus

    def tree_of_both(self, drafter: HybridDrafter, free: list[_Offer], offered: list[Offered],
                     record: CopyRecord, context: int) -> _Offer | None:
        """One tree of the free drafters' offers (`copy_record.union`), as the preferred one's offer: its
        draft, then the nodes the others add, each marked with its drafter; None where they add none. It
        is expected to give the preferred draft's tokens and what the others' nodes have added on this
        request (`CopyRecord.added`), priced at the tree's width after `context` tokens."""
        order = sorted(range(len(free)), key=lambda i: free[i].component.name != drafter.prefer)
        free, offered = [free[i] for i in order], [offered[i] for i in order]
        tree = union(offered)
        if len(tree.tokens) <= offered[0].width():
            return None
        drafts = [o.draft for o in free]
        earlier = None if all(d.from_earlier is None for d in drafts) else \
            [drafts[i].from_earlier is not None and bool(drafts[i].from_earlier[node]) for i, node in tree.sources]
        names = [o.component.name for o in free]
        draft = Draft(torch.tensor(tree.tokens, dtype=torch.long), None, tree.parents, from_earlier=earlier,
                      signal=drafts[0].signal, drafted_by=[names[i] for i, _ in tree.sources])
        expected, depth = free[0].plan.expected + record.added(), tree.depth()
        gain = expected / self.costs.relative(len(tree.tokens), context)[len(tree.tokens)]
        seen = dict(drafter=drafter.prefer, length=depth, expected_tokens=expected, gain=gain,
                    added=record.tokens_added(), **{"with": "+".join(names[1:])})
        return _Offer(free[0].component, Plan(depth, gain, expected=expected), draft, depth, seen)

    def merged(self, drafter: HybridDrafter, request: Request, copy: _Offer, offers: Sequence[_Offer],
               most: int, to_beat: float) -> tuple[Draft, Plan, str] | None:
        """One tree holding `copy`'s draft (the best paying free drafter's, cut to its plan) and a short
        chain of the model among the components (a head, a draft model, early exit: 1 to MERGE_LENGTH
        tokens), verified in one pass, where its expected gain (`merged_gain`) beats `to_beat` (the best
        single offer's): (the tree, its plan, the model's name), else None. The model's chain is scored against the
        output as a probe is; it drafts greedily under classic sampling (so that its nodes are fixed
        candidates, independent of verification's draws), with the request's sampler otherwise."""
        model = next((o for o in offers if not o.component.free_to_propose), None)
        if model is None or not copy.plan.length:
            return None
        name = model.component.name
        part, copying = self.parts[name], self.parts[copy.component.name]
        tokens = copy.draft.tokens.tolist()
        parents = chain_or_tree(copy.draft)
        depth = copy.plan.length
        kept = tree_shape.subtree_without(parents, {i for i, d in enumerate(tree_shape.depths(parents)) if d > depth})
        tokens, parents = [tokens[i] for i in kept], trees.reindex(parents, kept)
        first = copying.reach(request.index, depth, free=True, signal=copy.draft.signal)
        drafting = part.drafting_steps(len(request.tokens))
        cost = self.costs.relative(len(tokens) + MERGE_LENGTH, len(request.tokens))
        best = None
        for length in range(1, min(MERGE_LENGTH, most) + 1):
            expected, gain = merged_gain(first, part.reach(request.index, length, free=False), len(tokens) + length,
                                         cost, length * drafting)
            if best is None or gain > best[2]:
                best = (length, expected, gain)
        length, expected, gain = best
        if gain <= to_beat:
            return None
        request.budget = length
        sampler = request.sampler if request.sampler.greedy or request.sampler.invariant else _GREEDY
        chain = drafter.propose_with(model.component, request, sampler, aside=True)
        branch = chain.tokens.tolist()
        if not branch:
            return None
        part.propose_freely(request.index, branch, request.generated)     # scored against the output
        tokens, parents, _ = merge_branches(tokens, parents, branch)
        added = len(tokens) - len(kept)
        earlier = copy.draft.from_earlier
        writers = copy.draft.drafted_by or [copy.component.name] * len(copy.draft.tokens)
        deepest = max(tree_shape.depths(parents))
        request.budget = deepest
        draft = Draft(torch.tensor(tokens, dtype=torch.long), None, parents,
                      from_earlier=None if earlier is None else [earlier[i] for i in kept] + [False] * added,
                      signal=copy.draft.signal, drafted_by=[writers[i] for i in kept] + [name] * added)
        return draft, Plan(deepest, gain, expected=expected), name

    def shadow(self, part: CostAwarePolicy, component: Drafter, drafter: HybridDrafter, request: Request,
               length: int) -> None:
        """`component`'s draft of `length` noted for scoring against the output (greedy: exactly what
        verification would say; sampled: the chance the target writes the drafted token, at most its
        acceptance), never verified. Its state rolls back with the others' after the cycle."""
        request.budget = length
        draft = drafter.propose_with(component, request, aside=True)
        if draft.tokens.numel():
            part.propose_freely(request.index, draft.tokens.tolist(), request.generated, draft.signal, draft.parents)

    def learn(self, live: Sequence[Request], cycles: Sequence[Cycle], index: int, free: bool) -> None:
        """The drafter that drafted learns from its verified draft; every free one scores its proposal
        against the output; the pass's cost, and the drafting cost of a drafter that is not free."""
        (request,), (cycle,) = live, cycles
        output = request.tokens[len(request.tokens) - request.generated:]
        if request.index in self.records and self.costs.known:
            context = len(request.tokens)
            self.records[request.index].observe(output, lambda width: self.costs.relative(width, context))
        for name, part in self.parts.items():
            if name == cycle.drafter:
                part.observe(request.index, tree_shape.draft_reach(cycle), len(cycle.accepted_nodes), output,
                             nodes=len(cycle.drafted))
            else:
                part.observe(request.index, 0, 0, output)
        if index > 0:
            self.costs.observe(len(cycle.drafted), cycle.verify_seconds, len(request.tokens))
            if cycle.drafter is not None and cycle.drafter not in self.free:
                self.parts[cycle.drafter].draft_costs.observe(len(cycle.drafted), cycle.draft_seconds)

