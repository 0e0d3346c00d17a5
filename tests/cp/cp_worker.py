"""Multi-process CP worker, launched by tests/test_cp_distributed.py with
``python -m paddle.distributed.launch --nproc_per_node P tests/cp/cp_worker.py OUT_DIR``.

Runs every case in one process group (few launches keep CI short) and writes
OUT_DIR/rank{r}.json: per case the max relative error of the CP forward/gradients against
single-process ``paddle_fm3.flashmask_attention`` (and of both against the float64 reference).
Assertions live in the pytest file; exceptions here are recorded, not raised, so every rank
finishes and nothing hangs on a mismatched collective.
"""

import importlib.util
import json
import os
import sys
import traceback

import numpy as np
import paddle
import paddle.distributed as dist

if importlib.util.find_spec("paddle_fm3") is None:  # not installed: use this checkout
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import paddle_fm3  # noqa: E402
from paddle_fm3 import distributed as fm3dist  # noqa: E402
from paddle_fm3 import masks, reference  # noqa: E402

paddle.set_device("cpu")
dist.init_parallel_env()
RANK, P = dist.get_rank(), dist.get_world_size()
SEG = 32
S = 256  # 8 segments of 32: n/P = 4 (P=2) or 2 (P=4)
H, HK, D = 2, 1, 16
results = []


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = max(np.abs(b).max(), 1e-30)
    return float(np.abs(a - b).max() / den)


def t(x, grad=False):
    y = paddle.to_tensor(np.ascontiguousarray(x), dtype="float32")
    y.stop_gradient = not grad
    return y


def run_case(name, sri, causal, *, batch=1, seg=SEG, plan=None, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, S, H, D)).astype(np.float32)
    k = rng.standard_normal((batch, S, HK, D)).astype(np.float32)
    v = rng.standard_normal((batch, S, HK, D)).astype(np.float32)
    do = rng.standard_normal((batch, S, H, D)).astype(np.float32)
    # single process
    qs, ks, vs = t(q, True), t(k, True), t(v, True)
    out_s, lse_s = paddle_fm3.flashmask_attention(qs, ks, vs, paddle.to_tensor(sri), causal=causal,
                                                  return_softmax_lse=True)
    (out_s * t(do)).sum().backward()
    ref_out, _ = reference.attention_forward(q, k, v, sri, causal=causal)
    ref_dq, ref_dk, ref_dv = reference.attention_backward(q, k, v, do, sri, causal=causal)
    # context parallel
    if plan is None:
        plan = fm3dist.make_cp_plan(sri, causal=causal, segment_size=seg, debug=True)
    ql = plan.dispatch(t(q)); kl = plan.dispatch(t(k)); vl = plan.dispatch(t(v))
    for x in (ql, kl, vl):
        x.stop_gradient = False
    out_l, lse_l = fm3dist.cp_flashmask_attention(ql, kl, vl, plan, return_softmax_lse=True)
    (out_l * plan.dispatch(t(do))).sum().backward()
    out_g = plan.undispatch(out_l).numpy()
    disp = lambda x: plan.dispatch(t(x)).numpy()  # noqa: E731
    lse_ref = plan.dispatch(lse_s.transpose([0, 2, 1])).numpy()
    lse_cp = lse_l.transpose([0, 2, 1]).numpy()
    fin = np.isfinite(lse_ref)
    r = {
        "case": name, "P": P, "rank": RANK,
        "out": rel(out_l.numpy(), disp(out_s.numpy())), "undispatch": rel(out_g, out_s.numpy()),
        "dq": rel(ql.grad.numpy(), disp(qs.grad.numpy())), "dk": rel(kl.grad.numpy(), disp(ks.grad.numpy())),
        "dv": rel(vl.grad.numpy(), disp(vs.grad.numpy())),
        "lse": float(np.abs(lse_cp[fin] - lse_ref[fin]).max()) if fin.any() else 0.0,
        "lse_inf_match": bool(np.array_equal(np.isneginf(lse_cp), np.isneginf(lse_ref))),
        "out64_cp": rel(out_g, ref_out), "out64_single": rel(out_s.numpy(), ref_out),
        "dq64_cp": rel(ql.grad.numpy(), disp(ref_dq)), "dq64_single": rel(qs.grad.numpy(), ref_dq),
        "dk64_cp": rel(kl.grad.numpy(), disp(ref_dk)), "dk64_single": rel(ks.grad.numpy(), ref_dk),
        "nan": bool(any(np.isnan(x).any() for x in (out_l.numpy(), ql.grad.numpy(), kl.grad.numpy(),
                                                    vl.grad.numpy()))),
        "recv_peers": len(plan.recv_peers), "send_peers": len(plan.send_peers),
        "local_rows_all_masked": bool(np.isneginf(lse_cp).all()),
        "local_out_absmax": float(np.abs(out_l.numpy()).max()),
        "stats": plan.stats(),
    }
    results.append(r)


def guarded(name, fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - recorded for the pytest side
        results.append({"case": name, "P": P, "rank": RANK, "error": traceback.format_exc()})


rng = np.random.default_rng(1234)  # same seed on every rank: same masks everywhere
for fam, build in masks.FAMILIES.items():
    fm = build(S, rng)
    guarded(fam, lambda fm=fm, fam=fam: run_case(fam, fm.startend_row_indices, fm.causal))

# batch 2 with per-head masks (H_mask = H) and documents not aligned with segments
fm = masks.causal_document([[37, 91, 128], [5, 200, 51]], S, batch=2, num_heads=H)
guarded("batch2_heads", lambda: run_case("batch2_heads", fm.startend_row_indices, True, batch=2))

# every document is one segment: no rank receives anything
fm = masks.document([SEG] * (S // SEG), S)
guarded("receives_nothing", lambda: run_case("receives_nothing", fm.startend_row_indices, False))

# only the rows of the last segment see anything (non-causal C=2: LTS=S, UTE=S-SEG): with the
# balance, some rank holds only fully masked query rows
sri = np.stack([np.full(S, S), np.full(S, S - SEG)], -1).astype(np.int32)[None, None]
guarded("all_masked_rank", lambda: run_case("all_masked_rank", sri, False))

# documents not dividing by the segment size, larger segments
fm = masks.causal_document([13, 50, 77, 3, 113], S)
guarded("docs_unaligned_seg64", lambda: run_case("docs_unaligned_seg64", fm.startend_row_indices, True, seg=64))


def bad_divisible():
    try:
        fm3dist.make_cp_plan(masks.causal(S).startend_row_indices, causal=True, segment_size=48)
    except ValueError as e:
        results.append({"case": "not_divisible", "P": P, "rank": RANK, "message": str(e)})
        return
    results.append({"case": "not_divisible", "P": P, "rank": RANK, "error": "no ValueError"})


guarded("not_divisible", bad_divisible)


def two_masks():
    sw = masks.sliding_window(S, 20)
    gl = masks.global_sliding_window(S, 8, 16)
    p_sw, p_gl = fm3dist.make_cp_plans([(sw.startend_row_indices, True), (gl.startend_row_indices, False)],
                                       segment_size=SEG, debug=True)
    assert np.array_equal(p_sw.layout.segments, p_gl.layout.segments)
    run_case("two_masks_sliding", sw.startend_row_indices, True, plan=p_sw)
    run_case("two_masks_global", gl.startend_row_indices, False, plan=p_gl)
    p3 = p_sw.for_mask(masks.causal(S).startend_row_indices, causal=True)
    assert np.array_equal(p3.layout.segments, p_sw.layout.segments)
    run_case("for_mask_causal", masks.causal(S).startend_row_indices, True, plan=p3)


guarded("two_masks", two_masks)

out_dir = sys.argv[1]
with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f)
dist.barrier()
