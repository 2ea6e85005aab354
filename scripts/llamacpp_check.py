"""Do the llama.cpp sweep's figures agree with llama.cpp's own `timings`? Runs the load sweep on
llama.cpp (`runs.engine_load.engine_sweep`, the same code as `load --engine llamacpp`) and prints,
per point, the client's figures beside what the server said about the same requests:

- decode rate per request: the sweep's 1 / TPOT (client: first token to last) against llama.cpp's
  `timings.predicted_per_second`, each the mean over the point's requests;
- output throughput: the sweep's (all tokens / wall time at the client) against the server's view,
  B x all predicted tokens / the sum of every request's `prompt_ms + predicted_ms` (B streams are
  always busy in a closed loop, so the wall time is about the summed request time over B).

    python scripts/llamacpp_check.py --batch 1,4 --k 0,4 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import preset_prompt_sets  # noqa: E402
from specviz.engines import LlamaCppEngine, llamacpp  # noqa: E402
from specviz.runs.engine_load import engine_sweep  # noqa: E402
from specviz.settings import RunSettings, parse_draft, whole_numbers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,4")
    parser.add_argument("--k", default="0,4")
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--prompts", default="rewrite")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    batches, ks = whole_numbers("--batch", args.batch, 1, 64), whole_numbers("--k", args.k, 0, 64)
    settings = RunSettings(draft=args.draft, k=max(max(ks), 1), max_new_tokens=args.max_new_tokens, temperature=0.0)
    prompts = preset_prompt_sets()[args.prompts]
    engine = LlamaCppEngine(model=llamacpp.gguf_location(None), threads=args.threads, parallel=max(batches))
    configs = llamacpp.engine_configs(parse_draft(args.draft), ks)
    responses = defaultdict(list)       # (k, batch) -> the measured responses
    result = None
    for progress in engine_sweep(settings, prompts, engine, configs, batches=batches, ks=ks):
        result = progress.result
        if progress.response is not None:
            responses[progress.config.k, progress.batch].append(progress.response)
    print(f"llama.cpp {result.engine['version']} ({result.engine['server']}), {args.threads} threads, "
          f"{result.environment['device_name']}; {args.max_new_tokens} tokens per request, {args.prompts!r} prompts")
    print(f"{'k':>2} {'batch':>5} {'req':>4} | {'1/TPOT':>7} {'timings':>7} {'ratio':>6} | {'tok/s':>7} "
          f"{'timings':>7} {'ratio':>6}")
    for (k, batch), done in sorted(responses.items()):
        client_rate = statistics.mean((r.tokens - 1) / (r.finished - r.first) for r in done)
        server_rate = statistics.mean(r.extra["timings"]["predicted_per_second"] for r in done)
        wall = max(r.finished for r in done) - min(r.sent for r in done)
        client_throughput = sum(r.tokens for r in done) / wall
        busy = sum(r.extra["timings"]["prompt_ms"] + r.extra["timings"]["predicted_ms"] for r in done) / 1000
        server_throughput = batch * sum(r.extra["timings"]["predicted_n"] for r in done) / busy
        print(f"{k:>2} {batch:>5} {len(done):>4} | {client_rate:7.1f} {server_rate:7.1f} "
              f"{client_rate / server_rate:6.3f} | {client_throughput:7.1f} {server_throughput:7.1f} "
              f"{client_throughput / server_throughput:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
