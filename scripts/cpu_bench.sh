#!/usr/bin/env bash
# The CPU benchmark behind the tables of docs/benchmarks.md, in one command. Results go to $OUT (default
# ./bench_out): one JSON and one markdown table per configuration, plus the log.
#
#   bash scripts/cpu_bench.sh               # machine to itself: wall clock, every core
#   bash scripts/cpu_bench.sh --threads 1   # shared machine: one thread, timed by its own CPU time
#
# Extra arguments go to every `python -m specviz bench` call. About 45 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT="${OUT:-bench_out}"
mkdir -p "$OUT"
bench() {
    local name=$1; shift
    python -m specviz bench "$@" --json "$OUT/$name.json" --markdown "$OUT/$name.md" 2>&1 | tee "$OUT/$name.log"
}
# The tiny in-process pair (no model files): its 2-layer draft model, prompt lookup, early exit.
# Its forwards take ~3 ms, so timing noise is large: three rounds.
bench tiny --target tiny --draft tiny --draft ngram --draft self:4 --max-new-tokens 128 --repeats 3 "$@"
# The built-in SmolLM2-135M-Instruct in bf16 (this CPU's native type): prompt lookup, all 30 prompts.
bench smollm2-ngram --draft ngram --max-new-tokens 128 "$@"
# Early exit after 25 of 30 layers: two prompts per category (it is slow: drafts cost 3/4 of a step).
bench smollm2-self25 --draft self:25 --limit 2 --max-new-tokens 128 "$@"
# float32: greedy outputs must be identical to plain decoding.
bench smollm2-ngram-fp32 --draft ngram --dtype float32 --limit 1 --max-new-tokens 128 --repeats 3 "$@"
