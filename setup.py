"""Build paddle_fm3: generate the op registration from yaml/, compile the C++
kernels and Paddle glue into paddle_fm3/_fm3_ops.so with Paddle's
cpp_extension, and install the Python package. The sources and flags are the build
package's (paddle_fm3_build/recipe.py), which the developer builds of the Hopper kernels share.

Install (README "Install"): pip install -r requirements-build.txt, then
pip install --no-build-isolation .   (builds against the Paddle already installed)

Environment switches:
  FM3_WITH_CUDA  unset: build the Hopper (sm_90a) kernels when the installed Paddle has CUDA;
                 1: build them even if it reports none (cross-compiling; the CI build check);
                 0: CPU kernels only.
  CUDA_HOME / CUDA_PATH, CUTLASS_INC: the CUDA toolkit and CUTLASS/CuTe headers of the CUDA
                 build (see find_cuda_toolkit, recipe.find_cutlass_include).
  FM3_NATIVE=1   compile with -march=native (not portable). Without it the CPU kernels are
                 portable and still use AVX2 / AVX-512 where the CPU has them (run-time choice).
  FM3_NVCC_EXTRA, FM3_CU_SRCS: developer switches of the Hopper kernels' build (recipe.py).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # the build package beside this file (not installed)
from paddle_fm3_build import codegen, recipe  # noqa: E402

try:
    import paddle
except ImportError:
    sys.exit("paddle_fm3 builds against the installed PaddlePaddle (>= 3.0), and this Python has none: install "
             "paddlepaddle (CPU) or paddlepaddle-gpu first, and build without isolation (an isolated build "
             "environment has no Paddle): pip install -r requirements-build.txt && "
             "pip install --no-build-isolation .  (README, Install)")
from paddle.utils import cpp_extension
from paddle.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

GEN_DIR = ROOT / "build" / "generated"
MIN_CUDA = (12, 3)  # wgmma / TMA / setmaxnreg for sm_90a


def _is_toolkit(path: pathlib.Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda_runtime.h").is_file()


def _nvcc_top(nvcc: str) -> pathlib.Path | None:
    """The toolkit an nvcc driver really uses (its TOP), also when it is a wrapper script."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", out, re.MULTILINE)
    return pathlib.Path(m.group(1).strip()).resolve() if m else None


def find_cuda_toolkit() -> pathlib.Path:
    """The CUDA toolkit of the CUDA build, in this order: $CUDA_HOME, $CUDA_PATH, the toolkit of
    the nvcc on PATH (its real path, or, for a wrapper outside any toolkit, the TOP nvcc reports),
    /usr/local/cuda. A toolkit has bin/nvcc and include/cuda_runtime.h; it must be CUDA >= 12.3."""
    found = None
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            path = pathlib.Path(os.environ[var]).resolve()
            if not _is_toolkit(path):
                sys.exit(f"paddle_fm3: ${var}={os.environ[var]} is not a CUDA toolkit "
                         "(no bin/nvcc and include/cuda_runtime.h there)")
            found = path, f"${var}"
            break
    nvcc = shutil.which("nvcc")
    if found is None and nvcc:
        real = pathlib.Path(os.path.realpath(nvcc)).parent.parent
        if _is_toolkit(real):
            found = real, f"the nvcc on PATH, {nvcc}"
        elif (top := _nvcc_top(nvcc)) is not None and _is_toolkit(top):
            found = top, f"the nvcc on PATH, {nvcc}, which runs the toolkit's nvcc"
    if found is None and _is_toolkit(pathlib.Path("/usr/local/cuda")):
        found = pathlib.Path("/usr/local/cuda").resolve(), "/usr/local/cuda"
    if found is None:
        sys.exit("paddle_fm3: the CUDA build needs a CUDA toolkit >= 12.3 and none was found: set CUDA_HOME, "
                 "put its nvcc on PATH, or build the CPU kernels only with FM3_WITH_CUDA=0")
    toolkit, how = found
    version = subprocess.run([str(toolkit / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", version)
    if not m or (int(m.group(1)), int(m.group(2))) < MIN_CUDA:
        sys.exit(f"paddle_fm3: the Hopper kernels need CUDA >= 12.3; the toolkit at {toolkit} ({how}) is "
                 f"{m.group(0) if m else 'of unknown version'}")
    print(f"paddle_fm3: CUDA toolkit {toolkit} (CUDA {m.group(1)}.{m.group(2)}, from {how})")
    return toolkit


def nvidia_wheel_includes() -> list[str]:
    """include/ folders of the installed nvidia-* wheels (cuDNN, cuBLAS, ... as a paddlepaddle-gpu
    install brings them), whose headers Paddle's headers include in a CUDA build."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted({str(p) for base in spec.submodule_search_locations for p in pathlib.Path(base).glob("*/include")
                   if p.is_dir()})


def want_cuda() -> bool:
    flag = os.environ.get("FM3_WITH_CUDA", "")
    if flag not in ("", "0", "1"):
        sys.exit(f"paddle_fm3: FM3_WITH_CUDA must be unset, 0 or 1, got {flag!r}")
    return flag == "1" or (flag == "" and paddle.is_compiled_with_cuda())


class BuildExt(BuildExtension.with_options(no_python_abi_suffix=True)):
    """Paddle's build_ext, less the object files it leaves under build_lib (they would be
    packaged into site-packages/build/temp.*)."""

    def run(self) -> None:
        super().run()
        lib = pathlib.Path(self.build_lib)
        for obj in lib.rglob("*.o"):
            obj.unlink()
        for d in sorted((p for p in lib.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()


def relative(sources) -> list[str]:
    """Sources as setuptools takes them: relative to this folder (the build's working directory)."""
    return [os.path.relpath(os.path.abspath(p), ROOT) for p in sources]


def paths(items) -> list[str]:
    return [str(p) for p in dict.fromkeys(items)]  # (in order, each once)


codegen.generate(GEN_DIR, py_config=ROOT / "paddle_fm3" / "_config.py")

sources = recipe.CPU_SOURCES + recipe.PADDLE_GLUE_SOURCES + [GEN_DIR / "fm3_ops_generated.cc"]
include_dirs = recipe.CPU_INCLUDE_DIRS + [GEN_DIR]
cxx_flags = recipe.CXX_FLAGS + ["-fopenmp"]  # the CPU kernels' threads
if os.environ.get("FM3_NATIVE", "0") == "1":
    cxx_flags.append("-march=native")

if want_cuda():
    toolkit = find_cuda_toolkit()
    # Paddle's cpp_extension took CUDA_HOME from `which nvcc` when paddle was imported (wrong for
    # a wrapper or link outside the toolkit); its include and library lookups read the environment.
    os.environ["CUDA_HOME"] = str(toolkit)
    cpp_extension.cpp_extension.CUDA_HOME = str(toolkit)
    cutlass_include = recipe.find_cutlass_include()
    print(f"paddle_fm3: CUTLASS/CuTe headers {cutlass_include}")
    # Searched after the toolkit's own headers (-idirafter), so a toolkit that has them wins.
    wheel_includes = nvidia_wheel_includes()
    if wheel_includes:
        print(f"paddle_fm3: CUDA library headers also from the nvidia-* wheels: {', '.join(wheel_includes)}")
    ext = CUDAExtension(
        sources=relative(sources + recipe.hopper_sources()),
        include_dirs=paths(include_dirs + recipe.hopper_include_dirs(GEN_DIR, cutlass_include)),
        extra_compile_args={"cxx": cxx_flags + ["-DFM3_WITH_CUDA"] + [f for d in wheel_includes for f in ("-idirafter", d)],
                            "nvcc": recipe.nvcc_flags()},
        extra_link_args=["-fopenmp"],
    )
else:
    ext = CppExtension(sources=relative(sources), include_dirs=paths(include_dirs),
                       extra_compile_args={"cxx": cxx_flags}, extra_link_args=["-fopenmp"])
ext.name = "paddle_fm3._fm3_ops"

# Metadata lives in pyproject.toml.
setup(
    packages=find_packages(include=["paddle_fm3", "paddle_fm3.*"]),
    package_data={"paddle_fm3": ["py.typed"]},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
