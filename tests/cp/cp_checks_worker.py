"""Multi-process CP worker for the plan-agreement check and half-precision CP (issue 45, items 4
and 5), launched by tests/test_cp_checks.py with
``python -m paddle.distributed.launch --nproc_per_node 3 tests/cp/cp_checks_worker.py OUT_DIR``.

- ``shifted_documents``: rank r's causal documents have their boundaries shifted by 3 x r
  (S = 1536): different masks on every rank that need the same exchange sizes, so nothing in the
  exchange notices. ``make_cp_plan`` with its defaults (no ``FM3_CP_DEBUG``) must raise on every rank.
- ``shifted_plans`` / ``shifted_for_mask``: the same through ``make_cp_plans`` (the second mask
  differs) and ``CPPlan.for_mask``.
- ``half_float16`` / ``half_bfloat16``: CP forward and backward in half precision against
  single-process ``flashmask_attention`` and the float64 reference.
- ``call_layouts`` / ``call_scales``: ranks that call ``cp_flashmask_attention`` with different KV
  heads and head dims (of the same product: the exchange sizes agree) or softmax scales must get a
  RuntimeError on every rank; ``call_scores_overflow``: a softmax_scale whose scores overflow float32
  the ValueError of single-process ``flashmask_attention``, on every rank; ``undispatch_shapes``:
  ``undispatch`` of tensors whose shapes differ across the ranks, a RuntimeError on every rank.

Writes OUT_DIR/rank{r}.json; assertions are in the pytest file, exceptions are recorded
(tests/cp/cp_cases.py).
"""

import json
import os
import sys

os.environ.pop("FM3_CP_DEBUG", None)  # the check must not depend on it

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from cp_cases import fm3dist, guarded, rel  # noqa: E402 - tests/cp (the script's folder)
import paddle_fm3  # noqa: E402
from paddle_fm3 import masks, reference  # noqa: E402
from paddle_fm3.distributed.plan import build_layout  # noqa: E402

paddle.set_device("cpu")
dist.init_parallel_env()
RANK, P = dist.get_rank(), dist.get_world_size()
results = []
S_SHIFT = 1536


def shifted(rank):
    """Causal documents of 300 + 3r, 700 and 536 - 3r tokens: boundaries at 300 + 3r and 1000 + 3r."""
    return masks.causal_document([300 + 3 * rank, 700, 536 - 3 * rank]).startend_row_indices


def exchange_sizes(sri):
    lay = build_layout(sri, True, P)
    return [[len(x) for x in row] for row in lay.recv]


def disagreement(case, make):
    """``make()`` must raise RuntimeError on this rank; record its message, or an error."""
    same = all(exchange_sizes(shifted(r)) == exchange_sizes(shifted(0)) for r in range(P))
    try:
        make()
    except RuntimeError as e:
        results.append({"case": case, "rank": RANK, "same_exchange_sizes": same, "message": str(e)})
        return
    results.append({"case": case, "rank": RANK, "same_exchange_sizes": same,
                    "error": f"{case}: ranks holding different masks made plans without an error"})


guarded(results, "shifted_documents", lambda: disagreement(
    "shifted_documents", lambda: fm3dist.make_cp_plan(shifted(RANK), causal=True)))
same_everywhere = masks.causal(S_SHIFT).startend_row_indices
guarded(results, "shifted_plans", lambda: disagreement(
    "shifted_plans", lambda: fm3dist.make_cp_plans([(same_everywhere, True), (shifted(RANK), True)])))


def for_mask():
    plan = fm3dist.make_cp_plan(same_everywhere, causal=True)  # the same mask everywhere: agreed
    disagreement("shifted_for_mask", lambda: plan.for_mask(shifted(RANK), causal=True))


guarded(results, "shifted_for_mask", for_mask)


def call_case(case, heads_k, head_dim, scale, expect):
    """cp_flashmask_attention with this rank's (num_heads_k, head_dim, softmax_scale) must raise
    ``expect`` on this rank; record its message, or an error."""
    sri = masks.causal_document([40, 50, 54]).startend_row_indices
    plan = fm3dist.make_cp_plan(sri, causal=True, segment_size=16)
    rng = np.random.default_rng(0)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 144, h, head_dim)).astype(np.float32) * 1e18)
               for h in (2, heads_k, heads_k))
    try:
        fm3dist.cp_flashmask_attention(plan.dispatch(q), plan.dispatch(k), plan.dispatch(v), plan,
                                       softmax_scale=scale)
    except expect as e:
        results.append({"case": case, "rank": RANK, "message": str(e)})
        return
    results.append({"case": case, "rank": RANK, "error": f"{case}: no {expect.__name__} on rank {RANK}"})


# KV heads x head dim the same on every rank (the exchange sizes agree), the layouts not
guarded(results, "call_layouts", lambda: call_case("call_layouts", *((1, 16) if RANK % 2 == 0 else (2, 8)), 0.25,
                                                   RuntimeError))
guarded(results, "call_scales", lambda: call_case("call_scales", 1, 16, 0.25 * (1 + RANK), RuntimeError))
guarded(results, "call_scores_overflow", lambda: call_case("call_scores_overflow", 1, 16, 1e3, ValueError))


def undispatch_case():
    """Ranks gathering tensors of different widths must get a RuntimeError on every rank (once
    gloo aborted the process)."""
    plan = fm3dist.make_cp_plan(masks.causal(144).startend_row_indices, causal=True, segment_size=16)
    x = paddle.zeros([1, plan.local_seqlen, 2 + RANK % 2])
    try:
        plan.undispatch(x)
    except RuntimeError as e:
        results.append({"case": "undispatch_shapes", "rank": RANK, "message": str(e)})
        return
    results.append({"case": "undispatch_shapes", "rank": RANK, "error": f"no RuntimeError on rank {RANK}"})


guarded(results, "undispatch_shapes", undispatch_case)


def half_case(dtype):
    """CP forward + backward in ``dtype`` against single-process attention in ``dtype`` and the
    float64 reference; errors relative to the largest reference value."""
    s, seg = 384, 32
    sri = masks.causal_document([100, 200, 84]).startend_row_indices
    rng = np.random.default_rng(11)
    q, k, v, do = (rng.standard_normal((1, s, h, 16)).astype(np.float32) for h in (2, 1, 1, 2))

    def t(x, grad=False):
        y = paddle.to_tensor(x).astype(dtype)
        y.stop_gradient = not grad
        return y

    qs, ks, vs = t(q, True), t(k, True), t(v, True)
    out_s = paddle_fm3.flashmask_attention(qs, ks, vs, paddle.to_tensor(sri), causal=True)
    (out_s.astype("float32") * paddle.to_tensor(do)).sum().backward()
    plan = fm3dist.make_cp_plan(sri, causal=True, segment_size=seg)
    ql, kl, vl = (plan.dispatch(x) for x in (t(q), t(k), t(v)))
    for x in (ql, kl, vl):
        x.stop_gradient = False
    out_l = fm3dist.cp_flashmask_attention(ql, kl, vl, plan)
    (out_l.astype("float32") * plan.dispatch(paddle.to_tensor(do))).sum().backward()
    out_g = plan.undispatch(out_l)
    f32 = lambda x: x.astype("float32").numpy()  # noqa: E731
    disp = lambda x: plan.dispatch(paddle.to_tensor(np.ascontiguousarray(x, np.float32))).numpy()  # noqa: E731
    ref_out, _ = reference.attention_forward(q, k, v, sri, causal=True)
    ref = dict(zip(("dq", "dk", "dv"), reference.attention_backward(q, k, v, do, sri, causal=True)))
    rec = {"case": f"half_{dtype}", "rank": RANK, "dtypes": [str(x.dtype) for x in (ql, out_l, out_g, ql.grad)],
           "out": rel(f32(out_l), disp(f32(out_s))), "undispatch": rel(f32(out_g), f32(out_s)),
           "out64_cp": rel(f32(out_g), ref_out), "out64_single": rel(f32(out_s), ref_out)}
    for name, local, single in (("dq", ql, qs), ("dk", kl, ks), ("dv", vl, vs)):
        rec[name] = rel(f32(local.grad), disp(f32(single.grad)))
        rec[name + "64_cp"] = rel(f32(local.grad), disp(ref[name]))
        rec[name + "64_single"] = rel(f32(single.grad), ref[name])
    results.append(rec)


for dtype in ("float16", "bfloat16"):
    guarded(results, f"half_{dtype}", lambda dtype=dtype: half_case(dtype))

with open(os.path.join(sys.argv[1], f"rank{RANK}.json"), "w") as f:
    json.dump(results, f)
dist.barrier()
