#!/usr/bin/env bash
# The `speculators` library's own environment (vllm-project/speculators, the format specviz's draft heads
# are written in): a venv that tests/test_speculators.py reads the shipped head in (SPECVIZ_SPECULATORS_PYTHON).
# Prints the interpreter's path.
#
#   bash scripts/make_speculators_env.sh                                 # ~/.cache/specviz-speculators-venv
#   SPECULATORS_ENV_DIR=/somewhere bash scripts/make_speculators_env.sh  # another folder
#
# Its own venv because speculators 0.9.0 pins transformers <= 5.19 (specviz runs 5.24). torch is pinned in the
# same install, at specviz's pin (the CPU build on the project's machines): alone, speculators' torchvision
# pulls the newest CUDA torch (gigabytes). It also pulls the registry's torchvision and torchaudio (built
# for the CUDA torch), which break `import transformers` ("operator torchvision::nms does not
# exist"); reading a head needs neither, so they are removed, as in scripts/make_vllm_env.sh. Skips the
# build when the environment already imports speculators with that torch. About 2 minutes here.
set -euo pipefail
ENV_DIR="${SPECULATORS_ENV_DIR:-$HOME/.cache/specviz-speculators-venv}"
PACKAGE="${SPECULATORS_PACKAGE:-speculators==0.9.0}"
PY="$ENV_DIR/bin/python"
PROBE="import torch, transformers; from importlib.metadata import version; from speculators import SpeculatorModel
assert torch.__version__.startswith('2.13.0'), torch.__version__; print(version('speculators'))"

if [ -x "$PY" ] && "$PY" -c "$PROBE" >/dev/null 2>&1; then
    echo "$PY"
    exit 0
fi
rm -rf "$ENV_DIR"
python3 -m venv "$ENV_DIR"
"$PY" -m pip install -q --disable-pip-version-check "$PACKAGE" torch==2.13.0 >&2
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true
"$PY" -c "$PROBE" >&2
echo "$PY"
