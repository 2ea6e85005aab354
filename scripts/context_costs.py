"""A verification pass's cost over a plain step, by width, at several context lengths
(`python scripts/context_costs.py [--dtypes float32,bfloat16] [--contexts 64,256,800,1600]`): how far the
cost-aware policy's table, calibrated once on a short prompt (core.pass_costs), is from what a pass costs
after a long one. Each context is calibrated as the policy's table is (`pass_costs.calibrate`: medians of
interleaved rounds, the collector paused), on the built-in model, one torch thread, timed by thread CPU
time. Prints per dtype and context: the plain step's milliseconds and each width's cost in plain steps."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.core.pass_costs import PassCosts, calibrate  # noqa: E402 - after the sys.path insert
from specviz.runs.run import load  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402

WIDTHS = [0, 1, 2, 3, 4, 6, 8, 12, 16]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated")
    parser.add_argument("--contexts", default="64,256,800,1600", help="prompt lengths in tokens, comma-separated")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    for dtype in args.dtypes.split(","):
        pair = load(validate(RunSettings(draft="ngram", dtype=dtype), LOCAL))
        for context in (int(c) for c in args.contexts.split(",")):
            prompt = list(range(1000, 1000 + context))       # any tokens: a pass's cost does not read them
            costs = PassCosts()
            calibrate(pair.target, prompt, WIDTHS, costs, time.thread_time)
            relative = costs.relative(max(WIDTHS))
            print(f"{dtype} after {context} tokens: a plain step {costs.step * 1000:.1f} ms; passes over "
                  + ", ".join(f"{w}: {relative[w]:.2f}" for w in WIDTHS[1:]), flush=True)


if __name__ == "__main__":
    main()
