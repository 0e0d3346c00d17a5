"""Gradients of ours and of FlashAttention-4's own call at a benchmark's shape, against an fp32 reference
on a few (batch, head) slices: which one is right where they disagree (bench_attention.py's fa4_maxdiff).

The masks and calls are bench_attention.py's (--seed draws the family's parameters as its
--random-params does), the inputs random normal bf16 as there; the reference is dense fp32 attention with the mask of paddle_fm3.mask_semantics.to_dense, through autograd,
one (batch, head) at a time. Prints one line per implementation, family and gradient: the largest
absolute error over the slices and the relative Frobenius error, and exits 1 if an implementation's
relative error exceeds --tol (bf16 inputs, fp32 accumulation: about 1e-2 at most).

    python3 tools/check_peer_grads.py --head-dim 80 --families causal,causal_document --impls fm3,fa4
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_attention as ba  # noqa: E402  (also adds FM3_EXTRA_SITE for flash-attn-4)
from paddle_fm3 import kernels  # noqa: E402
from paddle_fm3.mask_semantics import to_dense  # noqa: E402


def reference_grads(q, k, v, do, visible, scale):
    """dq, dk, dv (fp32) of one head: q [S, D], visible [S_q, S_k] boolean."""
    qf, kf, vf = (x.float().requires_grad_(True) for x in (q, k, v))
    s = (qf @ kf.T) * scale
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows: 0
    out = p @ vf
    return torch.autograd.grad(out, (qf, kf, vf), do.float())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head-dim", type=ba.head_dim_pair, default=(80, 80), help="D or DxDV")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--total-tokens", type=int, default=32768)
    ap.add_argument("--families", default="full,causal,causal_document,document")
    ap.add_argument("--seed", type=int, default=1, help="the mask parameters' seed (bench --random-params)")
    ap.add_argument("--impls", default="fm3,fa4")
    ap.add_argument("--slices", default="0:0,-1:-1", help="batch:head pairs to check (negative: from the end)")
    ap.add_argument("--tol", type=float, default=2e-2)
    args = ap.parse_args()
    ba.torch = torch  # bench_attention imports torch in its main()
    d, d_v = args.head_dim
    s, b, h = args.seqlen, max(1, args.total_tokens // args.seqlen), ba.HIDDEN // d
    torch.manual_seed(0)
    q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(b, s, h, d_v, device="cuda", dtype=torch.bfloat16)
    do = torch.randn_like(v)
    scale = d ** -0.5
    slices = [tuple(int(x) for x in p.split(":")) for p in args.slices.split(",")]
    slices = [(bi % b, hi % h) for bi, hi in slices]
    bad = False
    for fam in args.families.split(","):
        sri_np, causal, _ = ba.family_mask(fam, s, b, args.seed)
        sri = torch.from_numpy(sri_np).cuda()
        grads = {}
        if "fm3" in args.impls:
            out = torch.empty_like(v)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            for x in (dq, dk, dv):
                x.fill_(float("nan"))  # poisoned: a gradient left unwritten shows
            kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
            kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal)
            grads["fm3"] = (dq, dk, dv)
        if "fa4" in args.impls:
            peer = ba.fa4_peer(sri_np, causal, b, s)
            if peer is None:
                print(f"{fam}: FlashAttention-4 has no own call for this mask")
            else:
                q4, k4, v4 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
                grads["fa4"] = torch.autograd.grad(peer[1](q4, k4, v4), (q4, k4, v4), do)
        err = {name: [[0.0, 0.0, 0.0] for _ in range(3)] for name in grads}  # [grad][max abs, err^2, ref^2]
        for bi, hi in slices:
            hm = hi if sri_np.shape[1] > 1 else 0
            visible = torch.from_numpy(to_dense(sri_np[bi:bi + 1, hm:hm + 1], causal)[0, 0]).cuda()
            ref = reference_grads(q[bi, :, hi], k[bi, :, hi], v[bi, :, hi], do[bi, :, hi], visible, scale)
            for name, g in grads.items():
                for i, (x, r) in enumerate(zip(g, ref)):
                    e = x[bi, :, hi].float() - r
                    err[name][i][0] = max(err[name][i][0], float(e.abs().max()))
                    err[name][i][1] += float((e * e).sum())
                    err[name][i][2] += float((r * r).sum())
        for name, per in err.items():
            for gname, (mx, e2, r2) in zip(("dq", "dk", "dv"), per):
                rel = (e2 / max(r2, 1e-30)) ** 0.5
                flag = "" if rel <= args.tol and np.isfinite(rel) else "  <-- wrong"
                bad |= bool(flag)
                print(f"D={d}/{d_v} {fam:16s} {name}: {gname} max abs {mx:.4g}, relative {rel:.3g}{flag}", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
