#!/usr/bin/env bash
# CI check (CPU machine, no GPU): setup.py's CUDA branch builds end to end: the generated op
# registration, the Paddle glue (ops/paddle) and the Hopper sources (ops/hopper) into the Paddle
# extension _fm3_ops.so, through the README's install path (a wheel built with
# --no-build-isolation), against the installed Paddle told that it has CUDA (FM3_WITH_CUDA=1:
# -DPADDLE_WITH_CUDA -DFM3_WITH_CUDA). Then: the wheel holds no object files, the library
# registers the ops declared in yaml/ when Paddle loads it, and it holds sm_90a machine code with
# wgmma instructions.
#
# A CPU Paddle wheel has the headers of a CUDA build but not the CUDA libraries' headers that they
# include under PADDLE_WITH_CUDA (cuBLAS, cuDNN, cuFFT, cuRAND, cuSPARSE, cuSOLVER); those are the
# include/ folders of the PyPI wheels below (CCCL comes from the toolkit), with cuobjdump and
# nvdisasm from theirs. They are downloaded once and only include/ and the two tools kept, in
# $FM3_CUDA_BUILD_DEPS (default ~/.cache/paddle_fm3/cuda-build-deps).
# Needs: the active python with Paddle 3.x and nvidia-cutlass, nvcc >= 12.3 (skipped without nvcc).
#   scripts/check_paddle_cuda_build.sh        (build in build/paddle_cuda_check/, kept for a look)
set -euo pipefail  # (no `cmd | grep -q` below: grep quitting early fails the pipe)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python}"
say() { echo "check_paddle_cuda_build: $*"; }
if ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && [ -z "${CUDA_HOME:-}${CUDA_PATH:-}" ]; then
  say "skipped (no nvcc on PATH and no CUDA_HOME)"; exit 0
fi

# Versions of CUDA 13.0's libraries (the toolkit here); any recent ones would do for the headers.
DEPS=(nvidia-cublas==13.1.1.3 nvidia-cudnn-cu13==9.24.0.43 nvidia-cufft==12.0.0.61 nvidia-curand==10.4.0.35
      nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66
      nvidia-cuda-cuobjdump==13.4.92 nvidia-cuda-nvdisasm==13.4.92)
CACHE_ROOT="${FM3_CUDA_BUILD_DEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/paddle_fm3/cuda-build-deps}"
CACHE="$CACHE_ROOT/$(printf '%s\n' "${DEPS[@]}" | sha256sum | cut -c1-16)"
if [ ! -f "$CACHE/complete" ]; then
  say "fetching the CUDA library headers, cuobjdump and nvdisasm into $CACHE"
  rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp/wheels"
  "$PY" -m pip download -q --no-deps -d "$CACHE.tmp/wheels" "${DEPS[@]}"
  "$PY" - "$CACHE.tmp" <<'PY'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
for whl in sorted((out / "wheels").glob("*.whl")):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            parts = name.split("/")
            tool = parts[-2:] in (["bin", "cuobjdump"], ["bin", "nvdisasm"])
            if not (tool or "include" in parts[:-1]) or name.endswith("/"):
                continue
            rel = parts[-2:] if tool else parts[parts.index("include"):]
            dst = out.joinpath(*rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(z.read(name))
for tool in (out / "bin").iterdir():
    tool.chmod(0o755)
PY
  rm -rf "$CACHE.tmp/wheels" && rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE" && touch "$CACHE/complete"
  find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 ! -name "$(basename "$CACHE")" -exec rm -rf {} +  # older pins
fi
for h in cublas_v2.h cudnn.h cufft.h curand.h cusparse.h cusolverDn.h; do
  [ -f "$CACHE/include/$h" ] || { say "FAILED ($h missing in $CACHE/include)"; exit 1; }
done

# Build from a copy of the working tree (tracked and untracked, not ignored files), so the
# checkout's own build/ (the CPU build) is left alone.
WORK="$ROOT/build/paddle_cuda_check"
rm -rf "$WORK" && mkdir -p "$WORK/src" "$WORK/dist"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
   | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$WORK/src"
[ -f "$WORK/src/setup.py" ] || { say "FAILED (could not copy the source tree)"; exit 1; }
say "building the CUDA branch (log: $WORK/build.log)"
start=$SECONDS
if ! FM3_WITH_CUDA=1 CPATH="$CACHE/include${CPATH:+:$CPATH}" MAX_JOBS="${MAX_JOBS:-2}" \
     "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1; then
  grep -m 40 -E "error|Error|failed|Terminated|Killed" "$WORK/build.log" || true; say "FAILED (build; log: $WORK/build.log)"; exit 1
fi
# Paddle's build_ext reports a failed compile and goes on: any such line fails the check too.
if grep -E "compile failed|generated an exception" "$WORK/build.log"; then say "FAILED (a source did not compile)"; exit 1; fi
grep -E "^ *paddle_fm3: (CUDA toolkit|CUTLASS)" "$WORK/build.log" | sed 's/^ */  /' | sort -u || true
say "built in $((SECONDS - start)) s"

WHEEL="$(ls "$WORK"/dist/paddle_fm3-*.whl)"
"$PY" - "$WHEEL" "$WORK/lib" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
objects = [n for n in names if n.endswith(".o")]
if objects:
    sys.exit(f"check_paddle_cuda_build: FAILED (object files in the wheel: {objects[:3]})")
if "paddle_fm3/_fm3_ops.so" not in names or "paddle_fm3/py.typed" not in names:
    sys.exit("check_paddle_cuda_build: FAILED (the wheel lacks paddle_fm3/_fm3_ops.so or py.typed)")
zipfile.ZipFile(sys.argv[1]).extract("paddle_fm3/_fm3_ops.so", sys.argv[2])
PY
SO="$WORK/lib/paddle_fm3/_fm3_ops.so"

# The ops: Paddle loads the library (its CUDA runtime from the toolkit via the rpath) and
# registers every op of yaml/ from it.
"$PY" - "$SO" "$WORK/src/build/generated/fm3_ops_generated.cc" <<'PY'
import re, sys
from paddle.utils.cpp_extension import extension_utils
declared = set(re.findall(r"^PD_BUILD_OP\((\w+)\)", open(sys.argv[2]).read(), re.MULTILINE))
registered = set(extension_utils.load_op_meta_info_and_register_op(sys.argv[1]))
if not declared or not declared <= registered:
    sys.exit(f"check_paddle_cuda_build: FAILED (ops declared {sorted(declared)}, registered {sorted(registered)})")
print(f"check_paddle_cuda_build: the library registers {len(registered)} ops: {', '.join(sorted(registered))}")
PY
# The Hopper entries are in, and the glue's GPU branch calls them on Paddle's current stream.
for sym in fm3_cuda_fwd fm3_cuda_bwd; do
  nm -D --defined-only "$SO" | grep -w "$sym" >/dev/null || { say "FAILED ($sym not in the library)"; exit 1; }
done
nm -DC --undefined-only "$SO" | grep "paddle::GetCurrentCUDAStream" >/dev/null \
  || { say "FAILED (the glue does not take Paddle's current CUDA stream: its GPU branch is not compiled)"; exit 1; }

# sm_90a machine code, with the wgmma (HGMMA) instructions of the warp-specialized kernels.
CUOBJDUMP="$CACHE/bin/cuobjdump"
"$CUOBJDUMP" --list-elf "$SO" | grep "sm_90a" >/dev/null || { say "FAILED (no sm_90a ELF in the library)"; exit 1; }
hgmma=$(PATH="$CACHE/bin:$PATH" "$CUOBJDUMP" --dump-sass "$SO" | grep -c "HGMMA" || true)
[ "$hgmma" -gt 0 ] || { say "FAILED (no HGMMA instruction in the sm_90a code)"; exit 1; }
say "sm_90a code present, $hgmma HGMMA instructions"
say "OK"
