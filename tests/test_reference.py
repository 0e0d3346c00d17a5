"""Tests of paddle_fm3.reference: the float64 dense oracle, forward and backward."""

import math

import numpy as np
import pytest

from paddle_fm3 import masks as M
from paddle_fm3 import reference as R


# ---------------------------------------------------------------------------
# Naive implementation: one query row at a time, explicit head mapping
# ---------------------------------------------------------------------------


def naive_forward(q, k, v, sri=None, causal=False, scale=None, block_mask=None):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Sq, H, D = q.shape
    _, Sk, Hk, Dv = v.shape
    G = H // Hk
    scale = D ** -0.5 if scale is None else scale
    dense = None if sri is None else M.to_dense(sri, causal, Sq)
    out = np.zeros((B, Sq, H, Dv))
    lse = np.full((B, H, Sq), -np.inf)
    for b in range(B):
        for h in range(H):
            kvh = h // G
            if sri is not None:
                hm = sri.shape[1]
                mh = h if hm == H else (h // G if hm == Hk else 0)
            for i in range(Sq):
                keys = []
                for j in range(Sk):
                    ok = dense[b, mh, i, j] if sri is not None else (not causal or j <= i + Sk - Sq)
                    if block_mask is not None:
                        bh = block_mask.shape[1]
                        bmh = h if bh == H else (h // G if bh == Hk else 0)
                        ok = ok and block_mask[b, bmh, i // 128, j // 128] == 1
                    if ok:
                        keys.append(j)
                if not keys:
                    continue
                scores = [scale * float(np.dot(q[b, i, h], k[b, j, kvh])) for j in keys]
                mx = max(scores)
                w = [math.exp(s - mx) for s in scores]
                tot = sum(w)
                lse[b, h, i] = mx + math.log(tot)
                out[b, i, h] = sum(wi / tot * v[b, j, kvh] for wi, j in zip(w, keys))
    return out, lse


def rand_qkv(rng, B, Sq, Sk, H, Hk, D, Dv=None, dtype=np.float64):
    Dv = D if Dv is None else Dv
    q = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    k = rng.standard_normal((B, Sk, Hk, D)).astype(dtype)
    v = rng.standard_normal((B, Sk, Hk, Dv)).astype(dtype)
    return q, k, v


def random_sri(rng, B, Hm, Sk, Sq, causal, C):
    return rng.integers(0, Sq + 1, size=(B, Hm, Sk, C)).astype(np.int32)


# (B, Sq, Sk, H, Hk, Hm, causal, C)  Hm = None: no startend_row_indices
FORWARD_CASES = [
    (1, 7, 7, 1, 1, None, False, None),
    (2, 5, 8, 2, 2, None, True, None),   # S_q < S_k causal, no flashmask
    (1, 8, 5, 2, 1, None, True, None),   # S_q > S_k causal: first rows fully masked
    (2, 9, 9, 4, 2, 1, True, 1),        # GQA, broadcast mask head
    (1, 9, 9, 4, 2, 2, True, 2),        # H_mask == H_k
    (1, 9, 9, 4, 2, 4, False, 2),       # H_mask == H
    (2, 6, 9, 4, 1, 1, False, 4),       # MQA, rectangular
    (1, 9, 6, 3, 3, 3, True, 2),        # rectangular causal with flashmask
    (1, 6, 11, 6, 2, 2, False, 4),
]


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_forward_vs_naive(case):
    B, Sq, Sk, H, Hk, Hm, causal, C = case
    rng = np.random.default_rng(hash(case) % 2**32)
    q, k, v = rand_qkv(rng, B, Sq, Sk, H, Hk, 5, Dv=3)
    sri = None if Hm is None else random_sri(rng, B, Hm, Sk, Sq, causal, C)
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri, causal=causal)
    ref_out, ref_lse = naive_forward(q, k, v, sri, causal)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    assert out.shape == (B, Sq, H, 3) and lse.shape == (B, H, Sq)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(M.FAMILIES))
def test_forward_vs_naive_every_family(name):
    rng = np.random.default_rng(len(name))
    S = 11
    fm = M.FAMILIES[name](S, rng, batch=2)
    q, k, v = rand_qkv(rng, 2, S, S, 2, 1, 4)
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, fm.startend_row_indices, causal=fm.causal, softmax_scale=0.3)
    ref_out, ref_lse = naive_forward(q, k, v, fm.startend_row_indices, fm.causal, scale=0.3)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_forward_block_mask_vs_naive():
    rng = np.random.default_rng(5)
    B, Sq, Sk, H, Hk = 1, 200, 300, 2, 1
    q, k, v = rand_qkv(rng, B, Sq, Sk, H, Hk, 4)
    sri = M.window_to_startend((250, 250), Sq, Sk, B, False)  # a non-causal C=2 mask, H_mask=1
    bm = np.array([[[[1, 0, 1], [0, 1, 1]]]], dtype=np.int32)  # [1, 1, 2, 3]
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri, causal=False, block_mask=bm)
    ref_out, ref_lse = naive_forward(q, k, v, sri, False, block_mask=bm)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
    # block_mask all ones == no block_mask
    out1, lse1 = R.attention_forward(q, k, v, sri, block_mask=np.ones_like(bm))
    out0, lse0 = R.attention_forward(q, k, v, sri)
    np.testing.assert_array_equal(out1, out0)
    np.testing.assert_array_equal(lse1, lse0)


def test_forward_block_mask_per_head_causal():
    rng = np.random.default_rng(6)
    B, S, H, Hk = 1, 140, 4, 2
    q, k, v = rand_qkv(rng, B, S, S, H, Hk, 3)
    sri = M.causal_document([60, 80], num_heads=Hk).startend_row_indices  # H_mask == H_k
    bm = np.ones((B, Hk, 2, 2), np.int32)
    bm[0, 1, 1, 0] = 0
    bm[0, 0, 0, 0] = 0  # rows 0..127 of heads 0,1 see nothing in block (0,0): fully masked rows
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri, causal=True, block_mask=bm)
    ref_out, ref_lse = naive_forward(q, k, v, sri, True, block_mask=bm)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert np.isneginf(lse[0, :2, :128]).all() and np.isfinite(lse[0, 2:]).all()


def test_forward_default_scale_and_dtypes():
    rng = np.random.default_rng(7)
    q, k, v = rand_qkv(rng, 1, 6, 6, 2, 2, 16, dtype=np.float32)
    out, lse = R.attention_forward(q, k, v, causal=True)
    ref_out, ref_lse = naive_forward(q, k, v, causal=True, scale=0.25)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    out16, _ = R.attention_forward(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), causal=True)
    assert out16.dtype == np.float64
    np.testing.assert_allclose(out16, out, atol=1e-2)


def test_fully_masked_rows_forward_and_backward():
    rng = np.random.default_rng(8)
    B, S, H, Hk, D = 1, 6, 2, 1, 4
    q, k, v = rand_qkv(rng, B, S, S, H, Hk, D)
    # non-causal C=2: UTE = 2 for every column -> rows 0, 1 see nothing; LTS = 0 for head 1 -> all masked
    sri = np.zeros((B, H, S, 2), np.int32)
    sri[:, 0, :, 0] = S
    sri[:, 0, :, 1] = 2
    dout = rng.standard_normal(q.shape)
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri)
        dq, dk, dv = R.attention_backward(q, k, v, dout, sri)
    assert not np.isnan(out).any() and not np.isnan(dq).any()
    assert (out[0, :2, 0] == 0).all() and (out[0, :, 1] == 0).all()
    assert np.isneginf(lse[0, 0, :2]).all() and np.isfinite(lse[0, 0, 2:]).all()
    assert np.isneginf(lse[0, 1]).all()
    assert (dq[0, :2, 0] == 0).all() and (dq[0, :, 1] == 0).all()
    # head 1 contributes nothing to dk/dv: compare with head-1 dout zeroed
    dout2 = dout.copy()
    dout2[:, :, 1] = 0
    dout2[:, :2, 0] = 0
    _, dk2, dv2 = R.attention_backward(q, k, v, dout2, sri)
    np.testing.assert_allclose(dk, dk2, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(dv, dv2, rtol=1e-13, atol=1e-14)
    # everything masked
    sri_all = np.zeros((B, 1, S, 1), np.int32)
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri_all, causal=True)
        grads = R.attention_backward(q, k, v, dout, sri_all, causal=True)
    assert (out == 0).all() and np.isneginf(lse).all()
    assert all((g == 0).all() for g in grads)


# ---------------------------------------------------------------------------
# Backward vs central finite differences
# ---------------------------------------------------------------------------


def finite_difference_grads(q, k, v, dout, coords=None, eps=1e-6, **kw):
    """d/dx of sum(out * dout) for x in (q, k, v), by central differences."""
    arrays = [q.copy(), k.copy(), v.copy()]
    grads = [np.zeros_like(a) for a in arrays]

    def loss():
        out, _ = R.attention_forward(*arrays, **kw)
        return float((out * dout).sum())

    for ai, a in enumerate(arrays):
        idxs = list(np.ndindex(a.shape)) if coords is None else coords[ai]
        for idx in idxs:
            old = a[idx]
            a[idx] = old + eps
            lp = loss()
            a[idx] = old - eps
            lm = loss()
            a[idx] = old
            grads[ai][idx] = (lp - lm) / (2 * eps)
    return grads


# (B, Sq, Sk, H, Hk, Hm, causal, C)
BACKWARD_CASES = [
    (1, 4, 4, 1, 1, None, False, None),
    (1, 3, 5, 2, 1, None, True, None),  # S_q < S_k causal
    (1, 5, 3, 2, 2, None, True, None),  # S_q > S_k causal: fully masked rows
    (2, 4, 4, 4, 2, 1, True, 1),       # GQA + broadcast mask
    (1, 4, 5, 4, 2, 2, True, 2),       # H_mask == H_k, rectangular
    (1, 5, 4, 2, 1, 2, False, 2),      # H_mask == H, MQA
    (1, 4, 4, 2, 2, 2, False, 4),
]


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_vs_finite_differences(case):
    B, Sq, Sk, H, Hk, Hm, causal, C = case
    rng = np.random.default_rng(hash(case) % 2**32)
    q, k, v = rand_qkv(rng, B, Sq, Sk, H, Hk, 3, Dv=2)
    sri = None if Hm is None else random_sri(rng, B, Hm, Sk, Sq, causal, C)
    dout = rng.standard_normal((B, Sq, H, 2))
    kw = dict(startend_row_indices=sri, causal=causal, softmax_scale=0.7)
    with np.errstate(all="raise"):
        dq, dk, dv = R.attention_backward(q, k, v, dout, sri, causal=causal, softmax_scale=0.7)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    fq, fk, fv = finite_difference_grads(q, k, v, dout, **kw)
    for got, want in ((dq, fq), (dk, fk), (dv, fv)):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_backward_block_mask_finite_differences():
    rng = np.random.default_rng(11)
    B, Sq, Sk, H, Hk = 1, 130, 140, 2, 1
    q, k, v = rand_qkv(rng, B, Sq, Sk, H, Hk, 2)
    # a causal C=2 mask over S_k columns; row indices must be <= S_q
    sri = np.minimum(M.qk_sparse(Sk, num_spans=2, seed=3).startend_row_indices, Sq).astype(np.int32)
    bm = np.array([[[[1, 0], [1, 1]]]], np.int32)
    dout = rng.standard_normal((B, Sq, H, 2))
    kw = dict(startend_row_indices=sri, causal=True, block_mask=bm)
    with np.errstate(all="raise"):
        dq, dk, dv = R.attention_backward(q, k, v, dout, sri, causal=True, block_mask=bm)
    pick = rng.integers
    coords = [
        [tuple(int(pick(0, s)) for s in q.shape) for _ in range(12)] + [(0, 129, 1, 0), (0, 0, 0, 1)],
        [tuple(int(pick(0, s)) for s in k.shape) for _ in range(12)] + [(0, 135, 0, 0), (0, 10, 0, 1)],
        [tuple(int(pick(0, s)) for s in v.shape) for _ in range(12)] + [(0, 139, 0, 1)],
    ]
    fq, fk, fv = finite_difference_grads(q, k, v, dout, coords=coords, **kw)
    for got, want, cs in ((dq, fq, coords[0]), (dk, fk, coords[1]), (dv, fv, coords[2])):
        for c in cs:
            np.testing.assert_allclose(got[c], want[c], rtol=1e-6, atol=1e-8)


def test_gqa_equals_repeated_kv():
    rng = np.random.default_rng(12)
    q, k, v = rand_qkv(rng, 1, 6, 6, 4, 2, 3)
    fm = M.causal_document([2, 4], num_heads=2)
    dout = rng.standard_normal(q.shape)
    out, lse = R.attention_forward(q, k, v, fm.startend_row_indices, causal=True)
    kr, vr = np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)
    sr = np.repeat(fm.startend_row_indices, 2, axis=1)
    out2, lse2 = R.attention_forward(q, kr, vr, sr, causal=True)
    np.testing.assert_allclose(out, out2, rtol=1e-14)
    np.testing.assert_allclose(lse, lse2, rtol=1e-14)
    dq, dk, dv = R.attention_backward(q, k, v, dout, fm.startend_row_indices, causal=True)
    dq2, dk2, dv2 = R.attention_backward(q, kr, vr, dout, sr, causal=True)
    np.testing.assert_allclose(dq, dq2, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dk, dk2.reshape(1, 6, 2, 2, 3).sum(3), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(dv, dv2.reshape(1, 6, 2, 2, 3).sum(3), rtol=1e-13, atol=1e-15)


def test_value_head_dim_mla_equals_value_zero_padded_to_query_head_dim():
    """MLA's (192, 128): out and dv have v's 128 columns; they equal the first 128 columns of the
    attention of v zero-padded to 192 (what PaddleFormers' DeepSeek-V3 does for Paddle's kernel),
    and dq, dk are the same (the padding's output columns get a zero gradient)."""
    rng = np.random.default_rng(14)
    q, k, v = rand_qkv(rng, 2, 9, 11, 4, 2, 192, Dv=128)
    sri = random_sri(rng, 2, 2, 11, 9, False, 4)
    dout = rng.standard_normal((2, 9, 4, 128))
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri)
        dq, dk, dv = R.attention_backward(q, k, v, dout, sri)
    assert out.shape == (2, 9, 4, 128) and lse.shape == (2, 4, 9)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    pad = np.zeros(v.shape[:3] + (64,))
    vp, doutp = np.concatenate([v, pad], -1), np.concatenate([dout, rng.standard_normal(dout.shape[:3] + (64,))], -1)
    outp, lsep = R.attention_forward(q, k, vp, sri)
    np.testing.assert_allclose(out, outp[..., :128], rtol=1e-13, atol=1e-15)
    assert (outp[..., 128:] == 0).all()
    np.testing.assert_array_equal(lse, lsep)
    doutp[..., 128:] = 0
    dqp, dkp, dvp = R.attention_backward(q, k, vp, doutp, sri)
    np.testing.assert_allclose(dq, dqp, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dk, dkp, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dv, dvp[..., :128], rtol=1e-12, atol=1e-14)
    o_naive, l_naive = naive_forward(q, k, v, sri)
    np.testing.assert_allclose(out, o_naive, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, l_naive, rtol=1e-12)


def test_none_mask_equals_explicit_causal():
    rng = np.random.default_rng(13)
    q, k, v = rand_qkv(rng, 2, 5, 8, 2, 2, 4)
    sri = np.full((2, 1, 8, 1), 5, np.int32)  # LTS = S_q: nothing but causal
    a = R.attention_forward(q, k, v, None, causal=True)
    b = R.attention_forward(q, k, v, sri, causal=True)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------


def _qkv():
    rng = np.random.default_rng(0)
    return rand_qkv(rng, 1, 4, 4, 4, 2, 3)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda q, k, v: (q[0], k, v, {}), ValueError, "q must be 4-D"),
    (lambda q, k, v: (q, k[:, :, :1].repeat(3, axis=2), v[:, :, :1].repeat(3, axis=2), {}), ValueError, "multiple"),
    (lambda q, k, v: (q, k, v[:, :3], {}), ValueError, "k and v"),
    (lambda q, k, v: (q, k[..., :2], v, {}), ValueError, "head_dim"),
    (lambda q, k, v: (q, k, v, {"startend_row_indices": np.zeros((1, 3, 4, 2), np.int32)}), ValueError,
     "startend_row_indices"),
    (lambda q, k, v: (q, k, v, {"startend_row_indices": np.zeros((2, 1, 4, 2), np.int32)}), ValueError, "batch"),
    (lambda q, k, v: (q, k, v, {"startend_row_indices": np.zeros((1, 1, 5, 2), np.int32)}), ValueError, "seqlen_k"),
    (lambda q, k, v: (q, k, v, {"startend_row_indices": np.zeros((1, 1, 4, 2), np.int32),
                                "block_mask": np.ones((1, 1, 2, 1), np.int32)}), ValueError, "block_mask"),
    (lambda q, k, v: (q, k, v, {"startend_row_indices": np.zeros((1, 1, 4, 2), np.int32),
                                "block_mask": np.ones((1, 2, 1, 1), np.int32)}), ValueError, "block_mask"),
    (lambda q, k, v: (q, k, v, {"block_mask": np.full((1, 1, 1, 1), 2, np.int32)}), ValueError, "0"),
    (lambda q, k, v: (q, k, v, {"block_mask": np.ones((1, 1, 1, 1), np.float32)}), TypeError, "block_mask"),
    (lambda q, k, v: (q.astype(bool), k, v, {}), TypeError, "q"),
    (lambda q, k, v: (q, k, v, {"causal": 1}), TypeError, "causal"),
    (lambda q, k, v: (q, k, v, {"softmax_scale": float("nan")}), ValueError, "softmax_scale"),
    (lambda q, k, v: (q, k, v, {"softmax_scale": "a"}), TypeError, "softmax_scale"),
])
def test_bad_arguments(mutate, exc, match):
    q, k, v, kw = mutate(*_qkv())
    with pytest.raises(exc, match=match):
        R.attention_forward(q, k, v, **kw)


def test_bad_dout():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dout"):
        R.attention_backward(q, k, v, np.zeros((1, 4, 4, 2)))


# ---------------------------------------------------------------------------
# Learnable sinks: a virtual key of score sink[h] and value 0 in every row
# ---------------------------------------------------------------------------


def naive_sink_forward(q, k, v, sri, causal, sink, scale):
    """The sink as an appended key column: scores [.., S_k + 1], value 0 for the extra key."""
    B, Sq, H, _ = q.shape
    _, Sk, Hk, Dv = v.shape
    vis = R.dense_visibility(B, Sq, Sk, H, Hk, sri, causal=causal)
    s = np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, H // Hk, axis=2)) * scale
    s = np.concatenate([np.where(vis, s, -np.inf), np.broadcast_to(sink[None, :, None, None], (B, H, Sq, 1))], -1)
    p = np.exp(s - s.max(-1, keepdims=True))
    lse = np.log(p.sum(-1)) + s.max(-1)
    p = p / p.sum(-1, keepdims=True)
    vz = np.concatenate([np.repeat(v, H // Hk, axis=2), np.zeros((B, 1, H, Dv))], 1)
    return np.einsum("bhqk,bkhd->bqhd", p, vz), lse


@pytest.mark.parametrize("causal,C", [(True, 1), (False, 4)])
def test_sink_forward_vs_appended_key(causal, C):
    rng = np.random.default_rng(21)
    B, S, H, Hk = 2, 9, 4, 2
    q, k, v = rand_qkv(rng, B, S, S, H, Hk, 3, Dv=2)
    sri = random_sri(rng, B, 1, S, S, causal, C)
    sink = rng.standard_normal(H) * 2
    out, lse = R.attention_forward(q, k, v, sri, causal=causal, softmax_scale=0.6, learnable_sink=sink)
    want_out, want_lse = naive_sink_forward(q, k, v, sri, causal, sink, 0.6)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)


def test_sink_fully_masked_rows_give_zero_and_lse_sink():
    rng = np.random.default_rng(22)
    q, k, v = rand_qkv(rng, 1, 6, 6, 2, 1, 4)
    sri = np.zeros((1, 1, 6, 1), np.int32)  # causal LTS = 0: every row masked
    sink = np.array([0.5, -1.5])
    dout = rng.standard_normal(q.shape)
    with np.errstate(all="raise"):
        out, lse = R.attention_forward(q, k, v, sri, causal=True, learnable_sink=sink)
        grads = R.attention_backward(q, k, v, dout, sri, causal=True, learnable_sink=sink)
    assert (out == 0).all()
    np.testing.assert_array_equal(lse, np.broadcast_to(sink[None, :, None], lse.shape))
    assert all((g == 0).all() for g in grads)  # no real key: D_row = 0, so dsink = 0 too


@pytest.mark.parametrize("causal,C", [(True, 2), (False, 2)])
def test_sink_backward_vs_finite_differences(causal, C):
    rng = np.random.default_rng(23)
    B, S, H, Hk = 1, 5, 2, 1
    q, k, v = rand_qkv(rng, B, S, S, H, Hk, 3, Dv=2)
    # column j masks rows [LTS, LTE) (causal) or [LTS, S) and [0, UTE): every head keeps rows that see keys
    lts = rng.integers(S // 2, S + 1, size=(B, H, S))
    second = np.minimum(lts + 1, S) if causal else rng.integers(0, 2, size=(B, H, S))
    sri = np.stack([lts, second], -1).astype(np.int32)
    sink = rng.standard_normal(H)
    dout = rng.standard_normal((B, S, H, 2))
    kw = dict(startend_row_indices=sri, causal=causal, softmax_scale=0.8)
    with np.errstate(all="raise"):
        dq, dk, dv, dsink = R.attention_backward(q, k, v, dout, learnable_sink=sink, **kw)
    arrays = [q.copy(), k.copy(), v.copy(), sink.copy()]

    def loss():
        out, _ = R.attention_forward(*arrays[:3], learnable_sink=arrays[3], **kw)
        return float((out * dout).sum())

    eps = 1e-6
    for a, got in zip(arrays, (dq, dk, dv, dsink)):
        assert got.shape == a.shape
        want = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + eps
            lp = loss()
            a[idx] = old - eps
            want[idx] = (lp - loss()) / (2 * eps)
            a[idx] = old
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    assert np.abs(dsink).min() > 1e-3  # the sink's gradient is exercised, not trivially 0


def test_sink_bad_shape():
    rng = np.random.default_rng(24)
    q, k, v = rand_qkv(rng, 1, 4, 4, 2, 2, 3)
    with pytest.raises(ValueError, match="learnable_sink"):
        R.attention_forward(q, k, v, learnable_sink=np.zeros(3))
    with pytest.raises(ValueError, match="learnable_sink"):
        R.attention_forward(q, k, v, learnable_sink=np.zeros((1, 2)))


def test_backward_given_out_takes_its_d_row():
    """``out=``: D_row = sum(dout * out) of the given out. The exact out gives the default's gradients;
    an out off by e changes dS by -P * (dout . e) per row: dv stays, dq and dk move by exactly that."""
    rng = np.random.default_rng(31)
    q, k, v = rand_qkv(rng, 1, 7, 7, 2, 1, 3, Dv=2)
    sri = M.causal_document([3, 4]).startend_row_indices
    dout = rng.standard_normal((1, 7, 2, 2))
    kw = dict(startend_row_indices=sri, causal=True, softmax_scale=0.6)
    out, _ = R.attention_forward(q, k, v, **kw)
    exact = R.attention_backward(q, k, v, dout, **kw)
    for got, want in zip(R.attention_backward(q, k, v, dout, out=out, **kw), exact):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    e = 1e-3 * rng.standard_normal(out.shape)
    dq, dk, dv = R.attention_backward(q, k, v, dout, out=out + e, **kw)
    np.testing.assert_array_equal(dv, exact[2])
    vis = R.dense_visibility(1, 7, 7, 2, 1, sri, causal=True)
    s = np.where(vis, np.einsum("bqhd,bkhd->bhqk", q, np.repeat(k, 2, 2)) * 0.6, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dd = np.einsum("bqhd,bqhd->bhq", dout, e)[..., None]  # D_row's change
    want_dq = exact[0] - 0.6 * np.einsum("bhqk,bkhd->bqhd", p * dd, np.repeat(k, 2, 2))
    want_dk = exact[1] - 0.6 * np.einsum("bhqk,bqhd->bkd", p * dd, q)[:, :, None]  # summed over the group
    np.testing.assert_allclose(dq, want_dq, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dk, want_dk, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match="out must have shape"):
        R.attention_backward(q, k, v, dout, out=out[:, :6], **kw)
