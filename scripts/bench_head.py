"""Benchmark a trained draft head against plain decoding and prompt lookup on chat prompts outside its
training set (the benchmark's 'chat' category and the chat examples), greedy, batch 1, one torch thread
(events timed by the thread's own CPU time, so other processes do not inflate them), per dtype:

    HF_HUB_OFFLINE=1 python scripts/bench_head.py [--head head | head:DIR] [--dtype bfloat16,float32]
                                                  [--k 2,3,4] [--trees 2x8:3] [--max-new-tokens 64] [--json FILE]

Per method: the median over prompts of its speedup over plain decoding (plain's seconds per token over
its own), its acceptance (accepted / drafted tokens; for a tree, accepted / drafted nodes, which counts
the siblings that lost), tokens per target pass, and the draft's cost per drafted token as a share of a
plain step. A tree BxN:D is the head's EAGLE-2 tree: top-B children, N nodes, depth D. In fp32 it also
checks that every greedy output equals plain decoding's (bf16 argmax may flip at near-ties between
one-token and multi-token forwards)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specviz.catalog import load_examples, prompt_set  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.core.head import HeadTreeDrafter  # noqa: E402
from specviz.core.plain import autoregressive_decode  # noqa: E402
from specviz.models.host import host_description  # noqa: E402
from specviz.models.pairs import make_drafter  # noqa: E402
from specviz.runs.run import encode, load  # noqa: E402
from specviz.settings import LOCAL, RunSettings, parse_draft, validate  # noqa: E402


def chat_prompts() -> list[str]:
    prompts = [p.prompt for p in prompt_set("chat")]
    prompts += [e["prompt"] for e in load_examples()
                if e["category"].split("/")[0] == "chat" and e["prompt"] not in prompts]
    return prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default="head")
    parser.add_argument("--dtype", default="bfloat16,float32")
    parser.add_argument("--k", default="2,3,4")
    parser.add_argument("--trees", default="2x8:3", help="head trees BRANCHxNODES:DEPTH, comma-separated ('' none)")
    parser.add_argument("--ngram-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = chat_prompts()[: args.limit or None]
    ks = [int(k) for k in args.k.split(",")]
    report = {"host": host_description("cpu"), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "dtypes": {}}
    for dtype in args.dtype.split(","):
        settings = validate(RunSettings(draft=args.head, dtype=dtype, max_new_tokens=args.max_new_tokens), LOCAL)
        pair = load(settings)
        head = pair.draft
        ngram = make_drafter(parse_draft("ngram"), pair.target)
        methods = {f"head k={k}": (head, k) for k in ks}
        for tree in filter(None, args.trees.split(",")):
            shape, depth = tree.split(":")
            branch, nodes = (int(n) for n in shape.split("x"))
            methods[f"head tree {branch}x{nodes} depth {depth}"] = (HeadTreeDrafter(head, branch, nodes), int(depth))
        methods[f"ngram k={args.ngram_k}"] = (ngram, args.ngram_k)
        rows = {name: [] for name in methods}
        identical = {name: True for name in methods}
        step_costs = []
        for number, prompt in enumerate(prompts):
            ids = encode(settings, prompt, pair)
            for _ in range(1):  # warm-up on the first prompt only
                if number == 0:
                    list(autoregressive_decode(pair.target, ids, 8, eos_token_id=pair.eos_token_ids))
            steps = list(autoregressive_decode(pair.target, ids, args.max_new_tokens, eos_token_id=pair.eos_token_ids))
            plain_tokens = [s.token for s in steps]
            plain_seconds = sum(s.seconds for s in steps[1:])          # the prefill is left out of both
            step_costs.append(statistics.median(s.seconds for s in steps[1:]))
            for name, (drafter, k) in methods.items():
                cycles = list(speculative_decode(pair.target, drafter, ids, args.max_new_tokens, k=k,
                                                 eos_token_id=pair.eos_token_ids))
                tokens = [t for c in cycles for t in c.emitted]
                rest = cycles[1:]                                        # the first pass holds the prefill
                seconds = sum(c.draft_seconds + c.verify_seconds for c in rest)
                drafted = sum(len(c.drafted) for c in rest)
                accepted = sum(c.num_accepted for c in rest)
                draft_seconds = sum(c.draft_seconds for c in rest)
                speedup = (plain_seconds / max(len(plain_tokens) - 1, 1)) / (seconds / max(len(tokens) - 1, 1))
                identical[name] &= tokens == plain_tokens
                rows[name].append(dict(speedup=speedup, drafted=drafted, accepted=accepted, passes=len(rest),
                                       emitted=len(tokens) - 1, draft_seconds=draft_seconds))
            print(f"{dtype} prompt {number + 1}/{len(prompts)}: " + ", ".join(
                f"{name} {rows[name][-1]['speedup']:.2f}x" for name in methods), file=sys.stderr, flush=True)
        step = statistics.median(step_costs)
        summary = {}
        for name, items in rows.items():
            drafted = sum(r["drafted"] for r in items)
            summary[name] = dict(
                median_speedup=round(statistics.median(r["speedup"] for r in items), 3),
                speedups=[round(r["speedup"], 3) for r in items],
                acceptance=round(sum(r["accepted"] for r in items) / max(drafted, 1), 3),
                tokens_per_pass=round(sum(r["emitted"] for r in items) / max(sum(r["passes"] for r in items), 1), 3),
                draft_cost_per_token_in_steps=round(sum(r["draft_seconds"] for r in items) / max(drafted, 1) / step, 4),
                identical_to_plain=identical[name])
        report["dtypes"][dtype] = {"plain_step_seconds": round(step, 4), "methods": summary}
        for name, s in summary.items():
            print(f"{dtype} {name}: median {s['median_speedup']:.2f}x, acceptance {s['acceptance']:.1%}, "
                  f"{s['tokens_per_pass']:.2f} tokens/pass, draft {s['draft_cost_per_token_in_steps']:.3f} step/token, "
                  f"identical to plain: {s['identical_to_plain']}")
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    report["load_average"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
