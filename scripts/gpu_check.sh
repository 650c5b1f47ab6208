#!/usr/bin/env bash
# Device check on a GPU machine that has torch and transformers (no vLLM, verl or Ray): see
# scripts/gpu_check.py for what it measures. Ends within 8 minutes; the last line is
#   RESULT device=cuda name=... lp_bf16_gap_in_spans=... gen_ratio_tiny=... sft_step=ok ... ok=1 minutes=...
#
#   scripts/gpu_check.sh [--smollm2 PATH] [--skip PARTS] [--device cpu --quick]   # run the check
#   scripts/gpu_check.sh --download-wheels        # here (with PyPI): fill .gpu_wheels/ to carry along
#
# DeepSpeed and the small packages it (and a GGUF SmolLM2) needs are carried as wheels in
# .gpu_wheels/ (gitignored, ~20 MB: DeepSpeed's sdist, hjson, py-cpuinfo, ninja, msgpack, pydantic,
# gguf, ...) and installed from there, without a network, when DeepSpeed is missing. PYTHON selects
# the interpreter (default python3); recallm itself comes from this checkout (PYTHONPATH).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="$ROOT/.gpu_wheels"
CARRIED=(deepspeed hjson py-cpuinfo ninja msgpack pydantic gguf)

if [[ "${1:-}" == "--download-wheels" ]]; then
  mkdir -p "$WHEELS"
  "$PY" -m pip download -q --no-deps -d "$WHEELS" "deepspeed==0.19.8" hjson py-cpuinfo einops nvidia-ml-py gguf \
    annotated-types typing-inspection "pydantic>=2"
  for pyver in 3.10 3.11 3.12 3.13; do   # binary wheels for whichever Python the device has
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$WHEELS" msgpack pydantic-core ninja psutil sentencepiece \
      || echo "no wheels for Python $pyver" >&2
  done
  du -sh "$WHEELS"
  exit 0
fi

if ! "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  if [[ -d "$WHEELS" ]]; then
    echo "[gpu_check] installing the carried wheels (${CARRIED[*]}) from $WHEELS" >&2
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-build-isolation "${CARRIED[@]}" >&2 \
      || echo "[gpu_check] warning: the carried wheels did not install; the SFT step will fail" >&2
  else
    echo "[gpu_check] warning: DeepSpeed is missing and there is no $WHEELS: the SFT step will fail" >&2
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout 470 "$PY" "$ROOT/scripts/gpu_check.py" "$@"
