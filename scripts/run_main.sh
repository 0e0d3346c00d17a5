#!/usr/bin/env bash
# Fresh machine -> the main job: set up the env (scripts/setup_env.sh: .venv with Paddle 3.3.1 CPU,
# this package and the main job's extra), then train a small causal LM on packed documents
# (examples/train_packed_lm.py; default data: the Python standard library's source).
# --help / -h answers at once, before any set-up (the options need only Python's standard library).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="$ROOT/examples/train_packed_lm.py"
for arg in "$@"; do
  case "$arg" in
    -h|--help) exec python3 "$MAIN" --help ;;
  esac
done
# shellcheck source=scripts/setup_env.sh
. "$ROOT/scripts/setup_env.sh"
python "$MAIN" "$@"
