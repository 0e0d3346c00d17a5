"""Test helpers: random valid masks, error metric, tolerances (CPU tests)."""

import numpy as np

# Relative tolerances by dtype (max |err| / max |ref|), per the project's rules.
RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def random_startend(rng, batch, mask_heads, seqlen_q, seqlen_k, causal, cols):
    """Random valid startend_row_indices [B, Hm, S_k, C] (int32) with LTS <= LTE, UTS <= UTE."""
    shape = (batch, mask_heads, seqlen_k)
    a = rng.integers(0, seqlen_q + 1, size=shape)
    b = rng.integers(0, seqlen_q + 1, size=shape)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    if cols == 1:
        vec = [a]
    elif causal:
        vec = [lo, hi]
    elif cols == 2:
        vec = [hi, lo]  # LTS, UTE: rows >= LTS or < UTE masked; keep a visible band
    else:
        c = rng.integers(0, seqlen_q + 1, size=shape)
        d = rng.integers(0, seqlen_q + 1, size=shape)
        vec = [lo, hi, np.minimum(c, d), np.maximum(c, d)]
    return np.stack(vec, axis=-1).astype(np.int32)


def rel_err(actual, expected):
    """max |actual - expected| / max(max |expected|, 1).

    The floor of 1 is the magnitude of the summed terms for the unit-normal
    inputs used throughout: where a result cancels to ~0 (e.g. dq with a single
    visible key, where softmax is constant), rounding of O(1) terms is the
    only meaningful scale; elsewhere this is the usual relative error."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert not np.isnan(actual).any(), "NaN in kernel result (unwritten or invalid elements)"
    scale = max(np.abs(expected).max(initial=0.0), 1.0)
    return np.abs(actual - expected).max(initial=0.0) / scale
