#!/usr/bin/env bash
# GPU benchmark of the specviz engine: random-weight Llamas with real shapes (SmolLM2-1.7B/135M,
# Llama-3-8B/3.2-1B) in bf16, no network, no gradio. Results go to $OUT (default ./gpu_bench_out):
# gpu_paths.json (scripts/gpu_paths.py: the CUDA paths checked), gpu_bench.json, gpu_bench.md and the
# logs. Takes under 9 minutes on one recent GPU.
#
#   bash scripts/gpu_bench.sh                        # CUDA
#   bash scripts/gpu_bench.sh --device cpu --small   # smoke test on a CPU, seconds
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-gpu_bench_out}"
mkdir -p "$OUT"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv" || true
fi
# First the own loop's CUDA paths (Clock on cuda:N, the batched loop, the head, out-of-memory
# recovery; under a minute; gpu_paths.json), then the benchmark. The benchmark stops starting new
# pairs after --budget-s (420 s); the timeout is the hard stop.
case " $* " in
    *" --device cpu "*) python scripts/gpu_paths.py --device cpu --out "$OUT" 2>&1 | tee "$OUT/gpu_paths.log" || true ;;
    *) timeout 120 python scripts/gpu_paths.py --out "$OUT" 2>&1 | tee "$OUT/gpu_paths.log" || true ;;
esac
timeout 470 python scripts/gpu_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_bench.log"
