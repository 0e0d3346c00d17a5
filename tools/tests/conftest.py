"""The tools' tests share the CPU tests' helpers (tests/fm3_testutil.py)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
