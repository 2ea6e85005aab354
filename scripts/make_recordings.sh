#!/usr/bin/env bash
# Remake the bundled recordings in assets/recordings/ on the built-in SmolLM2-135M-Instruct (offline).
# One torch thread: every event is timed by its thread's CPU time. Prompts: the app's examples.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
out=assets/recordings
prompt() { python -c "from specviz.catalog import load_examples; import sys; print(next(e['prompt'] for e in load_examples() if e['title'] == sys.argv[1]))" "$1"; }
python -m specviz run --threads 1 --baseline --draft ngram --k 8 --max-new-tokens 160 \
  --record "$out/prompt-lookup-rewrite.json" "$(prompt 'Fix the spelling')"
python -m specviz run --threads 1 --baseline --draft self:25 --k 2 --max-new-tokens 96 \
  --record "$out/early-exit-chat.json" "$(prompt 'Why is the sky blue?')"
python -m specviz run --threads 1 --baseline --draft ngram --k 8 --temperature 0.7 --top-p 0.95 --seed 7 \
  --max-new-tokens 160 --record "$out/sampled-prompt-lookup-code.json" "$(prompt 'Rename a variable')"
ls -la "$out"
