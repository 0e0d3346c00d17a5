"""Small cases for compute-sanitizer (memcheck / racecheck): partial blocks, GQA, a tail tile; then
the K/V ring wrapping many times within a tile and many tiles per CTA (two persistent CTAs), so that
stage reuse and tile boundaries run under the tools too."""
import os

import numpy as np
import torch

from paddle_fm3 import _config, kernels, masks


def run(s, family, dims, sink=False):
    d, dv = dims
    fm = masks.FAMILIES[family](s, np.random.default_rng(0))
    sri = torch.from_numpy(np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)).cuda()
    q = torch.randn(1, s, 2, d, device="cuda").to(torch.bfloat16)
    k = torch.randn(1, s, 1, d, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, s, 1, dv, device="cuda").to(torch.bfloat16)
    out = torch.empty(1, s, 2, dv, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(1, 2, s, device="cuda")
    learnable_sink = torch.randn(2, device="cuda") if sink else None
    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=fm.causal, learnable_sink=learnable_sink)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()


for d in _config.SM90_HEAD_DIMS:  # every head-dim pair of yaml/kernel_configs.yaml
    run(200, "global_sliding_window", d)
    run(200, "causal_document", d, sink=True)
os.environ["FM3_FWD_GRID"] = "2"  # read per call by the launcher
for d in _config.SM90_HEAD_DIMS:
    for family in ("full", "document"):
        run(1100, family, d)
print("sanitize case ok")
