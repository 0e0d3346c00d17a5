#!/usr/bin/env python3
"""Side-by-side forward benchmark on the GPU machine (no Paddle needed).

For each mask family of paddle_fm3.masks.FAMILIES, sequence length S and head dim D (bf16, 128K
tokens in total: batch = 128K / S; hidden 4096: heads = 4096 / D), times
  - this package's Hopper kernel (paddle_fm3.kernels.flashmask_fwd, block summary included),
  - torch.compile'd FlexAttention with a mask_mod reading the same four column vectors
    (create_block_mask time reported separately, not in the attention time),
  - cuDNN SDPA on the full and causal families,
and the block-summary kernel alone. TFLOP/s count only visible pairs: 4 * B * H * D * pairs / t.

    python3 scripts/bench_attention.py --seqlens 32768 --head-dims 128 --out $OUT/bench.json

--bwd times the backward instead (paddle_fm3.kernels.flashmask_bwd, default and deterministic dQ;
forward+backward; FlexAttention's and cuDNN SDPA's backward through autograd). Backward FLOPs are
2.5x the forward's, forward+backward 3.5x:

    python3 scripts/bench_attention.py --bwd --total-tokens 32768 --seqlens 32768 --head-dims 128
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from paddle_fm3 import kernels, masks  # noqa: E402

torch = None  # imported by main() after argument parsing, so --help works where torch is absent
TOTAL = 128 * 1024
HIDDEN = 4096


def bench(fn, warmup=2, rep=8):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts)) / 1e3  # seconds


def normalized_vectors(sri, causal, sq, device="cuda"):
    """[B, Hm, S, C] -> four [B, S] int32 vectors (LTS, LTE, UTS, UTE), as fm3::load_column."""
    a = sri[:, 0]
    c = a.shape[-1]
    lts = a[..., 0]
    if causal:
        lte = a[..., 1] if c == 2 else np.full_like(lts, sq)
        uts = np.zeros_like(lts)
        ute = np.zeros_like(lts)
    elif c == 2:
        lte, uts, ute = np.full_like(lts, sq), np.zeros_like(lts), a[..., 1]
    else:
        lte, uts, ute = a[..., 1], a[..., 2], a[..., 3]
    return [torch.from_numpy(np.ascontiguousarray(x, dtype=np.int32)).to(device) for x in (lts, lte, uts, ute)]


class FlexMask:
    """FlexAttention's view of a FlashMask mask: a mask_mod reading the four column vectors (and the
    causal flag) from buffers that each family overwrites, so the compiled kernels are reused."""

    def __init__(self, b, s, device="cuda"):
        self.b, self.s, self.device = b, s, device
        self.vecs = [torch.zeros(b, s, dtype=torch.int32, device=device) for _ in range(4)]
        self.causal_flag = torch.zeros(1, dtype=torch.int32, device=device)
        lts, lte, uts, ute = self.vecs
        causal_flag = self.causal_flag

        def mask_mod(bi, hi, qi, kj):  # a plain function: create_block_mask rejects bound methods
            hidden = ((qi >= lts[bi, kj]) & (qi < lte[bi, kj])) | ((qi >= uts[bi, kj]) & (qi < ute[bi, kj]))
            return ~hidden & ((kj <= qi) | (causal_flag[0] == 0))
        self.mask_mod = mask_mod

    def set_family(self, sri_np, causal):
        for buf, val in zip(self.vecs, normalized_vectors(sri_np, causal, self.s, self.device)):
            buf.copy_(val)
        self.causal_flag.fill_(1 if causal else 0)

    def block_mask(self):
        """The BlockMask of the current family. _compile=True evaluates the mask_mod block by block
        instead of materializing the dense B x S x S mask (at S = 128K that asks for 128 GiB)."""
        from torch.nn.attention.flex_attention import create_block_mask
        return create_block_mask(self.mask_mod, self.b, None, self.s, self.s, device=self.device, _compile=True)


def main():
    ap = argparse.ArgumentParser(description="Hopper attention benchmark vs FlexAttention and cuDNN SDPA "
                                 "(needs torch with CUDA and a Hopper GPU; see the module doc).")
    ap.add_argument("--seqlens", default="32768", help="comma-separated sequence lengths S")
    ap.add_argument("--head-dims", default="128", help="comma-separated head dims D (heads = 4096 / D)")
    ap.add_argument("--families", default=",".join(masks.FAMILIES), help="comma-separated mask families")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile takes minutes)")
    ap.add_argument("--out", default=None, help="write the result rows as JSON here")
    ap.add_argument("--bwd", action="store_true", help="benchmark the backward (see the module doc)")
    ap.add_argument("--total-tokens", type=int, default=TOTAL, help="batch = total / S")
    ap.add_argument("--rep", type=int, default=8, help="timed repetitions (median reported)")
    args = ap.parse_args()
    global torch
    try:
        import torch as torch_module
    except ImportError:
        sys.exit("bench_attention.py needs torch with CUDA on a Hopper GPU (the device machine); "
                 "torch is not installed here")
    if not torch_module.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU (Hopper); torch sees none")
    torch = torch_module
    if args.bwd:
        return main_bwd(args)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for d in [int(x) for x in args.head_dims.split(",")]:
        for s in [int(x) for x in args.seqlens.split(",")]:
            b, h = max(1, args.total_tokens // s), HIDDEN // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            out = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views
            flex_mask = FlexMask(b, s)
            for fam in args.families.split(","):
                fm = masks.FAMILIES[fam](s, np.random.default_rng(0), batch=b)
                sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
                causal = fm.causal
                pairs = masks.density(sri_np, causal) * b * s * s
                flops = 4.0 * h * d * pairs
                sri = torch.from_numpy(sri_np).cuda()
                row = {"family": fam, "S": s, "D": d, "B": b, "H": h, "density": pairs / (b * s * s)}
                t = bench(lambda: kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal))
                row["fm3_ms"] = t * 1e3
                row["fm3_tflops"] = flops / t / 1e12
                bn = kernels.block_n(d)
                summ = torch.empty(b, 1, -(-s // bn), 8, dtype=torch.int32, device="cuda")
                ts = bench(lambda: kernels.block_summary(sri, summ, causal=causal, seqlen_q=s, block_n=bn))
                row["summary_us"] = ts * 1e6
                row["summary_pct"] = 100.0 * ts / t
                if not args.no_flex:
                    try:
                        flex_mask.set_family(sri_np, causal)
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        bmask = flex_mask.block_mask()
                        torch.cuda.synchronize()
                        row["flex_block_mask_ms"] = (time.perf_counter() - t0) * 1e3
                        tf = bench(lambda: flex(qt, kt, vt, block_mask=bmask))
                        row["flex_tflops"] = flops / tf / 1e12
                        row["vs_flex"] = row["fm3_tflops"] / row["flex_tflops"]
                    except Exception as e:  # noqa: BLE001
                        row["flex_error"] = repr(e)[:200]
                if fam in ("full", "causal"):
                    try:
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            tc = bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                                qt, kt, vt, is_causal=causal))
                        row["cudnn_tflops"] = flops / tc / 1e12
                        row["vs_cudnn"] = row["fm3_tflops"] / row["cudnn_tflops"]
                    except Exception as e:  # noqa: BLE001
                        row["cudnn_error"] = repr(e)[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(rows, f, indent=1)
            del q, k, v, out, qt, kt, vt
            torch.cuda.empty_cache()
    print("\n| D | S | family | density | fm3 TFLOP/s | Flex TFLOP/s | fm3/Flex | cuDNN TFLOP/s | fm3/cuDNN | summary % |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda key, fmt="{:.0f}": fmt.format(r[key]) if key in r else "-"  # noqa: E731
        print(f"| {r['D']} | {r['S']} | {r['family']} | {r['density']:.3f} | {f('fm3_tflops')} | {f('flex_tflops')} | "
              f"{f('vs_flex', '{:.2f}')} | {f('cudnn_tflops')} | {f('vs_cudnn', '{:.2f}')} | {f('summary_pct', '{:.2f}')} |")


def main_bwd(args):
    """Backward and forward+backward TFLOP/s (2.5x / 3.5x the forward's visible-pair FLOPs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    rep = args.rep
    rows = []
    for d in [int(x) for x in args.head_dims.split(",")]:
        for s in [int(x) for x in args.seqlens.split(",")]:
            b, h = max(1, args.total_tokens // s), HIDDEN // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            do = torch.randn_like(q)
            out = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
            qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (qt, kt, vt))
            flex_mask = FlexMask(b, s)
            for fam in args.families.split(","):
                fm = masks.FAMILIES[fam](s, np.random.default_rng(0), batch=b)
                sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
                causal = fm.causal
                pairs = masks.density(sri_np, causal) * b * s * s
                fwd_flops = 4.0 * h * d * pairs
                sri = torch.from_numpy(sri_np).cuda()
                row = {"family": fam, "S": s, "D": d, "B": b, "H": h, "density": pairs / (b * s * s)}

                def fm3_fwd():
                    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)

                def fm3_bwd(det=False):
                    kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal, deterministic=det)
                fm3_fwd()
                t = bench(fm3_bwd, warmup=1, rep=rep)
                row["fm3_bwd_ms"] = t * 1e3
                row["fm3_bwd_tflops"] = 2.5 * fwd_flops / t / 1e12
                t = bench(lambda: fm3_bwd(True), warmup=1, rep=rep)
                row["fm3_bwd_det_tflops"] = 2.5 * fwd_flops / t / 1e12
                t = bench(lambda: (fm3_fwd(), fm3_bwd()), warmup=1, rep=rep)
                row["fm3_fwdbwd_tflops"] = 3.5 * fwd_flops / t / 1e12
                if not args.no_flex:
                    try:
                        flex_mask.set_family(sri_np, causal)
                        bmask = flex_mask.block_mask()
                        o = flex(qg, kg, vg, block_mask=bmask)
                        tb = bench(lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True),
                                   warmup=1, rep=rep)
                        row["flex_bwd_tflops"] = 2.5 * fwd_flops / tb / 1e12
                        tfb = bench(lambda: torch.autograd.grad(flex(qg, kg, vg, block_mask=bmask), (qg, kg, vg), dot),
                                    warmup=1, rep=rep)
                        row["flex_fwdbwd_tflops"] = 3.5 * fwd_flops / tfb / 1e12
                        row["bwd_vs_flex"] = row["fm3_bwd_tflops"] / row["flex_bwd_tflops"]
                        del o
                    except Exception as e:  # noqa: BLE001
                        row["flex_error"] = repr(e)[:200]
                if fam in ("full", "causal"):
                    try:
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                            tc = bench(lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True),
                                       warmup=1, rep=rep)
                            tcf = bench(lambda: torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
                                qg, kg, vg, is_causal=causal), (qg, kg, vg), dot), warmup=1, rep=rep)
                            del o
                        row["cudnn_bwd_tflops"] = 2.5 * fwd_flops / tc / 1e12
                        row["cudnn_fwdbwd_tflops"] = 3.5 * fwd_flops / tcf / 1e12
                        row["bwd_vs_cudnn"] = row["fm3_bwd_tflops"] / row["cudnn_bwd_tflops"]
                    except Exception as e:  # noqa: BLE001
                        row["cudnn_error"] = repr(e)[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump(rows, f, indent=1)
            del q, k, v, do, out, dq, dk, dv, qt, kt, vt, dot, qg, kg, vg
            torch.cuda.empty_cache()
    print("\n| D | S | family | density | fm3 bwd | fm3 bwd det | Flex bwd | fm3/Flex | cuDNN bwd | fm3/cuDNN "
          "| fm3 fwd+bwd | Flex fwd+bwd | cuDNN fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda key, fmt="{:.0f}": fmt.format(r[key]) if key in r else "-"  # noqa: E731
        print(f"| {r['D']} | {r['S']} | {r['family']} | {r['density']:.3f} | {f('fm3_bwd_tflops')} | "
              f"{f('fm3_bwd_det_tflops')} | {f('flex_bwd_tflops')} | {f('bwd_vs_flex', '{:.2f}')} | "
              f"{f('cudnn_bwd_tflops')} | {f('bwd_vs_cudnn', '{:.2f}')} | {f('fm3_fwdbwd_tflops')} | "
              f"{f('flex_fwdbwd_tflops')} | {f('cudnn_fwdbwd_tflops')} |")


if __name__ == "__main__":
    main()
