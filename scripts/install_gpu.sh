#!/usr/bin/env bash
# Install RecaLLM for a GPU node (Linux, NVIDIA, CUDA 13.0 driver: >= 580.65), into .venv:
#   1. torch==2.11.0 (+ torchvision 0.26.0, torchaudio 2.11.0), the versions verl 0.9.1's vllm extra
#      pins; PyPI's wheels are built for CUDA 13.0 and bring their CUDA libraries;
#   2. the package with its `gpu` extra: verl[vllm]==0.9.1 (vllm 0.24.0, transformers 5.9.0, Ray, ...),
#      flash-attn 2.8.3 (verl's fsdp extra; built against the torch of step 1, hence
#      --no-build-isolation: its setup.py fetches a prebuilt wheel when one matches, else compiles),
#      DeepSpeed. For torch 2.11 + CUDA 13 a prebuilt flash-attn 2.8.3 wheel is likely missing, so
#      expect a source build: it needs the CUDA 13 toolkit's compiler (nvcc 13.x on PATH or in
#      $CUDA_HOME/bin, e.g. `module load cuda/13.0`) on the node, takes long (tens of minutes to
#      hours), and needs memory: MAX_JOBS=<n> bounds the parallel compile jobs (each can take several
#      GiB; MAX_JOBS=4 on a node with 64 GiB). `recallm-doctor` reports the nvcc it finds while
#      flash-attn is missing;
#   3. recallm-doctor --require gpu: every pin, the device, bf16, the driver, the recall processor.
#
# Usage: scripts/install_gpu.sh        (RECALLM_VENV=... for another environment, PYTHON=python3.11)
set -euo pipefail
if ! command -v nvcc > /dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "install_gpu.sh: no nvcc (CUDA 13 toolkit) on PATH or in \$CUDA_HOME: if no prebuilt flash-attn wheel matches, its build will fail" >&2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECALLM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel packaging ninja psutil hatchling  # hatchling: recallm's own build backend
"$VENV/bin/pip" install "torch==2.11.0" "torchvision==0.26.0" "torchaudio==2.11.0"
"$VENV/bin/pip" install --no-build-isolation -e "$ROOT[gpu]"
"$VENV/bin/recallm-doctor" --require gpu
