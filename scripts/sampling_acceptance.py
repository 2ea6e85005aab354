"""What each sampling algorithm costs in acceptance, per drafter: on the bundled example prompts
(`specviz.catalog.load_examples`), sampled (temperature 0.7, one seed), a fixed draft length k, every
drafter run with drafter-invariant sampling and with classic rejection sampling, on the built-in
model in fp32:

    HF_HUB_OFFLINE=1 python scripts/sampling_acceptance.py [--draft ngram --draft head ...] [--k 4]

prints per drafter and algorithm the draft acceptance rate (accepted / drafted) and the mean
acceptance length (1 + accepted / drafts, vLLM's), pooled over the prompts, and whether every
invariant run wrote exactly plain sampling's text with the same seed. Acceptance is a count, not a
time: a busy host does not change it.

Expected (core.sampling): one-hot drafts (prompt lookup, suffix, n-gram trees) accept the same in
distribution under both; a model's drafts accept at least (1 - TV) / (1 + TV) under invariant
sampling against 1 - TV under classic (TV: the total variation distance between draft and target)."""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specviz.catalog import load_examples  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.core.plain import autoregressive_decode  # noqa: E402
from specviz.metrics import summarize  # noqa: E402
from specviz.models.host import host_description  # noqa: E402
from specviz.runs.run import drafter_for, encode, load  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402

# (label, draft spec, tree branch): prompt lookup, suffix decoding, early exit, the shipped EAGLE-3
# head, an n-gram tree and the head's EAGLE-2 tree.
DRAFTERS = [("ngram", "ngram", 1), ("suffix", "suffix", 1), ("self:25", "self:25", 1), ("head", "head", 1),
            ("ngram-tree", "ngram-tree", 1), ("head tree (top-2, 16 nodes)", "head", 2)]
RULES = ("invariant", "classic")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="append", default=None,
                        help="a draft spec (repeatable; default: the six of DRAFTERS), or the label of one of them")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="the first N example prompts only")
    args = parser.parse_args()
    known = {label: (label, draft, branch) for label, draft, branch in DRAFTERS}
    drafters = DRAFTERS if not args.draft else [known.get(d, (d, d, 1)) for d in args.draft]
    examples = load_examples()[:args.limit]
    print(f"{host_description('cpu')}; built-in SmolLM2-135M-Instruct, float32; {len(examples)} example prompts, "
          f"temperature {args.temperature:g}, seed {args.seed}, k = {args.k} every cycle, "
          f"{args.max_new_tokens} new tokens at most", flush=True)
    plain: dict[str, list[int]] = {}
    rows = []
    for label, draft, branch in drafters:
        settings = validate(RunSettings(draft=draft, k=args.k, fixed_k=True, temperature=args.temperature,
                                        seed=args.seed, max_new_tokens=args.max_new_tokens, dtype="float32",
                                        branch=branch), LOCAL)
        pair = load(settings)
        eos = list(pair.eos_token_ids or [])
        pooled = {rule: [] for rule in RULES}             # every prompt's cycles
        same = 0
        for example in examples:
            settings_here = settings if example["chat"] else validate(RunSettings(
                **{**settings.to_dict(), "chat": False}), LOCAL)
            ids = encode(settings_here, example["prompt"], pair)
            key = f"{example['chat']}:{example['prompt']}"
            if key not in plain:
                plain[key] = [s.token for s in autoregressive_decode(
                    pair.target, ids, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                    eos_token_id=eos)]
            for rule in RULES:
                drafter = drafter_for(settings, pair).without_memory()
                drafter.forget()
                cycles = list(speculative_decode(pair.target, drafter, ids, args.max_new_tokens, k=args.k,
                                                 temperature=args.temperature, seed=args.seed, eos_token_id=eos,
                                                 sampling=rule))
                pooled[rule] += cycles
                if rule == "invariant":
                    same += [t for c in cycles for t in c.emitted] == plain[key]
        row = [label]
        for rule in RULES:
            stats = summarize(pooled[rule])
            row += [stats.draft_acceptance_rate, stats.mean_acceptance_length]
        rows.append(row + [f"{same}/{len(examples)}"])
        if len(rows) == 1:
            print("| drafter | acceptance rate, invariant | classic | mean acceptance length, invariant | classic | "
                  "invariant text == plain sampling's |\n|---|---|---|---|---|---|")
        # Each drafter's row as soon as it is measured (a tree's rate: accepted / nodes).
        _, rate_i, length_i, rate_c, length_c, same = rows[-1]
        print(f"| {label} | {rate_i:.1%} | {rate_c:.1%} | {length_i:.2f} | {length_c:.2f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
