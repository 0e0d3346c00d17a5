"""Multi-process CP (gloo, 3 ranks; tests/cp/cp_checks_worker.py): ranks given different masks get
a clear error on every rank when the plan is made, with no setting needed (once, masks whose
exchange sizes agreed ran silently with outputs 25-105% off); and CP in float16 on the CPU (once a
raw Paddle error: ``index_select`` has no float16 CPU kernel) and bfloat16 matches single-process
attention. One launch, under a subprocess timeout."""

import pathlib

import numpy as np
import pytest
from fm3_testutil import launch_cp_workers

from paddle_fm3 import distributed as fm3dist
from paddle_fm3 import masks

WORKER = pathlib.Path(__file__).resolve().parent / "cp" / "cp_checks_worker.py"
P = 3
LAUNCH_TIMEOUT = 240
HALF_TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}  # CP against single process: a rounding apart


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launch_cp_workers(WORKER, P, tmp_path_factory.mktemp("cpchecks"), LAUNCH_TIMEOUT)


def _rows(res, name):
    rows = [r for r in res if r["case"] == name]
    errors = [f"rank {r['rank']}:\n{r['error']}" for r in rows if "error" in r]
    assert not errors, f"{name}:\n" + "\n".join(errors)
    assert len(rows) == P, rows
    return rows


@pytest.mark.parametrize("name", ["shifted_documents", "shifted_plans", "shifted_for_mask"])
def test_different_masks_fail_on_every_rank_by_default(results, name):
    for r in _rows(results, name):
        assert r["same_exchange_sizes"], "the masks were meant to need the same exchange sizes"
        assert "differ" in r["message"] and "mask" in r["message"], r["message"]


@pytest.mark.parametrize("name,needles", [("call_layouts", ["num_heads_k", "differs"]),
                                          ("call_scales", ["softmax_scale", "differs"]),
                                          ("call_scores_overflow", ["softmax_scale=1000.0 is too large"]),
                                          ("undispatch_shapes", ["undispatch", "differs"])])
def test_calls_that_differ_or_overflow_fail_on_every_rank(results, name, needles):
    """Once ranks whose num_heads_k x head_dim agreed exchanged their KV blocks in different layouts
    and returned wrong outputs with exit 0; a scale too large gave NaN instead of the single-process
    ValueError."""
    for r in _rows(results, name):
        assert all(n in r["message"] for n in needles), r["message"]


def test_one_rank_scores_overflow_is_the_single_process_error():
    import paddle

    plan = fm3dist.make_cp_plan(masks.causal(64).startend_row_indices, causal=True, segment_size=16)
    q = paddle.to_tensor(np.random.default_rng(3).standard_normal((1, 64, 2, 16)).astype(np.float32) * 1e18)
    with pytest.raises(ValueError, match="softmax_scale=1000.0 is too large"):
        fm3dist.cp_flashmask_attention(plan.dispatch(q), plan.dispatch(q), plan.dispatch(q), plan, softmax_scale=1e3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_matches_single_process(results, dtype):
    for r in _rows(results, f"half_{dtype}"):
        assert r["dtypes"] == [f"paddle.{dtype}"] * 4, r["dtypes"]
        for key in ("out", "undispatch", "dq", "dk", "dv"):
            assert r[key] < HALF_TOL[dtype], f"rank {r['rank']}: {key} rel err {r[key]:.2e}"
        for key in ("out64", "dq64", "dk64", "dv64"):  # CP is as close to float64 as one process
            assert r[key + "_cp"] <= 2 * r[key + "_single"] + HALF_TOL[dtype] / 4, (key, r)


def test_one_rank_float16_dispatch_and_undispatch():
    """One rank, no process group: dispatch / undispatch of float16 move the values exactly and
    take their gradients back (the same helper as the exchange's row selection)."""
    import paddle

    plan = fm3dist.make_cp_plan(masks.causal(64).startend_row_indices, causal=True, segment_size=16)
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((2, 64, 3)).astype(np.float16))
    x.stop_gradient = False
    local = plan.dispatch(x)
    back = plan.undispatch(local)
    assert local.dtype == back.dtype == paddle.float16
    np.testing.assert_array_equal(back.numpy(), x.numpy())
    (back.astype("float32") * 2).sum().backward()
    assert x.grad.dtype == paddle.float16 and (x.grad.numpy() == 2).all()
