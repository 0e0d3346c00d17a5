"""Helpers of the GPU tests: random inputs, running the kernel with poisoned outputs, references."""
import numpy as np
import torch

from paddle_fm3 import _config, kernels, masks, reference

# Every head-dim pair (q/k, v) of yaml/kernel_configs.yaml (paddle_fm3/_config.py, written by
# paddle_fm3_build/codegen.py): a head dim added there is tested here. A test's `d` is a head dim (equal
# for q, k, v) or such a pair.
HEAD_DIMS = _config.SM90_HEAD_DIMS
BWD_HEAD_DIMS = tuple(sorted((c["head_dim"], c["head_dim_v"]) for c in _config.SM90_BWD_CONFIGS))
# Head dims (equal for q, k, v) whose mma.sync kernels exist (FM3_FWD_KERNEL / FM3_BWD_KERNEL=mma_sync).
FWD_FALLBACK_DIMS = tuple(sorted(c["head_dim"] for c in _config.SM90_CONFIGS if c["fallback"]))
BWD_FALLBACK_DIMS = tuple(sorted(c["head_dim"] for c in _config.SM90_BWD_CONFIGS if c["fallback"]))


def head_dims(d):
    """(q/k head dim, v head dim) of a test's `d`."""
    return (d, d) if isinstance(d, int) else tuple(d)


def dims_id(d):
    dq, dv = head_dims(d)
    return f"d{dq}" if dq == dv else f"d{dq}v{dv}"


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOL = {"bf16": 1e-2, "fp16": 2e-3}  # relative Frobenius error of out


def make_qkv(b, sq, sk, h, hk, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    d, dv = head_dims(d)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, dv, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    return q, k, v


def run_kernel(q, k, v, sri, causal, **kw):
    b, sq, h, d = q.shape
    out = torch.full((b, sq, h, v.shape[3]), float("nan"), device="cuda", dtype=q.dtype)  # poison: all written
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal, **kw)
    torch.cuda.synchronize()
    return out, lse


def torch_reference(q, k, v, vis, scale, learnable_sink=None):
    """fp32 dense reference on the GPU; vis: bool [B, H, S_q, S_k] (numpy, possibly broadcast);
    learnable_sink: numpy [H] or None (reference.py's meaning: joins each row's denominator)."""
    b, sq, h, d = q.shape
    hk = k.shape[2]
    out = torch.zeros(b, sq, h, v.shape[3], device="cuda", dtype=torch.float32)
    lse = torch.full((b, h, sq), float("-inf"), device="cuda", dtype=torch.float32)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            s = (q[bi, :, hi].float() @ k[bi, :, kv].float().T) * scale
            m = torch.from_numpy(np.ascontiguousarray(vis[bi, hi])).cuda()
            s = s.masked_fill(~m, float("-inf"))
            l = torch.logsumexp(s, dim=-1)
            if learnable_sink is not None:
                l = torch.logaddexp(l, torch.full_like(l, float(learnable_sink[hi])))
            has = m.any(dim=-1)
            p = torch.where(has[:, None], torch.exp(s - l[:, None]), torch.zeros_like(s))
            out[bi, :, hi] = p @ v[bi, :, kv].float()
            lse[bi, hi] = l if learnable_sink is not None else torch.where(has, l, torch.full_like(l, float("-inf")))
    return out, lse


def check(q, k, v, sri_np, causal, dtype_name, *, softmax_scale=None, block_mask=None,
          window_size=None, sri_dev=None, dense=None, learnable_sink=None):
    """Run the kernel and compare with the float64 numpy oracle (small) or fp32 torch (large);
    learnable_sink: numpy float32 [H] or None."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    arg = sri_dev if sri_dev is not None else (None if sri_np is None else torch.from_numpy(sri_np).cuda())
    bm_dev = None if block_mask is None else torch.from_numpy(block_mask).cuda()
    sink_dev = None if learnable_sink is None else torch.from_numpy(learnable_sink).cuda()
    out, lse = run_kernel(q, k, v, arg, causal, softmax_scale=softmax_scale, block_mask=bm_dev,
                          window_size=window_size, learnable_sink=sink_dev)
    assert not torch.isnan(out).any(), "NaN (or unwritten element) in out"
    assert not torch.isnan(lse).any(), "NaN (or unwritten element) in lse"
    ref_sri = sri_np
    if window_size is not None:
        ref_sri = masks.window_to_startend(window_size, sq, sk, b, causal)
    if dense is None:
        dense = sq * sk * h * b <= 4_000_000
    if dense:
        ro, rl = reference.attention_forward(q.float().cpu().numpy(), k.float().cpu().numpy(),
                                             v.float().cpu().numpy(), ref_sri, causal=causal,
                                             softmax_scale=scale, block_mask=block_mask,
                                             learnable_sink=learnable_sink)
        ro = torch.from_numpy(ro).cuda()
        rl = torch.from_numpy(rl).cuda()
    vis = reference.dense_visibility(b, sq, sk, h, hk, ref_sri, causal=causal, block_mask=block_mask)
    if not dense:
        ro, rl = torch_reference(q, k, v, vis, scale, learnable_sink)
    o64, r64 = out.double(), ro.double()
    err = (torch.linalg.vector_norm(o64 - r64) / torch.linalg.vector_norm(r64).clamp_min(1e-30)).item()
    assert err <= TOL[dtype_name], f"relative error {err:.3e} > {TOL[dtype_name]}"
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), fin), "lse -inf pattern (fully masked rows) differs"
    assert torch.all(lse[~fin] == float("-inf"))
    if fin.any():
        lerr = (lse.double()[fin] - rl.double()[fin]).abs().max().item()
        assert lerr <= 2e-3, f"lse max abs error {lerr:.3e}"
    empty = torch.from_numpy(~vis.any(axis=-1)).cuda()  # [B, H, S_q]: rows that see no key must be exactly 0
    if empty.any():
        rows = out.permute(0, 2, 1, 3)[empty]
        assert torch.all(rows == 0), "fully masked rows must be 0"
    return err


def raw_paddle_values(sri, sq, seed):
    """The mask with Paddle's out-of-range spellings: values equal to seqlen_q raised past it (Paddle's
    own generators write document end + 1) and zeros made negative. The kernels read them clamped to
    [0, seqlen_q] (fm3::load_column), so the clamped mask is the reference."""
    rng = np.random.default_rng(seed)
    raw = sri.astype(np.int64)
    raw = np.where(raw == sq, sq + rng.integers(1, 1000, size=raw.shape), raw)
    raw = np.where(raw == 0, -rng.integers(1, 1000, size=raw.shape), raw)
    return np.ascontiguousarray(raw, dtype=np.int32)
