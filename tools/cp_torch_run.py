#!/usr/bin/env python3
"""One real context-parallel attention step across processes (torch.distributed), three schemes.

Launch with torchrun, one process per GPU (no Paddle needed; the Hopper kernels through the built
``paddle_fm3.kernels``)::

    torchrun --nproc_per_node 8 tools/cp_torch_run.py --out cp_nccl.json     # 8 H200s, NCCL: ~1-2 min
    torchrun --nproc_per_node 2 tools/cp_torch_run.py --backend reference \\
        --dist-backend gloo --seqlens 1024 --check-seqlen 1024 --heads 2 --head-dim 32  # CPU, logic only

Every rank builds the same global ``q, k, v, dout`` (batch 1; same seed, then broadcast from rank
0) and the same mask (``masks.FAMILIES[family](S, default_rng(seed))``), and runs its share of one
forward + backward step under each scheme:

- ``ours``: the plan of ``paddle_fm3.distributed`` (``build_layout``: HCC-IPO balanced segments;
  ``CPPlan``: localized mask, pruned KV exchange) run by ``paddle_fm3.distributed.step``, the CP
  step Paddle users run, with these kernels as its backend: the needed KV segments (K and V packed)
  posted with ``TorchCommunicator.exchange`` (one ``batch_isend_irecv``), attention on the local
  KV while they are in flight, each received chunk folded in by log-sum-exp merge (fp32); the
  remote KV is kept. Backward: dK/dV partials of the remote chunks first, sent back (fp32) to their
  owners with a second exchange while the local chunk's backward runs; owners add them with
  ``index_add``.
- ``zigzag``: ring attention on the dual-chunk split (2P chunks, rank r holds r and 2P-1-r).
  Forward: P steps; at each, the current KV goes to rank r+1 and the next arrives from r-1
  (``batch_isend_irecv``, K and V) while the current chunk's attention runs (every step runs the
  kernel, with the rank's localized mask; fully masked chunks are the kernel's to skip), partials
  LSE-merged. Backward: KV goes around the ring again; each chunk's dK/dV accumulator (fp32)
  travels with it and is back at its owner after P hops.
- ``allgather``: the dual-chunk split; all-gather of K and V, one kernel call over the whole KV with
  the localized mask; backward one call, dK/dV (fp32) reduce-scattered to the owners.

Per scheme and rank, three timed variants, each the median of ``--reps`` after ``--warmup``
(CUDA events around the whole step after a barrier; host clock on CPU): ``step`` (as above),
``compute`` (the same kernel calls, merges and adds, and ours' packing of the KV it sends, with
the KV and gradients already in place, no communication; ours copies the last step's received
buffers in) and ``comm`` (the same communication with ready buffers, no compute; ours still packs
what it sends). Reported
per scheme: max (and mean) over ranks of forward and forward+backward ms, the hidden share of the
communication ``1 - (step - compute) / comm`` (max-over-ranks times; about 0 for allgather, which
does not overlap), bytes sent per rank per step (p2p: the tensors posted; collectives: the ring
algorithm's ``(P-1)/P`` of the gathered / reduced tensor), and ``zigzag / ours`` and
``allgather / ours`` step-time ratios.

Before timing, for every family at ``--check-seqlen``: each scheme's outputs, LSE and dq/dk/dv,
gathered to global order, against one full-sequence computation on one process with the same
backend (``cp_rank_compute.compare``: relative errors <= 2e-2, lse within 1e-2, same -inf
rows; with ``--backend reference`` 1e-4 throughout), for the ``step`` and the ``compute``
variants. A failure exits non-zero before any timing.

``--backend reference`` replaces the kernels by an exact dense attention in torch fp32 on the CPU
(visibility from ``paddle_fm3.masks.to_dense``), to test the distributed logic with
``--dist-backend gloo`` on machines without a GPU; its times mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cp_rank_compute as crc  # noqa: E402  (also puts this checkout on sys.path when needed)
from paddle_fm3 import masks  # noqa: E402
from paddle_fm3.distributed import step  # noqa: E402
from paddle_fm3.distributed.backends.torch import HopperBackend, ReferenceBackend, lse_merge  # noqa: E402
from paddle_fm3.distributed.comm import Communicator, Pending  # noqa: E402
from paddle_fm3.distributed.plan import CPPlan  # noqa: E402

SCHEMES = ("ours", "zigzag", "allgather")
MODES = ("step", "compute", "comm")
DEFAULT_FAMILIES = ["causal_document", "document", "share_question", "causal"]


# ---- the schemes ---------------------------------------------------------------------------

class Ctx:
    """What every scheme shares: the process group, the backend, the clock."""

    def __init__(self, args, dist, comm, backend, device):
        import torch

        self.args, self.dist, self.comm, self.backend, self.device = args, dist, comm, backend, device
        self.rank, self.world = comm.rank, comm.world_size
        self.torch = torch
        self.cuda = device.type == "cuda"
        self.scale = args.head_dim ** -0.5

    def idx(self, rows: np.ndarray):
        return self.torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)

    def barrier(self):
        if self.cuda:
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()


def _rows(segments, segment_size: int) -> np.ndarray:
    segs = np.asarray(segments, dtype=np.int64)
    return (segs[:, None] * segment_size + np.arange(segment_size)[None, :]).reshape(-1)


class Scheme:
    """One rank's share of one scheme. ``run(mode, mark)`` does forward, calls ``mark()``, does
    backward, and returns ``(out, lse, dq fp32, dkv fp32 [B, L, H_k, 2D])`` of the rank's rows
    ``self.rows`` (global, in local order); ``mode`` is ``step``, ``compute`` (no communication:
    the buffers of the last ``step`` are used) or ``comm`` (no compute: ready buffers are sent).
    ``self.sent`` counts the bytes this rank sent in the last run."""

    def __init__(self, ctx: Ctx, layout, fm, q, k, v, dout):
        self.ctx, self.layout = ctx, layout
        self.plan = CPPlan(layout, fm.startend_row_indices, fm.causal, ctx.comm)
        self.rows = self.plan.kv_rows("local")
        i = ctx.idx(self.rows)
        self.q, self.k, self.v, self.dout = (x.index_select(1, i) for x in (q, k, v, dout))
        self.d = k.shape[3]
        self.sent = 0
        self.last = None

    def local_mask(self, key_rows):
        """The rank's localized mask over the given global key rows, prepared for the backend."""
        m = np.ascontiguousarray(self.plan.local_mask[:, :, key_rows, :])
        return self.ctx.backend.mask(m, False, self.plan.local_seqlen)

    def merge(self, acc, lse, o, l):
        return (o.float(), l) if acc is None else lse_merge(acc, lse, o.float(), l)

    def _send(self, sends, recvs):
        """Post point-to-point sends/recvs as one batch (several tensors per peer allowed: tags
        keep them apart on gloo; NCCL matches them in order). Returns the requests."""
        dist = self.ctx.dist
        ops = [dist.P2POp(dist.isend, t, p, tag=i) for i, (p, t) in enumerate(sends)]
        ops += [dist.P2POp(dist.irecv, t, p, tag=i) for i, (p, t) in enumerate(recvs)]
        self.sent += sum(t.numel() * t.element_size() for _, t in sends)
        return dist.batch_isend_irecv(ops) if ops else []


class _Traffic(Communicator):
    """``ctx.comm`` as the CP step sees it in one run of :class:`Ours`: counts the bytes sent, keeps
    the received buffers of every exchange (``received``), or, with ``replay`` (the ``received`` of
    a ``step`` run), communicates nothing and copies those buffers in (the ``compute`` variant)."""

    def __init__(self, comm, replay=None):
        self.comm, self.replay = comm, replay
        self.rank, self.world_size = comm.rank, comm.world_size
        self.sent, self.received = 0, []

    def exchange(self, sends, recvs):
        self.sent += sum(t.numel() * t.element_size() for _, t in sends)
        if self.replay is not None:
            for (_, buf), old in zip(recvs, self.replay[len(self.received)]):
                buf.copy_(old)
            self.received.append([buf for _, buf in recvs])
            return Pending([], [])
        self.received.append([buf for _, buf in recvs])
        return self.comm.exchange(sends, recvs)

    def all_gather(self, tensor):
        return self.comm.all_gather(tensor)


class _NoAttention:
    """The ``comm`` variant's backend: the step's tensor operations (packing what is sent, the
    fp32 casts) as ``backend``'s, attention and merges skipped (outputs: ready buffers)."""

    def __init__(self, backend, q, k):
        self.backend, self.name = backend, backend.name
        self._bufs = {}
        self._q, self._k = q, k

    def __getattr__(self, attr):  # index, take_rows, cat_last, split_last, empty, zeros_f32, f32, ...
        return getattr(self.backend, attr)

    def _buf(self, like, shape=None):
        shape = tuple(like.shape if shape is None else shape)
        key = (shape, like.dtype)
        if key not in self._bufs:
            self._bufs[key] = like.new_zeros(shape)
        return self._bufs[key]

    def fwd(self, q, k, v, mask, scale):
        b, lq, h, _ = q.shape
        return self._buf(q), self._buf(q, (b, h, lq)).float()

    def bwd(self, q, k, v, out, lse, dout, mask, scale):
        return self._buf(q), self._buf(k), self._buf(v)

    def lse_merge(self, o1, l1, o2, l2):
        return o1, l1

    def index_add_rows(self, x, index, src):
        return x


class Ours(Scheme):
    """``paddle_fm3.distributed.step`` (what Paddle users run) with ``ctx.backend`` and
    ``ctx.comm``: ``compute`` replays the received buffers of the last ``step`` run without
    communicating; ``comm`` communicates with attention and merges skipped."""

    def run(self, mode, mark):
        ctx, be = self.ctx, self.ctx.backend
        replay = self.last["received"] if mode == "compute" else None
        comm = _Traffic(ctx.comm, replay)
        if mode == "comm":
            be = _NoAttention(be, self.q, self.k)
        out, lse, remote = step.forward(self.plan, be, self.q, self.k, self.v, ctx.scale, comm=comm)
        mark()
        dq, dkv = step.backward(self.plan, be, self.q, self.k, self.v, out, lse, self.dout, remote, ctx.scale,
                                comm=comm)
        self.sent = comm.sent
        if mode == "step":
            self.last = dict(received=comm.received)
        if mode == "comm":
            return None, None, None, None
        return out, lse.contiguous(), dq, dkv


class Zigzag(Scheme):
    """Ring attention on the dual-chunk split (the layout's segments are [r, 2P-1-r])."""

    def __init__(self, ctx, layout, fm, q, k, v, dout):
        super().__init__(ctx, layout, fm, q, k, v, dout)
        c, P = layout.segment_size, ctx.world
        self.masks = [self.local_mask(_rows(layout.segments[o], c)) for o in range(P)]
        self.next, self.prev = (ctx.rank + 1) % P, (ctx.rank - 1) % P

    def _ring(self, cur, comm_on, pre, t, hist):
        """Post the hop of KV ``cur`` to the next rank; returns (requests, the buffers the next KV
        arrives in). Without communication the next KV is the one recorded at step ``t + 1``."""
        if t == self.ctx.world - 1:
            return [], None
        if not comm_on:
            return [], pre[t + 1]
        nxt = tuple(x.new_empty(x.shape) for x in cur)
        reqs = self._send([(self.next, cur[0]), (self.next, cur[1])], [(self.prev, nxt[0]), (self.prev, nxt[1])])
        if hist is not None:
            hist.append(nxt)
        return reqs, nxt

    def run(self, mode, mark):
        torch, ctx, be, P, r = self.ctx.torch, self.ctx, self.ctx.backend, self.ctx.world, self.ctx.rank
        comm_on, comp_on = mode != "compute", mode != "comm"
        self.sent, last = 0, self.last
        record = mode == "step"
        kv_hist = [(self.k, self.v)] if record else None
        pre_kv = last["kv"] if last else None
        # forward: P steps, the next hop in flight during each step's attention
        cur, acc, lse = (self.k, self.v), None, None
        for t in range(P):
            reqs, nxt = self._ring(cur, comm_on, pre_kv, t, kv_hist)
            if comp_on:
                o, l = be.fwd(self.q, cur[0], cur[1], self.masks[(r - t) % P], ctx.scale)
                acc, lse = self.merge(acc, lse, o, l)
            for q_ in reqs:
                q_.wait()
            cur = nxt
        out = acc.to(self.q.dtype) if comp_on else None
        lse = lse.contiguous() if comp_on else None
        mark()
        # backward: KV around the ring again, each chunk's dK/dV accumulator travelling with it
        b, L, hk, d = self.k.shape
        cur, dq, carry, dkv_reqs = (self.k, self.v), None, None, []
        dkv_sends, dkv_recvs = [], []
        if comp_on:
            dq = torch.zeros(self.q.shape, device=ctx.device)
        for t in range(P):
            reqs, nxt = self._ring(cur, comm_on, pre_kv, t, None)
            if comp_on:
                dq_c, dk_c, dv_c = be.bwd(self.q, cur[0], cur[1], out, lse, self.dout, self.masks[(r - t) % P],
                                          ctx.scale)
                dq += dq_c.float()
                part = torch.cat([dk_c.float(), dv_c.float()], -1)
            else:
                part = last["dkv_sends"][t]
            if t > 0:
                for q_ in dkv_reqs:
                    q_.wait()
                if comp_on:
                    part = part + carry
            if comm_on:
                carry = torch.empty((b, L, hk, 2 * d), device=ctx.device)
                dkv_reqs = self._send([(self.next, part)], [(self.prev, carry)])
            else:
                carry, dkv_reqs = last["dkv_recvs"][t], []
            dkv_sends.append(part)
            dkv_recvs.append(carry)
            for q_ in reqs:
                q_.wait()
            cur = nxt
        for q_ in dkv_reqs:
            q_.wait()
        if record:
            self.last = dict(kv=kv_hist, dkv_sends=dkv_sends, dkv_recvs=dkv_recvs)
        return out, lse, dq, (carry if comp_on else None)


class AllGather(Scheme):
    """All-gather K and V on the dual-chunk split; one kernel call over the whole KV."""

    def __init__(self, ctx, layout, fm, q, k, v, dout):
        super().__init__(ctx, layout, fm, q, k, v, dout)
        self.mask = self.local_mask(_rows(layout.segments.reshape(-1), layout.segment_size))  # keys in gathered (rank) order
        dist = ctx.dist  # the *_single names replace the *_tensor ones in newer torch
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def _gather(self, x):
        P, (b, L, h, d) = self.ctx.world, x.shape
        out = x.new_empty((P * b, L, h, d))
        self._all_gather(out, x.contiguous())
        self.sent += (P - 1) * x.numel() * x.element_size()  # ring all-gather
        return out.view(P, b, L, h, d).transpose(0, 1).reshape(b, P * L, h, d)

    def run(self, mode, mark):
        torch, ctx, be, P = self.ctx.torch, self.ctx, self.ctx.backend, self.ctx.world
        comm_on, comp_on = mode != "compute", mode != "comm"
        self.sent, last = 0, self.last
        if comm_on:
            k_all, v_all = self._gather(self.k), self._gather(self.v)
        else:
            k_all, v_all = last["k_all"], last["v_all"]
        out = lse = dq = None
        if comp_on:
            out, lse = be.fwd(self.q, k_all, v_all, self.mask, ctx.scale)
        mark()
        b, L, hk, d = self.k.shape
        if comp_on:
            dq, dk, dv = be.bwd(self.q, k_all, v_all, out, lse, self.dout, self.mask, ctx.scale)
            dq = dq.float()
            dkv_all = torch.cat([dk.float(), dv.float()], -1)  # [B, S, H_k, 2D], rank-major rows
        else:
            dkv_all = last["dkv_all"]
        if comm_on:
            dkv = torch.empty((b, L, hk, 2 * d), device=ctx.device)
            src = dkv_all.view(b, P, L, hk, 2 * d).transpose(0, 1).contiguous().view(P * b, L, hk, 2 * d)
            self._reduce_scatter(dkv, src)
            self.sent += (P - 1) * dkv.numel() * dkv.element_size()  # ring reduce-scatter
        else:
            dkv = last["dkv"]  # what the reduce-scatter delivered (compute: its input was still computed)
        if mode == "step":
            self.last = dict(k_all=k_all, v_all=v_all, dkv_all=dkv_all, dkv=dkv)
        return out, lse, dq, (dkv if comp_on else None)


def build(ctx, scheme, fm, layouts, qkvd):
    lay = layouts["ours" if scheme == "ours" else "zigzag"][0]
    return {"ours": Ours, "zigzag": Zigzag, "allgather": AllGather}[scheme](ctx, lay, fm, *qkvd)


# ---- correctness ---------------------------------------------------------------------------

def gather_global(ctx, sch, res):
    """This rank's (out, lse, dq, dkv) of every rank, put into global row order (on every rank)."""
    torch = ctx.torch
    out, lse, dq, dkv = res
    rows = ctx.comm.all_gather(torch.from_numpy(sch.rows).to(ctx.device))
    parts = [ctx.comm.all_gather(x.contiguous()) for x in (out, lse.transpose(1, 2), dq, dkv)]
    glob = []
    for xs in parts:
        g = xs[0].new_empty((xs[0].shape[0], sch.layout.seqlen) + tuple(xs[0].shape[2:]))
        for rw, x in zip(rows, xs):
            g[:, rw] = x
        glob.append(g)
    d = sch.d
    return glob[0], glob[1].transpose(1, 2), glob[2], glob[3][..., :d], glob[3][..., d:]


def check(ctx, family: str) -> dict:
    """Every scheme (step and compute variants) against one full-sequence computation."""
    args, torch, be = ctx.args, ctx.torch, ctx.backend
    s = args.check_seqlen
    fm = crc.make_mask(family, s, args.seed)
    qkvd = global_tensors(ctx, s)
    q, k, v, dout = qkvd
    full = be.mask(fm.startend_row_indices, fm.causal, s)
    out_ref, lse_ref = be.fwd(q, k, v, full, ctx.scale)
    ref = (out_ref, lse_ref) + tuple(be.bwd(q, k, v, out_ref, lse_ref, dout, full, ctx.scale))
    lays = crc.layouts(fm.startend_row_indices, fm.causal, ctx.world)
    # hopper: cp_rank_compute's bf16 tolerance; reference (fp32, exact up to summation order): tight
    tol = {} if be.name == "hopper" else dict(rel=1e-4, out_abs=1e-4, lse_abs=1e-4)
    res = {}
    for scheme in args.schemes:
        sch = build(ctx, scheme, fm, lays, qkvd)
        for mode in ("step", "compute"):
            r = crc.compare(gather_global(ctx, sch, sch.run(mode, lambda: None)), ref, **tol)
            res[f"{scheme}/{mode}"] = r
            if ctx.rank == 0:
                print(f"check {family:16s} S={s} P={ctx.world} {scheme:9s} {mode:7s} " + " ".join(
                    f"{n}={val:.2e}" if isinstance(val, float) else f"{n}={val}" for n, val in r.items()),
                    flush=True)
    # every rank decides the same: not ok anywhere -> not ok
    bad = torch.tensor([0.0 if r["ok"] else 1.0 for r in res.values()], device=ctx.device)
    ctx.dist.all_reduce(bad, op=ctx.dist.ReduceOp.MAX)
    for key, b in zip(res, bad.tolist()):
        res[key]["ok"] = res[key]["ok"] and not b
    return res


# ---- timing --------------------------------------------------------------------------------

class Clock:
    def __init__(self, cuda: bool):
        import torch

        self.torch, self.cuda, self.marks = torch, cuda, []

    def mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def elapsed(self):
        """ms from the first mark to each later one."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [self.marks[0].elapsed_time(e) for e in self.marks[1:]]
        return [1e3 * (t - self.marks[0]) for t in self.marks[1:]]


def time_mode(ctx, sch, mode):
    """Median (fwd ms, fwd+bwd ms) over reps, and the bytes sent in one run."""
    fwd, both = [], []
    for i in range(ctx.args.warmup + ctx.args.reps):
        ctx.barrier()
        clock = Clock(ctx.cuda)
        clock.mark()
        sch.run(mode, clock.mark)
        clock.mark()
        f, fb = clock.elapsed()
        if i >= ctx.args.warmup:
            fwd.append(f)
            both.append(fb)
    return float(np.median(fwd)), float(np.median(both)), int(sch.sent)


def gather_floats(ctx, values):
    """[P, n] float64 array of every rank's ``values``."""
    t = ctx.torch.tensor(values, dtype=ctx.torch.float64, device=ctx.device)
    return np.array([x.cpu().numpy() for x in ctx.comm.all_gather(t)])


def global_tensors(ctx, s):
    """The same global q, k, v, dout on every rank (drawn with the seed, then rank 0's broadcast)."""
    torch = ctx.torch
    dtype = None if ctx.backend.name == "hopper" else torch.float32
    qkvd = crc.random_qkv(ctx.args, s, ctx.args.seed + 1, device=ctx.device, dtype=dtype)
    for x in qkvd:
        ctx.dist.broadcast(x, src=0)
    return qkvd


def measure(ctx, family, s, fm, lays, qkvd) -> dict:
    row = dict(family=family, S=s, P=ctx.world)
    for scheme in ctx.args.schemes:
        sch = build(ctx, scheme, fm, lays, qkvd)
        sch.run("step", lambda: None)  # fills the buffers of the compute/comm variants
        per = []
        for mode in MODES:
            per += list(time_mode(ctx, sch, mode))
        g = gather_floats(ctx, per)  # [P, 9]: (fwd, fwdbwd, bytes) per mode
        x = {}
        for j, mode in enumerate(MODES):
            for k_, name in enumerate(("fwd_ms", "fwdbwd_ms", "bytes")):
                col = g[:, 3 * j + k_]
                x[f"{mode}_{name}_per_rank"] = col.tolist()
                x[f"{mode}_{name}_max"] = float(col.max())
                x[f"{mode}_{name}_mean"] = float(col.mean())
        for key in ("fwd_ms", "fwdbwd_ms"):
            comm = x[f"comm_{key}_max"]
            exposed = x[f"step_{key}_max"] - x[f"compute_{key}_max"]
            x[f"hidden_{key[:-3]}"] = float(1.0 - exposed / comm) if comm > 0 else None
        x["bytes_sent_max"], x["bytes_sent_mean"] = x["step_bytes_max"], x["step_bytes_mean"]
        x["segment_size"] = sch.layout.segment_size
        row[scheme] = x
        del sch
        if ctx.rank == 0:
            print(f"{family} S={s} P={ctx.world} {scheme}: step fwd {x['step_fwd_ms_max']:.3f} fwd+bwd "
                  f"{x['step_fwdbwd_ms_max']:.3f} compute {x['compute_fwdbwd_ms_max']:.3f} comm "
                  f"{x['comm_fwdbwd_ms_max']:.3f} ms (max over ranks), MB sent max {x['bytes_sent_max'] / 1e6:.1f}",
                  flush=True)
    if "ours" in row:
        for other in ("zigzag", "allgather"):
            if other in row:
                for key in ("fwd_ms", "fwdbwd_ms"):
                    row[f"{other}_over_ours_{key[:-3]}"] = row[other][f"step_{key}_max"] / row["ours"][f"step_{key}_max"]
    return row


def markdown(rows) -> str:
    lines = ["| family | S | P | scheme | fwd ms | fwd+bwd ms | fwd+bwd max/mean | compute fwd+bwd ms | "
             "comm fwd+bwd ms | hidden fwd / fwd+bwd | MB sent/rank max / mean | ours speedup fwd / fwd+bwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for scheme in SCHEMES:
            if scheme not in r:
                continue
            x = r[scheme]
            hid = " / ".join("-" if x[k] is None else f"{x[k]:.2f}" for k in ("hidden_fwd", "hidden_fwdbwd"))
            mom = x["step_fwdbwd_ms_max"] / x["step_fwdbwd_ms_mean"] if x["step_fwdbwd_ms_mean"] > 0 else 1.0
            sp = ("-" if scheme == "ours" or f"{scheme}_over_ours_fwd" not in r else
                  f"{r[f'{scheme}_over_ours_fwd']:.2f}x / {r[f'{scheme}_over_ours_fwdbwd']:.2f}x")
            lines.append(f"| {r['family']} | {r['S']} | {r['P']} | {scheme} | {x['step_fwd_ms_max']:.3f} | "
                         f"{x['step_fwdbwd_ms_max']:.3f} | {mom:.3f} | {x['compute_fwdbwd_ms_max']:.3f} | "
                         f"{x['comm_fwdbwd_ms_max']:.3f} | {hid} | {x['bytes_sent_max'] / 1e6:.1f} / "
                         f"{x['bytes_sent_mean'] / 1e6:.1f} | {sp} |")
    return "\n".join(lines)


# ---- driver --------------------------------------------------------------------------------

def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=sorted(masks.FAMILIES))
    ap.add_argument("--seqlens", type=int, nargs="+", default=[32768, 131072], help="total tokens S (batch 1)")
    ap.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--heads-k", type=int, default=None, help="KV heads (default: --heads)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="hopper only (reference: fp32)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="mask instances: masks.FAMILIES[f](S, default_rng(seed))")
    ap.add_argument("--check-seqlen", type=int, default=4096)
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument("--check-only", action="store_true", help="the correctness check only, no timing")
    ap.add_argument("--backend", choices=["hopper", "reference"], default="hopper",
                    help="attention: the Hopper kernels (CUDA) or an exact dense torch fp32 CPU reference")
    ap.add_argument("--dist-backend", choices=["nccl", "gloo"], default=None,
                    help="default: nccl for hopper, gloo for reference")
    ap.add_argument("--out", default=None, help="JSON output path, written by rank 0 (tables in its .md sibling)")
    args = ap.parse_args(argv)
    if "WORLD_SIZE" not in os.environ or "LOCAL_RANK" not in os.environ:
        ap.error("launch with torchrun (WORLD_SIZE / LOCAL_RANK not set), e.g. "
                 "torchrun --nproc_per_node 2 tools/cp_torch_run.py")
    world = int(os.environ["WORLD_SIZE"])
    if world < 2:
        ap.error(f"needs at least 2 processes (a CP group), got WORLD_SIZE={world}")
    args.dist_backend = args.dist_backend or ("nccl" if args.backend == "hopper" else "gloo")
    if (args.backend, args.dist_backend) not in (("hopper", "nccl"), ("reference", "gloo")):
        ap.error(f"--backend {args.backend} goes with --dist-backend "
                 f"{'nccl' if args.backend == 'hopper' else 'gloo'}, got {args.dist_backend}")
    hk = args.heads_k or args.heads
    for name, val in (("heads", args.heads), ("head-dim", args.head_dim), ("reps", args.reps),
                      ("heads-k", hk), ("check-seqlen", args.check_seqlen)):
        if val < 1:
            ap.error(f"--{name} must be >= 1, got {val}")
    if args.heads % hk:
        ap.error(f"--heads ({args.heads}) must be a multiple of --heads-k ({hk})")
    if args.warmup < 0 or args.seed < 0:
        ap.error("--warmup and --seed must be >= 0")
    for s in args.seqlens + ([] if args.no_check else [args.check_seqlen]):
        if s < 1 or s % (2 * world):
            ap.error(f"every S must be a positive multiple of 2P = {2 * world} (zigzag's 2P chunks), got {s}")
    if args.no_check and args.check_only:
        ap.error("--no-check and --check-only exclude each other")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        ap.error(f"--out: folder {os.path.dirname(os.path.abspath(args.out))} does not exist")
    return args


def main(argv=None):
    args = parse(argv)
    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(var, "1" if var != "NCCL_NVLS_ENABLE" else "0")  # NVLink multicast off
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.backend == "hopper":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = HopperBackend(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
        backend = ReferenceBackend(device)
    dist.init_process_group(backend=args.dist_backend)
    from paddle_fm3.distributed.comm import TorchCommunicator

    ctx = Ctx(args, dist, TorchCommunicator(), backend, device)
    t0 = time.perf_counter()
    result = dict(args=vars(args), world_size=ctx.world, nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
                  torch=torch.__version__, device=torch.cuda.get_device_name() if ctx.cuda else "cpu",
                  check={}, rows=[])

    def write():
        if ctx.rank == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    if not args.no_check:
        result["check"] = {f: check(ctx, f) for f in args.families}
        result["check_seconds"] = time.perf_counter() - t0
        write()
        bad = [(f, k) for f, r in result["check"].items() for k, x in r.items() if not x["ok"]]
        if bad:
            if ctx.rank == 0:
                print(f"correctness check failed for {bad}", file=sys.stderr, flush=True)
            dist.destroy_process_group()
            sys.exit(1)
    if not args.check_only:
        for s in args.seqlens:
            qkvd = global_tensors(ctx, s)
            for family in args.families:
                fm = crc.make_mask(family, s, args.seed)
                lays = crc.layouts(fm.startend_row_indices, fm.causal, ctx.world)
                result["rows"].append(measure(ctx, family, s, fm, lays, qkvd))
                write()
            del qkvd
            if ctx.cuda:
                torch.cuda.empty_cache()
    result["seconds"] = time.perf_counter() - t0
    if ctx.rank == 0:
        table = markdown(result["rows"])
        print("\n" + table, flush=True)
        if args.out:
            write()
            with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
                f.write(table + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
