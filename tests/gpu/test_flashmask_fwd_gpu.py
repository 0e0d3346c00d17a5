"""Hopper forward kernel vs the dense references, every mask family and form (device machine)."""
import zlib

import numpy as np
import pytest

from paddle_fm3 import masks

torch = pytest.importorskip("torch")
from fm3_gpu_util import (DTYPES, FWD_FALLBACK_DIMS, HEAD_DIMS, check, dims_id, head_dims, make_qkv,  # noqa: E402
                          raw_paddle_values, run_kernel)

FAMILIES = sorted(masks.FAMILIES)


def family_mask(name, s, seed, batch=1, num_heads=1):
    fm = masks.FAMILIES[name](s, np.random.default_rng(seed), batch=batch, num_heads=num_heads)
    return np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32), fm.causal


# All 12 families x head dims x dtypes, odd length 129, GQA (4 query heads on 2 kv heads), batch 2.
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_families(family, d, dtype):
    seed = zlib.crc32(repr((family, d, dtype)).encode())
    sri, causal = family_mask(family, 129, seed, batch=2)
    q, k, v = make_qkv(2, 129, 129, 4, 2, d, DTYPES[dtype], seed)
    check(q, k, v, sri, causal, dtype)


# All odd lengths on a few families (one head dim per dtype to keep device time small).
@pytest.mark.parametrize("s", [1, 127, 129, 1000, 8191])
@pytest.mark.parametrize("family", ["causal", "document", "global_sliding_window", "random_eviction",
                                    "share_question", "qk_sparse"])
@pytest.mark.parametrize("d,dtype", [(128, "bf16"), (64, "fp16")])
def test_lengths(family, s, d, dtype):
    seed = zlib.crc32(repr((family, s, d)).encode())
    sri, causal = family_mask(family, s, seed)
    h, hk = (2, 1) if s > 4000 else (4, 2)
    q, k, v = make_qkv(1, s, s, h, hk, d, DTYPES[dtype], seed)
    check(q, k, v, sri, causal, dtype)


# Head dims other than the 64 and 128 of the length tests above (80, 96, 192, the MLA pair, 256).
OTHER_DIMS = [d for d in HEAD_DIMS if d[0] not in (64, 128) or d[0] != d[1]]


@pytest.mark.parametrize("d", OTHER_DIMS, ids=dims_id)
def test_long_all_families_once(d):
    """Every family at 1000 tokens (S not a multiple of any tile) for the head dims not covered above."""
    for i, family in enumerate(FAMILIES):
        sri, causal = family_mask(family, 1000, 100 + i)
        q, k, v = make_qkv(1, 1000, 1000, 2, 1, d, DTYPES["bf16"], 200 + i)
        check(q, k, v, sri, causal, "bf16")


@pytest.mark.parametrize("sq,sk", [(200, 333), (333, 200), (1, 129), (129, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_seqlen_q_ne_k_no_mask(sq, sk, causal):
    q, k, v = make_qkv(2, sq, sk, 4, 4, 128, DTYPES["fp16"], sq * 7 + sk)
    check(q, k, v, None, causal, "fp16")


@pytest.mark.parametrize("sq,sk", [(200, 333), (333, 200)])
@pytest.mark.parametrize("causal", [True, False])
def test_seqlen_q_ne_k_window(sq, sk, causal):
    q, k, v = make_qkv(1, sq, sk, 4, 2, 64, DTYPES["bf16"], sq + sk)
    check(q, k, v, None, causal, "bf16", window_size=(37, 11))


@pytest.mark.parametrize("sq,sk,causal,c", [(200, 333, True, 2), (333, 200, True, 1), (200, 333, False, 4),
                                            (333, 200, False, 2)])
def test_seqlen_q_ne_k_random_bounds(sq, sk, causal, c):
    """Random column bounds with S_q != S_k (rows are query indices in [0, S_q])."""
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
    q, k, v = make_qkv(1, sq, sk, 4, 2, 128, DTYPES["fp16"], sq + 3 * sk)
    check(q, k, v, sri, causal, "fp16")


@pytest.mark.parametrize("mask_heads", ["1", "hk", "h"])
def test_mask_heads_broadcast(mask_heads):
    h, hk = 8, 2
    hm = {"1": 1, "hk": hk, "h": h}[mask_heads]
    parts = [family_mask("causal_document", 300, 10 + i)[0] for i in range(hm)]
    sri = np.ascontiguousarray(np.concatenate(parts, axis=1))
    q, k, v = make_qkv(1, 300, 300, h, hk, 128, DTYPES["bf16"], 5)
    check(q, k, v, sri, True, "bf16")


def test_mqa():
    sri, causal = family_mask("prefix_lm_document", 513, 3)
    q, k, v = make_qkv(1, 513, 513, 8, 1, 64, DTYPES["fp16"], 8)
    check(q, k, v, sri, causal, "fp16")


@pytest.mark.parametrize("family", ["full", "causal", "document"])
def test_softmax_scale(family):
    sri, causal = family_mask(family, 257, 1)
    q, k, v = make_qkv(1, 257, 257, 2, 2, 128, DTYPES["fp16"], 9)
    check(q, k, v, sri, causal, "fp16", softmax_scale=0.03)


# Every head dim: a tile of more than 128 rows (head dim 64's 192) spans block_mask row blocks.
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
    check(q, k, v, sri, causal, "bf16", block_mask=bm)


def test_block_mask_without_sri():
    s = 300
    nb = -(-s // 128)
    bm = np.ones((1, 1, nb, nb), dtype=np.int32)
    bm[0, 0, 1, 0] = 0
    q, k, v = make_qkv(1, s, s, 2, 2, 64, DTYPES["bf16"], 13)
    check(q, k, v, None, False, "bf16", block_mask=bm)


@pytest.mark.parametrize("d", [256, 80, (192, 128)], ids=dims_id)
@pytest.mark.parametrize("causal", [True, False])
def test_fully_masked_rows(causal, d):
    s = 333
    rng = np.random.default_rng(2)
    if causal:  # C=2: rows [LTS, LTE) masked in every column for a band of rows
        sri = np.zeros((1, 1, s, 2), dtype=np.int32)
        sri[..., 0] = 100
        sri[..., 1] = 250
    else:  # C=4 with random gaps plus a band masked everywhere
        sri = np.zeros((1, 1, s, 4), dtype=np.int32)
        sri[..., 0] = 40
        sri[..., 1] = 170
        sri[..., 2] = rng.integers(0, 20, size=s)
        sri[..., 3] = sri[..., 2] + 5
    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES["fp16"], 14)
    check(q, k, v, sri, causal, "fp16")


def test_host_mask_and_strided_qkv():
    """Mask given as a numpy array; q/k/v are views into one packed qkv tensor (non-contiguous)."""
    s, h, d = 257, 4, 64
    qkv = torch.randn(1, s, 3 * h, d, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :, :h], qkv[:, :, h:2 * h], qkv[:, :, 2 * h:]
    sri, causal = family_mask("document", s, 6)
    from paddle_fm3 import reference
    out, lse = run_kernel(q, k, v, sri, causal)
    ro, _ = reference.attention_forward(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                                        sri, causal=causal)
    err = np.linalg.norm(out.float().cpu().numpy() - ro) / np.linalg.norm(ro)
    assert err < 1e-2


# out with strides of its own (head dims 64, 128: the staged epilogue, shared memory + TMA store;
# 192, 192/128 and 256, one Q buffer: the direct one), poisoned.
@pytest.mark.parametrize("d", [(128, 128), (64, 64), (192, 128), (192, 192), (256, 256)], ids=dims_id)
@pytest.mark.parametrize("layout", ["every_other_head", "wide_rows"])
def test_out_layouts(d, layout):
    from paddle_fm3 import kernels, reference
    s, h, hk = 300, 4, 2
    sri, causal = family_mask("causal_document", s, 21)
    q, k, v = make_qkv(1, s, s, h, hk, d, torch.bfloat16, 22)
    dv = v.shape[3]
    if layout == "every_other_head":  # o_hs = 2 dv, o_rs = 2 h dv
        buf = torch.full((1, s, 2 * h, dv), float("nan"), device="cuda", dtype=q.dtype)
        out, untouched = buf[:, :, ::2], buf[:, :, 1::2]
    else:  # o_hs = dv + 64
        buf = torch.full((1, s, h, dv + 64), float("nan"), device="cuda", dtype=q.dtype)
        out, untouched = buf[..., :dv], buf[..., dv:]
    lse = torch.full((1, h, s), float("nan"), device="cuda")
    kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
    torch.cuda.synchronize()
    ro, _ = reference.attention_forward(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                                        sri, causal=causal)
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any()
    assert np.linalg.norm(got - ro) / np.linalg.norm(ro) < 1e-2
    assert torch.isnan(untouched).all()  # nothing written outside out


def test_bad_arguments():
    from paddle_fm3 import kernels
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.bfloat16, 0)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 64, device="cuda")
    with pytest.raises(TypeError):
        kernels.flashmask_fwd(q.float(), k, v, None, out, lse, causal=True)
    with pytest.raises(ValueError):
        kernels.flashmask_fwd(q, k[:, :32], v, None, out, lse, causal=True)
    with pytest.raises(ValueError):
        kernels.flashmask_fwd(q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous(), None,
                              out[..., :32].contiguous(), lse, causal=True)
    with pytest.raises(TypeError):
        kernels.flashmask_fwd(q, k, v, None, out, lse, causal=1)
    bad = torch.zeros(1, 1, 64, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError):
        kernels.flashmask_fwd(q, k, v, bad, out, lse, causal=True)  # C=4 needs causal=False
    with pytest.raises(TypeError):
        kernels.flashmask_fwd(q, k, v, bad.float(), out, lse, causal=False)


# The step-1 mma.sync kernel stays the fallback for configs/layouts the WGMMA kernel does not take;
# FM3_FWD_KERNEL=mma_sync forces it, so it keeps being checked at the head dims WGMMA now serves.
@pytest.mark.parametrize("d,dtype", [(128, "bf16"), (64, "fp16"), (192, "bf16")])
def test_mma_sync_fallback(d, dtype, monkeypatch):
    monkeypatch.setenv("FM3_FWD_KERNEL", "mma_sync")
    for i, family in enumerate(["causal", "document", "random_eviction", "global_sliding_window"]):
        sri, causal = family_mask(family, 333, 300 + i)
        q, k, v = make_qkv(1, 333, 333, 4, 2, d, DTYPES[dtype], 400 + i)
        check(q, k, v, sri, causal, dtype)


# The persistent kernel with 3 CTAs: each takes many tiles from the counter, across (batch, head)
# boundaries, so the tile boundaries in the ring, the double-buffered Q and the per-tile epilogue
# all run many times per CTA (head dims 192 and 256: one Q buffer, reloaded between tiles; 192 on 112-key blocks).
@pytest.mark.parametrize("d,dtype", [(128, "bf16"), (64, "fp16"), (256, "bf16"), (96, "fp16"), ((192, 128), "bf16"),
                                     (192, "fp16")],
                         ids=["d128", "d64", "d256", "d96", "d192v128", "d192"])
def test_persistent_many_tiles_per_cta(d, dtype, monkeypatch):
    monkeypatch.setenv("FM3_FWD_GRID", "3")
    for i, family in enumerate(FAMILIES):
        sri, causal = family_mask(family, 1000, 300 + i, batch=2)
        q, k, v = make_qkv(2, 1000, 1000, 4, 2, d, DTYPES[dtype], 400 + i)
        check(q, k, v, sri, causal, dtype)
    q, k, v = make_qkv(1, 200, 333, 4, 4, d, DTYPES[dtype], 7)
    check(q, k, v, None, True, dtype)


@pytest.mark.parametrize("family", ["causal_document", "document", "share_question", "global_sliding_window"])
@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
def test_values_outside_seqlen_q(family, d):
    """Out-of-range mask values (Paddle's meaning: above seqlen_q reads as seqlen_q, negative as 0) in the
    Hopper forward: the same output, bit for bit, as the clamped mask, which is checked against float64."""
    sq = 300
    seed = sum(head_dims(d))
    fm = masks.FAMILIES[family](sq, np.random.default_rng(seed))
    sri = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
    raw = raw_paddle_values(sri, sq, seed + 1)
    assert (raw > sq).any()
    q, k, v = make_qkv(1, sq, sq, 4, 2, d, DTYPES["bf16"], seed + 1)
    check(q, k, v, sri, fm.causal, "bf16")
    out_ref, lse_ref = run_kernel(q, k, v, torch.from_numpy(sri).cuda(), fm.causal)
    out_raw, lse_raw = run_kernel(q, k, v, torch.from_numpy(raw).cuda(), fm.causal)
    assert torch.equal(out_raw, out_ref) and torch.equal(lse_raw, lse_ref)


@pytest.mark.parametrize("d", [d for d in HEAD_DIMS if d[0] != d[1] or d[0] not in FWD_FALLBACK_DIMS], ids=dims_id)
def test_head_dims_without_mma_sync_say_so(d, monkeypatch):
    """FM3_FWD_KERNEL=mma_sync at a head dim only the WGMMA kernel serves: a clear error, no launch."""
    monkeypatch.setenv("FM3_FWD_KERNEL", "mma_sync")
    q, k, v = make_qkv(1, 64, 64, 2, 2, d, torch.bfloat16, 0)
    with pytest.raises(RuntimeError, match=rf"head_dim {d[0]} / head_dim_v {d[1]} runs on the WGMMA kernel only"):
        run_kernel(q, k, v, None, True)


def test_unserved_head_dim_pair_is_a_value_error():
    q, k, v = make_qkv(1, 64, 64, 2, 2, (128, 96), torch.bfloat16, 0)
    with pytest.raises(ValueError, match="head_dim 128 .q, k. with head_dim_v 96 .v. has no sm90 kernel"):
        run_kernel(q, k, v, None, True)


# Learnable sinks (reference.py's meaning): the sink joins each row's denominator at the epilogue.
def sink_logits(h, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(h) * scale).astype(np.float32)


@pytest.mark.parametrize("d", HEAD_DIMS, ids=dims_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_sink_families(family, d):
    seed = zlib.crc32(repr(("sink", family, d)).encode())
    sri, causal = family_mask(family, 129, seed, batch=2)
    q, k, v = make_qkv(2, 129, 129, 4, 2, d, DTYPES["bf16"], seed)
    check(q, k, v, sri, causal, "bf16", learnable_sink=sink_logits(4, seed, 2.0))


@pytest.mark.parametrize("sink", [40.0, -40.0, 0.0])
@pytest.mark.parametrize("d,dtype", [(64, "fp16"), (128, "bf16"), ((192, 128), "bf16")], ids=["d64", "d128", "d192v128"])
def test_sink_extreme_values(sink, d, dtype):
    """A sink far above every score (the row's output ~0, lse ~ the sink, no overflow) and far below."""
    sri, causal = family_mask("causal_document", 1000, 5)
    q, k, v = make_qkv(1, 1000, 1000, 4, 2, d, DTYPES[dtype], 15)
    sinks = np.array([sink, -sink, 0.5, sink], np.float32)
    check(q, k, v, sri, causal, dtype, learnable_sink=sinks)


@pytest.mark.parametrize("d", [64, 256, 80, (192, 128)], ids=dims_id)
def test_sink_fully_masked_rows(d):
    """Rows that see no key: out 0 and lse = the sink (not -inf)."""
    s = 333
    sri = np.zeros((1, 1, s, 2), dtype=np.int32)
    sri[..., 0], sri[..., 1] = 100, 250
    q, k, v = make_qkv(1, s, s, 2, 1, d, DTYPES["fp16"], 16)
    sinks = sink_logits(2, 16)
    check(q, k, v, sri, True, "fp16", learnable_sink=sinks)
    out, lse = run_kernel(q, k, v, torch.from_numpy(sri).cuda(), True, learnable_sink=torch.from_numpy(sinks).cuda())
    assert torch.equal(lse[0, :, 100:250], torch.from_numpy(sinks).cuda()[:, None].expand(2, 150))


@pytest.mark.parametrize("d", FWD_FALLBACK_DIMS)
def test_sink_mma_sync_fallback(d, monkeypatch):
    monkeypatch.setenv("FM3_FWD_KERNEL", "mma_sync")
    for i, family in enumerate(["causal", "document", "global_sliding_window"]):
        sri, causal = family_mask(family, 333, 700 + i)
        q, k, v = make_qkv(1, 333, 333, 4, 2, d, DTYPES["bf16"], 800 + i)
        check(q, k, v, sri, causal, "bf16", learnable_sink=sink_logits(4, i, 2.0))


def test_sink_gpt_oss_shape_long():
    """gpt-oss attention: head dim 64, 64 query / 8 kv heads, sliding window 128 and causal, S 4096
    (fp32 torch reference)."""
    sinks = sink_logits(64, 17, 2.0)
    q, k, v = make_qkv(1, 4096, 4096, 64, 8, 64, DTYPES["bf16"], 17)
    check(q, k, v, None, True, "bf16", window_size=(127, 0), learnable_sink=sinks)
    check(q, k, v, None, True, "bf16", learnable_sink=sinks)
