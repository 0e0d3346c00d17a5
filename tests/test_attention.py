"""paddle_fm3.flashmask_attention (CPU kernels) against the float64 reference:
every mask family x dtype x GQA x odd lengths, forward and all three gradients (four with a
learnable sink)."""

import numpy as np
import paddle
import pytest
from fm3_testutil import RTOL, check_dsink, random_startend, rel_err

import paddle_fm3 as fm
from paddle_fm3 import masks, reference


def _to64(t):
    return t.astype("float32").numpy().astype(np.float64)


def run_case(rng, q_shape, kv_shape, dtype, sri, causal, softmax_scale=None, block_mask=None, window_size=None,
             check_grads=True, head_dim_v=None, learnable_sink=None, sink_dtype=None):
    """Run our op forward+backward and the reference on the same (dtype-rounded) inputs, the backward's
    including the ``out`` it is given (the reference's ``out=``: D_row from it, as the kernel takes it;
    out itself is checked against the exact forward first). ``head_dim_v``:
    value's head dim when it differs from kv_shape's (MLA). ``learnable_sink``: the sink logits
    ``[num_heads]``, given as a tensor of ``sink_dtype`` (default: the inputs' dtype); its gradient is
    checked too."""
    v_shape = tuple(kv_shape[:3]) + (kv_shape[3] if head_dim_v is None else head_dim_v,)
    q = paddle.to_tensor(rng.standard_normal(q_shape).astype(np.float32)).astype(dtype)
    k = paddle.to_tensor(rng.standard_normal(kv_shape).astype(np.float32)).astype(dtype)
    v = paddle.to_tensor(rng.standard_normal(v_shape).astype(np.float32)).astype(dtype)
    sink = None
    if learnable_sink is not None:
        sink = paddle.to_tensor(np.asarray(learnable_sink, np.float32)).astype(sink_dtype or dtype)
    leaves = [t for t in (q, k, v, sink) if t is not None]
    for t in leaves:
        t.stop_gradient = False
    sri_t = None if sri is None else paddle.to_tensor(sri)
    bm_t = None if block_mask is None else paddle.to_tensor(block_mask)
    out, lse = fm.flashmask_attention(q, k, v, sri_t, causal=causal, softmax_scale=softmax_scale,
                                      block_mask=bm_t, window_size=window_size, return_softmax_lse=True,
                                      learnable_sink=sink)
    ref_sri = sri
    if window_size is not None:
        w = window_size if isinstance(window_size, tuple) else (window_size, window_size)
        ref_sri = masks.window_to_startend(w, q_shape[1], kv_shape[1], q_shape[0], causal)
    kw = dict(causal=causal, softmax_scale=softmax_scale, block_mask=block_mask,
              learnable_sink=None if sink is None else _to64(sink))
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
    args = (_to64(q), _to64(k), _to64(v), _to64(dout), ref_sri)
    ref = reference.attention_backward(*args, out=_to64(out), **kw)
    assert len(ref) == len(leaves)
    for name, leaf, want in zip(("dq", "dk", "dv"), leaves, ref):
        assert leaf.grad.dtype == leaf.dtype, name
        err = rel_err(_to64(leaf.grad), want)
        assert err < tol, f"{name}: rel err {err:.3g} >= {tol}"
    if sink is not None:
        # D_row = sum(dout * out) comes from the stored out (the backward's contract, params.h), whose
        # rounding a sum over every row of a head carries: measured against the sum's condition
        assert sink.grad.dtype == sink.dtype
        sink_tol = RTOL[str(sink.dtype).replace("paddle.", "")]
        exact = reference.attention_backward(*args, **kw)[3]
        check_dsink(_to64(sink.grad), _to64(sink), lse.numpy(), _to64(out), _to64(dout), exact, max(tol, sink_tol),
                    rounding=max(RTOL["float32"], sink_tol))
        if dtype == "float32" and sink.dtype == paddle.float32:
            assert rel_err(_to64(sink.grad), exact) < tol


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


# ---- learnable sinks: a virtual key of score sink[h] and value 0 in every row's softmax ----


def _sinks(rng, h):
    """Sink logits of both signs, large enough to take a real share of each row's softmax."""
    return rng.standard_normal(h) * 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_sink_family(family, dtype):
    rng = np.random.default_rng(hash(("sink", family, dtype)) % 2**32)
    m = masks.FAMILIES[family](200, rng, batch=2)
    # GQA (4 query heads on 2 kv heads), one sink per query head; the sink in the inputs' dtype
    run_case(rng, (2, 200, 4, 32), (2, 200, 2, 32), dtype, m.startend_row_indices, m.causal,
             learnable_sink=_sinks(rng, 4))


@pytest.mark.parametrize("causal,cols", [(True, 1), (True, 2), (False, 2), (False, 4)])
@pytest.mark.parametrize("mask_heads", ["one", "q"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_sink_random_masks_gqa_mask_heads(causal, cols, mask_heads, heads):
    h, hk = heads
    hm = {"one": 1, "q": h}[mask_heads]
    rng = np.random.default_rng(11 * cols + h + 3 * hk + hm + causal)
    sri = random_startend(rng, 2, hm, 150, 150, causal, cols)
    run_case(rng, (2, 150, h, 16), (2, 150, hk, 16), "float32", sri, causal, learnable_sink=_sinks(rng, h))


@pytest.mark.parametrize("sq,sk", [(100, 260), (260, 100), (1, 129)])
@pytest.mark.parametrize("causal,cols", [(True, 2), (False, 4)])
def test_sink_seqlen_q_ne_seqlen_k(sq, sk, causal, cols):
    rng = np.random.default_rng(sq * 1000 + sk + cols + 5)
    sri = random_startend(rng, 1, 1, sq, sk, causal, cols)
    run_case(rng, (1, sq, 2, 16), (1, sk, 2, 16), "float32", sri, causal, learnable_sink=_sinks(rng, 2))


@pytest.mark.parametrize("sink_dtype", ["float16", "bfloat16"])
def test_sink_in_half_precision_with_float32_inputs(sink_dtype):
    """A float16/bfloat16 sink (PaddleFormers creates it in the default dtype) runs as float32; its
    gradient comes back in its own dtype."""
    rng = np.random.default_rng(31)
    m = masks.FAMILIES["causal_document"](150, rng)
    run_case(rng, (1, 150, 4, 16), (1, 150, 2, 16), "float32", m.startend_row_indices, True,
             learnable_sink=_sinks(rng, 4), sink_dtype=sink_dtype)


def test_sink_with_block_mask_window_softmax_scale_and_mla():
    rng = np.random.default_rng(32)
    sri = random_startend(rng, 2, 2, 300, 400, False, 4)
    bm = rng.integers(0, 2, size=(2, 2, 3, 4)).astype(np.int32)
    run_case(rng, (2, 300, 2, 32), (2, 400, 2, 32), "bfloat16", sri, False, block_mask=bm,
             learnable_sink=_sinks(rng, 2))
    run_case(rng, (2, 140, 4, 16), (2, 140, 2, 16), "float32", None, True, window_size=(5, 0), softmax_scale=0.7,
             learnable_sink=_sinks(rng, 4))
    m = masks.FAMILIES["share_question"](193, rng)
    run_case(rng, (1, 193, 4, 192), (1, 193, 2, 192), "float16", m.startend_row_indices, m.causal, head_dim_v=128,
             learnable_sink=_sinks(rng, 4))


@pytest.mark.parametrize("sink_value", [50.0, -50.0, 1000.0, -1000.0])
def test_sink_extreme_values(sink_value):
    """A sink far above every score takes nearly all of each row's softmax (out tiny, lse the sink),
    far below it takes none (out and lse those without a sink): no overflow, no NaN."""
    rng = np.random.default_rng(33)
    m = masks.FAMILIES["causal_document"](150, rng)
    sink = np.full(2, sink_value)
    sink[1] = sink_value / 2
    run_case(rng, (1, 150, 2, 16), (1, 150, 2, 16), "float32", m.startend_row_indices, True, learnable_sink=sink)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 150, 2, 16)).astype(np.float32)) for _ in range(3))
    out, lse = fm.flashmask_attention(q, k, v, m.to_paddle(), causal=True, return_softmax_lse=True,
                                      learnable_sink=paddle.to_tensor(sink.astype(np.float32)))
    plain, plain_lse = fm.flashmask_attention(q, k, v, m.to_paddle(), causal=True, return_softmax_lse=True)
    if sink_value > 0:
        assert np.abs(out.numpy()).max() < np.exp(-sink_value / 4)
        np.testing.assert_allclose(lse.numpy(), np.broadcast_to(sink[None, :, None], lse.shape), rtol=1e-6)
    else:
        np.testing.assert_array_equal(out.numpy(), plain.numpy())
        np.testing.assert_array_equal(lse.numpy(), plain_lse.numpy())


def test_sink_fully_masked_rows_give_zero_lse_sink_and_no_nan():
    rng = np.random.default_rng(34)
    b, s, h = 1, 200, 2
    sri = np.zeros((b, 1, s, 4), np.int32)  # rows [50, 120) masked for every key column
    sri[..., 0], sri[..., 1] = 50, 120
    sink_np = np.array([0.75, -1.25], np.float32)
    run_case(rng, (b, s, h, 32), (b, s, h, 32), "float32", sri, False, learnable_sink=sink_np)
    q, k, v = (paddle.to_tensor(rng.standard_normal((b, s, h, 32)).astype(np.float32)) for _ in range(3))
    sink = paddle.to_tensor(sink_np)
    for t in (q, k, v, sink):
        t.stop_gradient = False
    out, lse = fm.flashmask_attention(q, k, v, paddle.to_tensor(sri), causal=False, return_softmax_lse=True,
                                      learnable_sink=sink)
    out.sum().backward()
    for t in (out, q.grad, k.grad, v.grad, sink.grad):
        assert not np.isnan(t.numpy()).any()
    assert np.all(out.numpy()[:, 50:120] == 0) and np.all(q.grad.numpy()[:, 50:120] == 0)
    np.testing.assert_array_equal(lse.numpy()[:, :, 50:120], np.broadcast_to(sink_np[None, :, None], (b, h, 70)))
    # Everything masked: out 0, lse the sink, every gradient 0 (the sink's too: out is 0, so D_row is 0).
    sri[..., 0], sri[..., 1] = 0, s
    for t in (q, k, v, sink):
        t.clear_gradient()
    out, lse = fm.flashmask_attention(q, k, v, paddle.to_tensor(sri), causal=False, return_softmax_lse=True,
                                      learnable_sink=sink)
    out.sum().backward()
    np.testing.assert_array_equal(lse.numpy(), np.broadcast_to(sink_np[None, :, None], (b, h, s)))
    for t in (out, q.grad, k.grad, v.grad, sink.grad):
        assert np.all(t.numpy() == 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sink_two_runs_bitwise_equal(dtype):
    rng = np.random.default_rng(35)
    m = masks.FAMILIES["share_question"](700, rng, batch=2)
    q, k, v = (paddle.to_tensor(rng.standard_normal((2, 700, 4, 64)).astype(np.float32)).astype(dtype)
               for _ in range(3))
    sink = paddle.to_tensor(_sinks(rng, 4).astype(np.float32)).astype(dtype)
    results = []
    for _ in range(2):
        for t in (q, k, v, sink):
            t.stop_gradient = False
            t.clear_gradient()
        out = fm.flashmask_attention(q, k, v, m.to_paddle(), causal=m.causal, learnable_sink=sink)
        paddle.autograd.backward([out], [paddle.ones_like(out)])
        results.append([t.astype("float32").numpy() for t in (out, q.grad, k.grad, v.grad, sink.grad)])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("shape", [(0, 16, 2, 8, 16), (1, 0, 2, 8, 5), (1, 4, 2, 8, 0)])
def test_sink_zero_size(shape):
    """No kernel runs: out zeros, lse the sink on rows that exist (they see no key), the sink's
    gradient zeros in its own dtype."""
    b, sq, h, d, sk = shape
    q, k = paddle.randn([b, sq, h, d]), paddle.randn([b, sk, h, d])
    sink = paddle.to_tensor([0.5, -2.0], dtype="bfloat16")
    for t in (q, k, sink):
        t.stop_gradient = False
    out, lse = fm.flashmask_attention(q, k, k, causal=False, return_softmax_lse=True, learnable_sink=sink)
    assert out.shape == [b, sq, h, d] and lse.shape == [b, h, sq]
    np.testing.assert_array_equal(lse.numpy(), np.broadcast_to(np.array([0.5, -2.0])[None, :, None], lse.shape))
    (out.sum() + 1.0).backward()
    assert sink.grad.dtype == paddle.bfloat16 and np.all(sink.grad.astype("float32").numpy() == 0)


def test_sink_without_gradient_and_under_no_grad():
    rng = np.random.default_rng(36)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 100, 2, 16)).astype(np.float32)) for _ in range(3))
    sink = paddle.to_tensor([1.0, -1.0])  # stop_gradient: no gradient asked of it
    q.stop_gradient = False
    out = fm.flashmask_attention(q, k, v, causal=True, learnable_sink=sink)
    out.sum().backward()
    assert sink.grad is None and q.grad is not None
    sink.stop_gradient = False
    with paddle.no_grad():
        again = fm.flashmask_attention(q, k, v, causal=True, learnable_sink=sink)
    assert again.stop_gradient
    np.testing.assert_array_equal(again.numpy(), out.numpy())


def test_standalone_backward_op_with_sink():
    """_ops.attention_backward (the op fm3_flashmask_attention_bwd, for callers with their own lse)
    gives the sink's gradient next to dq, dk, dv; without a sink, None."""
    from paddle_fm3 import _ops

    rng = np.random.default_rng(37)
    m = masks.FAMILIES["causal_document"](130, rng)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 130, h, 16)).astype(np.float32)) for h in (4, 2, 2))
    sink = paddle.to_tensor(_sinks(rng, 4).astype(np.float32))
    dout = paddle.to_tensor(rng.standard_normal((1, 130, 4, 16)).astype(np.float32))
    sri = m.to_paddle()
    for s, n_ref in ((None, 3), (sink, 4)):
        out, lse = _ops.attention_forward(q, k, v, sri, None, 0.25, True, s)
        got = _ops.attention_backward(q, k, v, sri, None, out, lse, dout, 0.25, True, False, s)
        ref = reference.attention_backward(q.numpy(), k.numpy(), v.numpy(), dout.numpy(), m.startend_row_indices,
                                           causal=True, softmax_scale=0.25,
                                           learnable_sink=None if s is None else s.numpy())
        assert len(ref) == n_ref
        if s is None:
            assert got[3] is None
        for g, want in zip(got, ref):
            assert rel_err(g.numpy(), want) < RTOL["float32"]
    # Given a caller's out and lse (CP: merged over chunks of keys), the sink's gradient is theirs,
    # whatever keys this call sees.
    half = paddle.to_tensor(m.startend_row_indices[:, :, :65].copy())
    k_half, v_half = k[:, :65].contiguous(), v[:, :65].contiguous()
    chunk = _ops.attention_backward(q, k_half, v_half, half, None, out, lse, dout, 0.25, True, False, sink)
    np.testing.assert_array_equal(chunk[3].numpy(), got[3].numpy())


def test_sink_to_static_matches_dygraph():
    """Forward and gradients (the sink's included) in a static graph equal dygraph's, with and
    without a sink."""
    rng = np.random.default_rng(38)
    sri = masks.FAMILIES["causal_document"](130, rng).to_paddle()
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 130, h, 16)).astype(np.float32)) for h in (4, 2, 2))
    sink = paddle.to_tensor(_sinks(rng, 4).astype(np.float32))

    def f(q, k, v, sri, sink):
        return fm.flashmask_attention(q, k, v, sri, causal=True, learnable_sink=sink)

    def g(q, k, v, sri):
        return fm.flashmask_attention(q, k, v, sri, causal=True)

    for fn, with_sink in ((f, True), (g, False)):
        runs = []
        for run in (paddle.jit.to_static(fn, full_graph=True), fn):
            xs = [x.detach() for x in ((q, k, v, sink) if with_sink else (q, k, v))]
            for x in xs:
                x.stop_gradient = False
            out = run(*xs[:3], sri, *xs[3:])
            (out * out).sum().backward()
            runs.append([out.numpy()] + [x.grad.numpy() for x in xs])
        for got, want in zip(*runs):
            np.testing.assert_array_equal(got, want)
