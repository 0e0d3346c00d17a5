"""Build paddle_fm3: generate the op registration from yaml/, compile the C++
kernels and Paddle glue into paddle_fm3/_fm3_ops.so with Paddle's
cpp_extension, and install the Python package.

Install: pip install --no-build-isolation .   (needs paddlepaddle installed)
"""

import os
import pathlib
import subprocess
import sys

from setuptools import find_packages, setup

import paddle
from paddle.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

ROOT = pathlib.Path(__file__).resolve().parent
GEN_DIR = ROOT / "build" / "generated"


def generate() -> None:
    subprocess.check_call([sys.executable, str(ROOT / "scripts" / "gen_ops.py"), "--out-dir", str(GEN_DIR),
                           "--py-config", str(ROOT / "paddle_fm3" / "_config.py")])


generate()

sources = ["ops/cpu/flashmask_cpu.cc", "ops/cpu/segment_workload.cc", "ops/paddle/fm3_paddle_kernels.cc", str(GEN_DIR / "fm3_ops_generated.cc")]
include_dirs = [str(ROOT / "ops" / "include"), str(ROOT / "ops" / "cpu"), str(GEN_DIR)]
cxx_flags = ["-O3", "-fopenmp", "-std=c++17"]
if os.environ.get("FM3_NATIVE", "1") == "1":
    cxx_flags.append("-march=native")

# The Hopper kernels join the build only where a CUDA-enabled Paddle and nvcc exist.
with_cuda = paddle.is_compiled_with_cuda() and os.environ.get("FM3_WITH_CUDA", "1") == "1"
if with_cuda:
    ext = CUDAExtension(
        sources=sources + [str(p) for p in sorted((ROOT / "ops" / "hopper").glob("*.cu"))],
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags + ["-DFM3_WITH_CUDA"],
                            "nvcc": ["-O3", "-std=c++17", "-DFM3_WITH_CUDA",
                                     "-gencode=arch=compute_90a,code=sm_90a"]},
        extra_link_args=["-fopenmp"],
    )
else:
    ext = CppExtension(sources=sources, include_dirs=include_dirs,
                       extra_compile_args={"cxx": cxx_flags}, extra_link_args=["-fopenmp"])
ext.name = "paddle_fm3._fm3_ops"

setup(
    name="paddle_fm3",
    version="0.1.0",
    description="FlashMask-3: mask-aware attention for PaddlePaddle (CPU and Hopper kernels, context parallelism)",
    packages=find_packages(include=["paddle_fm3", "paddle_fm3.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)},
    python_requires=">=3.9",
    install_requires=["numpy", "pyyaml", "tqdm"],
    zip_safe=False,
)
