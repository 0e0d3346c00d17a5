#!/usr/bin/env python3
"""How much work tiles aligned to document starts would save on packed documents: the (query tile,
key block) pairs the Hopper kernels compute on the global tile grid (ours: tiles at multiples of the
tile size, a document boundary inside a tile makes it partial on both sides) against tiles that
restart at every document's start (what FlashAttention's varlen call computes), for the masks
tools/bench_attention.py draws (same instances: family, S, B = total tokens / S, --random-params seeds).
CPU only.

    python3 tools/doc_tile_count.py [--seqlens 8192,32768] [--random-params 1 2 3]

The backward walks, per key block (one CTA), the query tiles from the block's first visible row to its
documents' end; the forward, per query tile, the key blocks from its documents' start to its last
visible key. Tile sizes: the D = 128 configs of yaml/kernel_configs.yaml.
"""
import argparse
import os
import sys

import numpy as np


def cdiv(a, b):
    return -(-a // b)


def pairs(docs, causal, tile_q, tile_k, aligned):
    """(query tile, key block) pairs over one batch row's documents: per key block of tile_k keys the
    query tiles of tile_q rows it is computed with (backward), and per query tile the key blocks
    (forward); aligned: tiles restart at each document's start, else they sit on the global grid."""
    s = sum(docs)
    starts = np.concatenate([[0], np.cumsum(docs)[:-1]])
    ends = starts + np.asarray(docs)
    doc_of = np.repeat(np.arange(len(docs)), docs)
    bwd = fwd = 0
    if aligned:
        for st, e in zip(starts, ends):
            n = e - st
            bwd += sum(cdiv(n, tile_q) - ((j * tile_k) // tile_q if causal else 0) for j in range(cdiv(n, tile_k)))
            fwd += sum(cdiv(min(n, (i + 1) * tile_q) if causal else n, tile_k) for i in range(cdiv(n, tile_q)))
        return bwd, fwd
    for k0 in range(0, s, tile_k):
        k1 = min(k0 + tile_k, s)
        q_first = k0 if causal else starts[doc_of[k0]]
        bwd += cdiv(ends[doc_of[k1 - 1]], tile_q) - q_first // tile_q
    for m0 in range(0, s, tile_q):
        m1 = min(m0 + tile_q, s)
        k_last = m1 if causal else ends[doc_of[m1 - 1]]
        fwd += cdiv(k_last, tile_k) - starts[doc_of[m0]] // tile_k
    return bwd, fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqlens", default="8192,32768")
    ap.add_argument("--total-tokens", type=int, default=32768)
    ap.add_argument("--random-params", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    # Here, not at the top: bench_attention puts the repository first on sys.path (the tests load pairs()
    # alone and must keep testing the installed package).
    sys.path.insert(0, os.path.dirname(__file__))
    import bench_attention as ba
    from paddle_fm3 import _config
    from paddle_fm3.mask_semantics import document_lengths
    def config(configs):
        return next(c for c in configs if c["head_dim"] == args.head_dim and c["head_dim_v"] == args.head_dim)
    passes = ((0, config(_config.SM90_BWD_CONFIGS)), (1, config(_config.SM90_CONFIGS)))  # pairs()'s backward, forward
    print(f"D = {args.head_dim}: backward tiles {passes[0][1]['block_m']} x {passes[0][1]['block_n']}, forward "
          f"{passes[1][1]['block_m']} x {passes[1][1]['block_n']}; pairs on the global grid / pairs aligned to "
          "documents")
    print("| family | S | seed | documents per row | backward | forward |")
    print("|---|---|---|---|---|---|")
    for fam in ("causal_document", "document"):
        for s in (int(x) for x in args.seqlens.split(",")):
            b = max(1, args.total_tokens // s)
            for seed in args.random_params or [None]:
                sri, causal, _ = ba.family_mask(fam, s, b, seed)
                docs = document_lengths(sri, causal)
                ratios = []
                for i, cfg in passes:
                    n = [sum(pairs(d, causal, cfg["block_m"], cfg["block_n"], aligned)[i] for d in docs)
                         for aligned in (False, True)]
                    ratios.append(f"{n[0] / n[1]:.3f}")
                print(f"| {fam} | {s} | {seed} | {'/'.join(str(len(d)) for d in docs)} | {' | '.join(ratios)} |")

if __name__ == "__main__":
    main()
