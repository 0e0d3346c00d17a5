#!/usr/bin/env python3
"""One attention call to profile under ncu on the GPU machine: ours (paddle_fm3.kernels),
FlashAttention-4's own call for the mask (fa4: flash_attn_func / flash_attn_varlen_func, as
bench_attention.py picks it) or FlexAttention (FLASH or Triton backend), forward or backward, one
mask family. Runs --calls calls
(the first ones warm up and compile), so `ncu --launch-skip` can pick a warm one:

    ncu --clock-control none --kernel-name regex:flash_bwd_wgmma --launch-skip 2 --launch-count 1 \\
        --set full --import-source yes -o $OUT/ours python3 tools/profile_case.py --impl fm3 --bwd

--kernel-times also prints every kernel's GPU time per call; --compare fm3,flex_flash instead times the
implementations in alternating rounds in one process, each call's event time beside its kernels' time
(--compare fm3: the host-side overhead of our entry point, the gap between the two).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import bench_attention as ba  # noqa: E402  (also applies FM3_EXTRA_SITE)

IMPLS = ("fm3", "fa4", "flex_flash", "flex_triton")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--impl", choices=IMPLS, default="fm3")
    ap.add_argument("--bwd", action="store_true", help="profile the backward (else the forward)")
    ap.add_argument("--family", default="full", choices=sorted(ba.masks.FAMILIES))
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--head-dim", type=ba.head_dim_pair, default=(128, 128), metavar="D|DxDV",
                    help="head dim, or q/k and v head dims (192x128: MLA)")
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--deterministic", action="store_true", help="ours: the backward's deterministic dQ")
    ap.add_argument("--compare", metavar="IMPL,IMPL",
                    help="instead: per round and implementation, in alternating order, the event time of one call "
                         "as bench_attention.py times it (median of --calls) beside the sum of its kernels' times")
    ap.add_argument("--rounds", type=int, default=3, help="--compare's rounds")
    ap.add_argument("--kernel-times", action="store_true",
                    help="after the calls, time --calls more under torch.profiler: every kernel's GPU time per call")
    args = ap.parse_args()
    if args.compare and not set(args.compare.split(",")) <= set(IMPLS):
        ap.error(f"--compare: a comma-separated list of {', '.join(IMPLS)}, got {args.compare!r}")
    import torch
    ba.torch = torch
    d, d_v = args.head_dim
    s, b, h = args.seqlen, args.batch, ba.HIDDEN // d
    q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v, do = (torch.randn(b, s, h, d_v, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    sri_np, causal, _ = ba.family_mask(args.family, s, b)

    def make_call(impl):
        if impl == "fm3":
            sri = torch.from_numpy(sri_np).cuda()
            out = torch.empty_like(do)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
            if args.bwd:
                return lambda: ba.kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal,
                                                        deterministic=args.deterministic)
            return lambda: ba.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
        if impl == "fa4":
            peer = ba.fa4_peer(sri_np, causal, b, s)
            if peer is None:
                sys.exit(f"fa4: FlashAttention-4 has no call of its own for {args.family} (FLASH-through-Flex is the peer)")
            q4, k4, v4 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
            o = peer[1](q4, k4, v4)
            if args.bwd:
                return lambda: torch.autograd.grad(o, (q4, k4, v4), do, retain_graph=True)
            return lambda: peer[1](q4, k4, v4)
        backend = impl.split("_")[1]
        flex = ba.compiled_flex([backend])[backend]
        fm = ba.FlexMask(b, s)
        fm.set_family(sri_np, causal)
        bmask = fm.block_mask()
        qg, kg, vg = (x.transpose(1, 2).detach().clone().requires_grad_(True) for x in (q, k, v))
        o = flex(qg, kg, vg, bmask)
        if args.bwd:
            return lambda: torch.autograd.grad(o, (qg, kg, vg), do.transpose(1, 2), retain_graph=True)
        return lambda: flex(qg, kg, vg, bmask)

    if args.compare:
        compare({impl: make_call(impl) for impl in args.compare.split(",")}, args.calls, args.rounds)
        return
    call = make_call(args.impl)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    if args.kernel_times:
        print_kernel_times(call, args.calls)
    print("profiled", vars(args))


def compare(calls, rep, rounds):
    """Event time per call (bench_attention.bench: each call alone, synchronized) against the GPU time
    of its kernels (torch.profiler), in ms, per round for every implementation in turn: a gap is time
    the GPU spends outside the kernels (host work before the launch, launch gaps)."""
    print("| round | impl | event ms | kernels ms | event / kernels |")
    print("|---|---|---|---|---|")
    for r in range(rounds):
        for impl, call in calls.items():
            event = ba.bench(call, warmup=1, rep=rep) * 1e3
            kern = sum(ba.kernel_times(call, rep).values()) * 1e3
            print(f"| {r + 1} | {impl} | {event:.3f} | {kern:.3f} | {event / kern:.3f} |", flush=True)


def print_kernel_times(call, calls):
    """Every GPU kernel of `calls` calls (bench_attention.kernel_times), as time per call (us), largest first."""
    times = sorted(((t * 1e6, name) for name, t in ba.kernel_times(call, calls).items()), reverse=True)
    print(f"kernel times per call (us), {calls} calls")
    for t, name in times:
        print(f"{t:10.1f}  {name[:110]}")
    print(f"{sum(t for t, _ in times):10.1f}  total")


if __name__ == "__main__":
    main()
