#!/usr/bin/env bash
# What the Makefile's commands need from the system, beyond Python and PyPI (Debian/Ubuntu names):
#
#   venv PYTHON   before `make` creates .venv: the interpreter's venv module (Debian splits it off
#                 into python3.X-venv; python.org, pyenv and Docker's python images have it)
#   test PYTHON   before `make test` / `make test-integration` (PYTHON: the venv's interpreter):
#                 bubblewrap   the RLM sandbox's default isolation (rlm.isolation=bwrap); without it the
#                              sandbox tests run the isolations that work and leave bwrap's cases out
#                 a C++ compiler and the interpreter's headers (Python.h)
#                              DeepSpeed builds two C++ ops on a CPU; without them its tests are skipped,
#                              with the reason
#                 chromium and chromium-driver (Debian's names)
#                              the HTML report's test opens report.html in headless Chromium (selenium
#                              drives /usr/bin/chromedriver, offline); without them it is skipped, with
#                              the reason, unless RECALLM_REQUIRE_CHROMIUM=1 (.ci/run sets it where it has them)
#
# What is missing is installed with apt-get when this runs as root on a machine that has apt-get (as a
# fresh CI machine does); otherwise it says what is missing and how to add it, and exits 0 (the tests
# go on without it, see above). Nothing is installed when nothing is missing.
set -uo pipefail

what=${1:?usage: system_deps.sh venv|test PYTHON}
python=${2:?usage: system_deps.sh venv|test PYTHON}

version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') || exit 1
# Debian's own interpreter (under /usr) has its venv module and headers in packages; another one
# (pyenv, conda, python.org) brings its own, and apt-get cannot add them.
debian_python=$("$python" -c 'import sys; print(int(sys.base_prefix == "/usr"))')

missing=()   # "package|what it is for"
case "$what" in
  venv)
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
      missing+=("python${version}-venv|creating .venv ($python has no ensurepip)")
    fi
    ;;
  test)
    command -v bwrap >/dev/null 2>&1 || missing+=("bubblewrap|the RLM sandbox's default isolation (bwrap)")
    command -v "${CXX:-c++}" >/dev/null 2>&1 || missing+=("g++|DeepSpeed's C++ ops on a CPU (${CXX:-c++})")
    command -v chromium >/dev/null 2>&1 || missing+=("chromium|the HTML report's test (headless Chromium)")
    command -v chromedriver >/dev/null 2>&1 || missing+=("chromium-driver|the HTML report's test (chromedriver)")
    header=$("$python" -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["include"], "Python.h"))')
    if [ ! -f "$header" ]; then
      if [ "$debian_python" = 1 ]; then
        missing+=("python${version}-dev|DeepSpeed's C++ ops on a CPU ($header)")
      else
        echo "system-deps: no $header: DeepSpeed's tests will be skipped (this interpreter is not Debian's; install its headers)"
      fi
    fi
    ;;
  *)
    echo "usage: system_deps.sh venv|test PYTHON" >&2
    exit 2
    ;;
esac

[ ${#missing[@]} -eq 0 ] && exit 0

packages=()
for entry in "${missing[@]}"; do
  packages+=("${entry%%|*}")
  echo "system-deps: missing ${entry%%|*}: ${entry#*|}"
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: apt-get install ${packages[*]}"
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}") >/dev/null; then
    exit 0
  fi
  echo "system-deps: apt-get could not install ${packages[*]}"
fi
if [ "$what" = venv ]; then
  echo "system-deps: install ${packages[*]} (sudo apt-get install ${packages[*]}), or set PYTHON=<an interpreter with venv>" >&2
  exit 1
fi
echo "system-deps: the tests go on without ${packages[*]}, leaving out what needs it (sudo apt-get install ${packages[*]} adds it)"
exit 0
