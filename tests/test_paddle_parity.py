"""Drop-in parity with paddle.nn.functional.flashmask_attention (Paddle 3.3), from its documented
behaviour: every int32 mask value is accepted with the meaning Paddle's kernels give it (they
compare query rows against the raw values: above seqlen_q reads as seqlen_q, negative as 0, an
interval whose start is past its end is empty) in every path; zero-size inputs give zeros without
a kernel; and the calling conventions (return_softmax_lse, return_seed_offset, fixed_seed_offset,
rng_name, training=False, window_size forms, block_mask, softmax_scale, head dims only the CPU
path serves). Checked against the float64 reference and against a dense mask built here from
Paddle's elementwise rule, independently of paddle_fm3.masks."""

import pathlib
import shutil
import subprocess

import numpy as np
import paddle
import pytest
from test_attention import run_case

import paddle_fm3 as fm
import paddle_fm3.distributed as fm3dist
from paddle_fm3 import masks
from paddle_fm3._ops import ops

FORMS = [(True, 1), (True, 2), (False, 2), (False, 4)]


def paddle_rule_visible(raw, causal, sq):
    """Dense visibility [B, H, S_q, S_k] from raw values by Paddle's elementwise rule."""
    b, h, sk, c = raw.shape
    rows = np.arange(sq)[None, None, :, None]
    v = [raw[:, :, None, :, i].astype(np.int64) for i in range(c)]
    if causal:
        masked = (rows >= v[0]) & (rows < v[1]) if c == 2 else rows >= v[0]
        masked = masked | (np.arange(sk)[None, None, None, :] > rows + (sk - sq))
    elif c == 2:
        masked = (rows >= v[0]) | (rows < v[1])
    else:
        masked = ((rows >= v[0]) & (rows < v[1])) | ((rows >= v[2]) & (rows < v[3]))
    return ~masked


def raw_values(rng, shape, sq):
    """Unordered values in [-3, sq + 3]: below 0, above seqlen_q, inverted intervals."""
    vals = rng.integers(-3, sq + 4, size=shape).astype(np.int32)
    vals.flat[0], vals.flat[-1] = sq + 1, -1  # Paddle's generators emit seqlen_q + 1
    return vals


# ---- mask values ----


@pytest.mark.parametrize("causal,cols", FORMS)
def test_to_dense_follows_paddles_elementwise_rule(causal, cols):
    rng = np.random.default_rng(cols + 10 * causal)
    for sq, sk in ((16, 16), (13, 21), (21, 13)):
        raw = raw_values(rng, (2, 2, sk, cols), sq)
        np.testing.assert_array_equal(masks.to_dense(raw, causal, sq), paddle_rule_visible(raw, causal, sq))
        assert masks.density(raw, causal, sq) == pytest.approx(paddle_rule_visible(raw, causal, sq).mean())


@pytest.mark.parametrize("causal,cols", FORMS)
@pytest.mark.parametrize("sq,sk", [(37, 37), (29, 45), (45, 29)])
def test_out_of_range_values_forward_and_gradients(causal, cols, sq, sk):
    """Our op on raw values = the float64 reference (forward, lse, three gradients), and = our op
    on the values clamped to [0, seqlen_q], bit for bit."""
    rng = np.random.default_rng(sq * 7 + sk + cols)
    raw = raw_values(rng, (2, 2, sk, cols), sq)
    run_case(rng, (2, sq, 4, 16), (2, sk, 2, 16), "float32", raw, causal)
    q, k, v = (paddle.to_tensor(rng.standard_normal(s).astype(np.float32))
               for s in ((2, sq, 4, 16), (2, sk, 2, 16), (2, sk, 2, 16)))
    a = fm.flashmask_attention(q, k, v, paddle.to_tensor(raw), causal=causal).numpy()
    b = fm.flashmask_attention(q, k, v, paddle.to_tensor(np.clip(raw, 0, sq)), causal=causal).numpy()
    np.testing.assert_array_equal(a, b)


def test_document_end_plus_one_as_paddles_generators_emit():
    """A causal document mask whose last document ends at seqlen_q + 1 (as in Paddle's tests)."""
    rng = np.random.default_rng(5)
    sq = 64
    sri = masks.causal_document([20, 30, 14]).startend_row_indices.copy()
    sri[sri == sq] = sq + 1
    run_case(rng, (1, sq, 2, 32), (1, sq, 2, 32), "bfloat16", sri, True)


@pytest.mark.parametrize("causal,cols", FORMS)
def test_block_classify_sound_on_raw_values(causal, cols):
    """block_classify (Python clamp) and the C op fed the raw values (fm3::load_column clamp) agree,
    and are sound against Paddle's rule."""
    rng = np.random.default_rng(40 + cols)
    sq, sk, bm_, bn = 50, 70, 8, 16
    raw = raw_values(rng, (2, 2, sk, cols), sq)
    cls = fm.block_classify(raw, causal=causal, seqlen_q=sq, block_m=bm_, block_n=bn)
    cls_c = ops.fm3_block_classify(paddle.to_tensor(raw), None, sq, bm_, bn, causal).numpy()
    np.testing.assert_array_equal(cls, cls_c)
    vis = paddle_rule_visible(raw, causal, sq)
    for i in range(cls.shape[2]):
        for j in range(cls.shape[3]):
            t = vis[:, :, i * bm_:(i + 1) * bm_, j * bn:(j + 1) * bn]
            assert not np.any((cls[:, :, i, j] == 0) & t.any(axis=(2, 3)))
            assert not np.any((cls[:, :, i, j] == 2) & ~t.all(axis=(2, 3)))


@pytest.mark.parametrize("causal,cols", FORMS)
def test_cp_localization_and_workload_on_raw_values(causal, cols):
    rng = np.random.default_rng(60 + cols)
    s, seg = 64, 16
    raw = raw_values(rng, (1, 2, s, cols), s)
    local = fm3dist.localize(raw, causal, [0, 2], seg)
    rows = np.r_[0:seg, 2 * seg:3 * seg]
    np.testing.assert_array_equal(masks.to_dense(local, False, 2 * seg),
                                  paddle_rule_visible(raw, causal, s)[:, :, rows, :])
    # The CP workload: the C op fed raw values equals the planner's (clamped) summary.
    from paddle_fm3.distributed.plan import segment_summary
    weights, needed = segment_summary(raw, causal, seg, seg)
    w_c, n_c = ops.fm3_segment_workload(paddle.to_tensor(raw), seg, seg, causal)
    np.testing.assert_array_equal(weights, w_c.numpy())
    np.testing.assert_array_equal(needed, n_c.numpy())
    dense = paddle_rule_visible(raw, causal, s).reshape(1, 2, s // seg, seg, s // seg, seg)
    assert np.all(needed >= dense.any(axis=(0, 1, 3, 5)))  # never prunes a visible pair


LOAD_COLUMN_PROGRAM = r"""
#include <cstdio>
#include <random>
#include "fm3/mask.h"
int main() {
  std::mt19937 rng(7);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  long checked = 0, bad = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int sq = uni(1, 200), sk = uni(1, 200), off = sk - sq, form = uni(0, 3);
    const bool causal = form < 2;
    const int c = form == 0 ? 1 : form == 3 ? 4 : 2;
    for (int j = 0; j < sk; ++j) {
      int32_t col[4];
      for (int k = 0; k < c; ++k)  // anything int32: extremes, negatives, past seqlen_q
        col[k] = uni(0, 9) == 0 ? (uni(0, 1) ? INT32_MAX : INT32_MIN) : uni(-5, sq + 5);
      const fm3::ColumnBounds cb = fm3::load_column(col, j, c, causal, sq, off);
      for (int r = 0; r < sq; ++r) {
        bool masked;  // Paddle's rule on the raw values
        if (causal) masked = (r >= col[0] && (c == 1 || r < col[1])) || j > r + off;
        else if (c == 2) masked = r >= col[0] || r < col[1];
        else masked = (r >= col[0] && r < col[1]) || (r >= col[2] && r < col[3]);
        const bool vis = fm3::visible(cb, r, j, causal, off, nullptr, 0);
        const bool bit = (fm3::visible_bits(cb, r & ~31) >> (r & 31)) & 1u;
        bad += (vis == masked) + (bit != vis);
        ++checked;
      }
    }
  }
  std::printf("%ld %ld\n", checked, bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_load_column_clamps_any_int32_to_paddles_meaning(tmp_path):
    """The one read of a mask column in C (used by the CPU, Hopper and DLPack kernels, the block
    summary, block_classify and the CP workload) against Paddle's rule on raw int32 values."""
    include = pathlib.Path(__file__).resolve().parent.parent / "ops" / "include"
    src, exe = tmp_path / "load_column.cc", tmp_path / "load_column"
    src.write_text(LOAD_COLUMN_PROGRAM)
    subprocess.run(["g++", "-std=c++17", "-O1", "-fsanitize=undefined", "-fno-sanitize-recover",
                    f"-I{include}", str(src), "-o", str(exe)], check=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    checked, bad = map(int, res.stdout.split())
    assert checked > 100_000 and bad == 0, (checked, bad)


def test_no_host_copy_of_the_mask_per_call(monkeypatch):
    """The API reads no mask value on the host (for a GPU tensor that would be a synchronizing
    device-to-host copy on every call): fail any host read of startend_row_indices."""
    rng = np.random.default_rng(3)
    q = paddle.to_tensor(rng.standard_normal((1, 32, 2, 16)).astype(np.float32))
    sri = paddle.to_tensor(masks.causal_document([10, 22]).startend_row_indices)
    expected = fm.flashmask_attention(q, q, q, sri, causal=True).numpy()

    def no_host_read(self, *a, **kw):
        raise AssertionError("host read of a tensor during flashmask_attention")

    for name in ("numpy", "tolist", "item", "__bool__", "__array__", "__int__"):
        monkeypatch.setattr(paddle.Tensor, name, no_host_read, raising=False)
    out = fm.flashmask_attention(q, q, q, sri, causal=True)
    monkeypatch.undo()
    np.testing.assert_array_equal(out.numpy(), expected)


# ---- zero-size inputs ----

ZERO_SIZE = [  # (q shape, k shape, v shape): Paddle returns outputs without a kernel
    ((2, 8, 0, 16), (2, 8, 2, 16), (2, 8, 2, 16)),  # query with no heads: empty output
    ((2, 8, 4, 16), (2, 8, 0, 16), (2, 8, 4, 16)),  # key with no heads: zeros of q's shape
    ((2, 8, 4, 16), (2, 8, 0, 16), (2, 8, 0, 16)),
    ((2, 0, 4, 16), (2, 8, 2, 16), (2, 8, 2, 16)),  # no query rows
    ((2, 8, 4, 16), (2, 0, 2, 16), (2, 0, 2, 16)),  # no keys: zeros
    ((0, 8, 4, 16), (0, 8, 2, 16), (0, 8, 2, 16)),  # no batch
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks,vs", ZERO_SIZE)
def test_zero_size_inputs(qs, ks, vs, causal, dtype):
    rng = np.random.default_rng(1)
    q, k, v = (paddle.to_tensor(rng.standard_normal(s).astype(np.float32)).astype(dtype) for s in (qs, ks, vs))
    for t in (q, k, v):
        t.stop_gradient = False
    out, lse = fm.flashmask_attention(q, k, v, causal=causal, return_softmax_lse=True)
    assert list(out.shape) == [qs[0], qs[1], qs[2], vs[3]] and out.dtype == q.dtype
    assert not out.astype("float32").numpy().any()
    assert list(lse.shape) == [qs[0], qs[2], qs[1]] and np.isneginf(lse.numpy()).all()
    (out.astype("float32") * 3.0).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and list(t.grad.shape) == list(t.shape)
        assert not t.grad.astype("float32").numpy().any()


def test_zero_size_with_a_mask_and_window():
    q = paddle.randn([1, 8, 4, 16])
    k = paddle.randn([1, 0, 2, 16])
    sri = paddle.zeros([1, 1, 0, 2], "int32")
    assert not fm.flashmask_attention(q, k, k, sri, causal=False).numpy().any()
    assert not fm.flashmask_attention(q, k, k, window_size=(2, 1)).numpy().any()
    with pytest.raises(ValueError, match=r"must have shape \[batch=1, mask_heads, seqlen_k=0, C\], got \[1, 1, 3, 2\]"):
        # still a genuinely inconsistent mask
        fm.flashmask_attention(q, k, k, paddle.zeros([1, 1, 3, 2], "int32"))


# Paddle's own zero-size tests (test_flashmask_zero_size.py, the XPU op test's TestFlashMaskAttentionZeroSize):
# shapes that disagree only where one side is 0 give zeros without a kernel. The output is
# [batch, seqlen_q, num_heads, head_dim_v], its batch 0 when any of q, k, v has batch 0.
PADDLE_ZERO_SIZE = [  # (q shape, k shape, v shape, output shape)
    ((1, 128, 8, 96), (1, 128, 8, 96), (1, 0, 8, 96), (1, 128, 8, 96)),  # value seqlen 0
    ((1, 128, 8, 96), (1, 128, 8, 0), (1, 128, 8, 96), (1, 128, 8, 96)),  # key head dim 0
    ((1, 128, 8, 96), (1, 128, 8, 96), (1, 128, 8, 0), (1, 128, 8, 0)),  # value head dim 0
    ((1, 128, 8, 96), (1, 128, 8, 96), (0, 128, 8, 96), (0, 128, 8, 96)),  # value batch 0
    ((1, 16, 8, 96), (1, 0, 8, 96), (1, 3, 8, 96), (1, 16, 8, 96)),  # key seqlen 0, value's 3
    ((1, 16, 8, 0), (1, 16, 8, 96), (1, 16, 8, 96), (1, 16, 8, 96)),  # query head dim 0
]


@pytest.mark.parametrize("qs,ks,vs,outs", PADDLE_ZERO_SIZE)
def test_zero_size_shapes_paddle_accepts(qs, ks, vs, outs):
    """As Paddle's tests call it (float16, a causal mask of ones over key's seqlen): zeros of
    Paddle's output shape, the lse -inf, and zero gradients of every input's shape."""
    rng = np.random.default_rng(4)
    q, k, v = (paddle.to_tensor(rng.standard_normal(s).astype(np.float16)) for s in (qs, ks, vs))
    for x in (q, k, v):
        x.stop_gradient = False
    sri = paddle.ones([ks[0], 1, ks[1], 1], dtype="int32")
    out, lse = fm.flashmask_attention(q, k, v, sri, causal=True, return_softmax_lse=True)
    assert list(out.shape) == list(outs) and out.dtype == paddle.float16
    assert not out.astype("float32").numpy().any()
    assert list(lse.shape) == [outs[0], qs[2], qs[1]] and np.isneginf(lse.numpy()).all()
    (out.astype("float32") * 3.0).sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and list(x.grad.shape) == list(x.shape)
        assert not x.grad.astype("float32").numpy().any()


@pytest.mark.parametrize("qs,ks,vs,match", [
    ((2, 8, 4, 16), (1, 0, 2, 16), (1, 0, 2, 16), "batch size"),
    ((2, 8, 4, 16), (2, 0, 2, 8), (2, 0, 2, 8), "head_dim"),
    ((2, 8, 3, 16), (2, 0, 2, 16), (2, 0, 2, 16), "multiple"),
])
def test_zero_size_inconsistent_shapes_still_fail(qs, ks, vs, match):
    with pytest.raises(ValueError, match=match):
        fm.flashmask_attention(paddle.zeros(qs), paddle.zeros(ks), paddle.zeros(vs))


# ---- calling conventions ----


def test_return_conventions():
    rng = np.random.default_rng(2)
    q = paddle.to_tensor(rng.standard_normal((2, 24, 2, 16)).astype(np.float32))
    base = fm.flashmask_attention(q, q, q, causal=True)
    assert isinstance(base, paddle.Tensor)
    out, lse = fm.flashmask_attention(q, q, q, causal=True, return_softmax_lse=True)
    assert lse.dtype == paddle.float32 and list(lse.shape) == [2, 2, 24] and lse.stop_gradient
    out2, seed_offset = fm.flashmask_attention(q, q, q, causal=True, return_seed_offset=True)
    assert seed_offset.dtype == paddle.int64 and list(seed_offset.shape) == [2]
    assert seed_offset.place.is_cpu_place() and seed_offset.numpy().tolist() == [0, 0]
    fixed = paddle.to_tensor([11, 7], dtype="int64")
    out3, lse3, so3 = fm.flashmask_attention(q, q, q, causal=True, return_softmax_lse=True,
                                             return_seed_offset=True, fixed_seed_offset=fixed, rng_name="local_seed")
    assert so3.numpy().tolist() == [11, 7]
    out4 = fm.flashmask_attention(q, q, q, causal=True, training=False)
    out5 = fm.flashmask_attention(q, q, q, causal=True, dropout=0.1, training=False)  # no dropout at eval
    for o in (out, out2, out3, out4, out5):
        np.testing.assert_array_equal(o.numpy(), base.numpy())
    np.testing.assert_array_equal(lse3.numpy(), lse.numpy())


def paddle_window_startend(window_size, s, batch, causal):
    """Paddle's documented window conversion (square: seqlen_q == seqlen_k == s)."""
    w = (window_size, window_size) if isinstance(window_size, int) else tuple(window_size)
    j = np.arange(s)
    if causal:
        vals = np.minimum(j + w[0] + 1, s)[:, None]
    else:
        vals = np.stack([np.clip(j + w[0] + 1, 0, s), np.clip(j - w[1], 0, s)], axis=-1)
    return np.broadcast_to(vals[None, None], (batch, 1) + vals.shape).astype(np.int32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window_size", [3, (5, 2), [0, 4], (40, 40)])
def test_window_size_forms(window_size, causal):
    rng = np.random.default_rng(8)
    s = 33
    q, k, v = (paddle.to_tensor(rng.standard_normal((2, s, 2, 16)).astype(np.float32)) for _ in range(3))
    got = fm.flashmask_attention(q, k, v, window_size=window_size, causal=causal).numpy()
    sri = paddle.to_tensor(paddle_window_startend(window_size, s, 2, causal))
    want = fm.flashmask_attention(q, k, v, sri, causal=causal).numpy()
    np.testing.assert_array_equal(got, want)
    w = window_size if isinstance(window_size, int) else tuple(window_size)  # run_case reads tuples
    run_case(rng, (2, s, 2, 16), (2, s, 2, 16), "float32", None, causal, window_size=w)


@pytest.mark.parametrize("head_dim", [80, 96, 32])
def test_head_dims_only_the_cpu_path_serves(head_dim):
    rng = np.random.default_rng(head_dim)
    sri = masks.causal_document([50, 80]).startend_row_indices
    run_case(rng, (1, 130, 4, head_dim), (1, 130, 2, head_dim), "bfloat16", sri, True)


def test_block_mask_and_softmax_scale_as_paddle_uses_them():
    """Paddle's block_mask needs head dim 128 and a flashmask; a softmax_scale is honoured."""
    rng = np.random.default_rng(9)
    s = 300
    sri = masks.causal_document([100, 200]).startend_row_indices
    bm = rng.integers(0, 2, size=(1, 1, 3, 3)).astype(np.int32)
    bm[0, 0, np.arange(3), np.arange(3)] = 1
    run_case(rng, (1, s, 2, 128), (1, s, 2, 128), "float16", sri, True, softmax_scale=0.05, block_mask=bm)

