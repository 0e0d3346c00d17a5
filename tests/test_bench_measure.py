"""scripts/bench_attention.py's measure(): the rounds of a row's implementations, in alternating order."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_attention.py"


def load():
    """The script as a module (torch is imported by its main() only). It puts the repository root first
    on sys.path, for the device machine; here the installed paddle_fm3 is imported first and sys.path
    restored, so that later tests still test the installed package."""
    import paddle_fm3.kernels  # noqa: F401
    import paddle_fm3.masks  # noqa: F401
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("bench_attention", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod


def test_rounds_alternate_and_report_the_median():
    ba, calls = load(), []

    def impl(name, values):
        it = iter(values)

        def fn():
            calls.append(name)
            return next(it)
        return fn

    def broken():
        calls.append("broken")
        raise RuntimeError("cannot run this mask")

    row = {}
    ba.measure(row, {"fm3": impl("fm3", [1.0, 5.0, 3.0]), "flex_flash": impl("flex_flash", [2.0, 2.0, 9.0]),
                     "cudnn": None, "flex_triton": broken}, rounds=3)
    assert calls == ["fm3", "flex_flash", "broken", "flex_flash", "fm3", "fm3", "flex_flash"]
    assert (row["fm3"], row["flex_flash"]) == (3.0, 2.0)
    assert row["fm3_rounds"] == [1.0, 5.0, 3.0] and row["flex_flash_rounds"] == [2.0, 2.0, 9.0]
    assert row["cudnn"] is None and "cudnn_error" not in row
    assert row["flex_triton"] is None and "cannot run this mask" in row["flex_triton_error"]


def test_one_round_keeps_the_row_as_before():
    ba = load()
    row = {}
    ba.measure(row, {"fm3": lambda: 7.0, "cudnn": None}, rounds=1)
    assert row == {"fm3": 7.0, "cudnn": None}


def test_our_kernel_failing_stops_the_run():
    ba = load()

    def broken():
        raise RuntimeError("kernel failed")
    with pytest.raises(RuntimeError, match="kernel failed"):
        ba.measure({}, {"fm3": broken, "cudnn": lambda: 1.0}, rounds=2)


def test_clocks_come_from_the_last_round():
    ba = load()
    readings = iter([(1800.0, 500.0, 0.010, 0.011), (1500.0, 690.0, 0.012, 0.010)])
    values = iter([100.0, 120.0])

    def fm3():  # what bench() leaves under --clocks: (MHz, watts, s/call over 2 s, s/call timed)
        ba._last_clocks = next(readings)
        return next(values)
    row = {}
    ba.measure(row, {"fm3": fm3}, rounds=2)
    assert row["fm3"] == 110.0 and row["fm3_rounds"] == [100.0, 120.0]
    assert (row["fm3_sm_mhz"], row["fm3_power_w"]) == (1500.0, 690.0)
    assert row["fm3_sustained"] == 100.0  # the last round's 120 TFLOP/s at 0.010 s timed, 0.012 s sustained
