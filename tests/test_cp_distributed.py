"""Multi-process CP tests on CPU: ``python -m paddle.distributed.launch`` with gloo, 2 and 4 ranks.

One launch per group size runs every case (tests/cp/cp_worker.py); each launch is wrapped in a
subprocess timeout so nothing hangs. Checks: every mask family, forward and gradients equal to
single-process ``flashmask_attention`` (fp32, 1e-5 relative), error not growing with P, a rank
that receives nothing, a rank whose queries are all masked (0, no NaN), documents not dividing by
the segment size, MLA's value head dim 128 under q/k's 192, a clear ValueError when S is not divisible by P * segment_size, two masks
sharing one dispatch, and a gradient penalty (an error on every rank). Learnable sinks: out, lse, dq, dk, dv and the sink's gradient against the
float64 reference (the sink's gradient on each rank is its rows' share; their sum is the whole).
"""

import pathlib

import numpy as np
import paddle
import pytest
from fm3_testutil import launch_cp_workers

from paddle_fm3 import distributed as fm3dist
from paddle_fm3 import masks, reference

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "cp" / "cp_worker.py"
TOL = 1e-5
LAUNCH_TIMEOUT = 240
_RESULTS = {}


def _launch(nproc, tmp_path_factory):
    if nproc not in _RESULTS:
        _RESULTS[nproc] = launch_cp_workers(WORKER, nproc, tmp_path_factory.mktemp(f"cp{nproc}"), LAUNCH_TIMEOUT)
    return _RESULTS[nproc]


@pytest.fixture(scope="module", params=[2, 4])
def results(request, tmp_path_factory):
    return request.param, _launch(request.param, tmp_path_factory)


def _cases(res, name=None):
    return [r for r in res if "out" in r and not r.get("sink") and (name is None or r["case"] == name)]


def test_no_errors(results):
    _, res = results
    errors = [f"{r['case']} rank {r['rank']}:\n{r['error']}" for r in res if "error" in r]
    assert not errors, "\n".join(errors)


def test_forward_and_gradients_match_single_process(results):
    p, res = results
    cases = _cases(res)
    assert len({r["case"] for r in cases}) >= 12 + 8
    for r in cases:
        for key in ("out", "undispatch", "dq", "dk", "dv"):
            assert r[key] < TOL, f"P={p} {r['case']} rank {r['rank']}: {key} rel err {r[key]:.2e}"
        assert r["lse"] < 1e-5 and r["lse_inf_match"], r["case"]
        assert not r["nan"], r["case"]


def test_error_does_not_grow_with_p(results):
    p, res = results
    for r in _cases(res):  # CP error vs float64 stays at the single-process level
        for key in ("out64", "dq64", "dk64", "dv64"):
            cp, single = r[key + "_cp"], r[key + "_single"]
            assert cp <= 3 * single + 2e-6, f"P={p} {r['case']}: {key} cp {cp:.2e} single {single:.2e}"


def test_special_cases(results):
    p, res = results
    nothing = _cases(res, "receives_nothing")
    assert len(nothing) == p and all(r["recv_peers"] == 0 and r["send_peers"] == 0 for r in nothing)
    masked = _cases(res, "all_masked_rank")
    all_masked = [r for r in masked if r["local_rows_all_masked"]]
    assert all_masked, "expected a rank whose queries are all masked"
    for r in all_masked:
        assert r["local_out_absmax"] == 0.0 and not r["nan"]
    assert len(_cases(res, "docs_unaligned_seg64")) == p
    msgs = [r for r in res if r["case"] == "not_divisible"]
    assert len(msgs) == p and all("message" in r and "divisible" in r["message"] for r in msgs)
    penalty = [r for r in res if r["case"] == "no_second_derivative"]
    assert len(penalty) == p and all("no second derivative" in r.get("message", "") for r in penalty), penalty
    for name in ("two_masks_sliding", "two_masks_global", "for_mask_causal"):
        assert len(_cases(res, name)) == p, name
    # pruning happened somewhere (segments fully masked for a rank are never sent)
    assert any(r["stats"]["remote_segments_skipped"] > 0 for r in _cases(res, "causal_document"))


def test_value_head_dim_differs_mla(results):
    """MLA's 192 / 128: out and dV have value's head dim; the KV exchange carried remote keys."""
    p, res = results
    for name in ("mla_causal_document", "mla_global_sliding_window"):
        rows = _cases(res, name)
        assert len(rows) == p, name
        for r in rows:
            assert r["out_shape"][-1] == 128 and r["dv_shape"][-1] == 128, (name, r["out_shape"], r["dv_shape"])
        assert any(r["recv_peers"] > 0 for r in rows), f"P={p} {name}: no rank received KV"


def test_frozen_inputs_get_no_gradient():
    """A q, k or v with stop_gradient (a frozen projection) gets no gradient; the others do (once
    the PyLayer's backward failed: it returned a gradient for every input)."""
    plan = fm3dist.make_cp_plan(masks.causal(32).startend_row_indices, causal=True, segment_size=16)
    q, k, v = (paddle.randn([1, 32, 2, 8]) for _ in range(3))
    q.stop_gradient = False
    fm3dist.cp_flashmask_attention(q, k, v, plan).sum().backward()
    assert q.grad is not None and float(q.grad.abs().max()) > 0 and k.grad is None and v.grad is None


SINK_CASES = ["sink_causal", "sink_document", "sink_sliding_window", "sink_qk_sparse", "sink_gqa_batch2",
              "sink_all_masked_rank"]


def test_learnable_sink_matches_reference(results):
    """The sink joins each row's log-sum-exp once: out, lse and dq, dk, dv equal the float64
    reference, and each rank's sink gradient is the share of its own rows (summed over the group:
    the reference's whole)."""
    p, res = results
    for name in SINK_CASES:
        rows = [r for r in res if r["case"] == name]
        assert len(rows) == p and all("error" not in r for r in rows), name
        for r in rows:
            for key in ("out", "undispatch", "dq", "dk", "dv", "dsink_share", "dsink_sum"):
                assert r[key] < TOL, f"P={p} {name} rank {r['rank']}: {key} rel err {r[key]:.2e}"
            assert r["lse"] < 1e-5 and not r["nan"], (name, r["rank"], r["lse"])
        # a rank's gradient is its share, not the whole (which would be counted P times by the sync)
        assert any(r["dsink_share_vs_whole"] > 0.01 for r in rows), name
        assert any(r["recv_peers"] > 0 for r in rows), f"P={p} {name}: no rank received KV"


def test_learnable_sink_fully_masked_rows(results):
    p, res = results
    rows = [r for r in res if r["case"] == "sink_all_masked_rank"]
    assert sum(r["masked_rows"] for r in rows) > 0
    for r in rows:
        assert r["masked_out_absmax"] == 0.0 and r["masked_lse_err"] < 1e-6, r


def test_learnable_sink_bad_input():
    plan = fm3dist.make_cp_plan(masks.causal(32).startend_row_indices, causal=True, segment_size=16)
    q, k, v = (paddle.randn([1, 32, h, 8]) for h in (4, 2, 2))
    with pytest.raises(ValueError, match="learnable_sink"):
        fm3dist.cp_flashmask_attention(q, k, v, plan, learnable_sink=paddle.zeros([2]))  # num_heads_k, not H
    with pytest.raises(ValueError, match="learnable_sink"):
        fm3dist.cp_flashmask_attention(q, k, v, plan, learnable_sink=paddle.zeros([1, 4]))
    with pytest.raises(TypeError, match="learnable_sink"):
        fm3dist.cp_flashmask_attention(q, k, v, plan, learnable_sink=paddle.zeros([4], dtype="int32"))
    with pytest.raises(TypeError, match="learnable_sink"):
        fm3dist.cp_flashmask_attention(q, k, v, plan, learnable_sink=np.zeros(4, np.float32))


def test_learnable_sink_dtype_and_frozen():
    """One rank (no exchange): a float16 sink is computed in float32 and gets its gradient in
    float16; a frozen sink (stop_gradient) gets none while q, k, v still do."""
    rng = np.random.default_rng(3)
    sri = masks.causal(32).startend_row_indices
    plan = fm3dist.make_cp_plan(sri, causal=True, segment_size=16)
    q, k, v, do = (rng.standard_normal([1, 32, 2, 8]).astype(np.float32) for _ in range(4))
    sink = np.array([1.5, -0.5], np.float16)
    want = reference.attention_backward(q, k, v, do, sri, causal=True, learnable_sink=sink)[3]
    ts = [paddle.to_tensor(x, stop_gradient=False) for x in (q, k, v)]
    sk = paddle.to_tensor(sink, stop_gradient=False)
    (fm3dist.cp_flashmask_attention(*ts, plan, learnable_sink=sk) * paddle.to_tensor(do)).sum().backward()
    assert sk.grad.dtype == paddle.float16
    np.testing.assert_allclose(sk.grad.numpy().astype(np.float64), want, rtol=2e-3)  # float16's rounding
    frozen = paddle.to_tensor(sink.astype(np.float32))
    fm3dist.cp_flashmask_attention(*ts, plan, learnable_sink=frozen).sum().backward()
    assert frozen.grad is None and ts[0].grad is not None
