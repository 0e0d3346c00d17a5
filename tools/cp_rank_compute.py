#!/usr/bin/env python3
"""Per-rank compute of one context-parallel attention step, measured rank after rank on one GPU.

While no multi-GPU machine is lent (issue #6), every rank's share of a CP step runs one after
another on the one GPU, so per-rank compute (and so the load balance that sets the step time) is
measured exactly. Needs torch and the built ``paddle_fm3.kernels`` (no Paddle); communication is
not modelled: times are compute only.

For each mask family, total tokens S (batch 1) and CP degree P, two splits of the sequence:

- ``ours``: the layout of ``paddle_fm3.distributed.make_cp_plan`` (``build_layout``: HCC-IPO
  balanced segments of ``default_segment_size``; ``CPPlan``: the rank's localized mask and the KV
  segments it receives);
- ``zigzag``: ring attention's split, 2P equal chunks, rank r holding chunks r and 2P-1-r, attending
  to every KV chunk its mask needs (the same ``CPPlan`` machinery with the zigzag segments).

A rank's share is ``paddle_fm3.distributed.step`` (the CP step Paddle users run, here with the
Hopper kernels as its backend): forward, one ``kernels.flashmask_fwd`` of its queries on its local
KV, then one per peer on the KV received from it (localized non-causal C=4 masks), partial results
merged by log-sum-exp in fp32; backward, one ``kernels.flashmask_bwd`` per KV chunk with the merged
out/lse (dQ summed in fp32, dK/dV in fp32, the partial dK/dV of its keys sent back by peers folded
in with ``index_add``). The exchange is a :class:`Loopback`: the KV a peer would send is copied into
the receive buffers, the partial dK/dV sent back are kept for the check (and peers' are zeros in
the timing). Times are CUDA-event medians of ``--reps`` runs after ``--warmup``.

Reported: per rank forward ms, forward+backward ms, visible pairs (not-fully-masked 128x128
(query tile, key block) pairs, the planner's workload); per (family, S, P) and split, max/mean of
the measured times and the predicted max/mean of pairs (the load model of ``simulate_cp.py``).
Before timing, a correctness check at ``--check-seqlen``/``--check-ranks``: the ranks' outputs,
LSE and gradients, put back into global order, against one full-sequence kernel call.

    PYTHONPATH=. python3 tools/cp_rank_compute.py --out cp_rank_compute.json     # H200: ~1-2 min
    PYTHONPATH=. python3 tools/cp_rank_compute.py --plan-only                    # CPU: inputs only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

if importlib.util.find_spec("paddle_fm3") is None:  # not installed / not on PYTHONPATH: this checkout
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
from paddle_fm3 import masks  # noqa: E402
from paddle_fm3.distributed import step  # noqa: E402
from paddle_fm3.distributed.backends.torch import HopperBackend  # noqa: E402
from paddle_fm3.distributed.comm import Communicator, Pending, PlanOnlyCommunicator  # noqa: E402
from paddle_fm3.distributed.plan import CPPlan, build_layout  # noqa: E402

SCHEMES = ("ours", "zigzag")
DEFAULT_FAMILIES = ["causal_document", "document", "share_question", "causal", "sliding_window"]


# ---- planning (numpy only) -----------------------------------------------------------------

def make_mask(family: str, seqlen: int, seed: int) -> masks.FlashMask:
    """A representative instance of ``masks.FAMILIES[family]`` (batch 1, one mask head)."""
    return masks.FAMILIES[family](seqlen, np.random.default_rng(seed))


def layouts(sri: np.ndarray, causal: bool, num_ranks: int) -> dict:
    """``{scheme: (CPLayout, build ms)}`` for ``ours`` (make_cp_plan's layout) and ``zigzag``."""
    s, out = sri.shape[2], {}
    zigzag = [[r, 2 * num_ranks - 1 - r] for r in range(num_ranks)]
    for scheme, kw in (("ours", {}), ("zigzag", dict(segment_size=s // (2 * num_ranks), segments=zigzag))):
        t0 = time.perf_counter()
        lay = build_layout(sri, causal, num_ranks, **kw)
        out[scheme] = (lay, 1e3 * (time.perf_counter() - t0))
    return out


def rank_shares(layout, sri: np.ndarray, causal: bool) -> list:
    """Every rank's share of one CP step, as the executor computes it.

    Returns one dict per rank: ``plan`` (its :class:`CPPlan`, without a process group); ``q_rows`` int64 ``[L]`` (global rows of its queries, also of its
    local KV); ``calls``: ``[(kv_rows int64 [L_k], mask int32 [B, H_mask, L_k, 4])]``, the local KV
    first, then the KV received from each peer (global key rows; the rank's localized mask over
    them, non-causal); ``grads_in``: int64 local row indices of the partial dK/dV each peer sends
    back; ``pairs``: visible (query tile, key block) pairs of the rank.
    """
    shares, loads = [], layout.loads()
    for r in range(layout.num_ranks):
        plan = CPPlan(layout, sri, causal, PlanOnlyCommunicator(r, layout.num_ranks))
        calls = [(plan.kv_rows(src), np.ascontiguousarray(plan.local_mask[:, :, plan.kv_rows(src), :]))
                 for src in ["local"] + plan.recv_peers]
        shares.append(dict(rank=r, plan=plan, q_rows=plan.kv_rows("local"), calls=calls,
                           grads_in=[plan.send_rows(p) for p in plan.send_peers], pairs=int(loads[r])))
    return shares


def max_over_mean(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(x.max() / x.mean()) if x.size and x.mean() > 0 else 1.0


# ---- one rank on the GPU (torch) -----------------------------------------------------------

class Loopback(Communicator):
    """One rank's exchanges without the other ranks (they run later on the same device): in
    forward the KV each peer would send (``kv_from[p]``) is copied into the receive buffers; in
    backward the partial dK/dV this rank sends back are kept (``grad_sends``) and the peers' are
    zeros. Call 0 of :meth:`exchange` is the forward one, call 1 the backward one."""

    def __init__(self, rank, world_size, kv_from):
        self.rank, self.world_size, self.kv_from = rank, world_size, kv_from
        self.calls, self.grad_sends = 0, []

    def exchange(self, sends, recvs):
        if self.calls % 2 == 0:
            for p, buf in recvs:
                buf.copy_(self.kv_from[p])
        else:
            self.grad_sends = list(sends)
            for _, buf in recvs:
                buf.zero_()
        self.calls += 1
        return Pending([], [])

    def all_gather(self, tensor):
        raise RuntimeError("Loopback has no collectives")


class RankInputs:
    """One rank's tensors on the GPU, gathered from the global ``q, k, v, dout`` ``[B, S, H(_k), D]``,
    and its :class:`Loopback` exchange."""

    def __init__(self, share, q, k, v, dout):
        import torch

        plan = share["plan"]
        self.plan = plan
        self.q_idx = torch.from_numpy(plan.kv_rows("local")).to(q.device)
        self.q, self.k, self.v, self.dout = (x.index_select(1, self.q_idx) for x in (q, k, v, dout))
        kv = torch.cat([k, v], -1)
        self.comm = Loopback(plan.rank, plan.layout.num_ranks,
                             {p: kv.index_select(1, torch.from_numpy(plan.kv_rows(p)).to(q.device))
                              for p in plan.recv_peers})


def forward(x: RankInputs, backend, scale: float):
    """The CP step's forward (``step.forward``). -> (out [B, L, H, D] in q's dtype, lse fp32
    [B, H, L], the received KV)."""
    return step.forward(x.plan, backend, x.q, x.k, x.v, scale, comm=x.comm)


def backward(x: RankInputs, backend, out, lse, remote, scale: float):
    """The CP step's backward (``step.backward``). -> (dq fp32 [B, L, H, D], dkv fp32 [B, L, H_k, 2D]
    of the rank's keys; the partial dK/dV sent to peers are in ``x.comm.grad_sends``)."""
    return step.backward(x.plan, backend, x.q, x.k, x.v, out, lse, x.dout, remote, scale, comm=x.comm)


def time_rank(x: RankInputs, backend, scale: float, warmup: int, reps: int):
    """Median forward ms and forward+backward ms of the rank's share (CUDA events)."""
    import torch

    fwd, both = [], []
    for i in range(warmup + reps):
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        out, lse, remote = forward(x, backend, scale)
        ev[1].record()
        backward(x, backend, out, lse, remote, scale)
        ev[2].record()
        ev[2].synchronize()
        if i >= warmup:
            fwd.append(ev[0].elapsed_time(ev[1]))
            both.append(ev[0].elapsed_time(ev[2]))
    return float(np.median(fwd)), float(np.median(both))


def random_qkv(args, seqlen: int, seed: int, device="cuda", dtype=None):
    """Global ``q, k, v, dout`` (batch 1) from ``args.heads/heads_k/head_dim``, drawn on ``device``
    from a generator seeded with ``seed``; ``dtype`` default ``args.dtype``."""
    import torch

    dt = dtype or {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    g = torch.Generator(device=device).manual_seed(seed)
    hk = args.heads_k or args.heads
    shapes = [(1, seqlen, args.heads, args.head_dim)] + [(1, seqlen, hk, args.head_dim)] * 2 + \
             [(1, seqlen, args.heads, args.head_dim)]
    return [torch.randn(*s, device=device, generator=g).to(dt) for s in shapes]  # q, k, v, dout


def rel_err(x, ref) -> float:
    """||x - ref||_F / max(||ref||_F, 1) (the GPU tests' metric)."""
    return float((x.float() - ref.float()).norm() / max(float(ref.float().norm()), 1.0))


def compare(got, ref, rel: float = 2e-2, out_abs: float = 5e-2, lse_abs: float = 1e-2) -> dict:
    """Errors of CP results ``got = (out, lse, dq, dk, dv)`` in global order against a full-sequence
    computation ``ref`` (same order), and ``ok``: by default the bf16 tolerance of this check (out
    max abs <= 5e-2, relative Frobenius errors <= 2e-2, finite lse within 1e-2, the same -inf rows)."""
    import torch

    out, lse, dq, dk, dv = got
    out_ref, lse_ref, dq_ref, dk_ref, dv_ref = ref
    fin = torch.isfinite(lse_ref)
    r = dict(out_max_abs=float((out.float() - out_ref.float()).abs().max()),
             out_rel=rel_err(out, out_ref),
             lse_max_abs=float((lse - lse_ref)[fin].abs().max()) if fin.any() else 0.0,
             lse_inf_same=bool(torch.equal(torch.isfinite(lse), fin)),
             dq_rel=rel_err(dq, dq_ref), dk_rel=rel_err(dk, dk_ref), dv_rel=rel_err(dv, dv_ref))
    # Both sides carry the kernel's own error (tests/gpu: relative <= 1e-2 in bf16 each).
    r["ok"] = bool(r["out_max_abs"] <= out_abs and r["lse_max_abs"] <= lse_abs and r["lse_inf_same"]
                   and max(r["out_rel"], r["dq_rel"], r["dk_rel"], r["dv_rel"]) <= rel)
    return r


def check(args, family: str) -> dict:
    """Ranks' outputs/LSE/gradients in global order vs one full-sequence call, for both splits."""
    import torch

    from paddle_fm3 import kernels

    s, p = args.check_seqlen, args.check_ranks
    fm = make_mask(family, s, args.seed)
    q, k, v, dout = random_qkv(args, s, args.seed + 1)
    scale, stream = args.head_dim ** -0.5, torch.cuda.current_stream().cuda_stream
    sri = torch.from_numpy(fm.startend_row_indices).to(q.device)
    out_ref, lse_ref = torch.empty_like(q), torch.empty(1, args.heads, s, device=q.device)
    kernels.flashmask_fwd(q, k, v, sri, out_ref, lse_ref, causal=fm.causal, softmax_scale=scale, stream=stream)
    dq_ref, dk_ref, dv_ref = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kernels.flashmask_bwd(q, k, v, out_ref, lse_ref, dout, sri, dq_ref, dk_ref, dv_ref, causal=fm.causal,
                          softmax_scale=scale, stream=stream)
    backend = HopperBackend(q.device)
    res = {}
    for scheme, (lay, _) in layouts(fm.startend_row_indices, fm.causal, p).items():
        out, lse = torch.empty_like(out_ref), torch.empty_like(lse_ref)
        dq = torch.empty_like(q, dtype=torch.float32)
        dkv = torch.zeros(*k.shape[:3], 2 * k.shape[3], device=q.device)
        for share in rank_shares(lay, fm.startend_row_indices, fm.causal):
            x = RankInputs(share, q, k, v, dout)
            o, l, remote = forward(x, backend, scale)
            dq_r, dkv_r = backward(x, backend, o, l, remote, scale)
            out[:, x.q_idx], lse[:, :, x.q_idx], dq[:, x.q_idx] = o, l, dq_r
            dkv.index_add_(1, x.q_idx, dkv_r)
            for peer, part in x.comm.grad_sends:  # what the owners of those keys receive and add
                dkv.index_add_(1, torch.from_numpy(x.plan.kv_rows(peer)).to(q.device), part)
        d = k.shape[3]
        r = compare((out, lse, dq, dkv[..., :d], dkv[..., d:]), (out_ref, lse_ref, dq_ref, dk_ref, dv_ref))
        res[scheme] = r
        print(f"check {family:16s} S={s} P={p} {scheme:6s} " + " ".join(
            f"{n}={val:.2e}" if isinstance(val, float) else f"{n}={val}" for n, val in r.items()), flush=True)
    return res


# ---- driver --------------------------------------------------------------------------------

def summarize(family, s, p, per_rank, lays) -> dict:
    row = dict(family=family, S=s, P=p)
    for scheme in SCHEMES:
        rs = [x for x in per_rank if x["scheme"] == scheme]
        row[scheme] = dict(segment_size=lays[scheme][0].segment_size, plan_ms=lays[scheme][1],
                           pred_max_over_mean=max_over_mean([x["pairs"] for x in rs]))
        if rs and "fwd_ms" in rs[0]:
            for key in ("fwd_ms", "fwdbwd_ms"):
                t = [x[key] for x in rs]
                row[scheme].update({f"{key}_max": max(t), f"{key}_mean": float(np.mean(t)),
                                    f"{key}_max_over_mean": max_over_mean(t)})
    if "fwdbwd_ms_max" in row["ours"]:
        row["zigzag_over_ours_fwdbwd_max"] = row["zigzag"]["fwdbwd_ms_max"] / row["ours"]["fwdbwd_ms_max"]
    return row


def markdown(per_rank, summary, timed: bool) -> str:
    t = ("| fwd ms | fwd+bwd ms " if timed else "")
    lines = ["| family | S | P | split | rank | q tokens | kernel calls | KV tokens | pairs " + t + "|",
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if timed else "")]
    for x in per_rank:
        lines.append(f"| {x['family']} | {x['S']} | {x['P']} | {x['scheme']} | {x['rank']} | {x['q_tokens']} | "
                     f"{x['calls']} | {x['kv_tokens']} | {x['pairs']} |" +
                     (f" {x['fwd_ms']:.3f} | {x['fwdbwd_ms']:.3f} |" if timed else ""))
    lines += ["", "| family | S | P | seg ours / zigzag | pred max/mean ours / zigzag" +
              (" | fwd max/mean ours / zigzag | fwd+bwd max/mean ours / zigzag | fwd+bwd max ms ours / zigzag"
               " | zigzag / ours" if timed else "") + " |",
              "|---|---|---|---|---|" + ("---|---|---|---|" if timed else "")]
    for r in summary:
        o, z = r["ours"], r["zigzag"]
        line = (f"| {r['family']} | {r['S']} | {r['P']} | {o['segment_size']} / {z['segment_size']} | "
                f"{o['pred_max_over_mean']:.3f} / {z['pred_max_over_mean']:.3f} |")
        if timed:
            line += (f" {o['fwd_ms_max_over_mean']:.3f} / {z['fwd_ms_max_over_mean']:.3f} |"
                     f" {o['fwdbwd_ms_max_over_mean']:.3f} / {z['fwdbwd_ms_max_over_mean']:.3f} |"
                     f" {o['fwdbwd_ms_max']:.2f} / {z['fwdbwd_ms_max']:.2f} | {r['zigzag_over_ours_fwdbwd_max']:.2f}x |")
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=sorted(masks.FAMILIES))
    ap.add_argument("--seqlens", type=int, nargs="+", default=[32768, 131072], help="total tokens S (batch 1)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="CP degrees P")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-k", type=int, default=None, help="KV heads (default: --heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0, help="mask instances: masks.FAMILIES[f](S, default_rng(seed))")
    ap.add_argument("--check-seqlen", type=int, default=4096)
    ap.add_argument("--check-ranks", type=int, default=4)
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument("--plan-only", action="store_true",
                    help="build every rank's inputs and print shapes/pairs; no torch, no GPU")
    ap.add_argument("--out", default=None, help="JSON output path (the tables also go to its .md sibling)")
    args = ap.parse_args(argv)
    positive = dict(ranks=args.ranks, seqlens=args.seqlens, heads=[args.heads], head_dim=[args.head_dim],
                    reps=[args.reps], check_seqlen=[args.check_seqlen], check_ranks=[args.check_ranks])
    for name, values in positive.items():
        if any(v < 1 for v in values):
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {values}")
    if args.warmup < 0 or args.seed < 0:
        ap.error("--warmup and --seed must be >= 0")
    for s_, p_ in [(s_, p_) for s_ in args.seqlens for p_ in args.ranks] + [(args.check_seqlen, args.check_ranks)]:
        if s_ % (2 * p_):  # zigzag's 2P equal chunks
            ap.error(f"every S must be divisible by 2P (zigzag's 2P chunks); S={s_}, P={p_}")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out: folder {os.path.dirname(os.path.abspath(args.out))} does not exist")
    timed = not args.plan_only
    result = dict(args=vars(args), check={}, per_rank=[], summary=[])
    if timed:
        import torch

        result["device"] = torch.cuda.get_device_name()
        backend = HopperBackend(torch.device("cuda", torch.cuda.current_device()))
        if not args.no_check:
            result["check"] = {f: check(args, f) for f in args.families}
    t_start = time.perf_counter()
    for s in args.seqlens:
        qkvd = random_qkv(args, s, args.seed + 1) if timed else None
        for family in args.families:
            fm = make_mask(family, s, args.seed)
            for p in args.ranks:
                lays = layouts(fm.startend_row_indices, fm.causal, p)
                per_rank = []
                for scheme in SCHEMES:
                    for share in rank_shares(lays[scheme][0], fm.startend_row_indices, fm.causal):
                        x = dict(family=family, S=s, P=p, scheme=scheme, rank=share["rank"],
                                 q_tokens=len(share["q_rows"]), calls=len(share["calls"]),
                                 kv_tokens=int(sum(len(rows) for rows, _ in share["calls"])), pairs=share["pairs"])
                        if timed:
                            x["fwd_ms"], x["fwdbwd_ms"] = time_rank(RankInputs(share, *qkvd), backend,
                                                                    args.head_dim ** -0.5, args.warmup, args.reps)
                        per_rank.append(x)
                        print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in x.items()),
                              flush=True)
                result["per_rank"] += per_rank
                result["summary"].append(summarize(family, s, p, per_rank, lays))
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(result, f, indent=1)
        del qkvd
    result["seconds"] = time.perf_counter() - t_start
    table = markdown(result["per_rank"], result["summary"], timed)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table + "\n")
    bad = [(f, sc) for f, r in result["check"].items() for sc, x in r.items() if not x["ok"]]
    if bad:
        sys.exit(f"correctness check failed for {bad}")


if __name__ == "__main__":
    main()
