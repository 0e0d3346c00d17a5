"""Bad input gets a clear ValueError/TypeError naming the argument, before any kernel runs."""

import numpy as np
import paddle
import pytest

import paddle_fm3 as fm


def qkv(b=1, s=16, h=2, hk=2, d=8, sk=None, dtype="float32"):
    sk = s if sk is None else sk
    return (paddle.randn([b, s, h, d]).astype(dtype), paddle.randn([b, sk, hk, d]).astype(dtype),
            paddle.randn([b, sk, hk, d]).astype(dtype))


def sri(b=1, hm=1, sk=16, c=1, value=16, dtype="int32"):
    return paddle.full([b, hm, sk, c], value, dtype=dtype)


CASES = [
    # (description, kwargs builder, exception, message fragment)
    ("dtype mismatch", lambda: dict(args=(qkv()[0], *qkv(dtype="float16")[1:])), TypeError, "share one dtype"),
    ("integer q", lambda: dict(args=(paddle.ones([1, 16, 2, 8], "int32"), *qkv()[1:])), TypeError, "query"),
    ("numpy q", lambda: dict(args=(np.zeros((1, 16, 2, 8), np.float32), *qkv()[1:])), TypeError, "query"),
    ("indices not int32", lambda: dict(args=(*qkv(), sri(dtype="int64")), causal=True), TypeError,
     "startend_row_indices must be int32"),
    ("rank of q", lambda: dict(args=(paddle.randn([16, 2, 8]), *qkv()[1:])), ValueError, "query must be 4-D"),
    ("rank of indices", lambda: dict(args=(*qkv(), paddle.full([1, 16, 1], 3, "int32")), causal=True),
     ValueError, "startend_row_indices must be 4-D"),
    ("batch mismatch", lambda: dict(args=(qkv(b=2)[0], *qkv(b=1)[1:])), ValueError, "batch size"),
    ("indices batch", lambda: dict(args=(*qkv(b=2), sri(b=3)), causal=True), ValueError,
     "startend_row_indices must have shape [batch=2, mask_heads, seqlen_k=16, C], got [3, 1, 16, 1]"),
    ("indices seqlen", lambda: dict(args=(*qkv(), sri(sk=15)), causal=True), ValueError,
     "startend_row_indices must have shape [batch=1, mask_heads, seqlen_k=16, C], got [1, 1, 15, 1]"),
    ("k/v seqlen", lambda: dict(args=(qkv()[0], qkv()[1], qkv(sk=12)[2])), ValueError, "seqlen"),
    ("head_dim mismatch", lambda: dict(args=(qkv(d=8)[0], *qkv(d=16)[1:])), ValueError,
     "key head_dim 16 != query head_dim 8"),
    # value's head dim may differ only for the MLA pair (192, 128)
    ("value head_dim 96 under 128", lambda: dict(args=(*qkv(d=128)[:2], qkv(d=96)[2])), ValueError,
     "value head_dim 96 != query/key head_dim 128: only (head_dim, head_dim_v) = (192, 128)"),
    ("MLA pair reversed", lambda: dict(args=(*qkv(d=128)[:2], qkv(d=192)[2])), ValueError,
     "value head_dim 192 != query/key head_dim 128: only (head_dim, head_dim_v) = (192, 128)"),
    ("bad value head_dim, zero-size", lambda: dict(args=(*qkv(b=0, d=128)[:2], qkv(b=0, d=96)[2])), ValueError,
     "value head_dim 96 != query/key head_dim 128"),
    ("value head_dim 64 under 192", lambda: dict(args=(*qkv(d=192)[:2], qkv(d=64)[2])), ValueError,
     "value head_dim 64 != query/key head_dim 192"),
    ("key head_dim 128 under MLA's 192", lambda: dict(args=(qkv(d=192)[0], qkv(d=128)[1], qkv(d=128)[2])),
     ValueError, "key head_dim 128 != query head_dim 192"),
    ("H_q % H_k", lambda: dict(args=(qkv(h=3)[0], *qkv(hk=2)[1:])), ValueError, "multiple"),
    ("H_mask", lambda: dict(args=(*qkv(h=4, hk=2), sri(hm=3)), causal=True), ValueError, "mask heads"),
    ("C for causal", lambda: dict(args=(*qkv(), sri(c=4)), causal=True), ValueError, "shape[3]"),
    ("C for non-causal", lambda: dict(args=(*qkv(), sri(c=1)), causal=False), ValueError, "shape[3]"),
    ("head dim too large", lambda: dict(args=qkv(d=264)), ValueError, "head_dim"),
    ("block_mask shape", lambda: dict(args=(*qkv(), sri()), causal=True,
                                      block_mask=paddle.ones([1, 1, 2, 1], "int32")), ValueError, "block_mask"),
    ("block_mask dtype", lambda: dict(args=(*qkv(), sri()), causal=True,
                                      block_mask=paddle.ones([1, 1, 1, 1], "float32")), TypeError, "block_mask"),
    ("block_mask values", lambda: dict(args=(*qkv(), sri()), causal=True,
                                       block_mask=paddle.full([1, 1, 1, 1], 2, "int32")), ValueError, "0 (masked)"),
    ("block_mask without indices", lambda: dict(args=qkv(), block_mask=paddle.ones([1, 1, 1, 1], "int32")),
     ValueError, "requires startend_row_indices"),
    ("window with indices", lambda: dict(args=(*qkv(), sri()), causal=True, window_size=4), ValueError,
     "window_size cannot be combined"),
    ("negative window", lambda: dict(args=qkv(), window_size=-2), ValueError, "window_size"),
    ("window type", lambda: dict(args=qkv(), window_size="4"), TypeError, "window_size"),
    ("softmax_scale", lambda: dict(args=qkv(), softmax_scale=-1.0), ValueError, "softmax_scale"),
    ("softmax_scale_beyond_float64", lambda: dict(args=qkv(), softmax_scale=10**400), ValueError,
     "softmax_scale"),  # once a bare OverflowError
    ("causal type", lambda: dict(args=qkv(), causal=1), TypeError, "causal"),
    ("dropout", lambda: dict(args=qkv(), dropout=0.1), NotImplementedError, "dropout"),
    ("dropout negative", lambda: dict(args=qkv(), dropout=-0.1), ValueError, "dropout must be a probability"),
    ("dropout above 1", lambda: dict(args=qkv(), dropout=1.5), ValueError, "dropout must be a probability"),
    ("dropout NaN", lambda: dict(args=qkv(), dropout=float("nan")), ValueError, "dropout must be a probability"),
    ("dropout above 1, not training", lambda: dict(args=qkv(), dropout=1.5, training=False), ValueError,
     "dropout must be a probability"),
    ("training type with dropout", lambda: dict(args=qkv(), dropout=0.1, training=0), TypeError, "training"),
    ("fixed_seed_offset shape", lambda: dict(args=qkv(), fixed_seed_offset=paddle.zeros([3], "int64")),
     ValueError, "fixed_seed_offset"),
    ("rng_name type", lambda: dict(args=qkv(), rng_name=3), TypeError, "rng_name"),
    ("key/value heads", lambda: dict(args=(qkv(hk=2)[0], qkv(hk=2)[1], qkv(hk=1)[2])), ValueError, "num_heads differ"),
    ("learnable_sink length", lambda: dict(args=qkv(), learnable_sink=paddle.zeros([3])), ValueError,
     "learnable_sink must have shape [num_heads=2] (one logit per query head), got [3]"),
    ("learnable_sink per kv head", lambda: dict(args=qkv(h=4, hk=2), learnable_sink=paddle.zeros([2])), ValueError,
     "learnable_sink must have shape [num_heads=4]"),
    ("learnable_sink 2-D", lambda: dict(args=qkv(), learnable_sink=paddle.zeros([1, 2])), ValueError,
     "learnable_sink must have shape [num_heads=2] (one logit per query head), got [1, 2]"),
    ("learnable_sink 0-D", lambda: dict(args=qkv(), learnable_sink=paddle.zeros([])), ValueError,
     "learnable_sink must have shape"),
    ("learnable_sink integer", lambda: dict(args=qkv(), learnable_sink=paddle.zeros([2], "int32")), TypeError,
     "learnable_sink must have dtype in (float32, float16, bfloat16)"),
    ("learnable_sink numpy", lambda: dict(args=qkv(), learnable_sink=np.zeros(2, np.float32)), TypeError,
     "learnable_sink must be a paddle.Tensor"),
    ("learnable_sink list", lambda: dict(args=qkv(), learnable_sink=[0.0, 0.0]), TypeError,
     "learnable_sink must be a paddle.Tensor"),
    ("learnable_sink length, zero-size", lambda: dict(args=qkv(b=0), learnable_sink=paddle.zeros([3])), ValueError,
     "learnable_sink must have shape [num_heads=2]"),
]


@pytest.mark.parametrize("desc,build,exc,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input(desc, build, exc, fragment):
    kw = build()
    args = kw.pop("args")
    with pytest.raises(exc) as info:
        fm.flashmask_attention(*args, **kw)
    assert fragment in str(info.value), str(info.value)


def test_block_classify_bad_sizes():
    with pytest.raises(ValueError, match="block_m"):
        fm.block_classify(np.zeros((1, 1, 4, 1), np.int32), causal=True, seqlen_q=4, block_m=0, block_n=2)
    with pytest.raises(TypeError, match="block_m must be an int, got float"):
        fm.block_classify(np.zeros((1, 1, 4, 1), np.int32), causal=True, seqlen_q=4, block_m=2.0, block_n=2)


def test_head_dim_rule_cpu_and_gpu():
    """The one rule (paddle_fm3._checks.check_head_dims), for CPU and GPU tensors alike: equal head
    dims (CPU: any in range; GPU: the pairs with a Hopper kernel) or a listed pair of another
    value head dim (MLA's (192, 128))."""
    from paddle_fm3 import _checks, _config

    assert (192, 128) in _config.HEAD_DIM_V_PAIRS
    for gpu in (False, True):
        _checks.check_head_dims(192, 192, 128, gpu=gpu)
        for d, dv in _config.SM90_HEAD_DIMS:
            _checks.check_head_dims(d, d, dv, gpu=gpu)
        with pytest.raises(ValueError, match=r"value head_dim 96 != query/key head_dim 128"):
            _checks.check_head_dims(128, 128, 96, gpu=gpu)
        with pytest.raises(ValueError, match=r"key head_dim 64 != query head_dim 192"):
            _checks.check_head_dims(192, 64, 128, gpu=gpu)
    _checks.check_head_dims(32, 32, 32, gpu=False)
    with pytest.raises(ValueError, match=r"\(head_dim, head_dim_v\) = \(32, 32\) has no GPU kernel"):
        _checks.check_head_dims(32, 32, 32, gpu=True)


def test_raw_op_checks_value_shape_in_c():
    """Under the Python checks (e.g. a static graph with unknown dims) the op's own checks stop a
    v or out of the wrong shape before the kernel reads it."""
    from paddle_fm3._ops import ops, sink_input

    q, k = paddle.randn([1, 16, 2, 192]), paddle.randn([1, 16, 2, 192])
    sri = paddle.full([1, 1, 16, 1], 16, "int32")
    for v in (paddle.randn([1, 15, 2, 128]), paddle.randn([1, 16, 1, 128])):
        with pytest.raises(ValueError, match=r"v must have shape \[1, 16, 2, 128\] \[batch, seqlen_k, num_heads_k, "
                                             r"head_dim_v\]"):
            ops.fm3_flashmask_attention(q, k, v, sri, None, sink_input(None), 0.1, True, False)
    with pytest.raises(ValueError, match=r"k must have shape \[1, 16, 2, 192\] \[batch, seqlen_k, num_heads_k, "
                                         r"head_dim\]"):
        ops.fm3_flashmask_attention(q, paddle.randn([1, 16, 2, 128]), paddle.randn([1, 16, 2, 128]), sri, None,
                                    sink_input(None), 0.1, True, False)
    v = paddle.randn([1, 16, 2, 128])
    out, lse = ops.fm3_flashmask_attention(q, k, v, sri, None, sink_input(None), 0.1, True, False)
    assert list(out.shape) == [1, 16, 2, 128]
    with pytest.raises(ValueError, match=r"out_grad must have shape \[1, 16, 2, 128\] \[batch, seqlen_q, num_heads, "
                                         r"head_dim_v\], got \[1, 16, 2, 192\]"):
        ops.fm3_flashmask_attention_bwd(q, k, v, sri, None, sink_input(None), out, lse, paddle.randn([1, 16, 2, 192]),
                                        0.1, True, False)


def test_raw_op_checks_learnable_sink_in_c():
    """Under the Python checks the op's own check stops a sink of the wrong shape or dtype before the
    kernel reads it; an empty sink is none."""
    from paddle_fm3._ops import ops, sink_input

    q = paddle.randn([1, 16, 2, 8])
    sri = paddle.full([1, 1, 16, 1], 16, "int32")
    shape = r"learnable_sink must have shape \[num_heads=2\] \(one logit per query head\), got "
    for sink, exc, match in ((paddle.zeros([3]), ValueError, shape + r"\[3\]"),
                             (paddle.zeros([2], "float64"), TypeError, "learnable_sink must be float32"),
                             (paddle.zeros([1, 2]), ValueError, shape + r"\[1, 2\]")):
        with pytest.raises(exc, match=match):
            ops.fm3_flashmask_attention(q, q, q, sri, None, sink, 0.1, True, False)
    out, lse = ops.fm3_flashmask_attention(q, q, q, sri, None, sink_input(None), 0.1, True, False)
    want, want_lse = fm.flashmask_attention(q, q, q, causal=True, softmax_scale=0.1, return_softmax_lse=True)
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    np.testing.assert_array_equal(lse.numpy(), want_lse.numpy())
