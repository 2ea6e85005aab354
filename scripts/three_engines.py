"""The same drafter on three engines: specviz's own loop, vLLM and llama.cpp, one prompt set, one table.

Runs `python -m specviz load` three times (`--engine specviz`, `vllm`, `llamacpp`) with the same
drafter, prompts, output length and batch sizes, one engine after the other, and prints for each
engine at each batch size, every row on one basis (docs/figures.md; docs/llamacpp.md says why this one):
the plain and speculative time per output token (TPOT: decode only, each request's, mean over
requests), the speedup in TPOT with its 95% range (requests resampled as pairs), vLLM's acceptance
figures by one formula for all three (draft acceptance rate = accepted / drafted; mean acceptance
length = 1 + accepted / drafting steps), which clock timed it, and whether every greedy text equalled
plain decoding's. Each engine's own JSON is kept beside the table (`--out`), and the table as
table.md and table.json (with its basis).

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 \\
        python scripts/three_engines.py --batch 1 --k 4 --max-new-tokens 48 --out three-engines

What differs besides the engine (said in the table's header): the own loop decodes the model in
`--dtype` (float32 by default, as vLLM does here) on one torch thread timed by thread CPU time; vLLM
runs the same weights in the same dtype; llama.cpp runs the GGUF as stored (Q4_1), on every core. vLLM
and llama.cpp are timed at the client by the wall clock. The ratios are each engine's against its own
plain decoding.
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
    elif args.llamacpp_threads:
        command += ["--threads", str(args.llamacpp_threads)]
    print(f"$ {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return json.loads(path.read_text())


HEADER = ["engine", "batch", "plain TPOT ms", "spec TPOT ms", "speedup in TPOT (95% range)", "draft acceptance rate",
          "mean acceptance length", "clock", "greedy texts identical"]
BASIS = "decode-only time per output token (TPOT) per request, mean over requests"


def records(engine: str, data: dict, k: int) -> list[dict]:
    clock = data["settings"].get("clock", "?")
    return [{"engine": engine, "batch": p["batch"], "plain_tpot_ms": 1e3 * p["plain_latency"],
             "spec_tpot_ms": 1e3 * p["spec_latency"], "tpot_ratio": p["tpot_ratio"],
             "tpot_range": [p["tpot_low"], p["tpot_high"]], "draft_acceptance_rate": p["draft_acceptance_rate"],
             "mean_acceptance_length": p["mean_acceptance_length"], "clock": clock, "identical": p["identical"],
             "rows_differing": sum(1 for r in p["rows"] if r.get("text") != r.get("plain_text"))}
            for p in sorted((p for p in data["points"] if p["k"] == k), key=lambda p: p["batch"])]


def cells(r: dict) -> list[str]:
    return [r["engine"], str(r["batch"]), f"{r['plain_tpot_ms']:.1f}", f"{r['spec_tpot_ms']:.1f}",
            f"**{r['tpot_ratio']:.2f}x** ({r['tpot_range'][0]:.2f}-{r['tpot_range'][1]:.2f})",
            f"{r['draft_acceptance_rate']:.0%}", f"{r['mean_acceptance_length']:.2f}", r["clock"],
            {True: "yes", False: f"{r['rows_differing']} differ", None: "-"}[r["identical"]]]


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
    parser.add_argument("--llamacpp-threads", type=int, default=None,
                        help="llama.cpp's server threads (default: every core; fewer where the machine is shared: its "
                             "threads spin while they wait for each other)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    before = load_average() or 0.0
    table = []
    for engine in args.engines.split(","):
        table += records(engine, run_engine(engine, args, args.out), args.k)
    machine = (f"{read_cpuinfo().name or os.uname().machine}, {os.cpu_count()} cores; {args.draft} k = {args.k}; "
               f"{args.prompts} prompts; {args.max_new_tokens} tokens per request (EOS ignored); own loop and vLLM "
               f"{args.dtype}, llama.cpp the GGUF as stored; load average {before:.2f} before, "
               f"{load_average() or 0.0:.2f} after")
    print(f"\n{machine}\nevery row: {BASIS}\n")
    lines = ["| " + " | ".join(line) + " |" for line in [HEADER, ["---"] * len(HEADER), *map(cells, table)]]
    print("\n".join(lines))
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "table.json").write_text(json.dumps({"machine": machine, "basis": BASIS, "rows": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
