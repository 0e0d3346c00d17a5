"""CP under fleet (2 processes), launched by tests/test_cp_fleet.py with
``python -m paddle.distributed.launch --nproc_per_node 2 tests/cp/cp_fleet_worker.py OUT_DIR AXIS``.

AXIS ``dp``: ``dp_degree=2``: each rank holds its own sequence (its own mask and tensors), so the
default plan must be a plan of one rank. AXIS ``sep``: ``sep_degree=2``: one sequence over both
ranks. Each case is compared with single-process attention on the rank's
own data (tests/cp/cp_cases.py). Writes OUT_DIR/rank{r}.json.
"""

import json
import os
import sys

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

from cp_cases import fm3dist, guarded, run_case  # tests/cp (the script's folder)
from paddle_fm3 import masks

out_dir, axis = sys.argv[1], sys.argv[2]
paddle.set_device("cpu")
degrees = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sep_degree": 1, "cp_degree": 1}
degrees[f"{axis}_degree"] = 2
strategy = fleet.DistributedStrategy()
strategy.hybrid_configs = degrees
fleet.init(is_collective=True, strategy=strategy)
RANK = dist.get_rank()
S = 256
results = []


def case():
    # dp: a different sequence (documents, q/k/v) on each rank; sep: the same on both
    own = RANK if axis == "dp" else 0
    fm = masks.causal_document([[100, 156], [37, 219]][own], S)
    plan = fm3dist.make_cp_plan(fm.startend_row_indices, causal=True, segment_size=32, debug=True)
    r = run_case(f"fleet_{axis}", fm.startend_row_indices, True, plan=plan, seed=own)
    r["plan_ranks"] = plan.comm.world_size
    results.append(r)


guarded(results, f"fleet_{axis}", case)
with open(os.path.join(out_dir, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f)
dist.barrier()
