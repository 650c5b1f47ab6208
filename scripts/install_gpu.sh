#!/usr/bin/env bash
# Install RecaLLM for a GPU node (Linux, NVIDIA, CUDA 13.0 driver: >= 580.65), into .venv:
#   1. torch==2.11.0 (+ torchvision 0.26.0, torchaudio 2.11.0), the versions verl 0.9.1's vllm extra
#      pins; PyPI's wheels are built for CUDA 13.0 and bring their CUDA libraries;
#   2. the package with its `gpu` extra: verl[vllm]==0.9.1 (vllm 0.24.0, transformers 5.9.0, Ray, ...),
#      flash-attn 2.8.3 (verl's fsdp extra; built against the torch of step 1, hence
#      --no-build-isolation: its setup.py fetches a prebuilt wheel when one matches, else compiles,
#      which takes long: MAX_JOBS=<n> bounds the compiler's memory), DeepSpeed;
#   3. recallm-doctor --require gpu: every pin, the device, bf16, the driver, the recall processor.
#
# Usage: scripts/install_gpu.sh        (RECALLM_VENV=... for another environment, PYTHON=python3.11)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECALLM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel packaging ninja psutil
"$VENV/bin/pip" install "torch==2.11.0" "torchvision==0.26.0" "torchaudio==2.11.0"
"$VENV/bin/pip" install --no-build-isolation -e "$ROOT[gpu]"
"$VENV/bin/recallm-doctor" --require gpu
