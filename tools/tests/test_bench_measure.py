"""tools/bench_attention.py's measure(): the rounds of a row's implementations, in alternating order."""
import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench_attention.py"


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


def test_random_params_are_reproducible_and_differ_from_the_fixed_instance():
    """--random-params: an instance per (family, seed), the same on every call; seed None is the fixed
    instance of before (the generator of seed 0); different seeds give different instances."""
    import argparse
    import numpy as np

    ba = load()
    args = argparse.Namespace(families="document,sliding_window", random_params=[1, 2, 3])
    assert ba.instances(args) == [("document", 1), ("document", 2), ("document", 3),
                                  ("sliding_window", 1), ("sliding_window", 2), ("sliding_window", 3)]
    assert ba.instances(argparse.Namespace(families="causal", random_params=None)) == [("causal", None)]
    for fam in ("document", "sliding_window", "prefix_lm_causal", "qk_sparse"):
        a, _, pa = ba.family_mask(fam, 4096, 2, seed=7)
        b, _, pb = ba.family_mask(fam, 4096, 2, seed=7)
        assert np.array_equal(a, b) and pa == pb
        fixed, _, _ = ba.family_mask(fam, 4096, 2)
        drawn = [ba.family_mask(fam, 4096, 2, seed=s)[0] for s in (1, 2, 3)]
        assert any(not np.array_equal(x, fixed) for x in drawn)
        assert not all(np.array_equal(drawn[0], x) for x in drawn[1:])


def test_summary_reports_the_worst_seed():
    spec = importlib.util.spec_from_file_location("bench_summary", SCRIPT.parent / "bench_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"family": "document", "head_dim": 128, "seqlen": 8192, "fm3": f, "flex_flash": p, "cudnn": None,
             "params_seed": s, "density": dens} for f, p, s, dens in
            ((500.0, 450.0, 1, 0.2), (480.0, 520.0, 2, 0.3), (510.0, 500.0, 3, 0.25))]
    table = mod.worst_ratios(rows)
    key = (128, 128, 8192, "document")
    assert set(table) == {key + ("flex_flash",), key + ("fastest",)}  # cudnn null: no column
    v = table[key + ("flex_flash",)]
    assert v["seed"] == 2 and v["density"] == 0.3 and v["n"] == 3
    assert v["worst"] == pytest.approx(480 / 520) and v["median"] == pytest.approx(510 / 500)


def test_summary_fastest_is_each_rows_best_peer():
    spec = importlib.util.spec_from_file_location("bench_summary", SCRIPT.parent / "bench_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"family": "causal", "head_dim": 64, "seqlen": 8192, "fm3": 500.0, "fa4": fa4, "flex_flash": flash,
             "cudnn": cudnn, "params_seed": s, "density": 0.5}
            for fa4, flash, cudnn, s in ((550.0, 450.0, 400.0, 1), (None, 480.0, 520.0, 2), (540.0, 560.0, None, 3))]
    v = mod.worst_ratios(rows)[(64, 64, 8192, "causal", "fastest")]
    assert v["worst"] == pytest.approx(500 / 560) and v["seed"] == 3 and v["n"] == 3
    assert mod.with_fastest(rows[1])["fastest_peer"] == "cudnn"


def test_summary_leaves_out_a_disagreeing_fa4():
    spec = importlib.util.spec_from_file_location("bench_summary", SCRIPT.parent / "bench_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    row = {"family": "causal", "head_dim": 80, "seqlen": 8192, "fm3": 440.0, "fa4": 490.0, "cudnn": 350.0,
           "params_seed": 1, "density": 0.5}
    agree = [{**row, "fa4_maxdiff": 0.0156}, {**row, "fa4_maxdiff": 0.5, "fa4_reldiff": 0.004}]
    disagree = [{**row, "fa4_maxdiff": 2.98}, {**row, "fa4_maxdiff": 0.02, "fa4_reldiff": 1.2}]
    for r in agree:
        assert not mod.fa4_disagrees(r) and mod.with_fastest(r)["fastest_peer"] == "fa4"
    for r in disagree:
        assert mod.fa4_disagrees(r) and mod.with_fastest(r)["fastest_peer"] == "cudnn"
    table = mod.worst_ratios(disagree)
    assert table[(80, 80, 8192, "causal", "fastest")]["worst"] == pytest.approx(440 / 350)
    assert table[(80, 80, 8192, "causal", "fa4")]["worst"] == pytest.approx(440 / 490)  # its own column stays


def test_fa4_window_peer_only_for_causal_sliding_windows():
    # The sliding-window family maps to FlashAttention-4's window_size=(w, 0); no other family does.
    import numpy as np

    from paddle_fm3 import masks as M
    ba = load()
    for seed in (1, 2, 3):
        sri, causal, _ = ba.family_mask("sliding_window", 2048, 2, seed=seed)
        w = ba.causal_window(sri, causal)
        assert w is not None
        visible = M.to_dense(sri, causal)
        i, j = np.meshgrid(np.arange(2048), np.arange(2048), indexing="ij")
        assert np.array_equal(visible[0, 0], (j <= i) & (j >= i - w))
    for fam in ("full", "global_sliding_window", "causal_document", "prefix_lm_causal"):
        sri, causal, _ = ba.family_mask(fam, 2048, 2, seed=1)
        assert ba.causal_window(sri, causal) is None
    sri, causal, _ = ba.family_mask("causal", 2048, 2)
    assert ba.causal_window(sri, causal) == 2047  # the whole past (fa4_peer calls it causal first)
