"""What one tree of both copies gave where `auto` drafted it (`python scripts/tree_of_both.py [--dtype
bfloat16]`): in every cycle where the hybrid drafted a tree of prompt lookup's and suffix decoding's
drafts (core.copy_record), the tree and suffix decoding's draft alone are scored against the text the
target wrote (greedy: the deeper match is what the tree's verification accepts), each at its plan's
length, as tokens per plain step's time over the pass its width costs (the process's calibrated
table, after the cycle's context). Prints, over those cycles: tokens per plain step's time of each,
the tokens each was expected to give and gave, and the nodes the tree added.

Runs the built-in `auto` on the bundled prompts (not Spec-Bench), k = 8, 96 new tokens, one thread."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import load_bench_prompts  # noqa: E402 - after the sys.path insert
from specviz.core import hybrid  # noqa: E402
from specviz.core.copy_record import Offered, union  # noqa: E402
from specviz.runs.run import last, load, race  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402

TREES: list[dict] = []      # per cycle that drafted a tree of both: where it stood, the offers, the costs


def _noting_copies(original):
    def copies(self, drafter, request, paying):
        kept, versus = original(self, drafter, request, paying)
        tree = next((o for o in kept if o.seen is not None), None)
        if tree is not None:
            free = {o.component.name: o for o in paying if o.draft is not None}
            other = next(name for name in free if name != drafter.prefer)
            TREES.append(dict(start=request.generated, preferred=free[drafter.prefer], other=free[other],
                              tree=tree, costs=self.costs, context=len(request.tokens)))
        return kept, versus
    return copies


def offered(offer, start: int) -> Offered:
    return Offered(offer.component.name, offer.draft.tokens.tolist(), hybrid.chain_or_tree(offer.draft),
                   offer.plan.length, start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--limit", type=int, default=3, help="prompts per category")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    hybrid.HybridPolicy.copies = _noting_copies(hybrid.HybridPolicy.copies)
    settings = validate(RunSettings(draft="auto", k=8, max_new_tokens=96, dtype=args.dtype), LOCAL)
    pair = load(settings)
    prompts = load_bench_prompts(categories="all", limit=args.limit)
    last(race(settings, prompts[0].prompt, pair))       # calibrated before any counted run
    total = Counter()
    for prompt in prompts:
        TREES.clear()
        run = last(race(settings, prompt.prompt, pair))
        output = [t for c in run.cycles for t in c.emitted]
        for cycle in TREES:
            alone, other = offered(cycle["preferred"], cycle["start"]), offered(cycle["other"], cycle["start"])
            matched, theirs = alone.matched(output), other.matched(output)
            if matched is None or theirs is None:
                continue
            nodes = len(union([alone, other]).tokens)
            cost = cycle["costs"].relative(nodes, cycle["context"])
            total["cycles"] += 1
            total["alone"] += (matched + 1) / cost[alone.width()]
            total["tree"] += (max(matched, theirs) + 1) / cost[nodes]
            total["alone expected"] += cycle["preferred"].plan.expected
            total["alone gave"] += matched + 1
            total["tree expected"] += cycle["tree"].plan.expected
            total["tree gave"] += max(matched, theirs) + 1
            total["nodes added"] += nodes - alone.width()
    n = total.pop("cycles", 0)
    print(f"{pair.target.dtype}: {n} cycles drafted a tree of both copies (of the bundled prompts, {len(prompts)})")
    for key, value in total.items():
        print(f"  {key}: {value / max(n, 1):.3f}")
    if n:
        print(f"  the tree against suffix decoding alone in those cycles: {total['tree'] / total['alone'] - 1:+.1%}")


if __name__ == "__main__":
    main()
