"""The CP step's attention backends in torch (:class:`~paddle_fm3.distributed.step.AttentionBackend`),
for the torch scripts (``tools/cp_torch_run.py``, ``tools/cp_rank_compute.py``).

torch is imported inside the methods: importing this module needs only numpy, so a script can name
the backends before it knows whether it will run them.
"""

from __future__ import annotations

import numpy as np

from ... import masks
from .. import step

__all__ = ["lse_merge", "TorchTensorOps", "HopperBackend", "ReferenceBackend"]


def lse_merge(o1, l1, o2, l2):
    """``executor._lse_merge`` in torch. o: fp32 ``[B, L, H, D]``; l: fp32 ``[B, H, L]`` (natural
    log, -inf where a row saw nothing). Returns the merged (o, l)."""
    import torch

    mx = torch.maximum(l1, l2)
    none = torch.isinf(mx)
    shift = torch.where(none, torch.zeros_like(mx), mx)
    e1, e2 = torch.exp(l1 - shift), torch.exp(l2 - shift)  # exp(-inf) == 0 exactly
    tot = torch.where(none, torch.ones_like(mx), e1 + e2)
    w1, w2 = ((e / tot).transpose(1, 2).unsqueeze(-1) for e in (e1, e2))
    return o1 * w1 + o2 * w2, torch.where(none, mx, shift + torch.log(tot))


class TorchTensorOps:
    """The tensor operations of ``step.AttentionBackend`` in torch."""

    def index(self, rows, like):
        import torch

        return torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(like.device)

    def take_rows(self, x, index):
        return x.index_select(1, index)

    def cat_last(self, a, b):
        import torch

        return torch.cat([a, b], -1)

    def split_last(self, x, d):
        return x[..., :d].contiguous(), x[..., d:].contiguous()

    def empty(self, shape, like, float32=False):
        import torch

        return torch.empty(tuple(shape), dtype=torch.float32 if float32 else like.dtype, device=like.device)

    def zeros_f32(self, shape, like):
        import torch

        return torch.zeros(tuple(shape), dtype=torch.float32, device=like.device)

    def f32(self, x):
        return x.float()

    def cast_like(self, x, like):
        return x.to(like.dtype)

    def index_add_rows(self, x, index, src):
        return x.index_add_(1, index, src)

    def lse_merge(self, o1, l1, o2, l2):
        return lse_merge(o1, l1, o2, l2)


class HopperBackend(TorchTensorOps, step.AttentionBackend):
    """``paddle_fm3.kernels.flashmask_fwd/bwd`` on the current CUDA stream."""

    name = "hopper"

    def __init__(self, device):
        import torch

        from paddle_fm3 import kernels

        self.torch, self.kernels, self.device = torch, kernels, device

    def mask(self, sri: np.ndarray, causal: bool, seqlen_q: int):
        return self.torch.from_numpy(np.ascontiguousarray(sri, dtype=np.int32)).to(self.device), bool(causal)

    def prepare_mask(self, local_mask, seqlen_q):
        return self.mask(local_mask, False, seqlen_q)

    def fwd(self, q, k, v, mask, scale):
        torch = self.torch
        sri, causal = mask
        out, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        self.kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal, softmax_scale=scale,
                                   stream=torch.cuda.current_stream().cuda_stream)
        return out, lse

    def bwd(self, q, k, v, out, lse, dout, mask, scale):
        torch = self.torch
        sri, causal = mask
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.kernels.flashmask_bwd(q, k, v, out, lse, dout, sri, dq, dk, dv, causal=causal, softmax_scale=scale,
                                   stream=torch.cuda.current_stream().cuda_stream)
        return dq, dk, dv


class ReferenceBackend(TorchTensorOps, step.AttentionBackend):
    """Exact dense attention in torch fp32 (CPU): the same outputs as the kernels (out; lse natural
    log, -inf for rows that see no key, whose out and gradients are 0; dq, dk, dv with GQA groups
    summed). The visibility comes from :func:`paddle_fm3.masks.to_dense`."""

    name = "reference"

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device

    def mask(self, sri: np.ndarray, causal: bool, seqlen_q: int):
        return self.torch.from_numpy(masks.to_dense(sri, bool(causal), seqlen_q)).to(self.device)  # [B,Hm,Lq,Lk]

    def prepare_mask(self, local_mask, seqlen_q):
        return self.mask(local_mask, False, seqlen_q)

    def _scores(self, q, k, v, vis, scale):
        torch = self.torch
        h, hk = q.shape[2], k.shape[2]
        g = h // hk
        kh, vh = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
        if vis.shape[1] not in (1, h):  # H_mask == H_k: query head h uses mask head h // g
            vis = vis.repeat_interleave(g, dim=1)
        s = torch.einsum("bqhd,bkhd->bhqk", q.float(), kh.float()) * scale
        return s.masked_fill(~vis, float("-inf")), kh.float(), vh.float(), g

    def fwd(self, q, k, v, vis, scale):
        torch = self.torch
        s, _, vh, _ = self._scores(q, k, v, vis, scale)
        lse = torch.logsumexp(s, dim=-1)  # -inf where the row sees nothing
        p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
        return torch.einsum("bhqk,bkhd->bqhd", p, vh).to(q.dtype), lse.contiguous()

    def bwd(self, q, k, v, out, lse, dout, vis, scale):
        torch = self.torch
        s, kh, vh, g = self._scores(q, k, v, vis, scale)
        # with the merged (out, lse) of the whole row, each KV chunk's gradients are exact partials
        p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
        do = dout.float()
        dv_h = torch.einsum("bhqk,bqhd->bkhd", p, do)
        dp = torch.einsum("bqhd,bkhd->bhqk", do, vh)
        delta = (do * out.float()).sum(-1).transpose(1, 2)[..., None]  # rowsum(dO * O): [B, H, Lq, 1]
        ds = p * (dp - delta)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, kh) * scale
        dk_h = torch.einsum("bhqk,bqhd->bkhd", ds, q.float()) * scale
        b, lk, hk, d = k.shape
        return (dq.to(q.dtype), dk_h.reshape(b, lk, hk, g, d).sum(3).to(k.dtype),
                dv_h.reshape(b, lk, hk, g, d).sum(3).to(v.dtype))
