# Sourced by the device scripts (gpu_run.sh, gpu_ab.sh, gpu_profile.sh): the checkout's root as the
# working directory and on PYTHONPATH, and $OUT (default .devout) created for the logs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.devout}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Builds may be carried compressed (16 MB of kernels are 1.2 MB as xz; a call carries 64 MiB):
# .devcarry/NAME.so.xz unpacks to .devbuild_NAME/libfm3_cuda.so.
for f in "$ROOT"/.devcarry/*.so.xz; do
  [ -e "$f" ] || continue
  d="$ROOT/.devbuild_$(basename "$f" .so.xz)"
  [ -f "$d/libfm3_cuda.so" ] && [ "$d/libfm3_cuda.so" -nt "$f" ] && continue
  mkdir -p "$d" && python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$f" "$d/libfm3_cuda.so"
done
# The words of an argument string given in an environment variable, quotes honoured as the shell
# would (TESTS='-q -k "d80 or d96"'), one per line: mapfile -t args < <(shell_words "$TESTS").
shell_words() { python3 -c 'import shlex, sys; sys.stdout.write("".join(w + "\n" for w in shlex.split(sys.argv[1])))' "$1"; }
