"""The same drafter on three engines: specviz's own loop, vLLM and llama.cpp, one prompt set, one table.

Runs `python -m specviz load` three times (`--engine specviz`, `vllm`, `llamacpp`) with the same
drafter, prompts, output length and batch sizes, one engine after the other, and prints for each
engine at each batch size: plain and speculative tokens/s, the speedup (its 95% range), the share of
acceptance as each engine measures it (the own loop: accepted / (accepted + rejected), the rate the
theory uses, drafts after a rejection not counted; vLLM and llama.cpp: accepted / drafted), tokens per
target pass (vLLM and llama.cpp: mean acceptance length over the steps that drafted), each engine's
plain step cost (ms per token at that batch size: what speculation has to save), which clock timed it,
and whether every greedy text equalled plain decoding's. Each engine's own JSON is kept beside the
table (`--out`).

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 \\
        python scripts/three_engines.py --batch 1 --k 4 --max-new-tokens 48 --out three-engines

What differs besides the engine (said in the table's header): the own loop decodes the model in
`--dtype` (float32 by default, as vLLM does here) on one torch thread timed by thread CPU time; vLLM
runs the same weights in the same dtype; llama.cpp runs the GGUF as stored (Q4_1), on every core, timed
at the client. The ratios are each engine's against its own plain decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.models.host import load_average, read_cpuinfo  # noqa: E402

ENGINES = {"specviz": ["--threads", "1"], "vllm": [], "llamacpp": []}


def run_engine(engine: str, args, out: Path) -> dict:
    path = out / f"load-{engine}.json"
    command = [sys.executable, "-m", "specviz", "load", "--engine", engine, "--draft", args.draft,
               "--batch", args.batch, "--k", f"0,{args.k}", "--prompts", args.prompts,
               "--max-new-tokens", str(args.max_new_tokens), "--json", str(path), "--quiet", *ENGINES[engine]]
    if engine != "llamacpp":
        command += ["--dtype", args.dtype]
    print(f"$ {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(path.read_text())


def rows(engine: str, data: dict, k: int) -> list[list[str]]:
    out = []
    clock = data["settings"].get("clock", "?")
    for point in sorted((p for p in data["points"] if p["k"] == k), key=lambda p: p["batch"]):
        figures = point.get("acceptance") or {}
        per_pass = figures.get("mean_acceptance_length", point["tokens_per_pass"])
        out.append([engine, str(point["batch"]), f"{point['plain_tokens_per_s']:.1f}",
                    f"{point['spec_tokens_per_s']:.1f}",
                    f"**{point['speedup']:.2f}x** ({point['speedup_low']:.2f}-{point['speedup_high']:.2f})",
                    f"{point['alpha']:.0%}", f"{per_pass:.2f}",
                    f"{1e3 * point['batch'] / point['plain_tokens_per_s']:.1f}" if point["plain_tokens_per_s"] else "-",
                    clock, {True: "yes", False: "no", None: "-"}[point["identical"]]])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="specviz,vllm,llamacpp")
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--batch", default="1")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", default="rewrite")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32", help="the own loop's and vLLM's (llama.cpp: the GGUF's)")
    parser.add_argument("--out", type=Path, default=Path("three-engines"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    before = load_average() or 0.0
    table = []
    for engine in args.engines.split(","):
        table += rows(engine, run_engine(engine, args, args.out), args.k)
    header = ["engine", "batch", "plain tok/s", "spec tok/s", "speedup (95% range)", "acceptance (engine's measure)",
              "tokens per pass", "plain ms per token", "clock", "greedy texts identical"]
    print(f"\n{read_cpuinfo().name or os.uname().machine}, {os.cpu_count()} cores; {args.draft} k = {args.k}; "
          f"{args.prompts} prompts; {args.max_new_tokens} tokens per request (EOS ignored); own loop and vLLM "
          f"{args.dtype}, llama.cpp the GGUF as stored; load average {before:.2f} before, "
          f"{load_average() or 0.0:.2f} after\n")
    for line in [header, ["---"] * len(header), *table]:
        print("| " + " | ".join(line) + " |")
    (args.out / "table.md").write_text("\n".join("| " + " | ".join(line) + " |"
                                                 for line in [header, ["---"] * len(header), *table]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
