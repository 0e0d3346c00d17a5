"""CP under fleet: the default CP group is fleet's context-parallel (``cp_degree``) or ``sep``
axis, never the world when other parallel axes exist (tests/cp/cp_fleet_worker.py, gloo, 2
processes, each launch under a timeout). Paddle 3.3.1 builds the ``cp_degree`` axis only in its
expert-parallel topology (carved out of ``sharding``); a 2-process gloo launch of it hung here, so
the ``cp`` branch is covered by the axis rule below, not by a launch."""

import pathlib

import pytest
from fm3_testutil import launch_cp_workers

from paddle_fm3.distributed.comm import fleet_cp_axis

WORKER = pathlib.Path(__file__).resolve().parent / "cp" / "cp_fleet_worker.py"
TOL = 1e-5
LAUNCH_TIMEOUT = 180


@pytest.mark.parametrize("axis, plan_ranks", [("dp", 1), ("sep", 2)])
def test_fleet_axis_sets_the_cp_group(axis, plan_ranks, tmp_path):
    res = launch_cp_workers(WORKER, 2, tmp_path, LAUNCH_TIMEOUT, args=[axis])
    errors = [f"rank {r['rank']}:\n{r['error']}" for r in res if "error" in r]
    assert not errors, "\n".join(errors)
    assert len(res) == 2
    for r in res:
        assert r["plan_ranks"] == plan_ranks, f"{axis}: rank {r['rank']} planned over {r['plan_ranks']} ranks"
        for key in ("out", "undispatch", "dq", "dk", "dv"):
            assert r[key] < TOL, f"{axis} rank {r['rank']}: {key} rel err {r[key]:.2e}"
        assert r["lse"] < 1e-5 and r["lse_inf_match"] and not r["nan"]


def test_fleet_axis_rule():
    assert fleet_cp_axis(1, 1) is None
    assert fleet_cp_axis(4, 1) == "cp"
    assert fleet_cp_axis(1, 2) == "sep"
    with pytest.raises(ValueError, match="cp_degree.*sep_degree.*group="):
        fleet_cp_axis(2, 2)
