"""Hopper backward kernel vs the float64 numpy reference (paddle_fm3.reference.attention_backward).

Asserted metric (the forward tests' one, floored): relative error ||kernel - ref||_F / max(||ref||_F, 1)
of each of dq, dk, dv <= 2e-3 (fp16) / 1e-2 (bf16). The element-wise reading,
max |kernel - ref| / max(|ref|, 1), is recorded, not asserted: on the device it reached 1.7e-2 (bf16)
and 2.04e-3 (fp16, MQA with 8 query heads summed into dk; every other fp16 case <= 1.7e-3), because
P and dS are rounded to the input dtype before the dV/dK/dQ tensor-core products (as in
FlashAttention-2/3): one rounded dS of magnitude ~10 moves an O(1) gradient element by up to ~8e-3
in bf16. Set FM3_BWD_ERR_LOG=path to append every case's errors (JSON lines).
out and lse fed to the backward come from the float64 reference forward (rounded to the kernel's
dtypes), so these tests do not depend on the forward kernel, except test_fwd_bwd_chain.
"""
import json
import os
import zlib

import numpy as np
import pytest

from paddle_fm3 import kernels, masks, reference

torch = pytest.importorskip("torch")
from fm3_gpu_util import (BWD_FALLBACK_DIMS, BWD_HEAD_DIMS as HEAD_DIMS, DTYPES, dims_id, head_dims, make_qkv,  # noqa: E402
                          raw_paddle_values)

FAMILIES = sorted(masks.FAMILIES)
BWD_TOL = {"bf16": 1e-2, "fp16": 2e-3}


def family_mask(name, s, seed, batch=1, num_heads=1):
    fm = masks.FAMILIES[name](s, np.random.default_rng(seed), batch=batch, num_heads=num_heads)
    return np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32), fm.causal


def rel_err(x, ref):
    """||x - ref||_F / max(||ref||_F, 1), in float64."""
    x = x.double().cpu().numpy()
    return float(np.linalg.norm(x - ref) / max(float(np.linalg.norm(ref)), 1.0))


def elem_err(x, ref):
    """max |x - ref| / max(|ref|, 1), element-wise, in float64."""
    x = x.double().cpu().numpy()
    return float(np.max(np.abs(x - ref) / np.maximum(np.abs(ref), 1.0))) if ref.size else 0.0


def assert_close(dtype_name, case, **pairs):
    """pairs: name=(kernel tensor, float64 reference). Asserts the metric of the module doc."""
    tol = BWD_TOL[dtype_name]
    errs = {n: rel_err(x, r) for n, (x, r) in pairs.items()}
    elem = {n: elem_err(x, r) for n, (x, r) in pairs.items()}
    log = os.environ.get("FM3_BWD_ERR_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"case": case, "dtype": dtype_name, "rel": errs, "elem": elem}) + "\n")
    assert all(e <= tol for e in errs.values()), f"relative errors {errs} > {tol} (element-wise: {elem})"
    return errs


def run_bwd(q, k, v, out, lse, do, sri_dev, causal, *, deterministic=False, poison=True, learnable_sink=None,
            **kw):
    """dq, dk, dv (and with learnable_sink, a CUDA float32 [H], its gradient too) from poisoned buffers."""
    fill = float("nan") if poison else 0.0
    dq = torch.full_like(q, fill)
    dk = torch.full_like(k, fill)
    dv = torch.full_like(v, fill)
    grads = (dq, dk, dv)
    if learnable_sink is not None:
        grads += (torch.full_like(learnable_sink, fill),)
        kw.update(learnable_sink=learnable_sink, dlearnable_sink=grads[3])
    kernels.flashmask_bwd(q, k, v, out, lse, do, sri_dev, dq, dk, dv, causal=causal,
                          deterministic=deterministic, **kw)
    torch.cuda.synchronize()
    return grads


def check_bwd(q, k, v, sri_np, causal, dtype_name, *, softmax_scale=None, block_mask=None, window_size=None,
              deterministic=False, seed=0, learnable_sink=None):
    """Run the backward on reference out/lse and a random dout; compare dq, dk, dv (and the gradient of
    learnable_sink, numpy float32 [H], when given) with float64."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    ref_sri = sri_np
    if window_size is not None:
        ref_sri = masks.window_to_startend(window_size, sq, sk, b, causal)
    qn, kn, vn = (x.float().cpu().numpy() for x in (q, k, v))
    ro, rl = reference.attention_forward(qn, kn, vn, ref_sri, causal=causal, softmax_scale=softmax_scale,
                                         block_mask=block_mask, learnable_sink=learnable_sink)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    do = torch.randn(ro.shape, device="cuda", dtype=torch.float32, generator=g).to(q.dtype)
    # numpy einsum may return strided arrays; the C ABI wants dout to share out's strides
    out = torch.from_numpy(np.ascontiguousarray(ro)).cuda().to(q.dtype)
    lse = torch.from_numpy(np.ascontiguousarray(rl)).cuda().float()
    ref = reference.attention_backward(qn, kn, vn, do.float().cpu().numpy(), ref_sri, causal=causal,
                                       softmax_scale=softmax_scale, block_mask=block_mask,
                                       learnable_sink=learnable_sink)
    rdq, rdk, rdv = ref[:3]
    sri_dev = None if sri_np is None else torch.from_numpy(sri_np).cuda()
    bm_dev = None if block_mask is None else torch.from_numpy(block_mask).cuda()
    sink_dev = None if learnable_sink is None else torch.from_numpy(learnable_sink).cuda()
    grads = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=deterministic,
                    softmax_scale=softmax_scale, block_mask=bm_dev, window_size=window_size,
                    learnable_sink=sink_dev)
    dq, dk, dv = grads[:3]
    for name, x in zip(("dq", "dk", "dv", "dlearnable_sink"), grads):
        assert not torch.isnan(x).any(), f"NaN (or unwritten element) in {name}"
    case = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    errs = assert_close(dtype_name, case, dq=(dq, rdq), dk=(dk, rdk), dv=(dv, rdv))
    if learnable_sink is not None:
        check_dsink(grads[3], learnable_sink, lse, out, do, ref[3], dtype_name)
    vis = reference.dense_visibility(b, sq, sk, h, k.shape[2], ref_sri, causal=causal, block_mask=block_mask)
    empty = ~vis.any(axis=-1)  # [B, H, S_q]: fully masked rows -> dq rows exactly 0
    if empty.any():
        rows = dq.permute(0, 2, 1, 3)[torch.from_numpy(np.ascontiguousarray(empty)).cuda()]
        assert torch.all(rows == 0), "fully masked rows must have dq == 0"
    return errs, grads, (out, lse, do)


def check_dsink(dsink, sink, lse, out, do, exact, dtype_name):
    """The sink's gradient, a sum over every row of terms t = -exp(sink - lse) * sum(dout * out) of
    either sign, measured against max(sum of |t|, 1) (a reduction's condition, floored as the module's
    metric is): within fp32 summation (1e-5) of the float64 sum over the inputs it was given (out in
    the input dtype), and within the dtype's tolerance of the exact gradient (``exact``: the
    reference's, from the unrounded out)."""
    lse64 = lse.double().cpu().numpy()
    d_row = (do.double() * out.double()).sum(-1).permute(0, 2, 1).cpu().numpy()  # [B, H, S_q]
    terms = -np.exp(sink.astype(np.float64)[None, :, None] - lse64) * d_row
    scale = np.maximum(np.abs(terms).sum(axis=(0, 2)), 1.0)
    got = dsink.double().cpu().numpy()
    assert np.all(np.abs(got - terms.sum(axis=(0, 2))) <= 1e-5 * scale), (got, terms.sum(axis=(0, 2)), scale)
    assert np.all(np.abs(got - exact) <= BWD_TOL[dtype_name] * scale), (got, exact, scale)


# All 12 families x head dims x dtypes, odd length 129, GQA (4 query heads on 2 kv heads), batch 2.
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_families(family, d, dtype):
    seed = zlib.crc32(repr(("bwd", family, d, dtype)).encode())
    sri, causal = family_mask(family, 129, seed, batch=2)
    q, k, v = make_qkv(2, 129, 129, 4, 2, d, DTYPES[dtype], seed)
    check_bwd(q, k, v, sri, causal, dtype, seed=seed)


@pytest.mark.parametrize("s", [1, 127, 1000])
@pytest.mark.parametrize("family", ["causal", "document", "global_sliding_window", "random_eviction",
                                    "share_question", "qk_sparse"])
@pytest.mark.parametrize("d,dtype", [(128, "bf16"), (64, "fp16")])
def test_lengths(family, s, d, dtype):
    seed = zlib.crc32(repr(("bwd", family, s, d)).encode())
    sri, causal = family_mask(family, s, seed)
    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES[dtype], seed)
    check_bwd(q, k, v, sri, causal, dtype, seed=seed)


@pytest.mark.parametrize("d", [256, 96, (192, 128)], ids=dims_id)
def test_long(d):
    sri, causal = family_mask("causal_document", 777, 5)
    q, k, v = make_qkv(1, 777, 777, 2, 1, d, DTYPES["bf16"], 6)
    check_bwd(q, k, v, sri, causal, "bf16", seed=6)


@pytest.mark.parametrize("sq,sk", [(200, 333), (333, 200), (1, 129), (129, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_seqlen_q_ne_k_no_mask(sq, sk, causal):
    q, k, v = make_qkv(2, sq, sk, 4, 4, 128, DTYPES["fp16"], sq * 7 + sk)
    check_bwd(q, k, v, None, causal, "fp16", seed=sq + sk)


@pytest.mark.parametrize("sq,sk,causal,c", [(200, 333, True, 2), (333, 200, True, 1), (200, 333, False, 4),
                                            (333, 200, False, 2)])
def test_seqlen_q_ne_k_random_bounds(sq, sk, causal, c):
    rng = np.random.default_rng(sq * sk + c)
    a = np.sort(rng.integers(0, sq + 1, size=(1, 2, sk, 2)), axis=-1)
    if c == 1:
        sri = a[..., 1:2]
    elif c == 2 and causal:
        sri = a
    elif c == 2:
        sri = np.stack([a[..., 1], a[..., 0]], axis=-1)  # LTS >= UTE
    else:
        b = np.sort(rng.integers(0, sq + 1, size=(1, 2, sk, 2)), axis=-1)
        sri = np.concatenate([a, b], axis=-1)
    sri = np.ascontiguousarray(sri, dtype=np.int32)
    q, k, v = make_qkv(1, sq, sk, 4, 2, 128, DTYPES["bf16"], sq + 3 * sk)
    check_bwd(q, k, v, sri, causal, "bf16", seed=c)


@pytest.mark.parametrize("causal", [True, False])
def test_window(causal):
    q, k, v = make_qkv(1, 300, 333, 4, 2, 64, DTYPES["bf16"], 21)
    check_bwd(q, k, v, None, causal, "bf16", window_size=(37, 11), seed=21)


@pytest.mark.parametrize("mask_heads", ["1", "hk", "h"])
def test_gqa_mask_heads(mask_heads):
    h, hk = 8, 2
    hm = {"1": 1, "hk": hk, "h": h}[mask_heads]
    parts = [family_mask("causal_document", 300, 10 + i)[0] for i in range(hm)]
    sri = np.ascontiguousarray(np.concatenate(parts, axis=1))
    q, k, v = make_qkv(1, 300, 300, h, hk, 128, DTYPES["bf16"], 5)
    check_bwd(q, k, v, sri, True, "bf16", seed=5)


def test_mqa():
    sri, causal = family_mask("prefix_lm_document", 513, 3)
    q, k, v = make_qkv(1, 513, 513, 8, 1, 64, DTYPES["fp16"], 8)
    check_bwd(q, k, v, sri, causal, "fp16", seed=8)


def test_softmax_scale():
    sri, causal = family_mask("document", 257, 1)
    q, k, v = make_qkv(1, 257, 257, 2, 2, 128, DTYPES["fp16"], 9)
    check_bwd(q, k, v, sri, causal, "fp16", softmax_scale=0.03, seed=9)


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
@pytest.mark.parametrize("family", ["full", "causal", "global_sliding_window"])
def test_block_mask(family, d):
    s = 700
    sri, causal = family_mask(family, s, 4)
    nb = -(-s // 128)
    rng = np.random.default_rng(11)
    bm = np.ascontiguousarray(rng.integers(0, 2, size=(1, 1, nb, nb)), dtype=np.int32)
    bm[0, 0, 2, :] = 0  # a fully dropped row of blocks: rows with no visible key
    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES["bf16"], 12)
    check_bwd(q, k, v, sri, causal, "bf16", block_mask=bm, seed=12)


def test_block_mask_without_sri():
    s = 300
    nb = -(-s // 128)
    bm = np.ones((1, 1, nb, nb), dtype=np.int32)
    bm[0, 0, 1, 0] = 0
    q, k, v = make_qkv(1, s, s, 2, 2, 64, DTYPES["bf16"], 13)
    check_bwd(q, k, v, None, False, "bf16", block_mask=bm, seed=13)


@pytest.mark.parametrize("d", [256, 80, (192, 128)], ids=dims_id)
@pytest.mark.parametrize("causal", [True, False])
def test_fully_masked_rows(causal, d):
    s = 333
    rng = np.random.default_rng(2)
    if causal:
        sri = np.zeros((1, 1, s, 2), dtype=np.int32)
        sri[..., 0] = 100
        sri[..., 1] = 250
    else:
        sri = np.zeros((1, 1, s, 4), dtype=np.int32)
        sri[..., 0] = 40
        sri[..., 1] = 170
        sri[..., 2] = rng.integers(0, 20, size=s)
        sri[..., 3] = sri[..., 2] + 5
    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES["fp16"], 14)
    check_bwd(q, k, v, sri, causal, "fp16", seed=14)


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
def test_deterministic(d):
    """deterministic=True: bitwise repeatable, within tolerance, and dk/dv equal to the atomic mode's."""
    sri, causal = family_mask("causal_document", 700, 31)
    q, k, v = make_qkv(1, 700, 700, 4, 2, d, DTYPES["bf16"], 31)
    _, (dq1, dk1, dv1), (out, lse, do) = check_bwd(q, k, v, sri, causal, "bf16", deterministic=True, seed=31)
    sri_dev = torch.from_numpy(sri).cuda()
    for _ in range(2):
        dq2, dk2, dv2 = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=True)
        assert torch.equal(dq1, dq2) and torch.equal(dk1, dk2) and torch.equal(dv1, dv2)
    dqa, dka, dva = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=False)
    assert torch.equal(dk1, dka) and torch.equal(dv1, dva)
    assert (dq1.float() - dqa.float()).abs().max().item() <= 1e-2 * max(1.0, dq1.float().abs().max().item())


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
def test_caller_workspace(d):
    """A caller's workspace (the Paddle op's path) gives the pool's gradients bitwise (deterministic
    order); one byte short, a misaligned or a non-uint8 one is a ValueError / TypeError before any
    kernel; release_workspace hands the pool's memory back and the next call takes it again."""
    sri, causal = family_mask("causal_document", 700, 33)
    q, k, v = make_qkv(1, 700, 700, 4, 2, d, DTYPES["bf16"], 33)
    _, (dq1, dk1, dv1), (out, lse, do) = check_bwd(q, k, v, sri, causal, "bf16", deterministic=True, seed=33)
    sri_dev = torch.from_numpy(sri).cuda()
    grads = [torch.empty_like(x) for x in (q, k, v)]
    need = kernels.bwd_workspace_bytes(q, k, v, out, lse, do, sri_dev, *grads, causal=causal, deterministic=True)
    assert need >= 700 * 4 * head_dims(d)[0] * 4  # at least the fp32 dQ accumulator
    ws = torch.full((need + 512,), 0xAB, dtype=torch.uint8, device="cuda")  # stale contents
    dq2, dk2, dv2 = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=True, workspace=ws[:need])
    assert torch.equal(dq1, dq2) and torch.equal(dk1, dk2) and torch.equal(dv1, dv2)
    for bad, err in ((ws[:need - 1], ValueError), (ws[1:need + 1], ValueError), (ws.view(torch.int32), TypeError)):
        with pytest.raises(err):
            run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=True, workspace=bad)
    kernels.release_workspace()
    dq3, dk3, dv3 = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=True)
    assert torch.equal(dq1, dq3) and torch.equal(dk1, dk3) and torch.equal(dv1, dv3)


def test_fwd_bwd_chain():
    """Forward kernel -> backward kernel, checked against the float64 reference."""
    sri, causal = family_mask("share_question", 513, 41)
    q, k, v = make_qkv(1, 513, 513, 4, 2, 128, DTYPES["bf16"], 41)
    out = torch.empty_like(q)
    lse = torch.empty(1, 4, 513, device="cuda")
    sri_dev = torch.from_numpy(sri).cuda()
    kernels.flashmask_fwd(q, k, v, sri_dev, out, lse, causal=causal)
    do = torch.randn_like(q)
    dq, dk, dv = run_bwd(q, k, v, out, lse, do, sri_dev, causal)
    qn, kn, vn = (x.float().cpu().numpy() for x in (q, k, v))
    rdq, rdk, rdv = reference.attention_backward(qn, kn, vn, do.float().cpu().numpy(), sri, causal=causal)
    assert_close("bf16", "chain", dq=(dq, rdq), dk=(dk, rdk), dv=(dv, rdv))


def test_strided_packed_qkv():
    """q/k/v views into one packed tensor; dq/dk/dv views into a packed gradient of the same layout."""
    s, h, d = 257, 4, 64
    qkv = torch.randn(1, s, 3 * h, d, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, :h], qkv[:, :, h:2 * h], qkv[:, :, 2 * h:]
    sri, causal = family_mask("document", s, 6)
    qn, kn, vn = (x.float().cpu().numpy() for x in (q, k, v))
    ro, rl = reference.attention_forward(qn, kn, vn, sri, causal=causal)
    out = torch.from_numpy(np.ascontiguousarray(ro)).cuda().to(torch.bfloat16)
    lse = torch.from_numpy(np.ascontiguousarray(rl)).cuda().float()
    do = torch.randn_like(out)
    dqkv = torch.full_like(qkv, float("nan"))
    dq, dk, dv = dqkv[:, :, :h], dqkv[:, :, h:2 * h], dqkv[:, :, 2 * h:]
    kernels.flashmask_bwd(q, k, v, out, lse, do, torch.from_numpy(sri).cuda(), dq, dk, dv, causal=causal)
    torch.cuda.synchronize()
    rdq, rdk, rdv = reference.attention_backward(qn, kn, vn, do.float().cpu().numpy(), sri, causal=causal)
    assert_close("bf16", "strided", dq=(dq, rdq), dk=(dk, rdk), dv=(dv, rdv))


def test_bad_arguments():
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.bfloat16, 0)
    out, do = torch.zeros_like(q), torch.zeros_like(q)
    lse = torch.zeros(1, 2, 64, device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with pytest.raises(TypeError):
        kernels.flashmask_bwd(q, k, v, out, lse, do.float(), None, dq, dk, dv, causal=True)
    with pytest.raises(TypeError):
        kernels.flashmask_bwd(q, k, v, out, lse, do, None, dq, dk, dv, causal=1)
    with pytest.raises(TypeError):
        kernels.flashmask_bwd(q, k, v, out, lse, do, None, dq, dk, dv, causal=True, deterministic=1)
    with pytest.raises(TypeError):
        kernels.flashmask_bwd(q, k, v, out, lse.double(), do, None, dq, dk, dv, causal=True)
    with pytest.raises(ValueError):
        kernels.flashmask_bwd(q, k, v, out, lse, do, None, dq, dk[:, :32], dv, causal=True)
    with pytest.raises(ValueError):
        kernels.flashmask_bwd(q, k, v, out, lse[:, :1], do, None, dq, dk, dv, causal=True)
    with pytest.raises(ValueError):  # dq must share q's strides
        kernels.flashmask_bwd(q, k, v, out, lse, do, None, torch.empty(1, 2, 64, 64, device="cuda",
                              dtype=torch.bfloat16).transpose(1, 2), dk, dv, causal=True)
    with pytest.raises(ValueError):
        kernels.flashmask_bwd(q, k, v, out, lse, do, None, dq, dk, dv, causal=True, softmax_scale=-1.0)
    bad = torch.zeros(1, 1, 64, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError):
        kernels.flashmask_bwd(q, k, v, out, lse, do, bad, dq, dk, dv, causal=True)  # C=4 needs causal=False
    with pytest.raises(ValueError):
        kernels.flashmask_bwd(q.cpu(), k, v, out, lse, do, None, dq, dk, dv, causal=True)


# The mma.sync (step-1) backward stays the kernel for layouts TMA cannot describe;
# FM3_BWD_KERNEL=mma_sync forces it, so it keeps being checked at every head dim WGMMA serves.
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d,dtype", [(128, "bf16"), (64, "fp16"), (256, "bf16"), (192, "fp16")])
def test_mma_sync_fallback(d, dtype, deterministic, monkeypatch):
    monkeypatch.setenv("FM3_BWD_KERNEL", "mma_sync")
    for i, family in enumerate(["causal", "document", "random_eviction", "global_sliding_window"]):
        sri, causal = family_mask(family, 333, 500 + i)
        q, k, v = make_qkv(1, 333, 333, 4, 2, d, DTYPES[dtype], 600 + i)
        check_bwd(q, k, v, sri, causal, dtype, deterministic=deterministic, seed=600 + i)



@pytest.mark.parametrize("family", ["causal_document", "document", "share_question", "global_sliding_window"])
def test_values_outside_seqlen_q(family):
    """Out-of-range mask values (Paddle's meaning) in the Hopper backward: same gradients as the clamped mask."""
    sq = 300
    sri, causal = family_mask(family, sq, 41)
    raw = raw_paddle_values(sri, sq, 42)
    assert (raw > sq).any()
    q, k, v = make_qkv(1, sq, sq, 4, 2, 128, DTYPES["bf16"], 43)
    _, (dq, dk, dv), (out, lse, do) = check_bwd(q, k, v, sri, causal, "bf16", deterministic=True, seed=43)
    raw_dev = torch.from_numpy(raw).cuda()
    got = run_bwd(q, k, v, out, lse, do, raw_dev, causal, deterministic=True)
    for x, y in zip(got, (dq, dk, dv)):
        assert torch.equal(x, y)
    # Default mode: dQ is summed by bulk reductions in no fixed order (not bitwise), dK and dV are.
    dqa, dka, dva = run_bwd(q, k, v, out, lse, do, raw_dev, causal)
    assert torch.equal(dka, dk) and torch.equal(dva, dv)
    assert (dqa.float() - dq.float()).abs().max().item() <= 1e-2 * max(1.0, dq.float().abs().max().item())


@pytest.mark.parametrize("d", [d for d in HEAD_DIMS if d[0] != d[1] or d[0] not in BWD_FALLBACK_DIMS], ids=dims_id)
def test_head_dims_without_mma_sync_say_so(d, monkeypatch):
    """FM3_BWD_KERNEL=mma_sync at a head dim only the WGMMA backward serves: a clear error, no launch."""
    monkeypatch.setenv("FM3_BWD_KERNEL", "mma_sync")
    q, k, v = make_qkv(1, 64, 64, 2, 2, d, torch.bfloat16, 0)
    out = torch.randn(1, 64, 2, d[1], device="cuda").to(torch.bfloat16)
    lse = torch.zeros(1, 2, 64, device="cuda")
    with pytest.raises(RuntimeError, match=rf"head_dim {d[0]} / head_dim_v {d[1]} runs on the WGMMA backward only"):
        run_bwd(q, k, v, out, lse, torch.randn_like(out), None, True)


# Learnable sinks: dq, dk, dv see the sink only through lse; its own gradient is a fixed-order sum.
def sink_logits(h, seed, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(h) * scale).astype(np.float32)


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_sink_families(family, d):
    seed = zlib.crc32(repr(("sink", family, d)).encode())
    sri, causal = family_mask(family, 129, seed, batch=2)
    q, k, v = make_qkv(2, 129, 129, 4, 2, d, DTYPES["bf16"], seed)
    check_bwd(q, k, v, sri, causal, "bf16", seed=seed, learnable_sink=sink_logits(4, seed))


@pytest.mark.parametrize("d,dtype", [(64, "fp16"), (128, "bf16"), (256, "fp16"), ((192, 128), "bf16")],
                         ids=["d64", "d128", "d256", "d192v128"])
def test_sink_long_fully_masked_and_extreme(d, dtype):
    """S 1000, fully masked rows (lse = the sink there), sinks far above and below the scores."""
    s = 1000
    sri = np.zeros((1, 1, s, 2), dtype=np.int32)
    sri[..., 0], sri[..., 1] = 300, 420
    sinks = np.array([30.0, -30.0, 0.7, -1.2], np.float32)
    q, k, v = make_qkv(1, s, s, 4, 2, d, DTYPES[dtype], 18)
    check_bwd(q, k, v, sri, True, dtype, seed=18, learnable_sink=sinks)


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
def test_sink_deterministic(d):
    """The sink's gradient is bitwise repeatable in both modes (it has one order); dq in deterministic mode."""
    sri, causal = family_mask("causal_document", 700, 35, batch=2)
    q, k, v = make_qkv(2, 700, 700, 4, 2, d, DTYPES["bf16"], 35)
    sinks = sink_logits(4, 35)
    _, g1, (out, lse, do) = check_bwd(q, k, v, sri, causal, "bf16", deterministic=True, seed=35,
                                      learnable_sink=sinks)
    sri_dev, sink_dev = torch.from_numpy(sri).cuda(), torch.from_numpy(sinks).cuda()
    for det in (True, False):
        g2 = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=det, learnable_sink=sink_dev)
        assert torch.equal(g1[3], g2[3]) and torch.equal(g1[1], g2[1]) and torch.equal(g1[2], g2[2])
        if det:
            assert torch.equal(g1[0], g2[0])
    # a caller's workspace, sized with the sink's gradient asked for (its partial sums live there)
    need = kernels.bwd_workspace_bytes(q, k, v, out, lse, do, sri_dev, *g1[:3], causal=causal, deterministic=True,
                                       learnable_sink=sink_dev, dlearnable_sink=g1[3])
    assert need > kernels.bwd_workspace_bytes(q, k, v, out, lse, do, sri_dev, *g1[:3], causal=causal,
                                              deterministic=True)
    ws = torch.full((need,), 0xAB, dtype=torch.uint8, device="cuda")  # stale contents
    g3 = run_bwd(q, k, v, out, lse, do, sri_dev, causal, deterministic=True, learnable_sink=sink_dev, workspace=ws)
    assert all(torch.equal(a, b) for a, b in zip(g1, g3))


@pytest.mark.parametrize("d", BWD_FALLBACK_DIMS)
def test_sink_mma_sync_fallback(d, monkeypatch):
    monkeypatch.setenv("FM3_BWD_KERNEL", "mma_sync")
    for i, family in enumerate(["causal", "document", "global_sliding_window"]):
        sri, causal = family_mask(family, 333, 900 + i)
        q, k, v = make_qkv(1, 333, 333, 4, 2, d, DTYPES["bf16"], 910 + i)
        check_bwd(q, k, v, sri, causal, "bf16", seed=910 + i, learnable_sink=sink_logits(4, i))


@pytest.mark.parametrize("window", [None, 128])
def test_sink_fwd_bwd_chain_vs_autograd_gpt_oss(window):
    """gpt-oss attention (head dim 64, 64 query / 8 kv heads, sliding window 128 or causal), S 2048:
    our forward then backward against torch autograd of the fp32 dense softmax with the sink appended
    as an extra key column (an independent formulation), the sink's gradient included."""
    s, h, hk, d = 2048, 64, 8, 64
    q, k, v = make_qkv(1, s, s, h, hk, d, DTYPES["bf16"], 19)
    sinks = torch.from_numpy(sink_logits(h, 19)).cuda()
    g = torch.Generator(device="cuda").manual_seed(20)
    do = torch.randn(1, s, h, d, device="cuda", generator=g).to(q.dtype)
    sri = None if window is None else torch.from_numpy(masks.sliding_window(s, window).startend_row_indices).cuda()
    out = torch.full((1, s, h, d), float("nan"), device="cuda", dtype=q.dtype)
    lse = torch.full((1, h, s), float("nan"), device="cuda")
    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=True, learnable_sink=sinks)
    dq, dk, dv, dsink = run_bwd(q, k, v, out, lse, do, sri, True, learnable_sink=sinks)

    qf, kf, vf, sf = (x.detach().float().requires_grad_() for x in (q, k, v, sinks))
    kr, vr = kf.repeat_interleave(h // hk, dim=2), vf.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kr) * d ** -0.5
    i = torch.arange(s, device="cuda")
    vis = i[None, :] <= i[:, None]
    if window is not None:
        vis &= i[:, None] - i[None, :] <= window  # masks.sliding_window: keys [i - window, i]
    scores = scores.masked_fill(~vis, float("-inf"))
    logits = torch.cat([scores, sf[None, :, None, None].expand(1, h, s, 1)], dim=-1)
    p = torch.softmax(logits, dim=-1)[..., :s]
    ref = torch.einsum("bhqk,bkhd->bqhd", p, vr)
    ref.backward(do.float())
    ref_lse = torch.logsumexp(logits, dim=-1)
    for name, x, r in (("out", out, ref), ("dq", dq, qf.grad), ("dk", dk, kf.grad), ("dv", dv, vf.grad)):
        err = (torch.linalg.vector_norm(x.double() - r.double()) / torch.linalg.vector_norm(r.double())).item()
        assert err <= BWD_TOL["bf16"], f"{name}: relative error {err:.3e}"
    assert (lse - ref_lse.detach()).abs().max().item() <= 2e-3
    check_dsink(dsink, sinks.cpu().numpy(), lse, out, do, sf.grad.double().cpu().numpy(), "bf16")
