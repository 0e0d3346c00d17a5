"""Context parallelism for FlashMask attention (FlashMask-3's distributed layer).

Usage (every rank holds the same global mask; no communication to plan)::

    from paddle_fm3 import distributed as fm3dist
    plan = fm3dist.make_cp_plan(startend_row_indices, causal=True)   # group: fleet's cp / sep axis, else the world
    q_l, k_l, v_l = plan.dispatch(q), plan.dispatch(k), plan.dispatch(v)
    out_l = fm3dist.cp_flashmask_attention(q_l, k_l, v_l, plan)
    out = plan.undispatch(out_l)      # global order on every rank
    plan.stats()                      # loads, max/mean, KV volume vs ring, segments skipped

Steps (docs/design.md, "Context parallelism"): localize (``localize``), balance (``balance.hcc_ipo``),
plan (``plan``), execute (``executor``); communication behind ``comm.Communicator``.
"""

from .balance import hcc_ipo
from .comm import Communicator, PaddleCommunicator, PlanOnlyCommunicator, TorchCommunicator
from .localize import explicit_four_column, local_row_bound, localize
from .plan import (CPLayout, CPPlan, build_layout, default_segment_size, make_cp_plan, make_cp_plans,
                   segment_summary)

__all__ = ["make_cp_plan", "make_cp_plans", "cp_flashmask_attention", "CPPlan", "CPLayout", "build_layout",
           "segment_summary", "hcc_ipo", "localize", "local_row_bound", "explicit_four_column", "default_segment_size",
           "Communicator", "PaddleCommunicator", "TorchCommunicator", "PlanOnlyCommunicator"]


def __getattr__(name):
    if name == "cp_flashmask_attention":  # needs the compiled ops: load on first use
        from .executor import cp_flashmask_attention

        return cp_flashmask_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
