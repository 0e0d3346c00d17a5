"""The build package's command line: python -m paddle_fm3_build COMMAND (the checkout on PYTHONPATH).

  generate --out-dir DIR [--py-config FILE]   code generation from yaml/ (codegen.py)
  cuda-lib [OUT_DIR]   OUT_DIR/libfm3_cuda.so: the Hopper kernels behind their C ABI, compiled as the
                       Paddle op compiles them (recipe.py); OUT_DIR/ptxas.log: registers and spills per
                       kernel; the generated sources in OUT_DIR/gen, and paddle_fm3/_config.py (the GPU
                       tests take their head dims from it). NVCC: the nvcc to run. (scripts/gpu_build.sh)
  dlpack [LIB_DIR]     the DLPack module paddle_fm3/kernels/_fm3_dlpack*.so for this Python, beside a copy
                       of LIB_DIR/libfm3_cuda.so; needs pybind11, no CUDA toolkit. FM3_DLPACK_DST: another
                       destination folder; CXX: the compiler. (scripts/build_dlpack_ext.sh)
  cutlass-include      prints the CUTLASS/CuTe include folder that the CUDA build uses
OUT_DIR and LIB_DIR default to .devbuild in the checkout.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig

from . import recipe

DEVBUILD = recipe.ROOT / ".devbuild"


def build_cuda_lib(out: pathlib.Path) -> None:
    from . import codegen  # (needs PyYAML, which the dlpack command does not)

    gen = out / "gen"
    codegen.generate(gen, py_config=recipe.ROOT / "paddle_fm3" / "_config.py")
    includes = recipe.hopper_include_dirs(gen, recipe.find_cutlass_include())
    # -Xptxas -v: ptxas reports each kernel's registers and spills (ptxas.log); it changes no code.
    cmd = [os.environ.get("NVCC", "nvcc"), *recipe.nvcc_flags(), "-Xptxas", "-v", "-Xcompiler", "-fPIC", "-shared",
           *[f"-I{d}" for d in includes], *map(str, recipe.hopper_sources()), "-o", str(out / "libfm3_cuda.so")]
    with open(out / "ptxas.log", "w") as log:
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            sys.stderr.write(line)
            log.write(line)
    if proc.wait() != 0:
        raise SystemExit(f"paddle_fm3_build: nvcc failed (exit status {proc.returncode})")
    print(f"built {out / 'libfm3_cuda.so'}")


def build_dlpack(lib_dir: pathlib.Path) -> None:
    try:
        import pybind11
    except ImportError:
        raise SystemExit("build_dlpack_ext: pybind11 is missing (pip install pybind11)") from None
    dst = pathlib.Path(os.environ.get("FM3_DLPACK_DST") or recipe.ROOT / "paddle_fm3" / "kernels")
    shutil.copy(lib_dir / "libfm3_cuda.so", dst / "libfm3_cuda.so")
    target = dst / f"_fm3_dlpack{sysconfig.get_config_var('EXT_SUFFIX')}"
    python_includes = dict.fromkeys([sysconfig.get_paths()["include"], sysconfig.get_paths()["platinclude"],
                                     pybind11.get_include()])
    cmd = [*shlex.split(os.environ.get("CXX", "c++")), *recipe.CXX_FLAGS, "-shared", "-fPIC",
           *[f"-I{d}" for d in [*python_includes, *recipe.ABI_INCLUDE_DIRS]], *map(str, recipe.dlpack_sources()),
           f"-L{dst}", "-lfm3_cuda", "-Wl,-rpath,$ORIGIN", "-o", str(target)]
    subprocess.run(cmd, check=True)
    print(f"built {target}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m paddle_fm3_build", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="code generation from yaml/")
    gen.add_argument("--out-dir", type=pathlib.Path, required=True)
    gen.add_argument("--py-config", type=pathlib.Path, default=None, help="where to write paddle_fm3/_config.py's text")
    sub.add_parser("cuda-lib", help="libfm3_cuda.so").add_argument("out_dir", type=pathlib.Path, nargs="?",
                                                                   default=DEVBUILD)
    sub.add_parser("dlpack", help="the DLPack module").add_argument("lib_dir", type=pathlib.Path, nargs="?",
                                                                    default=DEVBUILD)
    sub.add_parser("cutlass-include", help="the CUTLASS/CuTe include folder")
    args = ap.parse_args(argv)
    if args.command == "generate":
        from . import codegen

        codegen.generate(args.out_dir, py_config=args.py_config)
    elif args.command == "cuda-lib":
        args.out_dir.mkdir(parents=True, exist_ok=True)
        build_cuda_lib(args.out_dir)
    elif args.command == "dlpack":
        build_dlpack(args.lib_dir)
    else:
        print(recipe.find_cutlass_include())


if __name__ == "__main__":
    main()
