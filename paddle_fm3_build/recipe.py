"""The one build definition of paddle_fm3's compiled parts: their sources, include folders and flags.

Two entry points build from it:
- setup.py: the Paddle op (paddle_fm3/_fm3_ops.so) through Paddle's cpp_extension: the CPU kernels,
  the Paddle glue and, in a CUDA build, the Hopper kernels;
- the command line (python -m paddle_fm3_build, under scripts/gpu_build.sh and scripts/build_dlpack_ext.sh):
  libfm3_cuda.so, the Hopper kernels alone behind their C ABI (ops/hopper/fm3_cuda.h), and the DLPack
  module paddle_fm3.kernels on top of it.
The Hopper kernels get the same nvcc flags in both, so the GPU tests and benchmarks (which run
libfm3_cuda.so) measure the machine code that a user installs.

Developer switches (environment), honoured by both entry points:
  FM3_NVCC_EXTRA  more nvcc flags, space-separated (e.g. -DFM3_NO_WGMMA=1: the mma.sync kernels alone)
  FM3_CU_SRCS     the Hopper sources, space-separated, instead of ops/hopper/*.cu (e.g. to leave out a
                  file being written)
  FM3_DLPACK_SRC  the DLPack binding's source, instead of ops/dlpack/fm3_dlpack.cc
  CUTLASS_INC     the CUTLASS/CuTe include folder, instead of the nvidia-cutlass package's
"""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPS = ROOT / "ops"

# Host C++ of the Paddle op and of the DLPack module.
CXX_FLAGS = ["-O3", "-std=c++17"]
# The Hopper kernels: sm_90a machine code (wgmma, TMA and setmaxnreg need the arch-specific target);
# -lineinfo maps the machine code to source lines for profilers and changes no instruction.
NVCC_FLAGS = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-lineinfo"]

# The CP planning kernel on the CPU: in the Paddle op and in the DLPack module (CP plans without Paddle).
SEGMENT_WORKLOAD = OPS / "cpu" / "segment_workload.cc"
# The CPU kernels (flashmask_cpu_avx2/avx512.cc: the same kernels again for wider x86 units, chosen at
# run time), their headers, and the Paddle glue.
CPU_SOURCES = [OPS / "cpu" / "flashmask_cpu.cc", OPS / "cpu" / "flashmask_cpu_avx2.cc",
               OPS / "cpu" / "flashmask_cpu_avx512.cc", SEGMENT_WORKLOAD]
CPU_INCLUDE_DIRS = [OPS / "include", OPS / "cpu"]
PADDLE_GLUE_SOURCES = [OPS / "paddle" / "fm3_paddle_kernels.cc"]
# The C ABI's headers: fm3/mask.h, fm3/params.h (ops/include) and fm3_cuda.h (ops/hopper).
ABI_INCLUDE_DIRS = [OPS / "include", OPS / "hopper"]
DLPACK_BINDING = OPS / "dlpack" / "fm3_dlpack.cc"


def nvcc_flags() -> list[str]:
    return NVCC_FLAGS + os.environ.get("FM3_NVCC_EXTRA", "").split()


def hopper_sources() -> list[pathlib.Path]:
    if os.environ.get("FM3_CU_SRCS"):
        return [pathlib.Path(s) for s in os.environ["FM3_CU_SRCS"].split()]
    return sorted((OPS / "hopper").glob("*.cu"))


def hopper_include_dirs(gen_dir: pathlib.Path, cutlass_include: pathlib.Path) -> list[pathlib.Path]:
    """Where the Hopper sources find their headers: the C ABI's, the generated ones (gen_dir) and CuTe's."""
    return ABI_INCLUDE_DIRS + [gen_dir, cutlass_include]


def dlpack_sources() -> list[pathlib.Path]:
    return [pathlib.Path(os.environ.get("FM3_DLPACK_SRC") or DLPACK_BINDING), SEGMENT_WORKLOAD]


def find_cutlass_include() -> pathlib.Path:
    """CUTLASS/CuTe headers: $CUTLASS_INC, else those of the PyPI package nvidia-cutlass."""
    if os.environ.get("CUTLASS_INC"):
        inc = pathlib.Path(os.environ["CUTLASS_INC"])
    else:
        try:
            import cutlass_library
        except ImportError:
            raise SystemExit("paddle_fm3: the CUDA build needs the CUTLASS/CuTe headers: pip install nvidia-cutlass "
                             "(or set CUTLASS_INC to a CUTLASS include folder)") from None
        inc = pathlib.Path(cutlass_library.__file__).parent / "source" / "include"
    if not (inc / "cute" / "arch" / "mma_sm90_gmma.hpp").is_file():
        raise SystemExit(f"paddle_fm3: no CuTe sm90 headers under {inc} (cute/arch/mma_sm90_gmma.hpp)")
    return inc
