"""paddle_fm3.flashmask_attention (CPU kernels) against the float64 reference:
every mask family x dtype x GQA x odd lengths, forward and all three gradients."""

import numpy as np
import paddle
import pytest
from fm3_testutil import RTOL, random_startend, rel_err

import paddle_fm3 as fm
from paddle_fm3 import masks, reference


def _to64(t):
    return t.astype("float32").numpy().astype(np.float64)


def run_case(rng, q_shape, kv_shape, dtype, sri, causal, softmax_scale=None, block_mask=None, window_size=None,
             check_grads=True, head_dim_v=None):
    """Run our op forward+backward and the reference on the same (dtype-rounded) inputs. ``head_dim_v``:
    value's head dim when it differs from kv_shape's (MLA)."""
    v_shape = tuple(kv_shape[:3]) + (kv_shape[3] if head_dim_v is None else head_dim_v,)
    q = paddle.to_tensor(rng.standard_normal(q_shape).astype(np.float32)).astype(dtype)
    k = paddle.to_tensor(rng.standard_normal(kv_shape).astype(np.float32)).astype(dtype)
    v = paddle.to_tensor(rng.standard_normal(v_shape).astype(np.float32)).astype(dtype)
    for t in (q, k, v):
        t.stop_gradient = False
    sri_t = None if sri is None else paddle.to_tensor(sri)
    bm_t = None if block_mask is None else paddle.to_tensor(block_mask)
    out, lse = fm.flashmask_attention(q, k, v, sri_t, causal=causal, softmax_scale=softmax_scale,
                                      block_mask=bm_t, window_size=window_size, return_softmax_lse=True)
    ref_sri = sri
    if window_size is not None:
        w = window_size if isinstance(window_size, tuple) else (window_size, window_size)
        ref_sri = masks.window_to_startend(w, q_shape[1], kv_shape[1], q_shape[0], causal)
    kw = dict(causal=causal, softmax_scale=softmax_scale, block_mask=block_mask)
    ref_out, ref_lse = reference.attention_forward(_to64(q), _to64(k), _to64(v), ref_sri, **kw)
    tol = RTOL[dtype]
    assert list(out.shape) == list(q_shape[:3]) + [v_shape[3]]
    assert rel_err(_to64(out), ref_out) < tol
    lse_np = lse.numpy().astype(np.float64)
    assert np.array_equal(np.isneginf(lse_np), np.isneginf(ref_lse)), "fully masked rows differ"
    finite = np.isfinite(ref_lse)
    assert np.abs(lse_np[finite] - ref_lse[finite]).max(initial=0) < 1e-4
    if not check_grads:
        return
    dout = paddle.to_tensor(rng.standard_normal(out.shape).astype(np.float32)).astype(dtype)
    paddle.autograd.backward([out], [dout])
    ref = reference.attention_backward(_to64(q), _to64(k), _to64(v), _to64(dout), ref_sri, **kw)
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref):
        err = rel_err(_to64(got), want)
        assert err < tol, f"{name}: rel err {err:.3g} >= {tol}"


FAMILIES = sorted(masks.FAMILIES)
DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("seqlen", [1, 127, 129, 1000])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_family(family, dtype, seqlen):
    rng = np.random.default_rng(hash((family, dtype, seqlen)) % 2**32)
    m = masks.FAMILIES[family](seqlen, rng)
    # GQA (4 query heads on 2 kv heads) with the mask broadcast over heads.
    run_case(rng, (1, seqlen, 4, 32), (1, seqlen, 2, 32), dtype, m.startend_row_indices, m.causal)


@pytest.mark.parametrize("causal,cols", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("mask_heads", ["one", "kv", "q"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_random_masks_gqa_mask_heads(causal, cols, mask_heads, heads):
    h, hk = heads
    hm = {"one": 1, "kv": hk, "q": h}[mask_heads]
    rng = np.random.default_rng(7 * cols + h + 3 * hk + hm)
    b, s = 2, 150
    sri = random_startend(rng, b, hm, s, s, causal, cols)
    run_case(rng, (b, s, h, 16), (b, s, hk, 16), "float32", sri, causal)


@pytest.mark.parametrize("sq,sk", [(100, 260), (260, 100), (1, 129), (129, 1), (64, 64)])
@pytest.mark.parametrize("causal,cols", [(True, 1), (True, 2), (False, 2), (False, 4)])
def test_seqlen_q_ne_seqlen_k(sq, sk, causal, cols):
    rng = np.random.default_rng(sq * 1000 + sk + cols)
    sri = random_startend(rng, 1, 1, sq, sk, causal, cols)
    run_case(rng, (1, sq, 2, 16), (1, sk, 2, 16), "float32", sri, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,sk", [(200, 200), (100, 300)])
def test_no_mask_is_plain_attention(causal, sq, sk):
    rng = np.random.default_rng(sq + sk + causal)
    run_case(rng, (2, sq, 2, 16), (2, sk, 2, 16), "float32", None, causal)


@pytest.mark.parametrize("head_dim", [1, 8, 64, 100, 128, 256])
def test_head_dims(head_dim):
    rng = np.random.default_rng(head_dim)
    m = masks.FAMILIES["causal_document"](200, rng)
    run_case(rng, (1, 200, 2, head_dim), (1, 200, 1, head_dim), "float32", m.startend_row_indices, True)


# MLA (DeepSeek-V3): q, k 192 columns, v and out 128. GQA, lengths off the 64-row tiles.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["causal_document", "share_question", "sliding_window", "random_eviction"])
def test_value_head_dim_differs_mla(family, dtype):
    rng = np.random.default_rng(hash(("mla", family, dtype)) % 2**32)
    m = masks.FAMILIES[family](193, rng, batch=2)
    run_case(rng, (2, 193, 4, 192), (2, 193, 2, 192), dtype, m.startend_row_indices, m.causal, head_dim_v=128)


@pytest.mark.parametrize("sq,sk", [(70, 200), (200, 70)])
@pytest.mark.parametrize("causal,cols", [(True, 2), (False, 4)])
def test_value_head_dim_differs_rectangular_block_mask_and_no_mask(sq, sk, causal, cols):
    rng = np.random.default_rng(sq * 7 + sk + cols)
    sri = random_startend(rng, 1, 2, sq, sk, causal, cols)
    bm = rng.integers(0, 2, size=(1, 2, (sq + 127) // 128, (sk + 127) // 128)).astype(np.int32)
    run_case(rng, (1, sq, 2, 192), (1, sk, 2, 192), "float32", sri, causal, block_mask=bm, head_dim_v=128)
    run_case(rng, (1, sq, 2, 192), (1, sk, 1, 192), "float32", None, causal, softmax_scale=0.3, head_dim_v=128)


@pytest.mark.parametrize("scale", [0.01, 0.5, 2.0])
def test_softmax_scale(scale):
    rng = np.random.default_rng(int(scale * 100))
    m = masks.FAMILIES["document"](150, rng)
    run_case(rng, (1, 150, 2, 32), (1, 150, 2, 32), "float32", m.startend_row_indices, False, softmax_scale=scale)


@pytest.mark.parametrize("window", [0, 5, (3, 17), (40, 0)])
@pytest.mark.parametrize("causal", [True, False])
def test_window_size(window, causal):
    rng = np.random.default_rng(hash((str(window), causal)) % 2**32)
    run_case(rng, (2, 140, 2, 16), (2, 140, 2, 16), "float32", None, causal, window_size=window)


@pytest.mark.parametrize("causal,cols", [(True, 1), (False, 2), (False, 4)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_block_mask(causal, cols, dtype):
    rng = np.random.default_rng(cols + causal)
    b, hm, sq, sk = 2, 2, 300, 400
    sri = random_startend(rng, b, hm, sq, sk, causal, cols)
    bm = rng.integers(0, 2, size=(b, hm, 3, 4)).astype(np.int32)
    run_case(rng, (b, sq, 2, 32), (b, sk, 2, 32), dtype, sri, causal, block_mask=bm)


def test_fully_masked_rows_give_zero_and_no_nan():
    rng = np.random.default_rng(0)
    b, s, h = 1, 200, 2
    # Rows [50, 120) are masked for every key column (C=4: LTS=50, LTE=120, empty upper interval).
    sri = np.zeros((b, 1, s, 4), np.int32)
    sri[..., 0], sri[..., 1] = 50, 120
    q = paddle.to_tensor(rng.standard_normal((b, s, h, 32)).astype(np.float32))
    k = paddle.to_tensor(rng.standard_normal((b, s, h, 32)).astype(np.float32))
    v = paddle.to_tensor(rng.standard_normal((b, s, h, 32)).astype(np.float32))
    for t in (q, k, v):
        t.stop_gradient = False
    out, lse = fm.flashmask_attention(q, k, v, paddle.to_tensor(sri), causal=False, return_softmax_lse=True)
    out.sum().backward()
    o, l, dq = out.numpy(), lse.numpy(), q.grad.numpy()
    assert not np.isnan(o).any() and not np.isnan(dq).any()
    assert not np.isnan(k.grad.numpy()).any() and not np.isnan(v.grad.numpy()).any()
    assert np.all(o[:, 50:120] == 0) and np.all(dq[:, 50:120] == 0)
    assert np.all(np.isneginf(l[:, :, 50:120])) and np.all(np.isfinite(l[:, :, :50]))
    assert np.abs(o[:, :50]).max() > 0
    # Everything masked: all zeros, zero gradients everywhere.
    sri[..., 0], sri[..., 1] = 0, s
    q.clear_gradient(), k.clear_gradient(), v.clear_gradient()
    out = fm.flashmask_attention(q, k, v, paddle.to_tensor(sri), causal=False)
    out.sum().backward()
    for t in (out, q.grad, k.grad, v.grad):
        assert np.all(t.numpy() == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_runs_bitwise_equal(dtype):
    rng = np.random.default_rng(3)
    m = masks.FAMILIES["share_question"](700, rng, batch=2)
    q, k, v = (paddle.to_tensor(rng.standard_normal((2, 700, 4, 64)).astype(np.float32)).astype(dtype)
               for _ in range(3))
    results = []
    for _ in range(2):
        for t in (q, k, v):
            t.stop_gradient = False
            t.clear_gradient()
        out = fm.flashmask_attention(q, k, v, m.to_paddle(), causal=m.causal)
        paddle.autograd.backward([out], [paddle.ones_like(out)])
        results.append([t.astype("float32").numpy() for t in (out, q.grad, k.grad, v.grad)])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_empty_batch_and_zero_length():
    q = paddle.zeros([0, 16, 2, 8])
    out = fm.flashmask_attention(q, q, q, causal=True)
    assert out.shape == [0, 16, 2, 8]
    q = paddle.randn([1, 0, 2, 8])
    k = paddle.randn([1, 5, 2, 8])
    out, lse = fm.flashmask_attention(q, k, k, causal=False, return_softmax_lse=True)
    assert out.shape == [1, 0, 2, 8] and lse.shape == [1, 2, 0]


def test_to_static_matches_dygraph():
    rng = np.random.default_rng(5)
    m = masks.FAMILIES["causal_document"](130, rng)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 130, 2, 16)).astype(np.float32)) for _ in range(3))
    sri = m.to_paddle()

    def f(q, k, v, sri):
        return fm.flashmask_attention(q, k, v, sri, causal=True)

    static_f = paddle.jit.to_static(f, full_graph=True)
    np.testing.assert_array_equal(static_f(q, k, v, sri).numpy(), f(q, k, v, sri).numpy())


def test_to_static_value_head_dim_differs_mla():
    """The op's shape inference gives out [b, sq, h, head_dim_v]; forward and gradients in a static
    graph equal dygraph's."""
    rng = np.random.default_rng(6)
    sri = masks.FAMILIES["causal_document"](130, rng).to_paddle()
    q, k = (paddle.to_tensor(rng.standard_normal((1, 130, 2, 192)).astype(np.float32)) for _ in range(2))
    v = paddle.to_tensor(rng.standard_normal((1, 130, 1, 128)).astype(np.float32))
    k = k[:, :, :1]

    def f(q, k, v, sri):
        return fm.flashmask_attention(q, k, v, sri, causal=True)

    static_f = paddle.jit.to_static(f, full_graph=True)
    grads = []
    for fn in (static_f, f):
        xs = [x.detach() for x in (q, k, v)]
        for x in xs:
            x.stop_gradient = False
        out = fn(*xs, sri)
        assert list(out.shape) == [1, 130, 2, 128]
        (out * out).sum().backward()
        grads.append([out.numpy()] + [x.grad.numpy() for x in xs])
    for got, want in zip(*grads):
        np.testing.assert_array_equal(got, want)
