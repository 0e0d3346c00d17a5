#!/usr/bin/env python3
"""One attention call to profile under ncu on the GPU machine: ours (paddle_fm3.kernels) or
FlexAttention (FLASH or Triton backend), forward or backward, one mask family. Runs --calls calls
(the first ones warm up and compile), so `ncu --launch-skip` can pick a warm one:

    ncu --clock-control none --kernel-name regex:flash_bwd_wgmma --launch-skip 2 --launch-count 1 \\
        --set full --import-source yes -o $OUT/ours python3 scripts/profile_case.py --impl fm3 --bwd
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import bench_attention as ba  # noqa: E402  (also applies FM3_EXTRA_SITE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=["fm3", "flex_flash", "flex_triton"], default="fm3")
    ap.add_argument("--bwd", action="store_true", help="profile the backward (else the forward)")
    ap.add_argument("--family", default="full", choices=sorted(ba.masks.FAMILIES))
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--deterministic", action="store_true", help="ours: the backward's deterministic dQ")
    args = ap.parse_args()
    import torch
    ba.torch = torch
    s, b, d = args.seqlen, args.batch, args.head_dim
    h = ba.HIDDEN // d
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    sri_np, causal, _ = ba.family_mask(args.family, s, b)
    if args.impl == "fm3":
        sri = torch.from_numpy(sri_np).cuda()
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
        if args.bwd:
            call = lambda: ba.kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal,  # noqa: E731
                                                    deterministic=args.deterministic)
        else:
            call = lambda: ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)  # noqa: E731
    else:
        flex = ba.compiled_flex([args.impl.split("_")[1]])[args.impl.split("_")[1]]
        fm = ba.FlexMask(b, s)
        fm.set_family(sri_np, causal)
        bmask = fm.block_mask()
        qg, kg, vg = (x.transpose(1, 2).detach().clone().requires_grad_(True) for x in (q, k, v))
        o = flex(qg, kg, vg, bmask)
        if args.bwd:
            call = lambda: torch.autograd.grad(o, (qg, kg, vg), do.transpose(1, 2), retain_graph=True)  # noqa: E731
        else:
            call = lambda: flex(qg, kg, vg, bmask)  # noqa: E731
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print("profiled", vars(args))


if __name__ == "__main__":
    main()
