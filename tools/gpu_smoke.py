#!/usr/bin/env python3
"""Quick device smoke test of the forward kernels: relative error vs the fp32 torch reference for a few
families / head dims / dtypes / lengths, for the default path (WGMMA where covered) and the mma.sync
fallback (FM3_FWD_KERNEL=mma_sync). Prints one line per case; exit 1 on any failure."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
import numpy as np  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    sys.exit("gpu_smoke.py needs torch with CUDA on a Hopper GPU (the device machine)")

from fm3_gpu_util import DTYPES, TOL, make_qkv, run_kernel  # noqa: E402
from paddle_fm3 import masks, reference  # noqa: E402

bad = 0
for path in ("default", "mma_sync"):
    if path == "mma_sync":
        os.environ["FM3_FWD_KERNEL"] = "mma_sync"
    for d in (64, 128):
        for dtype in ("bf16", "fp16"):
            for family in ("full", "causal", "document", "random_eviction"):
                for s in (129, 1000):
                    fm = masks.FAMILIES[family](s, np.random.default_rng(s + d))
                    sri = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
                    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES[dtype], s * d)
                    out, lse = run_kernel(q, k, v, torch.from_numpy(sri).cuda(), fm.causal)
                    ro, rl = reference.attention_forward(q.float().cpu().numpy(), k.float().cpu().numpy(),
                                                         v.float().cpu().numpy(), sri, causal=fm.causal)
                    o = out.float().cpu().numpy()
                    err = float(np.linalg.norm(o - ro) / max(np.linalg.norm(ro), 1e-30))
                    ok = np.isfinite(o).all() and err < TOL[dtype]
                    if not ok and bad == 0:  # where the first failure lies: rows by 8, head-dim columns by 8
                        try:
                            e = np.nan_to_num(np.abs(o - ro)[0, :, 0], nan=99.0)
                            print("  row-groups:", np.round(e[:128].reshape(-1, 8).mean(1), 3).tolist())
                            print("  col-groups:", np.round(e[:128].reshape(128, -1, 8).mean((0, 2)), 3).tolist())
                            print("  lse rows 0..7:", lse[0, 0, :8].tolist(), "ref", np.asarray(rl)[0, 0, :8].tolist())
                        except Exception as exc:  # noqa: BLE001
                            print("  diag failed:", exc)
                    bad += not ok
                    print(f"{path:8s} d={d:3d} {dtype} {family:16s} s={s:5d} err={err:.2e} {'ok' if ok else 'FAIL'}",
                          flush=True)
print("smoke:", "FAILED" if bad else "ok", bad)
sys.exit(1 if bad else 0)
