#!/usr/bin/env bash
# Create (or reuse) a virtualenv with Paddle (CPU), the test tools and the main job's extra, and
# build + install paddle_fm3 into it. Sourced by run_tests.sh and run_main.sh.
#
# pip runs only when something it would act on changed: a stamp in the venv holds a hash of the
# requirements files, pyproject.toml, setup.py and every source file of the build (yaml/, ops/,
# paddle_fm3/, paddle_fm3_build/; build outputs left out), of the Python and of the build's
# environment variables. Any change there, a missing stamp or a package that no longer imports
# reinstalls; FM3_REINSTALL=1 forces it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FM3_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "paddle_fm3: creating the virtualenv $VENV" >&2
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
STAMP="$VENV/.paddle_fm3_install_stamp"
fm3_install_hash() {
  python - "$ROOT" <<'EOF'
import hashlib, os, pathlib, sys
root = pathlib.Path(sys.argv[1])
h = hashlib.sha256()
h.update(sys.version.encode())
for var in ("FM3_WITH_CUDA", "FM3_NATIVE", "CUDA_HOME", "CUDA_PATH", "CUTLASS_INC", "CPATH"):
    h.update(f"{var}={os.environ.get(var, '')}\n".encode())
generated = {"paddle_fm3/_config.py", "paddle_fm3/_fm3_ops.py"}  # written by the build itself
files = [root / n for n in ("requirements.txt", "requirements-build.txt", "pyproject.toml", "setup.py")]
for top in ("yaml", "ops", "paddle_fm3", "paddle_fm3_build"):
    files += [p for p in (root / top).rglob("*") if p.is_file()]
for p in sorted(set(files)):
    rel = p.relative_to(root).as_posix()
    if rel in generated or "__pycache__" in p.parts or p.suffix in (".so", ".pyc", ".o"):
        continue
    h.update(rel.encode() + b"\0" + (p.read_bytes() if p.exists() else b"<missing>") + b"\0")
print(h.hexdigest())
EOF
}
fm3_installed() {  # the installed copy, not the source tree (run from outside the checkout)
  (cd / && python -c "import paddle, paddle_fm3._ops" >/dev/null 2>&1)
}
if [ "${FM3_REINSTALL:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(fm3_install_hash)" ] \
    && fm3_installed; then
  echo "paddle_fm3: installed copy is up to date (no pip run; FM3_REINSTALL=1 forces one)" >&2
else
  rm -f "$STAMP"
  echo "paddle_fm3: installing $(grep -m1 '^paddlepaddle' "$ROOT/requirements.txt" || echo Paddle) (CPU) and the" \
       "build, test and main-job packages into $VENV," \
       "then building paddle_fm3 (the first time: about 3 minutes, quiet; later runs skip this while the" \
       "sources are unchanged)" >&2
  python -m pip install -q -r "$ROOT/requirements.txt" -r "$ROOT/requirements-build.txt"
  # The README's install command, with pyproject.toml's extras: the test tools, the main job's
  # (tqdm, matplotlib) and PaddleFormers.
  python -m pip install -q --no-build-isolation "$ROOT[dev,train,paddleformers]"
  echo "paddle_fm3: installed into $VENV" >&2
  fm3_install_hash >"$STAMP"
fi
