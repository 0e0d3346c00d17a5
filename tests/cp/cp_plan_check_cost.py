"""What the plan-agreement check costs (not a test; a measurement). Run on CPU with gloo:

    python -m paddle.distributed.launch --nproc_per_node 3 tests/cp/cp_plan_check_cost.py [REPEATS]

For causal document masks of S tokens (B = 1, one mask head, the default segment size), rank 0
prints the median wall time of: ``make_cp_plan`` (planning and the check), planning alone (the
same steps without the check) and the check alone (``check_agreement``: hashing the plan, one
all-gather of one int64). A barrier before each timed call keeps the ranks in step, so waiting for
a slower rank is not counted.
"""

import os
import statistics
import sys
import time

from cp_cases import fm3dist  # noqa: F401 - tests/cp (the script's folder): finds the package
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddle_fm3 import masks  # noqa: E402
from paddle_fm3.distributed import plan as cp_plan  # noqa: E402
from paddle_fm3.distributed.comm import default_communicator  # noqa: E402

paddle.set_device("cpu")
dist.init_parallel_env()
REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
comm = default_communicator(None)


def plan_without_check(sri):
    """make_cp_plan's steps without check_agreement."""
    checked = cp_plan._check_mask(sri, True)
    lay = cp_plan._build_layout(checked, True, comm.world_size, None, (), None, cp_plan.TILE)
    return cp_plan.CPPlan._from_checked(lay, checked, True, comm)


def median_ms(fn):
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


rows = []
for s in (1536, 12288, 98304):  # divisible by 3 ranks (and by 2 and 4)
    n = s // 8
    sri = masks.causal_document([n, 3 * n, 2 * n, s - 6 * n]).startend_row_indices
    plan = fm3dist.make_cp_plan(sri, causal=True)  # warm up (op load, first collective)
    with_check = median_ms(lambda: fm3dist.make_cp_plan(sri, causal=True))
    without = median_ms(lambda: plan_without_check(sri))
    check = median_ms(lambda: cp_plan.check_agreement([plan]))
    rows.append((s, plan.layout.segment_size, with_check, without, check))

if dist.get_rank() == 0:
    print(f"P={comm.world_size} ranks, gloo, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, "
          f"median of {REPEATS}")
    print(f"{'S':>7} {'segment':>8} {'make_cp_plan ms':>16} {'no check ms':>12} {'check ms':>9} {'overhead':>9}")
    for s, seg, w, wo, c in rows:
        print(f"{s:>7} {seg:>8} {w:>16.2f} {wo:>12.2f} {c:>9.2f} {100 * (w - wo) / wo:>8.1f}%")
dist.barrier()
