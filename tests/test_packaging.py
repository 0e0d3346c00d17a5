"""The package as installed (metadata, files), the message without Paddle, and how setup.py
chooses the CUDA build (FM3_WITH_CUDA, the toolkit and its version), run on a copy of the build
files with `setup.py --name` (configures the extension, compiles nothing)."""

import importlib.metadata
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_installed_files_have_no_build_objects_and_carry_py_typed():
    files = [str(f) for f in importlib.metadata.files("paddle_fm3")]
    assert not [f for f in files if f.endswith(".o")], "object files were installed"
    assert not [f for f in files if f.startswith("build/")]
    assert "paddle_fm3/py.typed" in files
    assert any(f.startswith("paddle_fm3/_fm3_ops") and f.endswith(".so") for f in files)


def test_metadata_leaves_paddle_out_and_dev_extra_brings_the_test_tools():
    meta = importlib.metadata.metadata("paddle_fm3")
    requires = importlib.metadata.requires("paddle_fm3") or []
    names = [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-") for r in requires]
    assert not {"paddlepaddle", "paddlepaddle-gpu"} & set(names), requires  # CPU and GPU users differ
    dev = [r.split(";")[0].strip() for r in requires if 'extra == "dev"' in r]
    for tool in ("pytest", "pytest-timeout", "hypothesis"):
        assert tool in dev, dev
    assert meta["Requires-Python"] == ">=3.9"
    assert meta["License-Expression"] == "Apache-2.0"


def test_without_paddle_the_paddle_facing_names_say_what_to_install(tmp_path):
    code = ("import sys; sys.modules['paddle'] = None\n"
            "import paddle_fm3\n"
            "from paddle_fm3 import masks, reference\n"  # numpy only: these work
            "masks.causal(8)\n"
            "try:\n"
            "    paddle_fm3.flashmask_attention\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "paddle_fm3.flashmask_attention needs PaddlePaddle 3.x" in out.stdout
    assert "pip install paddlepaddle" in out.stdout


def _build_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    src = tmp_path / "src"
    for rel in ("setup.py", "pyproject.toml", "README.md"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    shutil.copytree(ROOT / "paddle_fm3_build", src / "paddle_fm3_build", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "yaml", src / "yaml")
    shutil.copytree(ROOT / "paddle_fm3", src / "paddle_fm3", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return src


def test_build_package_command_line_generates(tmp_path):
    """python -m paddle_fm3_build (the command line under scripts/gpu_build.sh) writes the generated
    sources as setup.py's build does."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "paddle_fm3_build", "generate", "--out-dir", str(tmp_path / "gen"),
                          "--py-config", str(tmp_path / "config.py")], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "kSm90Configs" in (tmp_path / "gen" / "fm3_generated_config.h").read_text()
    assert (tmp_path / "gen" / "fm3_ops_generated.cc").is_file()
    assert "SM90_HEAD_DIMS" in (tmp_path / "config.py").read_text()


def _fake_toolkit(root: pathlib.Path, release: str) -> pathlib.Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return root


def _setup(src: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FM3_WITH_CUDA")}
    full.update(env)
    return subprocess.run([sys.executable, "setup.py", "--name"], cwd=src, env=full, capture_output=True,
                          text=True, timeout=300)


def test_setup_without_paddle_says_to_build_without_isolation(tmp_path):
    code = "import runpy, sys; sys.modules['paddle'] = None; sys.argv = ['setup.py', '--name']; " \
           "runpy.run_path('setup.py', run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", code], cwd=_build_copy(tmp_path), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0
    assert "an isolated build environment has no Paddle" in out.stderr
    assert "pip install --no-build-isolation ." in out.stderr


def test_setup_rejects_a_bad_fm3_with_cuda(tmp_path):
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="yes")
    assert out.returncode != 0
    assert "FM3_WITH_CUDA must be unset, 0 or 1, got 'yes'" in out.stderr


def test_setup_cpu_build_without_cuda_flag(tmp_path):
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="0")
    assert out.returncode == 0, out.stderr
    assert "paddle_fm3" in out.stdout and "CUDA toolkit" not in out.stdout


def test_setup_cuda_home_that_is_no_toolkit(tmp_path):
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="1", CUDA_HOME=str(tmp_path / "nowhere"))
    assert out.returncode != 0
    assert f"$CUDA_HOME={tmp_path / 'nowhere'} is not a CUDA toolkit" in out.stderr


def test_setup_requires_cuda_12_3(tmp_path):
    old = _fake_toolkit(tmp_path / "cuda-12.2", "12.2")
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="1", CUDA_PATH=str(old))
    assert out.returncode != 0
    assert "the Hopper kernels need CUDA >= 12.3" in out.stderr and "release 12.2" in out.stderr


def test_setup_says_which_toolkit_it_uses(tmp_path):
    pytest.importorskip("cutlass_library")
    kit = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="1", CUDA_HOME=str(kit))
    assert out.returncode == 0, out.stderr
    assert f"paddle_fm3: CUDA toolkit {kit.resolve()} (CUDA 12.4, from $CUDA_HOME)" in out.stdout


def test_setup_takes_cuda_library_headers_from_nvidia_wheels(tmp_path):
    """cuDNN & co. of a paddlepaddle-gpu install come as nvidia-* wheels (site-packages/nvidia/*/include)."""
    pytest.importorskip("cutlass_library")
    kit = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    site = tmp_path / "site"
    (site / "nvidia" / "cudnn" / "include").mkdir(parents=True)
    (site / "nvidia" / "cudnn" / "include" / "cudnn.h").write_text("")
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="1", CUDA_HOME=str(kit), PYTHONPATH=str(site))
    assert out.returncode == 0, out.stderr
    assert f"CUDA library headers also from the nvidia-* wheels: {site / 'nvidia' / 'cudnn' / 'include'}" in out.stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs an nvcc on PATH")
def test_setup_follows_an_nvcc_wrapper_outside_the_toolkit(tmp_path):
    """An nvcc on PATH that is a wrapper script elsewhere (as /usr/local/bin/nvcc on our CPU
    machines): Paddle's own lookup takes its parent folder; setup.py finds the real toolkit."""
    pytest.importorskip("cutlass_library")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec "{shutil.which("nvcc")}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    out = _setup(_build_copy(tmp_path), FM3_WITH_CUDA="1", PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("paddle_fm3: CUDA toolkit "))
    kit = pathlib.Path(line.split()[3])
    assert (kit / "bin" / "nvcc").is_file() and (kit / "include" / "cuda_runtime.h").is_file(), line
    assert f"from the nvcc on PATH, {wrapper}" in line
