"""The app's default race in each dtype: the Run tab's defaults (built-in model, prompt lookup, k 8, 128
new tokens, greedy) on its example prompts (`--prompts examples`, the first being the page's default,
"Fix the spelling"; or another shipped set). For each run: whether the speculative and plain outputs are identical, both
token counts, where they part, and the measured speedup with its 95% range over equal work (the
tokens both wrote: `equal_work.equal_work`). One torch thread, thread CPU time, through `runs.execute`
(the one run path the app and CLI use).

    python scripts/lossless_race.py                       # bfloat16 and auto (float32)
    python scripts/lossless_race.py --dtypes auto --prompts rewrite --repeats 2
"""
import argparse
import json
from dataclasses import replace
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import prompt_set  # noqa: E402 - after the sys.path insert
from specviz.models.host import environment  # noqa: E402
from specviz.runs.run import execute, load  # noqa: E402
from specviz.settings import RunSettings, validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,auto")
    parser.add_argument("--prompts", default="examples", help="a shipped prompt set (examples, chat, rewrite, ...)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None, help="write every row here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = prompt_set(args.prompts)
    rows = []
    for dtype in args.dtypes.split(","):
        settings = validate(RunSettings(draft="ngram", k=8, max_new_tokens=128, dtype=dtype))
        pair = load(settings)
        for prompt in prompts:
            for repeat in range(args.repeats):
                run = execute(replace(settings, chat=prompt.chat), prompt.prompt, pair, baseline=True)
                speed, work = run.speed, run.compared
                row = {"dtype": dtype, "resolved": run.dtype, "prompt": prompt.id, "repeat": repeat,
                       "identical": run.identical, "spec_tokens": run.stats.tokens, "plain_tokens": len(run.steps),
                       "parts_at": run.divergence, "compared_tokens": work.tokens, "basis": work.basis,
                       "speedup": speed.speedup if speed else None, "low": speed.low if speed else None,
                       "high": speed.high if speed else None, "reliable": bool(speed and speed.reliable),
                       "tokens_per_pass": run.stats.mean_acceptance_length}
                rows.append(row)
                figure = (f"{speed.speedup:.2f}x ({speed.low:.2f}-{speed.high:.2f})"
                          + ("" if speed.reliable else " too short to trust") if speed else "none")
                print(f"{run.dtype:9} {prompt.id:<24} identical={str(run.identical):5} "
                      f"tokens spec/plain {row['spec_tokens']:3}/{row['plain_tokens']:3} parts at {row['parts_at']} "
                      f"| speedup {figure} over {work.tokens} tokens ({work.basis}), "
                      f"{row['tokens_per_pass']:.2f} tokens/pass", flush=True)
    env = environment(torch.device("cpu"))
    print(f"hardware: {env['device_name']}; torch {torch.__version__}; 1 thread; clock: thread CPU time; "
          f"load average {env.get('host_load_average')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
