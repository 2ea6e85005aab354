"""How well `auto` chooses between its two copies (`python scripts/copy_choice.py`): in every cycle where
prompt lookup and suffix decoding both offered a draft that pays, each offer is scored against the
output the target wrote (fp32 greedy: exactly what verification would have accepted), at the length
its own plan chose, as tokens per pass-priced time (the process's calibrated table, after the cycle's
context). Prints, over those cycles: what the drafter `auto` chose gave, what each copy would have
given had it always been chosen, a tree of both, the better of the two every cycle (an oracle), and
each copy's expected tokens against what came true, where it was chosen and where not.

Runs `auto` less its head (`decision_quality.py --without-head`, the bundled prompts; any of its
options) with the policy's offers noted as they are made. The rule `auto` chooses by is the one in the
code (core.copy_record); `--by-gain` in decision_quality's options also runs the previous rule (by
expected gain) and notes its cycles too."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import decision_quality  # noqa: E402 - after the sys.path insert
from specviz.core import hybrid, tree_shape  # noqa: E402
from specviz.core.copy_record import Offered  # noqa: E402
from specviz.core.draft_policy import CostAwarePolicy  # noqa: E402

NOTED: list[dict] = []          # per hybrid cycle: the request, where it stood, the free offers, the choice
_offers: list[dict] = []


def _noting_plan_proposal(original):
    def plan_proposal(self, request, draft, plans):
        out = original(self, request, draft, plans)
        plan = plans.get(request.index)
        if draft.tokens.numel() and plan is not None and plan.length and getattr(self, "noted_as", None):
            _offers.append(dict(offer=Offered(self.noted_as, draft.tokens.tolist(), hybrid.chain_or_tree(draft),
                                              plan.length, request.generated), expected=plan.expected))
        return out
    return plan_proposal


def _noting_part(original):
    def part(self, component):
        policy = original(self, component)
        policy.noted_as = component.name
        return policy
    return part


def _noting_draft(original):
    def draft(self, drafter, live, plans):
        _offers.clear()
        context = len(live[0].tokens)      # the tokens before this cycle's pass
        out = original(self, drafter, live, plans)
        (request,) = live
        NOTED.append(dict(request=request, offers=list(_offers), chosen=plans[request.index].drafter,
                          costs=self.costs, context=context, config=drafter.prefer))
        return out
    return draft


def tree_of_both(a: Offered, b: Offered) -> int:
    """Nodes of one tree holding both offers (cut to their lengths) as a trie."""
    def paths(offer):
        depths = tree_shape.depths(offer.parents)
        out = set()
        for node in (i for i, d in enumerate(depths) if d <= offer.length):
            path = []
            while node >= 0:
                path.append(offer.tokens[node])
                node = offer.parents[node]
            out.add(tuple(path))
        return out
    return len(paths(a) | paths(b))


def main(argv=None) -> int:
    CostAwarePolicy.plan_proposal = _noting_plan_proposal(CostAwarePolicy.plan_proposal)
    hybrid.HybridPolicy.part = _noting_part(hybrid.HybridPolicy.part)
    hybrid.HybridPolicy.draft = _noting_draft(hybrid.HybridPolicy.draft)
    decision_quality.main(["--draft", "suffix", "--without-head", *(argv if argv is not None else sys.argv[1:])])
    sums: dict = defaultdict(lambda: defaultdict(float))
    for noted in NOTED:
        request, offers = noted["request"], noted["offers"]
        names = {o["offer"].name for o in offers}
        if len(offers) != 2 or names != {"ngram", "suffix"} or noted["chosen"] not in names:
            continue            # not both copies paying, or the head (or a tree with it) drafted instead
        output = request.tokens[len(request.tokens) - request.generated:]
        relative = noted["costs"].relative(64, noted["context"])
        given, reached = {}, {}
        for o in offers:
            offer = o["offer"]
            matched = reached[offer.name] = offer.matched(output)
            if matched is None:
                break
            given[offer.name] = (matched + 1) / relative[offer.width()]
            side = sums[(noted["config"], offer.name, "chosen" if offer.name == noted["chosen"] else "not chosen")]
            side["cycles"] += 1
            side["expected"] += o["expected"]
            side["came true"] += matched + 1
        if len(given) != 2:
            continue
        a, b = (o["offer"] for o in offers)
        both = sums[(noted["config"], "both paid", "")]
        both["cycles"] += 1
        both["auto's choice"] += given[noted["chosen"]]
        both["ngram always"] += given["ngram"]
        both["suffix always"] += given["suffix"]
        both["better each cycle"] += max(given.values())
        both["a tree of both"] += (max(reached.values()) + 1) / relative[tree_of_both(a, b)]
    for (config, name, side), figures in sorted(sums.items(), key=str):
        n = figures.pop("cycles")
        rule = f"prefer {config}" if config else "by expected gain"
        print(f"{rule}: {name} {side}: {int(n)} cycles, " + ", ".join(f"{k} {v / n:.3f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
