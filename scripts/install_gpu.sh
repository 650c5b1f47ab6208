#!/usr/bin/env bash
# Install RecaLLM for a GPU node (Linux, NVIDIA, CUDA 13.0 driver: >= 580.65), into .venv:
#   1. torch==2.11.0 (+ torchvision 0.26.0, torchaudio 2.11.0), the versions verl 0.9.1's vllm extra
#      pins; PyPI's wheels are built for CUDA 13.0 and bring their CUDA libraries;
#   2. flash-attn 2.8.3 (verl's fsdp extra), first as a prebuilt wheel that matches the installed torch,
#      CUDA, C++ ABI and Python: $FLASH_ATTN_WHEEL (a file or URL you give), else the one flash-attn's
#      GitHub release names for this combination
#      (flash_attn-2.8.3+cu<CUDA major>torch<major.minor>cxx11abi<TRUE|FALSE>-cp<py>-cp<py>-linux_x86_64.whl);
#      only when none installs, a source build (--no-build-isolation against the torch of step 1). For
#      torch 2.11 + CUDA 13 a prebuilt wheel may well be missing: the build needs the CUDA 13 toolkit's
#      compiler (nvcc 13.x on PATH or in $CUDA_HOME/bin, e.g. `module load cuda/13.0`), takes long (tens
#      of minutes to hours) and memory: MAX_JOBS=<n> bounds the parallel compile jobs (each can take
#      several GiB; MAX_JOBS=4 on a node with 64 GiB). What happened is recorded in
#      $VENV/recallm-flash-attn-install.txt, which `recallm-doctor` prints. Without flash-attn the
#      recipes can still run unpacked (actor_rollout_ref.model.use_remove_padding=false
#      actor_rollout_ref.model.override_config.attn_implementation=sdpa; `recallm-plan` shows the cost);
#   3. the package with its `gpu` extra: verl[vllm]==0.9.1 (vllm 0.24.0, transformers 5.9.0, Ray, ...),
#      flash-attn (already there), DeepSpeed;
#   4. recallm-doctor --require gpu: every pin, the device, bf16, the driver, the recall processor.
#
# Usage: scripts/install_gpu.sh        (RECALLM_VENV=... for another environment, PYTHON=python3.11,
#                                       FLASH_ATTN_WHEEL=<file or URL>, SKIP_FLASH_ATTN=1 to leave it out)
set -euo pipefail
FLASH_ATTN_VERSION=2.8.3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECALLM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
RECORD="$VENV/recallm-flash-attn-install.txt"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip setuptools wheel packaging ninja psutil hatchling  # hatchling: recallm's own build backend
"$VENV/bin/pip" install "torch==2.11.0" "torchvision==0.26.0" "torchaudio==2.11.0"

# The name of flash-attn's prebuilt wheel for the installed torch (the scheme of its release assets).
flash_attn_wheel_name() {
  "$VENV/bin/python" - "$FLASH_ATTN_VERSION" <<'PYEOF'
import sys, torch
version = sys.argv[1]
cuda = (torch.version.cuda or "").split(".")[0]
torch_mm = ".".join(torch.__version__.split("+")[0].split(".")[:2])
abi = "TRUE" if torch._C._GLIBCXX_USE_CXX11_ABI else "FALSE"
py = f"cp{sys.version_info.major}{sys.version_info.minor}"
print(f"flash_attn-{version}+cu{cuda}torch{torch_mm}cxx11abi{abi}-{py}-{py}-linux_x86_64.whl")
PYEOF
}

if [ "${SKIP_FLASH_ATTN:-0}" != "1" ]; then
  NAME="$(flash_attn_wheel_name)"
  URL="https://github.com/Dao-AILab/flash-attention/releases/download/v$FLASH_ATTN_VERSION/$NAME"
  WHEEL="${FLASH_ATTN_WHEEL:-$URL}"
  echo "install_gpu.sh: looking for a prebuilt flash-attn wheel: $WHEEL"
  if "$VENV/bin/pip" install --no-deps "$WHEEL"; then
    echo "prebuilt wheel $(basename "$WHEEL")" > "$RECORD"
  else
    echo "install_gpu.sh: no prebuilt flash-attn wheel matches torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'): building it from source" >&2
    if ! command -v nvcc > /dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
      echo "install_gpu.sh: no nvcc (CUDA 13 toolkit) on PATH or in \$CUDA_HOME: the build will fail" >&2
    fi
    FLASH_ATTENTION_SKIP_CUDA_BUILD=FALSE FLASH_ATTENTION_FORCE_BUILD=TRUE \
      "$VENV/bin/pip" install --no-build-isolation --no-deps "flash-attn==$FLASH_ATTN_VERSION"
    echo "built from source (no prebuilt wheel $NAME)" > "$RECORD"
  fi
fi
"$VENV/bin/pip" install --no-build-isolation -e "$ROOT[gpu]"
"$VENV/bin/recallm-doctor" --require gpu
