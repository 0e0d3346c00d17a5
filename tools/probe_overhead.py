#!/usr/bin/env python3
"""Host-side overhead of our GPU entry points, on the device: each call's event time (as
bench_attention.py times it) beside the sum of its kernels' times (torch.profiler), per kernel for the
first case. A gap between the two is time the GPU spends on something other than our kernels in the
call (workspace mapping, launch gaps), which a kernel profile does not show.

    python3 tools/probe_overhead.py [--bwd] [--cases causal:8192,full:32768] [--head-dim 128]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import bench_attention as ba  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bwd", action="store_true", help="the backward (else the forward)")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--cases", default="causal:8192,full:8192,causal_document:8192,full:32768,causal:32768",
                    help="family:seqlen,... (batch = total_tokens / seqlen)")
    ap.add_argument("--total-tokens", type=int, default=32768)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    import torch
    ba.torch = torch
    for i, case in enumerate(args.cases.split(",")):
        fam, s = case.split(":")
        s = int(s)
        b, d = max(1, args.total_tokens // s), args.head_dim
        h = ba.HIDDEN // d
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        sri_np, causal, pairs = ba.family_mask(fam, s, b)
        sri = torch.from_numpy(sri_np).cuda()
        ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
        if args.bwd:
            flops = 2.5 * 4.0 * h * d * pairs
            fn = lambda: ba.kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal,  # noqa: E731
                                                   deterministic=args.deterministic)
        else:
            flops = 4.0 * h * d * pairs
            fn = lambda: ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)  # noqa: E731
        t = ba.bench(fn, warmup=2, rep=7)
        kt = ba.kernel_times(fn, rep=3)
        ks = sum(kt.values())
        print(f"{fam} S={s} B={b} D={d}: event {t * 1e3:.3f} ms ({flops / t / 1e12:.0f} TFLOP/s), "
              f"kernels {ks * 1e3:.3f} ms ({flops / ks / 1e12:.0f} TFLOP/s), gap {(t - ks) * 1e3:.3f} ms", flush=True)
        if i == 0:
            for name, sec in sorted(kt.items(), key=lambda z: -z[1]):
                print(f"    {sec * 1e3:8.3f} ms  {name[:70]}")
        del q, k, v, do, out, lse, dq, dk, dv
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
