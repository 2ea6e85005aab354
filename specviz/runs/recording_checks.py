"""What a recording may hold, checked at load before any view is built: text that is Unicode, a
cost (runs, events, drafted tokens, a cross-tokenizer draft's own tokens, characters) within caps
no real run reaches, and each cycle's invariants, so that a damaged or hostile file fails here
rather than inside a view, a chart that allocates by a forged k, or a replay that waits forever."""

from __future__ import annotations

import json
import math

from ..core.events import ACCEPTED, BONUS, NOT_REACHED, REJECTED, RESAMPLED, Cycle
from ..core.tree_shape import check_tree
from ..errors import SpecvizError
from ..settings import LOCAL, MAX_BRANCH
from .result import CycleText

# What showing a recording costs grows with these; each cap is above anything a real run writes.
MAX_EVENT_SECONDS = 600.0          # one cycle or step: ten minutes, a long prompt's prefill on a CPU included
MAX_NODES = LOCAL.max_k * MAX_BRANCH    # 512: a cycle's drafted tokens (a tree at its largest budget) and its k
MAX_DRAFTED = LOCAL.max_new_tokens * LOCAL.max_k   # 262,144 drafted tokens in a file: 4,096 cycles of k = 64
MAX_RUNS = 64                      # runs in a file: a comparison's configurations (the Compare tab runs 4)
MAX_EVENTS = 2 ** 17               # 131,072 cycles and steps in a file (a run has at most 2 x 4,096)
MAX_TEXT_CHARS = 2 ** 22           # 4,194,304 characters of prompts and token texts in a file
MAX_RESIDUAL_TOP = 10              # tokens kept of a residual distribution (core.sampling.top_tokens)
# Drafting across tokenizers: the draft model's own tokens (as text) each cycle. Its drafter runs at
# most 4 of them per target token proposed, k + 1 at most (core.cross_tokenizer); twice that is read.
PIECES_PER_CANDIDATE = 8           # a cycle holds at most this many pieces per candidate (k + 1)
# 2,097,152 pieces in a file (a real run at k = 64 runs at most 1,064,960)
MAX_PIECES = PIECES_PER_CANDIDATE * MAX_DRAFTED
MAX_PIECE_CHARS = 1024             # one piece's text, and the text a cycle's alignment cut (a token or two)
MAX_NOTE_CHARS = 1000              # a run's note (models.pairs: one line, such as the cross-tokenizer note)


def check_text(record: dict, name: str) -> None:
    """Refuse text that is not Unicode: JSON can spell a lone surrogate ("\\udc80"), which no page,
    terminal or file can encode. Refused rather than replaced: the file is damaged, and a token's
    text changed silently would misreport what the model wrote."""
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        try:
            where = first_unencodable(record)
        except RecursionError:
            where = "a deeply nested value"
        raise SpecvizError(f"{name} holds text that is not valid Unicode (a lone surrogate such as \\udc80, "
                           f"in {where}): it cannot be shown or saved. Record the run again, or correct "
                           "that text.") from None


def first_unencodable(value, where: str = "the file") -> str:
    """Where the first string that UTF-8 cannot encode sits (only called once one is known to)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return ""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and first_unencodable(key):
            return f"a key of {where}"
        found = first_unencodable(item, f"{where} \u2192 {key}" if where != "the file" else str(key))
        if found:
            return found
    return ""


def check_cost(runs: list, name: str) -> None:
    """The file-wide caps, counted on the parsed JSON before any run is validated or shown."""
    def sized(value) -> int:
        return len(value) if isinstance(value, (list, str)) else 0

    records = [r for r in runs if isinstance(r, dict)]
    cycles = [c for r in records if isinstance(r.get("cycles"), list) for c in r["cycles"] if isinstance(c, dict)]
    steps = [s for r in records if isinstance(r.get("steps"), list) for s in r["steps"] if isinstance(s, dict)]
    events = sum(sized(r.get("cycles")) + sized(r.get("steps")) for r in records)
    drafted = sum(sized(c.get("drafted")) for c in cycles)
    pieces = sum(sized(c.get("draft_pieces")) for c in cycles)
    characters = (sum(sized(r.get("prompt")) + sized(r.get("note")) for r in records)
                  + sum(sized(s.get("text")) for s in steps)
                  + sum(sized(c.get("correction_text")) + sized(c.get("cut_text")) for c in cycles)
                  + sum(sized(t) for c in cycles for name in ("drafted_text", "draft_pieces")
                        if isinstance(c.get(name), list) for t in c[name]))
    # Each cycle writes a token or more, each step one: no run has more of either than the most new
    # tokens a run may write (checked against its own max new tokens once its settings are read).
    longest = max(max(sized(r.get("cycles")), sized(r.get("steps"))) for r in records) if records else 0
    for count, cap, what in ((len(runs), MAX_RUNS, "runs"), (events, MAX_EVENTS, "cycles and plain steps"),
                             (longest, LOCAL.max_new_tokens, "cycles (or plain steps) in one run"),
                             (drafted, MAX_DRAFTED, "drafted tokens"),
                             (pieces, MAX_PIECES, "draft model tokens (drafted across tokenizers)"),
                             (characters, MAX_TEXT_CHARS, "characters of prompt and token text")):
        if count > cap:
            raise SpecvizError(f"{name} holds {count:,} {what}; at most {cap:,} are read (more than any run "
                               f"within specviz's limits writes). Record a shorter run.")


def check_time(seconds: float, where: str) -> None:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{where}: a time that is negative or not finite")
    if seconds > MAX_EVENT_SECONDS:
        raise ValueError(f"{where} claims {seconds:.3g} s; one cycle or step takes at most {MAX_EVENT_SECONDS:g} s")


def check_cycle(cycle: Cycle, text: CycleText, number: int) -> None:
    """The invariants the views rely on: a damaged file must fail here, not inside a view (or make
    a chart allocate by a k of a billion, or a replay wait forever)."""
    n = len(cycle.drafted)
    where = f"cycle {number}"
    if cycle.index != number:
        raise ValueError(f"{where} has another cycle's index")
    if n > MAX_NODES or not 0 <= cycle.k <= MAX_NODES:
        raise ValueError(f"{where}: more than {MAX_NODES} drafted tokens")
    check_time(cycle.draft_seconds, where)
    check_time(cycle.verify_seconds, where)
    check_time(cycle.seconds, where)
    if not 0 <= cycle.num_accepted <= n or len(text.drafted) != n or not cycle.emitted:
        raise ValueError(f"{where}: its counts do not add up")
    # What the decoding loop records per cycle is bounded by its drafted tokens: one uniform per
    # token tested, one target argmax per position verified, the residual's top ten.
    if (len(cycle.uniforms) > n or len(cycle.target_top) > n + 1 or len(cycle.residual_top) > MAX_RESIDUAL_TOP):
        raise ValueError(f"{where}: more draws, argmaxes or residual tokens than it verified")
    if len(cycle.draft_probs) != n or len(cycle.target_probs) != n:
        raise ValueError(f"{where}: one probability per drafted token expected")
    if cycle.correction_kind not in (RESAMPLED, BONUS, None) or (cycle.correction is None) != (
            cycle.correction_kind is None):
        raise ValueError(f"{where}: its correction is of no known kind")
    if cycle.from_earlier is not None and len(cycle.from_earlier) != n:
        raise ValueError(f"{where}: one 'from earlier' mark per drafted token expected")
    check_across_tokenizers(cycle, where)
    check_hybrid(cycle, where)
    if cycle.is_tree:
        try:
            if len(cycle.parents) != n:
                raise ValueError
            check_tree(cycle.parents)
        except ValueError:
            raise ValueError(f"{where}: its tree's parents are invalid") from None
        # The path runs down from the root, one node per accepted token.
        path = cycle.path
        if (path is None or len(path) != cycle.num_accepted or any(not 0 <= node < n for node in path)
                or any(cycle.parents[node] != parent for node, parent in zip(path, [-1, *path]))):
            raise ValueError(f"{where}: its tree's path is invalid")
        # Verification tries the children of the root and of accepted nodes only: a node elsewhere
        # is never rejected (the views describe each rejected branch once, so they cost its size).
        on_path = set(path)
        tried = {-1, *path}
        if (cycle.node_verdicts is None or len(cycle.node_verdicts) != n
                or not set(cycle.node_verdicts) <= VERDICT_NAMES
                or any((verdict == ACCEPTED) != (node in on_path)
                       or (verdict == REJECTED and cycle.parents[node] not in tried)
                       for node, verdict in enumerate(cycle.node_verdicts))):
            raise ValueError(f"{where}: one known verdict per node expected, rejected only where "
                             "verification tried it")
    elif cycle.path is not None or cycle.node_verdicts is not None:
        raise ValueError(f"{where}: a chain with a tree's path or verdicts")
    expected = [cycle.drafted[i] for i in cycle.accepted_nodes]
    expected += [cycle.correction] if cycle.correction is not None else []
    if list(cycle.emitted) != expected or (cycle.correction is None) != (text.correction is None):
        raise ValueError(f"{where}: its emitted tokens do not match its verdicts")

VERDICT_NAMES = {ACCEPTED, REJECTED, NOT_REACHED}
MAX_OFFERS = 8                     # a hybrid's drafters compared in a cycle (it has at most four kinds)
OFFER_KEYS = {"drafter", "length", "expected_tokens", "gain"}
MERGED_OFFER_KEYS = OFFER_KEYS | {"with"}     # a tree of two drafters' branches: the second drafter
COMPARED_OFFER_KEYS = OFFER_KEYS | {"versus"}  # a copy compared with the preferred one (core.copy_record)
BOTH_OFFER_KEYS = MERGED_OFFER_KEYS | {"added"}   # one tree of both copies: what the others' nodes added
ADDED_KEYS = {"cycles", "tokens"}
VERSUS_KEYS = {"preferred", "cycles", "ahead", "clearly"}


def valid_versus(versus) -> bool:
    """A copy's comparison with the preferred one (core.copy_record.CopyRecord.versus): the preferred
    drafter's name, the cycles compared, the mean difference, whether it is clearly ahead."""
    return (isinstance(versus, dict) and set(versus) == VERSUS_KEYS
            and isinstance(versus["preferred"], str) and len(versus["preferred"]) <= MAX_NOTE_CHARS
            and isinstance(versus["cycles"], int) and 0 <= versus["cycles"] <= MAX_EVENTS
            and isinstance(versus["ahead"], (int, float)) and math.isfinite(versus["ahead"])
            and isinstance(versus["clearly"], bool))


def valid_added(added) -> bool:
    """What the other copies' nodes in a tree of both added (core.copy_record.CopyRecord.tokens_added):
    the cycles they held nodes the preferred copy's draft did not, the tokens they are expected to add."""
    return (isinstance(added, dict) and set(added) == ADDED_KEYS
            and isinstance(added["cycles"], int) and 0 <= added["cycles"] <= MAX_EVENTS
            and isinstance(added["tokens"], (int, float)) and math.isfinite(added["tokens"]) and added["tokens"] >= 0)


def check_hybrid(cycle: Cycle, where: str) -> None:
    """A hybrid cycle's drafter (a name) and the offers it was chosen from (each a drafter's planned
    length, expected tokens and gain)."""
    if cycle.drafter is not None and len(cycle.drafter) > MAX_NOTE_CHARS:
        raise ValueError(f"{where}: its drafter's name is too long")
    if len(cycle.offers) > MAX_OFFERS:
        raise ValueError(f"{where}: more than {MAX_OFFERS} drafters' offers")
    if cycle.drafted_by is not None and (
            cycle.drafter is None or len(cycle.drafted_by) != len(cycle.drafted)
            or not all(isinstance(name, str) and len(name) <= MAX_NOTE_CHARS for name in cycle.drafted_by)):
        raise ValueError(f"{where}: its drafters per token are not one name per drafted token")
    for offer in cycle.offers:
        if "versus" in offer and not valid_versus(offer["versus"]):
            raise ValueError(f"{where}: an offer's comparison with the preferred copy is not one")
        if "added" in offer and not valid_added(offer["added"]):
            raise ValueError(f"{where}: a tree of both copies' record of what the others added is not one")
        if (set(offer) not in (OFFER_KEYS, MERGED_OFFER_KEYS, COMPARED_OFFER_KEYS, BOTH_OFFER_KEYS)
                or not all(isinstance(offer.get(key, ""), str) and len(offer.get(key, "")) <= MAX_NOTE_CHARS
                           for key in ("drafter", "with"))
                or not isinstance(offer["length"], int) or not 0 <= offer["length"] <= MAX_NODES
                or not all(isinstance(offer[key], (int, float)) and math.isfinite(offer[key]) and offer[key] >= 0
                           for key in ("expected_tokens", "gain"))):
            raise ValueError(f"{where}: an offer is not a drafter's length, expected tokens and gain")


def check_across_tokenizers(cycle: Cycle, where: str) -> None:
    """A cross-tokenizer cycle's own fields: the draft model's tokens (as many as its drafter could
    have run for this k, each a token's text), the cut text, and one shared-vocabulary share per
    draft token; a cycle drafted in the target's tokens has none of them."""
    pieces = cycle.draft_pieces
    if pieces is None:
        if cycle.cut_text is not None or cycle.shared_mass is not None:
            raise ValueError(f"{where}: a cut or shared-vocabulary share without the draft model's tokens")
        return
    if len(pieces) > PIECES_PER_CANDIDATE * (cycle.k + 1):
        raise ValueError(f"{where}: {len(pieces):,} draft model tokens for k = {cycle.k}; at most "
                         f"{PIECES_PER_CANDIDATE} per target token (k + 1) are read")
    if any(len(piece) > MAX_PIECE_CHARS for piece in pieces) or len(cycle.cut_text or "") > MAX_PIECE_CHARS:
        raise ValueError(f"{where}: a draft model token or its cut text longer than {MAX_PIECE_CHARS:,} characters")
    if cycle.shared_mass is not None and (len(cycle.shared_mass) != len(pieces)
                                          or not all(0.0 <= mass <= 1.0 for mass in cycle.shared_mass)):
        raise ValueError(f"{where}: one shared-vocabulary share (between 0 and 1) per draft model token expected")
