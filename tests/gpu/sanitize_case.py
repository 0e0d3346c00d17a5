"""One small case for compute-sanitizer (memcheck / racecheck): partial blocks, GQA, a tail tile."""
import numpy as np
import torch

from paddle_fm3 import _config, kernels, masks

for d in _config.SM90_HEAD_DIMS:  # every head dim of yaml/kernel_configs.yaml
    s = 200
    fm = masks.FAMILIES["global_sliding_window"](s, np.random.default_rng(0))
    sri = torch.from_numpy(np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)).cuda()
    q = torch.randn(1, s, 2, d, device="cuda").to(torch.bfloat16)
    k = torch.randn(1, s, 1, d, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, s, 1, d, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, s, device="cuda")
    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=fm.causal)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
print("sanitize case ok")
