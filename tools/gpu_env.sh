# Sourced by the device scripts (gpu_run.sh, gpu_ab.sh, gpu_profile.sh): the checkout's root as the
# working directory and on PYTHONPATH, and $OUT (default .devout) created for the logs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.devout}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
