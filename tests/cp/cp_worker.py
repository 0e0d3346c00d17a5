"""Multi-process CP worker, launched by tests/test_cp_distributed.py with
``python -m paddle.distributed.launch --nproc_per_node P tests/cp/cp_worker.py OUT_DIR``.

Runs every case in one process group (few launches keep CI short) and writes
OUT_DIR/rank{r}.json: per case the max relative error of the CP forward/gradients against
single-process ``paddle_fm3.flashmask_attention`` (and of both against the float64 reference;
tests/cp/cp_cases.py).
Assertions live in the pytest file; exceptions here are recorded, not raised, so every rank
finishes and nothing hangs on a mismatched collective.
"""

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from cp_cases import fm3dist, guarded as _guarded, run_case as _run_case, run_sink_case  # tests/cp (the script's folder)
from paddle_fm3 import masks

paddle.set_device("cpu")
dist.init_parallel_env()
RANK, P = dist.get_rank(), dist.get_world_size()
SEG = 32
S = 256  # 8 segments of 32: n/P = 4 (P=2) or 2 (P=4)
H, HK, D = 2, 1, 16
results = []


def run_case(name, sri, causal, *, batch=1, seg=SEG, plan=None, seed=0, heads=(H, HK, D), head_dim_v=None):
    results.append(_run_case(name, sri, causal, heads=heads, batch=batch, seg=seg, plan=plan, seed=seed,
                             head_dim_v=head_dim_v))


def guarded(name, fn):
    _guarded(results, name, fn)


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

# MLA (DeepSeek-V3): q, k 192 columns, v and out 128, so the packed KV messages and dK/dV
# partials are 192 + 128 wide; GQA, causal and bidirectional masks with remote KV
fm = masks.causal_document([70, 120, 66], S)
guarded("mla_causal_document", lambda: run_case("mla_causal_document", fm.startend_row_indices, True,
                                                heads=(2, 1, 192), head_dim_v=128))
fm = masks.FAMILIES["global_sliding_window"](S, rng)  # bidirectional, C = 4
guarded("mla_global_sliding_window", lambda: run_case("mla_global_sliding_window", fm.startend_row_indices,
                                                      fm.causal, heads=(2, 2, 192), head_dim_v=128))

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


def no_second_derivative():
    """A gradient penalty through CP attention: an error on every rank, not a dropped term."""
    plan = fm3dist.make_cp_plan(masks.causal(S).startend_row_indices, causal=True, segment_size=SEG)
    x = [plan.dispatch(paddle.to_tensor(rng.standard_normal((1, S, n, D)).astype(np.float32))) for n in (H, HK, HK)]
    for t in x:
        t.stop_gradient = False
    out = fm3dist.cp_flashmask_attention(*x, plan)
    gq = paddle.grad(out.sum(), x, create_graph=True)[0]
    try:
        (out.sum() + (gq ** 2).sum()).backward()
    except NotImplementedError as e:  # from the grad of the backward, or the backward run a second time
        results.append({"case": "no_second_derivative", "rank": RANK, "message": str(e)})
        return
    results.append({"case": "no_second_derivative", "rank": RANK, "error": "no NotImplementedError"})


guarded("no_second_derivative", no_second_derivative)

# learnable sinks: the sink joins each row's log-sum-exp once, after the last merge
sink_rng = np.random.default_rng(99)
for fam in ("causal", "document", "sliding_window", "qk_sparse"):
    fm = masks.FAMILIES[fam](S, sink_rng)
    guarded(f"sink_{fam}", lambda fm=fm, fam=fam: results.append(
        run_sink_case(f"sink_{fam}", fm.startend_row_indices, fm.causal, seed=5)))
fm = masks.causal_document([[37, 91, 128], [5, 200, 51]], S, batch=2)  # GQA 4 / 2, batch 2
guarded("sink_gqa_batch2", lambda: results.append(
    run_sink_case("sink_gqa_batch2", fm.startend_row_indices, True, heads=(4, 2, D), batch=2, seed=6)))
# the all_masked_rank mask above: rows that see no key get out 0 and lse = sink
guarded("sink_all_masked_rank", lambda: results.append(run_sink_case("sink_all_masked_rank", sri, False, seed=7)))

out_dir = sys.argv[1]
with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f)
dist.barrier()
