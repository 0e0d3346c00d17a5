"""Shared by the multi-process CP workers (tests/cp/*_worker.py): one CP attention case compared
with single-process ``paddle_fm3.flashmask_attention`` and the float64 reference, and the guard
that records a case's exception instead of raising it (so every rank reaches the next collective
and nothing hangs)."""

import importlib.util
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
from paddle_fm3 import reference  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = max(np.abs(b).max(), 1e-30)
    return float(np.abs(a - b).max() / den)


def t(x, grad=False):
    y = paddle.to_tensor(np.ascontiguousarray(x), dtype="float32")
    y.stop_gradient = not grad
    return y


def idle(plan) -> bool:
    """The rank sends and receives no KV under ``plan``."""
    return not plan.recv_peers and not plan.send_peers


def run_case(name, sri, causal, *, heads=(2, 1, 16), batch=1, seg=32, plan=None, seed=0, head_dim_v=None):
    """One CP forward + backward of ``sri`` against single-process attention; returns the record.
    ``head_dim_v``: value's head dim when it differs from ``heads``' (MLA's 128 under 192)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    h, hk, d = heads
    dv = d if head_dim_v is None else head_dim_v
    s = sri.shape[2]
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, s, h, d)).astype(np.float32)
    k = rng.standard_normal((batch, s, hk, d)).astype(np.float32)
    v = rng.standard_normal((batch, s, hk, dv)).astype(np.float32)
    do = rng.standard_normal((batch, s, h, dv)).astype(np.float32)
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
    return {
        "case": name, "P": world, "rank": rank,
        "out": rel(out_l.numpy(), disp(out_s.numpy())), "undispatch": rel(out_g, out_s.numpy()),
        "dq": rel(ql.grad.numpy(), disp(qs.grad.numpy())), "dk": rel(kl.grad.numpy(), disp(ks.grad.numpy())),
        "dv": rel(vl.grad.numpy(), disp(vs.grad.numpy())),
        "lse": float(np.abs(lse_cp[fin] - lse_ref[fin]).max()) if fin.any() else 0.0,
        "lse_inf_match": bool(np.array_equal(np.isneginf(lse_cp), np.isneginf(lse_ref))),
        "out64_cp": rel(out_g, ref_out), "out64_single": rel(out_s.numpy(), ref_out),
        "dq64_cp": rel(ql.grad.numpy(), disp(ref_dq)), "dq64_single": rel(qs.grad.numpy(), ref_dq),
        "dk64_cp": rel(kl.grad.numpy(), disp(ref_dk)), "dk64_single": rel(ks.grad.numpy(), ref_dk),
        "dv64_cp": rel(vl.grad.numpy(), disp(ref_dv)), "dv64_single": rel(vs.grad.numpy(), ref_dv),
        "out_shape": list(out_l.shape), "dv_shape": list(vl.grad.shape),
        "nan": bool(any(np.isnan(x).any() for x in (out_l.numpy(), ql.grad.numpy(), kl.grad.numpy(),
                                                    vl.grad.numpy()))),
        "recv_peers": len(plan.recv_peers), "send_peers": len(plan.send_peers), "idle": idle(plan),
        "local_rows_all_masked": bool(np.isneginf(lse_cp).all()),
        "local_out_absmax": float(np.abs(out_l.numpy()).max()),
        "stats": plan.stats(),
    }


def run_sink_case(name, sri, causal, *, heads=(2, 1, 16), batch=1, seg=32, seed=0):
    """One CP forward + backward with a learnable sink against the float64 reference (which has
    the sink; the single-process op may not). The sink's gradient is this rank's share: it is
    compared with the reference's share of the rank's rows, and its all-reduced sum over the
    group with the reference's whole ``dsink``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    h, hk, d = heads
    s = sri.shape[2]
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, s, h, d)).astype(np.float32)
    k = rng.standard_normal((batch, s, hk, d)).astype(np.float32)
    v = rng.standard_normal((batch, s, hk, d)).astype(np.float32)
    do = rng.standard_normal((batch, s, h, d)).astype(np.float32)
    sink = (rng.standard_normal(h) * 2).astype(np.float32)  # some rows' sink outweighs their keys
    ref_out, ref_lse = reference.attention_forward(q, k, v, sri, causal=causal, learnable_sink=sink)
    ref_dq, ref_dk, ref_dv, ref_dsink = reference.attention_backward(q, k, v, do, sri, causal=causal,
                                                                     learnable_sink=sink)
    plan = fm3dist.make_cp_plan(sri, causal=causal, segment_size=seg, debug=True)
    ql = plan.dispatch(t(q)); kl = plan.dispatch(t(k)); vl = plan.dispatch(t(v))
    sk = t(sink, True)
    for x in (ql, kl, vl):
        x.stop_gradient = False
    out_l, lse_l = fm3dist.cp_flashmask_attention(ql, kl, vl, plan, return_softmax_lse=True, learnable_sink=sk)
    (out_l * plan.dispatch(t(do))).sum().backward()
    dsink_local = sk.grad.numpy().astype(np.float64)
    dsink_sum = sk.grad.clone()
    dist.all_reduce(dsink_sum)  # what the grad sync of a replicated weight does (SUM over the group)
    disp = lambda x: plan.dispatch(t(x)).numpy()  # noqa: E731
    lse_ref = disp(ref_lse.transpose(0, 2, 1))  # [B, L, H] of the rank's rows
    lse_cp = lse_l.transpose([0, 2, 1]).numpy()
    # the reference's dsink over this rank's rows only (the same formula as reference.attention_backward)
    d_row = disp((do.astype(np.float64) * ref_out).sum(-1))  # [B, L, H]
    share = -(np.exp(sink[None, None, :] - lse_ref.astype(np.float64)) * d_row).sum((0, 1))
    masked = ~reference.dense_visibility(batch, s, s, h, hk, sri, causal=causal).any(-1)  # [B, H, S]
    masked_l = disp(masked.transpose(0, 2, 1).astype(np.float32)) > 0.5
    return {
        "case": name, "P": world, "rank": rank, "sink": True,
        "out": rel(out_l.numpy(), disp(ref_out)), "undispatch": rel(plan.undispatch(out_l).numpy(), ref_out),
        "lse": float(np.abs(lse_cp - lse_ref).max()),
        "dq": rel(ql.grad.numpy(), disp(ref_dq)), "dk": rel(kl.grad.numpy(), disp(ref_dk)),
        "dv": rel(vl.grad.numpy(), disp(ref_dv)),
        "dsink_share": rel(dsink_local, share), "dsink_sum": rel(dsink_sum.numpy(), ref_dsink),
        "dsink_share_vs_whole": rel(dsink_local, ref_dsink),  # a share, not the whole: far from 0
        "masked_rows": int(masked_l.sum()),
        # rows that see no key: out exactly 0, lse exactly the sink
        "masked_out_absmax": float(np.abs(out_l.numpy()[masked_l]).max()) if masked_l.any() else 0.0,
        "masked_lse_err": float(np.abs(lse_cp[masked_l] - np.broadcast_to(sink, lse_cp.shape)[masked_l]).max())
        if masked_l.any() else 0.0,
        "nan": bool(any(np.isnan(x).any() for x in (out_l.numpy(), lse_cp, ql.grad.numpy(), kl.grad.numpy(),
                                                    vl.grad.numpy(), dsink_local))),
        "recv_peers": len(plan.recv_peers),
    }


def guarded(results, name, fn):
    """Run ``fn()``; record its exception (with the traceback) in ``results`` instead of raising."""
    try:
        fn()
    except Exception:  # noqa: BLE001 - recorded for the pytest side
        results.append({"case": name, "P": dist.get_world_size(), "rank": dist.get_rank(),
                        "error": traceback.format_exc()})
