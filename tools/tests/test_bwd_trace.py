"""tools/bwd_trace.py's summary of a per-CTA trace, on traces with known phase times."""

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "bwd_trace.py"
spec = importlib.util.spec_from_file_location("bwd_trace", SCRIPT)
bwd_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bwd_trace)


def trace(starts_ns, tiles, sms, fixed_ns=4000, per_tile_ns=2000):
    """A trace whose CTAs last fixed + per_tile x tiles, phases evenly spread over that."""
    raw = np.zeros((len(starts_ns) + 1, bwd_trace.NSLOTS), np.uint64)  # + one CTA that never ran
    for i, (t0, n, sm) in enumerate(zip(starts_ns, tiles, sms)):
        length = fixed_ns + per_tile_ns * n
        raw[i, :len(bwd_trace.SLOTS)] = [t0 + length * j // (len(bwd_trace.SLOTS) - 1) for j in range(len(bwd_trace.SLOTS))]
        raw[i, -1] = (sm << 32) | n
    return raw


def test_fit_recovers_fixed_and_per_tile_cost():
    tiles = [1, 5, 9, 2, 7]
    r = bwd_trace.summarize(trace([1_000 + 10_000 * i for i in range(5)], tiles, [0, 1, 2, 3, 4]))
    assert r["ctas"] == 5
    assert abs(r["fit_fixed_us"] - 4.0) < 1e-6 and abs(r["fit_per_tile_us"] - 2.0) < 1e-6
    assert r["phase_median_us"]["start"] == 0.0
    assert r["phase_median_us"]["writer_done"] == r["cta_median_us"] == 4.0 + 2.0 * np.median(tiles)


def test_same_sm_gap_is_next_start_minus_previous_end():
    # two CTAs of 3 tiles (10 us) on SM 0, the second starting 1.5 us after the first ends
    r = bwd_trace.summarize(trace([1_000, 12_500], [3, 3], [0, 0]))
    assert abs(r["sm_gap_median_us"] - 1.5) < 1e-9
    assert "fit_fixed_us" not in r  # one tile count: nothing to fit
    assert abs(r["wall_us"] - 21.5) < 1e-9
