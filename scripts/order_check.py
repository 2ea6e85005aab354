"""Does a run's figure depend on which configuration ran before it in the same process? (issue 50)

In one Python process, as the app and Compare run: prompt lookup on a summarisation prompt, fresh;
then a model drafter (early exit by default) on the same target; then prompt lookup again. Prints
what prompt lookup drafted and its speedup each time, and the ratio of the second to the first
(drafted tokens should stay >= 80% of the fresh run's and the speedup >= 0.85x of it). Then Compare
on the same prompt with the two drafters in both orders: each row's speedup in each order, with
its 95% interval.

    python scripts/order_check.py                       # built-in model, fp32 (auto), one thread
    python scripts/order_check.py --other self:24 --k 8 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import load_bench_prompts  # noqa: E402 - after the sys.path insert
from specviz.runs.compare import compare  # noqa: E402
from specviz.runs.run import execute, load  # noqa: E402
from specviz.settings import RunSettings, validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="target model (default: the built-in one)")
    parser.add_argument("--other", default="self:24", help="the drafter run in between (default self:24)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--prompt-index", type=int, default=0, help="which bundled summarisation prompt")
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()

    prompt = load_bench_prompts(categories=["summarisation"])[args.prompt_index].prompt
    common = dict(k=args.k, max_new_tokens=args.max_new_tokens)
    if args.target:
        common["target"] = args.target
    lookup = validate(RunSettings(draft="ngram", **common))
    other = validate(RunSettings(draft=args.other, **common))

    def race(settings):
        run = execute(settings, prompt, load(settings), baseline=True)
        return {"draft": run.draft_name, "drafted": run.stats.drafted, "accepted": run.stats.accepted,
                "speedup": run.speedup, "low": run.speed.low, "high": run.speed.high,
                "calibration_seconds": run.calibration_seconds, "clock": run.clock, "dtype": run.dtype}

    fresh = race(lookup)
    between = race(other)
    after = race(lookup)
    report = {"fresh": fresh, "between": between, "after": after,
              "drafted_ratio": after["drafted"] / max(fresh["drafted"], 1),
              "speedup_ratio": after["speedup"] / fresh["speedup"]}
    for name in ("fresh", "between", "after"):
        r = report[name]
        print(f"{name:8} {r['draft']:28} drafted {r['drafted']:4}  accepted {r['accepted']:4}  "
              f"{r['speedup']:.2f}x ({r['low']:.2f}-{r['high']:.2f}, {r['clock']}, {r['dtype']})  "
              f"calibration {r['calibration_seconds']:.2f} s")
    print(f"prompt lookup after {args.other}: drafted {report['drafted_ratio']:.0%} of fresh, "
          f"speedup {report['speedup_ratio']:.2f}x of fresh")

    orders = {}
    for name, configs in (("lookup first", [lookup, other]), ("lookup second", [other, lookup])):
        comparison = compare(configs, prompt)
        orders[name] = {label: (run.speedup, run.speed.low, run.speed.high)
                        for label, run in zip(comparison.labels, comparison.results)}
        print(f"compare, {name}: " + "; ".join(f"{label} {s:.2f}x ({lo:.2f}-{hi:.2f})"
                                               for label, (s, lo, hi) in orders[name].items()))
    report["compare"] = orders
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
