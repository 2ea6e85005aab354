"""How much to draft: cost-aware speculation. Before each cycle the policy chooses the draft length
n (0 = a plain step) that maximises the expected tokens per unit of time,

    gain(n) = E[tokens | n] / cost(n),   E[tokens | n] = 1 + sum_{i=1..n} prod_{j<=i} c_j,
    cost(n) = (pass over n drafted tokens + drafting n) / (a plain one-token step),

where c_j is this request's estimated chance that draft position j is accepted given that the ones
before it were, and the costs are this device's, measured (core.pass_costs): a target pass's by width
(`PassCosts`, one table per target, device, dtype and thread count) and drafting's per token
(`DraftCosts`, one per drafter: never another drafter's), each calibrated once before its first run
(`calibrate`: medians, the collector paused) and then fixed for the process (`runs.run`). A run's
decisions depend on its own request and those measured costs only, never on which configuration ran
before it. A plain step has gain 1, so the policy drafts only where drafting is expected to beat plain
decoding on this device, and no further than pays. It decides only how much is drafted: verification
is untouched, so the output is what it always is (greedy: the target's own; sampled: the target's
distribution).

What it takes from the field (docs/draft_policy.md says more): the objective is DISCO's / dynamic
lookahead's and SpecDec++'s (stop drafting where the expected gain of one more token turns
negative), priced by the device's measured pass costs instead of assuming a pass costs one step (the
theory of Leviathan et al.); per-position acceptance instead of one alpha; llama.cpp's p-min and
transformers' confidence threshold act on the draft's own probability, which a one-hot drafter
(prompt lookup) does not have, so acceptance is learned from the request itself.

How a paused request gets its drafts back: a drafter whose proposals cost nothing next to a pass and
depend only on the sequence (`Drafter.free_to_propose`: prompt lookup) still proposes every cycle,
and its proposal is scored against the tokens the target then emits (greedy: exactly what
verification would have said; sampled with a one-hot draft, P(emitted == drafted) = P(accepted)), so
its estimates follow the text at no cost. Any other drafter is probed: after `probe_after` paused
cycles it drafts a short chain, and each probe that does not pay doubles the wait (up to
`max_probe_after`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


from . import tree_shape
from .drafters import Draft, Drafter, no_draft
from .events import Cycle
from .pass_costs import DraftCosts, PassCosts
from .request import Request

# A position's acceptance before anything is seen. A drafter whose drafts cost a pass must draft to
# learn, so it starts hopeful; one whose proposals are scored for free (prompt lookup) loses nothing by
# waiting for evidence (its first proposal is scored against the first tokens the target writes), and
# a first draft that misses costs most of a plain step on a CPU.
PRIOR_ACCEPTANCE = 0.5
FREE_PRIOR_ACCEPTANCE = 0.25
PRIOR_WEIGHT = 1.0          # worth this many observations
DECAY = 0.9                 # per observation: recent text outweighs old (a request's text changes)
PROBE_LENGTH = 2            # a probe drafts this many tokens
EVIDENCE_REACH = 2          # a drafter that must draft to learn drafts at most this far past what it reached
# Draft only where the expected gain clears this: below it the gain is within what the measured costs
# resolve (a few percent between identical passes here), and a plain step never loses.
MIN_GAIN = 1.02


# ----------------------------------------------------------------------------- one request's acceptance

@dataclass
class Acceptance:
    """A request's acceptance by draft position: how often position j was reached (every earlier
    drafted token accepted) and accepted there, decayed so that recent text counts most."""

    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def observe(self, matched: int, length: int) -> None:
        """A draft of `length` tokens whose first `matched` were accepted (the next, if any, was not)."""
        for j in range(min(matched + 1, length)):
            self.observe_position(j, j < matched)

    def observe_position(self, j: int, accepted: bool) -> None:
        """Position j (from 0) was reached, and accepted or not."""
        while len(self.reached) <= j:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        self.reached[j] = DECAY * self.reached[j] + 1.0
        self.accepted[j] = DECAY * self.accepted[j] + float(accepted)

    def rates(self, n: int, prior: Sequence[float] | None = None, start: float = PRIOR_ACCEPTANCE) -> list[float]:
        """c_1..c_n: each position's acceptance, its own observations shrunk toward `prior` (another
        estimate's rates) or else toward the position before it (the first toward the pooled rate of
        every position, itself shrunk toward `start`): a deep position seldom reached borrows
        from the shallower ones, and a copy that holds (acceptance rising with depth) is not pulled
        down by the first position's misses."""
        toward = ((sum(self.accepted) + start * PRIOR_WEIGHT) / (sum(self.reached) + PRIOR_WEIGHT))
        out = []
        for j in range(n):
            reached = self.reached[j] if j < len(self.reached) else 0.0
            accepted = self.accepted[j] if j < len(self.accepted) else 0.0
            if prior is not None:
                toward = prior[j]
            toward = (accepted + toward * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            out.append(toward)
        return out


def expected_tokens(rates: Sequence[float]) -> list[float]:
    """E[tokens emitted | n drafted] for n = 0..len(rates): 1 + sum over i <= n of prod_{j<=i} c_j."""
    out, survive = [1.0], 1.0
    for c in rates:
        survive *= c
        out.append(out[-1] + survive)
    return out


# ----------------------------------------------------------------------------- the policy

@dataclass(frozen=True)
class Plan:
    """One cycle's choice for one request."""

    length: int                 # tokens to verify this cycle (0: a plain step)
    gain: float                 # expected tokens per plain step's time of the best drafting length (> 1 pays)
    probe: bool = False         # drafting although not expected to pay, to learn whether it does now
    expected: float = 1.0       # expected tokens this cycle emits at that length (1: a plain step)

    def fields(self) -> dict:
        """Its cycle's `Cycle` fields."""
        return dict(planned=self.length, expected_gain=self.gain, probe=self.probe)


@dataclass
class _Pending:
    """A free proposal being scored against what the target emits (positions compared so far)."""

    tokens: list[int]
    start: int                  # output position its first token would take
    signal: int | None = None
    parents: list[int] = field(default_factory=list)    # each node's parent (-1: the root); a chain: i - 1
    node: int = -1              # the deepest node the output has followed so far
    matched: int = 0            # its depth


@dataclass
class _State:
    acceptance: Acceptance = field(default_factory=Acceptance)
    by_signal: dict[int, Acceptance] = field(default_factory=dict)     # per kind of draft (Draft.signal)
    pending: _Pending | None = None
    paused_for: int = 0         # cycles since it last drafted
    probe_after: int = 0        # paused cycles before the next probe
    tree_nodes: float = 0.0     # its trees' nodes, running mean (a tree's pass is priced at this width)


class CostAwarePolicy:
    """Chooses each request's draft length (see the module docstring). One policy per run: it keeps
    each request's acceptance; `costs` may be shared by runs on the same model and device."""

    def __init__(self, costs: PassCosts, draft_costs: DraftCosts | None = None, *, probe_after: int = 4,
                 max_probe_after: int = 32):
        self.costs = costs
        self.draft_costs = draft_costs if draft_costs is not None else DraftCosts()
        self.probe_after, self.max_probe_after = probe_after, max_probe_after
        self.states: dict[int, _State] = {}

    def relative(self, max_width: int, drafted: Sequence[int] | None = None, context: int | None = None) -> list[float]:
        """cost[w] for w = 0..max_width: a pass over w drafted tokens plus drafting them (`drafted[w]`
        tokens drafted for a pass of width w; a chain: w), over a plain step, after `context` tokens
        (`PassCosts.relative`, `DraftCosts.at`)."""
        passes = self.costs.relative(max_width, context)
        drafting = self.drafting_steps(context)
        if not drafting:
            return passes
        return [cost + (w if drafted is None else drafted[w]) * drafting for w, cost in enumerate(passes)]

    def drafting_steps(self, context: int | None = None) -> float:
        """Drafting one token after `context` tokens, in plain steps after the same context (0: unmeasured,
        or a drafter that proposes for free)."""
        per_token = self.draft_costs.at(context)
        return per_token / self.costs.step_after(context) if per_token else 0.0

    def state(self, request: int) -> _State:
        return self.states.setdefault(request, _State(probe_after=self.probe_after))

    def plan(self, request: int, max_length: int, *, free: bool, tree: bool = False,
             signal: int | None = None, widths: Sequence[int] | None = None, context: int | None = None) -> Plan:
        """How deep request `request` drafts this cycle, out of at most `max_length`, its passes priced
        after `context` tokens (its prompt and output so far). A free drafter's
        plan is made after it proposed, for that proposal's kind (`signal`) and, for a tree, its width at
        each depth (`widths[n]`: the nodes a pass verifies when the tree is cut to depth n). Any other
        tree (`tree`) is drafted whole or not at all, priced at the width of this request's trees so far."""
        if max_length <= 0:
            return Plan(0, 1.0)
        state = self.state(request)
        if not free:
            # A drafter that must draft to learn drafts at most EVIDENCE_REACH positions deeper than
            # its drafts have been seen to reach on this request: two hits at its first positions are
            # no evidence for the eighth (drafted whole at the first positions' rate, a wide pass
            # that misses costs a CPU most of two plain steps in fp32). A free drafter's proposals
            # are scored to their full depth every cycle.
            max_length = min(max_length, len(state.acceptance.reached) + EVIDENCE_REACH)
        expected = expected_tokens(self._rates(state, max_length, free, signal))
        if not self.costs.known:
            return Plan(max_length, expected[-1], expected=expected[-1])
        if widths is None and tree:
            width = max(1, round(state.tree_nodes)) if state.tree_nodes else max_length
            best, gain = max_length, expected[-1] / self.relative(width, context=context)[width]
        else:
            widths = list(widths) if widths is not None else list(range(max_length + 1))
            cost = self.relative(widths[max_length], context=context)
            best = max(range(1, max_length + 1), key=lambda n: (expected[n] / cost[widths[n]], -n))
            gain = expected[best] / cost[widths[best]]
        if gain >= MIN_GAIN:
            state.paused_for, state.probe_after = 0, self.probe_after
            return Plan(best, gain, expected=expected[best])
        state.paused_for += 1
        if not free and state.paused_for > state.probe_after:
            state.paused_for, state.probe_after = 0, min(2 * state.probe_after, self.max_probe_after)
            length = max_length if tree else min(PROBE_LENGTH, max_length)
            return Plan(length, gain, probe=True, expected=expected[length])
        return Plan(0, gain)

    def _rates(self, state: _State, n: int, free: bool, signal: int | None) -> list[float]:
        rates = state.acceptance.rates(n, start=FREE_PRIOR_ACCEPTANCE if free else PRIOR_ACCEPTANCE)
        if signal is not None and signal in state.by_signal:
            rates = state.by_signal[signal].rates(n, prior=rates)
        return rates

    def reach(self, request: int, n: int, *, free: bool, signal: int | None = None) -> list[float]:
        """The chance that a draft of this request reaches and keeps depth d, for d = 1..n (the
        products of the rates `plan` prices with): what each depth adds to the expected tokens."""
        expected = expected_tokens(self._rates(self.state(request), n, free, signal))
        return [after - before for before, after in zip(expected, expected[1:])]

    # -------------------------------------------------------------- in the decoding loop

    def draft(self, drafter: Drafter, live: Sequence[Request], plans: dict[int, Plan]) -> list[Draft]:
        """The loop's step 1: each request's draft (of at most `request.budget`) as long as is expected to
        pay, its plan in `plans`. A free drafter proposes its most, then is cut; any other drafts as planned."""
        free = drafter.free_to_propose
        if not free:
            for request in live:
                plans[request.index] = plan = self.plan(request.index, request.budget, free=False,
                                                        tree=drafter.drafts_trees, context=len(request.tokens))
                request.budget = plan.length
        drafts = drafter.propose_batch(live)
        if free:
            drafts = [self.plan_proposal(request, draft, plans) for request, draft in zip(live, drafts)]
        return drafts

    def plan_proposal(self, request: Request, draft: Draft, plans: dict[int, Plan]) -> Draft:
        """A free drafter's proposal: noted for scoring, its plan made for it (into `plans`), and the
        draft cut to it (a tree: to the planned depth, through the request's budget, which the tree
        pass cuts by)."""
        n = draft.tokens.shape[0]
        if not n:
            return draft
        self.propose_freely(request.index, draft.tokens.tolist(), request.generated, draft.signal, draft.parents)
        if draft.parents is None:
            plans[request.index] = plan = self.plan(request.index, n, free=True, signal=draft.signal,
                                                    context=len(request.tokens))
            return draft if n <= plan.length else Draft(draft.tokens[:plan.length],
                                                        None if draft.probs is None else draft.probs[:plan.length])
        depths = tree_shape.depths(list(draft.parents))
        deepest = min(max(depths), request.budget)
        widths = [sum(d <= n for d in depths) for n in range(deepest + 1)]
        plans[request.index] = plan = self.plan(request.index, deepest, free=True, tree=True, signal=draft.signal,
                                                widths=widths, context=len(request.tokens))
        if plan.length == 0:
            return no_draft()
        request.budget = plan.length
        return draft

    def learn(self, live: Sequence[Request], cycles: Sequence[Cycle], index: int, free: bool) -> None:
        """What a cycle teaches: each request's acceptance by position (a tree's by depth along its
        accepted path), and, for a request decoded alone, what a pass of this width cost (not the first
        pass, which also read the prompt)."""
        for request, cycle in zip(live, cycles):
            self.observe(request.index, tree_shape.draft_reach(cycle), len(cycle.accepted_nodes),
                         request.tokens[len(request.tokens) - request.generated:], nodes=len(cycle.drafted))
        if len(live) == 1 and index > 0:
            cycle = cycles[0]
            self.costs.observe(len(cycle.drafted), cycle.verify_seconds, len(live[0].tokens))
            if not free:
                self.draft_costs.observe(len(cycle.drafted), cycle.draft_seconds)

    # -------------------------------------------------------------- what the request did

    def propose_freely(self, request: int, proposal: Sequence[int], generated: int, signal: int | None = None,
                       parents: Sequence[int] | None = None) -> None:
        """A free drafter's whole proposal this cycle (`generated` tokens emitted before it; a tree's
        nodes with their `parents`): scored against the output as it comes, unless an earlier proposal
        is still being scored."""
        state = self.state(request)
        if state.pending is None and proposal:
            chain = list(range(-1, len(proposal) - 1))
            state.pending = _Pending(list(proposal), generated, signal, list(parents) if parents is not None else chain)

    def observe(self, request: int, drafted: int, accepted: int, output: Sequence[int], *, nodes: int = 0) -> None:
        """After a cycle: it verified a draft `drafted` deep (a chain's length, a tree's depth, of
        `nodes` tokens) and accepted `accepted`; `output` is the request's output so far. A free
        proposal is scored against `output` instead."""
        state = self.state(request)
        if nodes and nodes > drafted:       # a tree
            state.tree_nodes = nodes if not state.tree_nodes else state.tree_nodes + 0.3 * (nodes - state.tree_nodes)
        pending = state.pending
        if pending is None:
            if drafted:
                state.acceptance.observe(accepted, drafted)
            return
        # Each position is learned as soon as the output reaches it, so that a paused request whose
        # proposals start to come true drafts again after one token, not after the whole proposal.
        estimates = [state.acceptance]
        if pending.signal is not None:
            estimates.append(state.by_signal.setdefault(pending.signal, Acceptance()))
        while pending.start + pending.matched < len(output):
            children = [i for i, parent in enumerate(pending.parents) if parent == pending.node]
            if not children:
                break
            token = output[pending.start + pending.matched]
            hit = next((i for i in children if pending.tokens[i] == token), None)
            for estimate in estimates:
                estimate.observe_position(pending.matched, hit is not None)
            if hit is None:
                state.pending = None
                return
            pending.node, pending.matched = hit, pending.matched + 1
        if pending.node not in pending.parents:     # a leaf: nothing deeper to score
            state.pending = None


def planned_fields(plan: Plan | None) -> dict:
    """A cycle's `Cycle` fields for its plan (none without the policy, or with nothing proposed)."""
    return {} if plan is None else plan.fields()
