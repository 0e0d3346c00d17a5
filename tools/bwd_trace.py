#!/usr/bin/env python3
"""Where a backward CTA spends its time: per-CTA timestamps of the WGMMA backward's phases.

Needs a build with the trace compiled in (ops/hopper/bwd/trace.cuh; without the flag the stamps are empty
and the kernels' machine code is that of a build without them):

    FM3_NVCC_EXTRA=-DFM3_BWD_TRACE scripts/gpu_build.sh .devbuild_trace
    scripts/build_dlpack_ext.sh .devbuild_trace
    python3 tools/bwd_trace.py --families causal,causal_document --seqlen 8192 --head-dim 128 [--out t.json]

For each mask it runs the backward once untraced (warm-up), then once with the trace buffer set, and
prints, over the CTAs of the main kernel: the medians of each phase's time from the CTA's start
(bwd/trace.cuh), the median CTA length, and a fit of CTA length = fixed + per_tile x tiles. The gap
between one CTA's end and the next CTA's start on the same SM is the launch cost the fit cannot see.
"""

import argparse
import ctypes
import json
import os
import sys

import numpy as np

SLOTS = ("start", "summary", "scheduled", "first_load", "kv_ready", "first_tile", "loop_end", "epilogue_done", "writer_done")
NSLOTS = len(SLOTS) + 1  # + (SM id << 32 | tiles): kBwdTraceSlots


def summarize(raw):
    """Per-phase medians (us from the CTA's start), CTA lengths, the linear fit and same-SM gaps of a
    [ctas, NSLOTS] uint64 trace."""
    t = raw[:, :len(SLOTS)].astype(np.int64)
    tiles = (raw[:, -1] & 0xFFFFFFFF).astype(np.int64)
    sm = (raw[:, -1] >> 32).astype(np.int64)
    ran = t[:, 0] > 0
    t, tiles, sm = t[ran], tiles[ran], sm[ran]
    rel = (t - t[:, :1]) / 1e3
    end = t[:, 1:].max(axis=1)
    length = (end - t[:, 0]) / 1e3
    out = {"ctas": int(ran.sum()), "phase_median_us": {n: float(np.median(rel[:, i])) for i, n in enumerate(SLOTS)},
           "cta_median_us": float(np.median(length)), "tiles_median": float(np.median(tiles))}
    if np.ptp(tiles) > 0:
        per_tile, fixed = np.polyfit(tiles, length, 1)
        out.update(fit_fixed_us=float(fixed), fit_per_tile_us=float(per_tile))
    gaps = []
    for s in np.unique(sm):  # CTA start minus the previous CTA's end on the same SM
        idx = np.flatnonzero(sm == s)
        order = idx[np.argsort(t[idx, 0])]
        gaps.extend(((t[order[1:], 0] - end[order[:-1]]) / 1e3).tolist())
    if gaps:
        out["sm_gap_median_us"] = float(np.median(gaps))
    out["wall_us"] = float((end.max() - t[:, 0].min()) / 1e3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default="full,causal,causal_document")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--total-tokens", type=int, default=32768)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1, help="mask parameters drawn from this seed")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    import torch
    import bench_attention as ba
    from paddle_fm3 import kernels

    lib_path = os.path.join(os.path.dirname(kernels.__file__), "libfm3_cuda.so")
    lib = ctypes.CDLL(lib_path)
    if not hasattr(lib, "fm3_cuda_bwd_trace"):
        sys.exit(f"{lib_path} has no trace: build it with FM3_NVCC_EXTRA=-DFM3_BWD_TRACE (see this file's doc)")
    lib.fm3_cuda_bwd_trace.argtypes = [ctypes.c_void_p]
    d, s = args.head_dim, args.seqlen
    b, h = max(1, args.total_tokens // s), 4096 // d
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = torch.empty_like(v), torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_n = kernels.bwd_block_n(d)
    ctas = (s + block_n - 1) // block_n * h * b
    buf = torch.zeros(ctas, NSLOTS, dtype=torch.int64, device="cuda")
    rows = []
    for fam in args.families.split(","):
        sri_np, causal, _ = ba.family_mask(fam, s, b, args.seed)
        sri = torch.from_numpy(sri_np).cuda()

        def bwd():
            kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal,
                                  deterministic=args.deterministic)
        kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
        bwd()
        buf.zero_()
        torch.cuda.synchronize()
        if lib.fm3_cuda_bwd_trace(ctypes.c_void_p(buf.data_ptr())) != 0:
            sys.exit("fm3_cuda_bwd_trace failed")
        bwd()
        torch.cuda.synchronize()
        lib.fm3_cuda_bwd_trace(None)
        row = {"family": fam, "head_dim": d, "seqlen": s, "batch": b, "heads": h, "seed": args.seed,
               "deterministic": args.deterministic, **summarize(buf.cpu().numpy().view(np.uint64))}
        rows.append(row)
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
