"""Multi-process CP worker for groups where some ranks exchange KV and others none (P >= 3),
launched by tests/test_cp_mixed.py with
``python -m paddle.distributed.launch --nproc_per_node P tests/cp/cp_mixed_worker.py OUT_DIR``.

Cases (S = 384, segments of 32): real documents then a padding tail that no query sees; one
document then a tail where every row sees only its own key; a 4-layer model alternating two plans
of ``make_cp_plans``, one of which leaves ranks idle; and ranks holding different masks with the
same layout under the agreement check (always on). Writes OUT_DIR/rank{r}.json; assertions are in the
pytest file, exceptions are recorded (tests/cp/cp_cases.py).
"""

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from cp_cases import fm3dist, guarded, idle, rel, run_case, t  # tests/cp (the script's folder)
import paddle_fm3  # noqa: E402
from paddle_fm3.distributed.plan import build_layout  # noqa: E402

paddle.set_device("cpu")
dist.init_parallel_env()
RANK, P = dist.get_rank(), dist.get_world_size()
S, SEG = 384, 32
results = []


def documents_then_tail(docs, tail_sees_itself):
    """Causal C=1 mask: causal documents of the given lengths, then a tail of single tokens whose
    keys no row sees (``tail_sees_itself=False``, padding) or only their own row sees (True)."""
    lts = np.empty(S, np.int64)
    a = 0
    for n in docs:
        lts[a:a + n] = a + n
        a += n
    lts[a:] = np.arange(a, S) + int(tail_sees_itself)
    return lts.astype(np.int32)[None, None, :, None]


PADDED = documents_then_tail([32, 32, 64, 32, 32], False)
SELF_TAIL = documents_then_tail([48], True)
CAUSAL = np.full((1, 1, S, 1), S, np.int32)

guarded(results, "docs_unseen_tail", lambda: results.append(run_case("docs_unseen_tail", PADDED, True, seg=SEG)))
guarded(results, "doc_self_tail", lambda: results.append(run_case("doc_self_tail", SELF_TAIL, True, seg=SEG)))


def alternating_layers():
    """4 layers alternating the two plans: o_i = attn(q + o_{i-1}, k + o_{i-1}, v + o_{i-1})."""
    h = d = 16
    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal((1, S, 2, d)).astype(np.float32) for _ in range(4))
    layers = [(SELF_TAIL, True), (CAUSAL, True)] * 2
    plans = fm3dist.make_cp_plans(layers[:2], segment_size=SEG, debug=True)

    qs, ks, vs = t(q, True), t(k, True), t(v, True)
    o = paddle.zeros_like(qs)
    for sri, causal in layers:
        o = paddle_fm3.flashmask_attention(qs + o, ks + o, vs + o, paddle.to_tensor(sri), causal=causal)
    (o * t(do)).sum().backward()

    ql, kl, vl = (plans[0].dispatch(t(x)) for x in (q, k, v))
    for x in (ql, kl, vl):
        x.stop_gradient = False
    ol = paddle.zeros_like(ql)
    for i in range(len(layers)):
        ol = fm3dist.cp_flashmask_attention(ql + ol, kl + ol, vl + ol, plans[i % 2])
    (ol * plans[0].dispatch(t(do))).sum().backward()
    disp = lambda x: plans[0].dispatch(t(x)).numpy()  # noqa: E731
    results.append({
        "case": "alternating_layers", "P": P, "rank": RANK, "h": h,
        "out": rel(plans[0].undispatch(ol).numpy(), o.numpy()),
        "dq": rel(ql.grad.numpy(), disp(qs.grad.numpy())), "dk": rel(kl.grad.numpy(), disp(ks.grad.numpy())),
        "dv": rel(vl.grad.numpy(), disp(vs.grad.numpy())),
        "idle": [idle(p) for p in plans],
    })


guarded(results, "alternating_layers", alternating_layers)


def disagreeing_masks():
    """Rank r masks key 0 for its last r rows: a different mask on every rank, the same layout."""
    mine = CAUSAL.copy()
    mine[0, 0, 0, 0] = S - RANK
    other = CAUSAL.copy()
    other[0, 0, 0, 0] = S - (RANK + 1) % P
    a, b = build_layout(mine, True, P, SEG), build_layout(other, True, P, SEG)
    same = bool(np.array_equal(a.segments, b.segments) and np.array_equal(a.needed, b.needed)
                and np.array_equal(a.weights, b.weights))
    try:
        fm3dist.make_cp_plan(mine, causal=True, segment_size=SEG, debug=True)
    except RuntimeError as e:
        results.append({"case": "disagreeing_masks", "P": P, "rank": RANK, "same_layout": same, "message": str(e)})
        return
    results.append({"case": "disagreeing_masks", "P": P, "rank": RANK, "same_layout": same,
                    "error": "make_cp_plan accepted different masks on different ranks"})


guarded(results, "disagreeing_masks", disagreeing_masks)

with open(os.path.join(sys.argv[1], f"rank{RANK}.json"), "w") as f:
    json.dump(results, f)
dist.barrier()
