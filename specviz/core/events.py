"""What the decoding loops report: one frozen record per speculative cycle or plain step.

Everything downstream (metrics, the token view, the charts, the command line, exports) is
computed from these records; nothing downstream reaches back into the loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

# The one vocabulary of verdicts, used by every layer. A drafted token (or tree node) is accepted,
# rejected, or (a tree's node under a branch that lost) not reached; the target's own token after
# the accepted ones is resampled (after a rejection) or a bonus (nothing was rejected).
ACCEPTED, REJECTED, NOT_REACHED = "accepted", "rejected", "not reached"
RESAMPLED, BONUS = "resampled", "bonus"


@dataclass(frozen=True)
class Cycle:
    """One draft -> verify cycle of speculative decoding.

    `emitted == drafted[:num_accepted] + [correction]`, except that `correction` is None
    when the run ended on an accepted EOS token (drafts never run past an EOS).
    """

    index: int                      # 0-based cycle number
    # The run's draft length in this cycle: its `k`, which dynamic k moves between cycles (the
    # policy's value, not what was drafted: the drafter may propose fewer, see `drafted`, and the
    # last cycles ask for fewer so as not to pass max_new_tokens). A tree's k bounds its depth.
    k: int
    drafted: list[int]              # tokens the drafter proposed (may be fewer than k)
    num_accepted: int               # length of the accepted prefix of `drafted`
    emitted: list[int]              # tokens this cycle appends to the output, in order
    correction: int | None          # the target's own token after the accepted prefix
    correction_kind: str | None     # RESAMPLED (after a rejection) or BONUS (all accepted)
    correction_prob: float | None   # probability of `correction` in the distribution it came from
    draft_probs: list[float]        # draft probability of each drafted token (1.0 for one-hot drafters)
    target_probs: list[float]       # target probability of each drafted token
    uniforms: list[float]           # uniform draws consulted (sampling only; one per verified token)
    residual_top: list[tuple[int, float]]  # top of the residual distribution after a rejection
    greedy: bool                    # greedy verification (argmax match) instead of sampling
    draft_seconds: float            # drafting time, device-synchronised
    verify_seconds: float           # target pass plus acceptance, device-synchronised
    # Greedy and invariant sampling: the target's own token at each verified position.
    target_top: list[int] = field(default_factory=list)
    # Drafter-invariant sampling (core.sampling): a drafted token was accepted iff it equals the target's
    # own token there (`target_top`: its race's winner under the position's noise); no uniforms, no residual.
    invariant: bool = False
    # A token tree (core.trees): `drafted` holds its nodes, `parents` each node's parent (-1: a
    # child of the last token), `path` the accepted nodes from the root. None for a chain.
    parents: list[int] | None = None
    path: list[int] | None = None
    node_verdicts: list[str] | None = None   # per node: ACCEPTED, REJECTED or NOT_REACHED
    # Per drafted token: proposed only by earlier requests' text (suffix decoding's memory of this
    # session or command); None when the drafter does not say.
    from_earlier: list[bool] | None = None
    # Drafting across tokenizers (core.cross_tokenizer); None for a draft in the target's tokens.
    # `draft_pieces`: the draft model's own tokens this cycle, as text, in order (what it wrote
    # before the text was re-tokenized into `drafted`); `cut_text`: the end of that text left out
    # of `drafted` (the last target token the alignment cut, which may be the start of a longer
    # one, and whatever followed); `shared_mass`: sampling with token-level intersection only, per
    # draft token the share of the draft's probability inside the vocabulary both models share.
    draft_pieces: list[str] | None = None
    cut_text: str | None = None
    shared_mass: list[float] | None = None
    # The cost-aware policy (core.draft_policy); None without it. `planned`: the draft length it chose
    # (0: a plain step, speculation paused); `expected_gain`: its expected tokens per plain step's time
    # of the best draft length (below 1: drafting would not pay, so it paused); `probe`: drafted to
    # learn whether drafting pays again, not because it was expected to.
    planned: int | None = None
    expected_gain: float | None = None
    probe: bool = False
    # A hybrid drafter (core.hybrid, `--draft auto`): the component that wrote this cycle's draft (its
    # name: "ngram", "suffix", "head", "self:L" or a draft model's; None: nothing drafted, or one
    # drafter only), and what the policy compared to choose it: each component's offer as
    # {"drafter", "length", "expected_tokens", "gain"} (empty without a hybrid).
    drafter: str | None = None
    offers: list[dict] = field(default_factory=list)
    # A hybrid's tree that held two drafters' branches, verified in one pass: per node (of `drafted`),
    # the drafter that wrote it (a node both wrote: `drafter`'s, the drafter that was expected to pay
    # most alone); None when one drafter wrote the whole draft.
    drafted_by: list[str] | None = None

    def node_drafters(self) -> list[str | None]:
        """Per drafted token, the drafter that wrote it (None: not a hybrid run)."""
        return list(self.drafted_by) if self.drafted_by is not None else [self.drafter] * len(self.drafted)

    @property
    def is_cross_tokenizer(self) -> bool:
        return self.draft_pieces is not None

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @property
    def accepted_nodes(self) -> list[int]:
        """Indices into `drafted` of the accepted tokens, in order (a chain's accepted prefix)."""
        return list(self.path) if self.is_tree else list(range(self.num_accepted))

    @property
    def verdicts(self) -> list[str]:
        """Per drafted token: accepted or rejected (a chain: the accepted prefix, then the rest);
        a tree's nodes may also be NOT_REACHED."""
        if self.node_verdicts is not None:
            return list(self.node_verdicts)
        return [ACCEPTED] * self.num_accepted + [REJECTED] * (len(self.drafted) - self.num_accepted)

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds

    def to_dict(self) -> dict:
        record = asdict(self)
        record["verdicts"] = self.verdicts
        record["residual_top"] = [list(pair) for pair in self.residual_top]
        return record


def drafter_counts(cycles: Sequence[Cycle]) -> dict[str, dict] | None:
    """A hybrid run's drafts by the drafter that wrote them, in vLLM's counts (num_drafts,
    num_draft_tokens, num_accepted_tokens, and accepted per position): they sum to the run's. None for
    a run of one drafter."""
    if not any(c.drafter is not None for c in cycles):
        return None
    counts: dict[str, dict] = {}
    for c in cycles:
        if c.drafter is None or not c.drafted:
            continue
        # A tree of two drafters' branches is a draft of each: its nodes and its accepted path's by writer.
        writers = c.node_drafters()
        accepted = [writers[node] for node in c.accepted_nodes]
        for name in dict.fromkeys(writers):
            n = counts.setdefault(str(name), dict(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
                                                  accepted_per_position=[]))
            n["num_drafts"] += 1
            n["num_draft_tokens"] += writers.count(name)
            n["num_accepted_tokens"] += accepted.count(name)
            positions = n["accepted_per_position"]      # [i]: its drafts that accepted position i (a tree: depth)
            depths = [i for i, writer in enumerate(accepted) if writer == name]
            positions += [0] * (len(accepted) - len(positions))
            for i in depths:
                positions[i] += 1
    return counts


@dataclass(frozen=True)
class Step:
    """One step of plain autoregressive decoding: one target forward, one token."""

    index: int
    token: int
    prob: float                     # probability of `token` under the (warped) target distribution
    seconds: float                  # forward plus sampling, device-synchronised


@dataclass(frozen=True)
class Followed:
    """Plain decoding's one-token steps along another method's greedy text, from `start` (where the two
    outputs parted) on (`core.plain.follow`): step i reads that text's tokens before position i, as plain
    decoding's step i reads its own, and costs what it costs (a step's work does not depend on which token
    it reads). Each `steps[j].token` is the followed text's token at `start + j`. Where plain decoding's own
    argmax there was another token within a near-tie of it (`near_ties`: position, logit margin), the step
    still counts; at the first position where it was more than a near-tie away (`stopped_at`) the steps stop."""

    start: int
    steps: tuple[Step, ...]
    near_ties: tuple[tuple[int, float], ...] = ()
    stopped_at: int | None = None


# ----------------------------------------------------------------------------- batches

@dataclass(frozen=True)
class BatchCycle:
    """One target pass of speculative decoding over a batch: every live request's cycle. A request's
    `Cycle` is what it gets decoded alone, except that its draft and verify seconds are the whole
    batch's (it waited for all of it). A single request's run is a batch of one."""

    index: int
    requests: list[int]             # the live requests (their places among the prompts), in row order
    cycles: list[Cycle]             # one per live request, in the order of `requests`
    draft_seconds: float
    verify_seconds: float
    tokens: int                     # real tokens the target pass computed: every request's pending + drafted
    slots: int                      # key slots of the pass: rows x (cached + new) columns
    padded_slots: int               # of those, padding and holes (what the ragged layout wastes)
    regathered: bool                # a cache was re-gathered after this pass

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.verify_seconds

    @property
    def emitted(self) -> int:
        return sum(len(c.emitted) for c in self.cycles)

    @property
    def drafted(self) -> int:
        return sum(len(c.drafted) for c in self.cycles)


@dataclass(frozen=True)
class BatchStep:
    """One target forward of plain decoding over a batch: one token for every live request."""

    index: int
    requests: list[int]             # the live requests (their places among the prompts), in row order
    tokens: list[int]               # one per live request
    probs: list[float]              # each token's probability under its request's (warped) distribution
    seconds: float
    slots: int
    padded_slots: int

    @property
    def emitted(self) -> int:
        return len(self.tokens)


def row_outputs(events: Iterable[BatchCycle | BatchStep]) -> dict[int, list[int]]:
    """Each request's output (by its place among the prompts) from batch events, cycles or steps."""
    out: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, BatchCycle):
            for request, cycle in zip(event.requests, event.cycles):
                out.setdefault(request, []).extend(cycle.emitted)
        else:
            for request, token in zip(event.requests, event.tokens):
                out.setdefault(request, []).append(token)
    return out


def interleave(spec: Iterator[Cycle], plain: Iterator[Step] | None) -> Iterator[Cycle | Step]:
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
