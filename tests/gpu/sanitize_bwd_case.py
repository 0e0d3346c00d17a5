"""Small backward cases for compute-sanitizer (memcheck / racecheck): every head dim, GQA, partial
blocks, tail tiles (S_q != S_k, odd), both dQ modes, with and without a learnable sink."""
import numpy as np
import torch

from paddle_fm3 import _config, kernels, masks

for d, dv in _config.SM90_HEAD_DIMS:  # every head-dim pair of yaml/kernel_configs.yaml
    sq, sk = 200, 333
    fm = masks.FAMILIES["global_sliding_window"](sk, np.random.default_rng(0))
    sri = torch.from_numpy(np.ascontiguousarray(np.minimum(fm.startend_row_indices, sq), dtype=np.int32)).cuda()
    q = torch.randn(1, sq, 2, d, device="cuda").to(torch.bfloat16)
    k = torch.randn(1, sk, 1, d, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, sk, 1, dv, device="cuda").to(torch.bfloat16)
    out = torch.randn(1, sq, 2, dv, device="cuda").to(torch.bfloat16)
    do = torch.randn_like(out)
    lse = torch.randn(1, 2, sq, device="cuda") + 5.0
    for det in (False, True):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        sink, dsink = (torch.randn(2, device="cuda"), torch.empty(2, device="cuda")) if det else (None, None)
        kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=fm.causal, deterministic=det,
                              learnable_sink=sink, dlearnable_sink=dsink)
        torch.cuda.synchronize()
        assert not torch.isnan(dq).any() and not torch.isnan(dk).any() and not torch.isnan(dv).any()
        assert dsink is None or not torch.isnan(dsink).any()
print("sanitize bwd case ok")
