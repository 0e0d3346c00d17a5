#!/usr/bin/env bash
# Fresh machine -> the main job: set up the env, build, and train a small
# causal LM on packed documents (default: the Python standard library's source).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/setup_env.sh
. "$ROOT/scripts/setup_env.sh"
python "$ROOT/scripts/train.py" "$@"
