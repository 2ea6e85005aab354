"""Do two races at once keep their figures? The Run tab's default race (the built-in model, prompt lookup
k = 8, the default example, 128 new tokens, greedy, one torch thread timed by its thread CPU time) run
alone ROUNDS times and two at once ROUNDS times, in alternation (alone, pair, alone, ...), each race in
a forked process of its own as the app runs them on a CPU (`runs.race_worker`; `--in-process`: on
threads of this process instead). Prints each race's speedup with its 95% interval, its wall time,
and whether every race of a pair lies within the alone races' intervals; and the wall time a pair
takes against two alone races in turn (what serving two visitors at once gains).

    python scripts/two_at_once.py              # 5 rounds each way
    python scripts/two_at_once.py --rounds 3

On a busy host every figure moves: run it on a quiet one for the decision (docs/spaces.md)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--in-process", action="store_true", help="race on threads of this process, not forked")
    args = parser.parse_args()

    from specviz.catalog import load_examples
    from specviz.runs import execute, last
    from specviz.runs.race_worker import can_fork, forked_race
    from specviz.runs.run import load
    from specviz.settings import RunSettings
    from specviz.ui import configure_torch
    from specviz.ui.run_tab import default_example

    print(configure_torch())                     # one torch thread, as the app
    examples = load_examples()
    example = examples[default_example(examples)]
    settings = RunSettings(draft="ngram", k=8, max_new_tokens=args.max_new_tokens, chat=example["chat"])
    pair = load(settings)
    forked = can_fork(pair) and not args.in_process
    print("each race in a forked process of its own" if forked else "races on threads of this process")

    def race() -> tuple:
        began = time.monotonic()
        run = (last(forked_race(settings, example["prompt"], pair, baseline=True)) if forked
               else execute(settings, example["prompt"], pair, baseline=True))
        return run.speed.speedup, run.speed.low, run.speed.high, time.monotonic() - began

    race()                                       # warm-up
    alone, together, pair_walls = [], [], []
    for round_ in range(1, args.rounds + 1):
        alone.append(race())
        results = [None, None]
        threads = [threading.Thread(target=lambda i=i, into=results: into.__setitem__(i, race())) for i in range(2)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pair_walls.append(time.monotonic() - began)
        together += results
        print(f"round {round_}: alone {alone[-1][0]:.2f}x [{alone[-1][1]:.2f}, {alone[-1][2]:.2f}] in "
              f"{alone[-1][3]:.1f} s; two at once " + ", ".join(f"{s:.2f}x [{lo:.2f}, {hi:.2f}] in {w:.1f} s"
                                                             for s, lo, hi, w in results), flush=True)
    low, high = min(r[1] for r in alone), max(r[2] for r in alone)
    inside = sum(low <= r[0] <= high for r in together)
    within_each = sum(any(a[1] <= r[0] <= a[2] for a in alone) for r in together)
    print(f"alone: speedup median {statistics.median(r[0] for r in alone):.2f}x, its intervals span "
          f"[{low:.2f}, {high:.2f}], wall median {statistics.median(r[3] for r in alone):.1f} s")
    print(f"two at once: speedup median {statistics.median(r[0] for r in together):.2f}x, "
          f"{inside} of {len(together)} within the alone intervals' span, {within_each} within at least one "
          f"alone race's interval; wall per race median {statistics.median(r[3] for r in together):.1f} s")
    print(f"a pair took {statistics.median(pair_walls):.1f} s (median) against "
          f"{2 * statistics.median(r[3] for r in alone):.1f} s for two alone races in turn "
          f"({2 * statistics.median(r[3] for r in alone) / statistics.median(pair_walls):.2f}x the throughput)")


if __name__ == "__main__":
    main()
