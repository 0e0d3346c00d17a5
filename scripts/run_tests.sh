#!/usr/bin/env bash
# Fresh machine -> test results: set up the env, build, check that the CUDA
# sources compile for sm90a (skipped without nvcc), run the CPU test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/setup_env.sh
. "$ROOT/scripts/setup_env.sh"
if [ -f "$ROOT/scripts/check_cuda_compile.sh" ]; then bash "$ROOT/scripts/check_cuda_compile.sh"; fi
cd "$ROOT"
# Plain `pytest` (not `python -m pytest`) so the installed package is tested, not the source tree.
pytest -q --timeout 900 "$@"
