#!/usr/bin/env bash
# Create (or reuse) a virtualenv with Paddle (CPU) and the dev tools, and
# build + install paddle_fm3 into it. Sourced by run_tests.sh and run_main.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FM3_VENV:-$ROOT/.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q -r "$ROOT/requirements.txt" -r "$ROOT/requirements-build.txt"
# The README's install command, with the test dependencies and PaddleFormers (pyproject.toml's extras).
python -m pip install -q --no-build-isolation "$ROOT[dev,paddleformers]"
