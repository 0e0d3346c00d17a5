"""The main job's habits: examples/train_packed_lm.py draws its progress bar only on a terminal, its
`train` extra (not the package) brings what it imports beyond Paddle and paddle_fm3, `--help` answers
without Paddle or any set-up, and scripts/setup_env.sh (sourced by run_main.sh and run_tests.sh) says
what it does before pip and runs pip only when a build input changed."""

import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_packed_lm.py"


class Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("fm3_train_script", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_progress_bar_only_when_stdout_and_stderr_are_terminals(train):
    assert train.show_progress(False, (Stream(True), Stream(True))) is True
    assert train.show_progress(False, (Stream(False), Stream(True))) is False
    assert train.show_progress(False, (Stream(True), Stream(False))) is False
    assert train.show_progress(True, (Stream(True), Stream(True))) is False  # --no-progress
    assert train.show_progress(False, (object(), Stream(True))) is False  # a stream without isatty


def test_piped_run_prints_step_lines_and_no_bar(tmp_path):
    """Without --no-progress, output to a pipe: the plain step lines, no tqdm bar."""
    args = ["--steps", "2", "--seq-len", "64", "--batch-size", "2", "--n-layers", "1", "--d-model", "32",
            "--max-doc-len", "100", "--eval-rows", "0", "--samples", "0", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run([sys.executable, str(TRAIN), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.findall(r"^step (\d)/2 loss \S+$", proc.stdout, re.M) == ["1", "2"], proc.stdout[-2000:]
    assert "train:" not in out and "step/s" not in out and "s/step" not in out, out[-2000:]


def test_main_job_needs_are_its_extra_not_the_package():
    requires = importlib.metadata.requires("paddle_fm3") or []
    name = lambda r: re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()  # noqa: E731
    plain = [name(r) for r in requires if "extra ==" not in r]
    train = [name(r) for r in requires if 'extra == "train"' in r]
    assert not {"tqdm", "matplotlib"} & set(plain), requires
    assert {"tqdm", "matplotlib"} <= set(train), requires


def test_help_needs_no_paddle_and_no_set_up(tmp_path):
    """`run_main.sh --help` answers before setup_env.sh: with the system python3, even where numpy and
    Paddle are not importable; the venv is not created."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    for mod in ("numpy", "paddle", "tqdm"):
        (blocker / f"{mod}.py").write_text(f"raise ImportError('{mod} blocked by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(blocker), FM3_VENV=str(tmp_path / "venv"))
    for flag in ("--help", "-h"):
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "run_main.sh"), "--steps", "3", flag], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "--resume" in proc.stdout and "--mask" in proc.stdout, proc.stdout[-2000:]
        assert "paddle_fm3:" not in proc.stderr, proc.stderr  # setup_env.sh did not run
    assert not (tmp_path / "venv").exists()
    bad = subprocess.run([sys.executable, str(TRAIN), "--steps", "0"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "--steps must be >= 1" in bad.stderr, bad.stderr[-2000:]  # before numpy too


# ---------------------------------------------------------------------------
# scripts/setup_env.sh on a copy of the build's inputs, with a venv whose python logs pip runs
# ---------------------------------------------------------------------------


def make_tree(tmp_path):
    root = tmp_path / "root"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup_env.sh", root / "scripts" / "setup_env.sh")
    for rel in ("requirements.txt", "requirements-build.txt", "pyproject.toml", "setup.py", "scripts/gen_ops.py",
                "yaml/ops.yaml", "ops/cpu/kernel.cc", "paddle_fm3/__init__.py", "README.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{rel}\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    # "python -m pip ..." is logged and succeeds; anything else runs on this interpreter, which has
    # paddle and an installed paddle_fm3 (the script's check that the installed copy imports).
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {log}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\n')
    return root, venv, log


def pip_runs(root, venv, log, **env):
    before = log.read_text().count("\n") if log.exists() else 0
    full = {k: v for k, v in os.environ.items() if k != "FM3_REINSTALL"}
    full.update(FM3_VENV=str(venv), **env)
    proc = subprocess.run(["bash", str(root / "scripts" / "setup_env.sh")], env=full, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = (log.read_text().count("\n") if log.exists() else 0) - before
    # A run that installs says so before pip starts (a fresh one is quiet for minutes otherwise).
    assert ("paddle_fm3: installing" in proc.stderr) == (runs > 0), proc.stderr[-3000:]
    return runs


def test_setup_env_runs_pip_only_when_a_build_input_changed(tmp_path):
    root, venv, log = make_tree(tmp_path)
    assert pip_runs(root, venv, log) == 2  # no stamp: the requirements, then the package
    assert pip_runs(root, venv, log) == 0  # nothing changed
    (root / "README.md").write_text("docs only\n")
    (root / "paddle_fm3" / "_config.py").write_text("# written by the build\n")
    (root / "paddle_fm3" / "__pycache__").mkdir()
    (root / "paddle_fm3" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert pip_runs(root, venv, log) == 0  # none of these is a build input
    (root / "ops" / "cpu" / "kernel.cc").write_text("changed\n")
    assert pip_runs(root, venv, log) == 2  # a changed source reinstalls
    assert pip_runs(root, venv, log) == 0
    (root / "ops" / "cpu" / "new.h").write_text("new\n")
    assert pip_runs(root, venv, log) == 2  # so does a new one
    (root / "pyproject.toml").write_text("changed\n")
    assert pip_runs(root, venv, log) == 2
    assert pip_runs(root, venv, log, FM3_WITH_CUDA="0") == 2  # the build's switches count
    assert pip_runs(root, venv, log, FM3_WITH_CUDA="0", FM3_REINSTALL="1") == 2  # forced
    assert pip_runs(root, venv, log, FM3_WITH_CUDA="0") == 0
