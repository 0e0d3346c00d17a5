"""Test helpers: random valid masks, error metric, tolerances (CPU tests)."""

import os
import subprocess
import sys

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


def check_dsink(got, sink, lse, out, dout, exact, tol, rounding=1e-5):
    """The learnable sink's gradient ``got`` [H], a sum over every row of terms t = -exp(sink - lse)
    * sum(dout * out) of either sign, measured per head against max(sum of |t|, 1) (the sum's
    condition, floored as rel_err is; tests/gpu's check_dsink does the same): within ``rounding``
    (fp32 summation, or a half-precision sink's rounding) of the float64 sum over the out and lse the
    backward was given (out ``[B, S, H, Dv]`` in the inputs' dtype, lse ``[B, H, S]``), and within
    ``tol`` of ``exact``, the reference's gradient from the unrounded out."""
    got = np.asarray(got, dtype=np.float64)
    assert not np.isnan(got).any(), "NaN in the sink's gradient"
    d_row = (np.asarray(dout, np.float64) * np.asarray(out, np.float64)).sum(-1).transpose(0, 2, 1)
    terms = -np.exp(np.asarray(sink, np.float64)[None, :, None] - np.asarray(lse, np.float64)) * d_row
    scale = np.maximum(np.abs(terms).sum(axis=(0, 2)), 1.0)
    given = terms.sum(axis=(0, 2))
    assert np.all(np.abs(got - given) <= rounding * scale), (got, given, scale)
    assert np.all(np.abs(got - exact) <= tol * scale), (got, exact, scale)


def launch_cp_workers(worker, nproc, out_dir, timeout, args=()):
    """Run ``python -m paddle.distributed.launch --nproc_per_node nproc worker out_dir *args`` (CPU,
    gloo) under a wall-clock ``timeout``; return every rank's records (``out_dir/rank{r}.json``,
    concatenated). Fails the test on a timeout or a non-zero exit, with the ranks' log tails."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    import pytest

    out_dir = pathlib.Path(out_dir)
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # the worker finds the installed package (or this checkout)
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc),
           "--log_dir", str(out_dir / "log"), str(worker), str(out_dir), *map(str, args)]
    try:
        proc = subprocess.run(cmd, cwd=str(root), env=env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{pathlib.Path(worker).name} with {nproc} ranks timed out after {timeout}s: {e}")
    logs = "".join(p.read_text()[-3000:] for p in sorted((out_dir / "log").glob("workerlog.*")))
    assert proc.returncode == 0, (f"launch failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}\n{logs}")
    res = []
    for r in range(nproc):
        res += json.loads((out_dir / f"rank{r}.json").read_text())
    return res


def run_without_paddle(code: str, cwd) -> str:
    """Run ``code`` in a fresh interpreter (same ``paddle_fm3`` as this one) where ``import paddle``
    fails; returns its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", "import sys; sys.modules['paddle'] = None\n" + code],
                         capture_output=True, text=True, cwd=cwd, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def dlpack_available() -> bool:
    """Whether the installed paddle_fm3.kernels module is built (scripts/run_tests.sh builds it)."""
    from paddle_fm3 import kernels
    return kernels.available()


NO_DLPACK = "paddle_fm3.kernels not built (scripts/run_tests.sh builds it into the installed package)"
