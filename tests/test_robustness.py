"""Regressions from adversarial testing: inputs that once crashed, misbehaved or were silently wrong."""

import multiprocessing

import numpy as np
import paddle
import pytest
from paddle.static import InputSpec

import paddle_fm3 as fm3
from paddle_fm3 import distributed as fm3dist
from paddle_fm3 import masks


def qkv(grad=True):
    ts = [paddle.randn([1, 16, 2, 8]) for _ in range(3)]
    for t in ts:
        t.stop_gradient = not grad
    return ts


def causal_attention(q, k, v):
    return fm3.flashmask_attention(q, k, v, causal=True)


def _attention_sum(seed):
    paddle.seed(seed)
    q = paddle.randn([1, 256, 2, 64])
    return float(fm3.flashmask_attention(q, q, q, causal=True).sum())


def test_forked_child_runs_the_cpu_kernels_after_its_parent_did():
    """A fork()ed worker (multiprocessing's 'fork', data-loader workers) that runs the op after its
    parent did gets the parent's result; it used to wait forever in GCC's OpenMP thread pool, which
    does not survive fork() (ops/cpu/cpu_threads.h)."""
    want = _attention_sum(0)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_attention_sum, (0,)).get(timeout=120)
    assert got == want


def test_lse_carries_no_gradient_and_lse_only_backward_does_not_crash():
    q, k, v = qkv()
    out, lse = fm3.flashmask_attention(q, k, v, causal=True, return_softmax_lse=True)
    assert lse.stop_gradient  # no silent half-gradient through the lse
    (out.sum() + lse.sum()).backward()
    g = q.grad.numpy().copy()
    q.clear_gradient()
    fm3.flashmask_attention(q, k, v, causal=True).sum().backward()
    np.testing.assert_array_equal(g, q.grad.numpy())


def test_to_static_first_call_and_dynamic_dims():
    q, k, v = qkv(grad=False)
    want = causal_attention(q, k, v).numpy()
    np.testing.assert_array_equal(paddle.jit.to_static(causal_attention)(q, k, v).numpy(), want)
    spec = [InputSpec([None, None, 2, 8], "float32")] * 3
    dyn = paddle.jit.to_static(causal_attention, input_spec=spec, full_graph=True)
    np.testing.assert_array_equal(dyn(q, k, v).numpy(), want)


def test_static_graph_reads_unchecked_indices_with_the_interval_meaning():
    """Values are never checked (any int32 has Paddle's meaning); a static graph reads -5 like 0 (rows >= LTS)."""
    q, k, v = qkv(grad=False)

    def f(q, k, v, sri):
        return fm3.flashmask_attention(q, k, v, sri, causal=True)

    spec = [InputSpec([1, 16, 2, 8], "float32")] * 3 + [InputSpec([1, 1, 16, 1], "int32")]
    sf = paddle.jit.to_static(f, input_spec=spec, full_graph=True)
    got = sf(q, k, v, paddle.full([1, 1, 16, 1], -5, "int32")).numpy()
    np.testing.assert_array_equal(got, f(q, k, v, paddle.full([1, 1, 16, 1], 0, "int32")).numpy())
    assert np.all(got == 0)  # every row masked


def test_static_graph_checks_cpu_block_mask_values_at_run_time():
    """The dynamic check's rule holds in a static graph too: a CPU block_mask value other than 0/1 is a
    ValueError when the graph runs (it was read as "keep")."""
    q, k, v = qkv(grad=False)

    def f(q, k, v, sri, bm):
        return fm3.flashmask_attention(q, k, v, sri, causal=True, block_mask=bm)

    spec = [InputSpec([1, 16, 2, 8], "float32")] * 3 + [InputSpec([1, 1, 16, 1], "int32"),
                                                         InputSpec([1, 1, 1, 1], "int32")]
    sf = paddle.jit.to_static(f, input_spec=spec, full_graph=True)
    sri = paddle.full([1, 1, 16, 1], 16, "int32")
    np.testing.assert_array_equal(sf(q, k, v, sri, paddle.ones([1, 1, 1, 1], "int32")).numpy(),
                                  f(q, k, v, sri, paddle.ones([1, 1, 1, 1], "int32")).numpy())
    for bad in (-1, 2):
        with pytest.raises(ValueError, match=r"block_mask values must be 0 \(masked\) or 1 \(kept\)"):
            sf(q, k, v, sri, paddle.full([1, 1, 1, 1], bad, "int32"))


def test_static_graph_with_unknown_dims_checks_mask_shape_at_run_time():
    """Unknown (-1) dims hide the mask's shape from the Python checks; the op checks it when the graph
    runs (once a mask shorter than seqlen_k or of another batch was read out of bounds: a segfault)."""
    def f(q, k, v, sri):
        return fm3.flashmask_attention(q, k, v, sri, causal=True)

    spec = [InputSpec([None, None, 1, 8], "float32")] * 3 + [InputSpec([None, 1, None, 1], "int32")]
    sf = paddle.jit.to_static(f, input_spec=spec, full_graph=True)
    q = paddle.randn([1, 64, 1, 8])
    good = paddle.full([1, 1, 64, 1], 64, "int32")
    np.testing.assert_array_equal(sf(q, q, q, good).numpy(), f(q, q, q, good).numpy())
    long_kv = paddle.randn([1, 5000, 1, 8])
    with pytest.raises(ValueError, match="startend_row_indices must have shape"):
        sf(q, long_kv, long_kv, paddle.full([1, 1, 1, 1], 64, "int32"))
    q4 = paddle.randn([4, 64, 1, 8])
    with pytest.raises(ValueError, match="startend_row_indices must have shape"):
        sf(q4, q4, q4, good)


def test_raw_op_checks_shapes():
    from paddle_fm3._ops import ops, sink_input
    q = paddle.randn([1, 100, 2, 16])
    k = paddle.randn([1, 90, 2, 16])
    for sri, what in [(paddle.full([1, 1, 50, 1], 100, "int32"), "must have shape"),
                      (paddle.full([1, 5, 90, 1], 100, "int32"), "shape\\[1\\]"),
                      (paddle.full([1, 1, 90, 3], 100, "int32"), "shape\\[3\\]")]:
        with pytest.raises(ValueError, match=what):
            ops.fm3_flashmask_attention(q, k, k, sri, None, sink_input(None), 0.25, True, False)


def test_huge_window_equals_no_window():
    q, k, v = qkv(grad=False)
    got = fm3.flashmask_attention(q, k, v, window_size=(2**63 - 1, 0), causal=True)
    np.testing.assert_array_equal(got.numpy(), causal_attention(q, k, v).numpy())


@pytest.mark.parametrize("scale", [1e40, 1e300, float(np.finfo(np.float32).max), 2.4e38])
def test_softmax_scale_beyond_float32_is_rejected(scale):
    """float32 max once passed and returned NaN: the kernels scale by softmax_scale * log2(e)."""
    q, k, v = qkv(grad=False)
    with pytest.raises(ValueError, match="softmax_scale"):
        fm3.flashmask_attention(q, k, v, causal=True, softmax_scale=scale)


def test_softmax_scale_whose_scores_overflow_is_rejected():
    q, k, v = (paddle.full([1, 16, 2, 8], 4.0) for _ in range(3))  # scores 1e37 * log2(e) * 8 * 16
    with pytest.raises(ValueError, match=r"softmax_scale=1e\+37 is too large for these inputs"):
        fm3.flashmask_attention(q, k, v, causal=True, softmax_scale=1e37)
    # a large scale whose scores fit is accepted and gives finite output (a hard argmax)
    q, k, v = qkv(grad=False)
    out = fm3.flashmask_attention(q, k, v, causal=True, softmax_scale=1e30)
    assert np.isfinite(out.numpy()).all()


def test_heads_seqlen_swapped_names_the_layout():
    """A [B, H, S, D] tensor once gave 'startend_row_indices.shape[2] must equal key seqlen 2'."""
    q, k, v = (paddle.randn([1, 2, 16, 8]) for _ in range(3))  # [batch, num_heads, seqlen, head_dim]
    sri = fm3.masks.causal_document([6, 10], 16).to_paddle()
    with pytest.raises(ValueError, match=r"\[batch, seqlen, num_heads, head_dim\].*transpose\(\[0, 2, 1, 3\]\)"):
        fm3.flashmask_attention(q, k, v, sri, causal=True)
    with pytest.raises(ValueError, match=r"query must be 4-D \[batch, seqlen, num_heads, head_dim\]"):
        fm3.flashmask_attention(q[0], k, v)


def test_numpy_scalars_are_accepted():
    q, k, v = qkv(grad=False)
    a = fm3.flashmask_attention(q, k, v, causal=np.bool_(True), softmax_scale=np.float32(0.5),
                                window_size=np.int64(3))
    b = fm3.flashmask_attention(q, k, v, causal=True, softmax_scale=0.5, window_size=3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_nan_propagates_instead_of_masking_the_row():
    q, k, v = qkv(grad=False)
    qn = q.numpy()
    qn[0, 3, 0, 0] = np.nan
    out = fm3.flashmask_attention(paddle.to_tensor(qn), k, v, causal=True).numpy()
    assert np.isnan(out[0, 3, 0]).all() and not np.isnan(out[0, :3]).any()


def test_block_classify_validates_block_mask_and_values():
    sri = masks.full(2048).startend_row_indices
    with pytest.raises(ValueError, match="block_mask"):
        fm3.block_classify(sri, causal=False, seqlen_q=2048, block_m=128, block_n=128,
                           block_mask=np.zeros([1, 1, 1, 1], np.int32))
    with pytest.raises(TypeError):
        fm3.block_classify(np.zeros([1, 1, 16, 2], np.float32), causal=True, seqlen_q=16, block_m=4, block_n=4)


def test_cp_plan_argument_errors():
    sri = masks.causal(16).startend_row_indices
    with pytest.raises(TypeError, match="group"):
        fm3dist.make_cp_plan(sri, causal=True, group="world")
    with pytest.raises(ValueError, match="C must be one of"):
        fm3dist.make_cp_plan(np.zeros([1, 1, 16, 3], np.int32), causal=True)
    plan = fm3dist.make_cp_plan(sri, causal=True)
    with pytest.raises(TypeError, match="paddle.Tensor"):
        plan.dispatch(np.zeros([1, 16, 2, 8], np.float32))
    with pytest.raises(ValueError, match="axis"):
        plan.dispatch(paddle.zeros([1, 16, 2, 8]), axis=5)


def test_mask_builders_reject_sequences_beyond_int32():
    with pytest.raises(ValueError, match="int32"):
        masks.causal_document([2**31, 1])


def test_flashmask_to_paddle_does_not_wrap_or_truncate():
    with pytest.raises(ValueError, match="int32"):
        masks.FlashMask(np.full((1, 1, 8, 1), 2**32 + 3, np.int64), True).to_paddle()  # once became 3
    with pytest.raises(TypeError, match="integer"):
        masks.FlashMask(np.full((1, 1, 8, 1), 5.7), True).to_paddle()  # once became 5


def test_share_question_rejects_lengths_beyond_int32():
    with pytest.raises(ValueError, match="int32"):  # once a 2^31-element allocation (OOM kill)
        masks.share_question([(2**31, [1])])


@pytest.mark.parametrize("segments,segment_size,exc,match", [
    ([0, 1], -5, ValueError, "segment_size must be >= 1"),  # once negative local rows
    ([0, 1], 0, ValueError, "segment_size must be >= 1"),  # once all zeros
    ([0, 1], 2.5, TypeError, "segment_size must be an integer"),
    ([0, 9], 4, ValueError, "segments must be < 4"),
    ([1, 0], 4, ValueError, "strictly ascending"),
])
def test_localize_argument_errors(segments, segment_size, exc, match):
    m = masks.causal_document([6, 10])
    with pytest.raises(exc, match=match):
        fm3dist.localize(m.startend_row_indices, True, segments, segment_size)


def test_localize_validates_the_mask():
    m = masks.causal_document([6, 10])
    with pytest.raises(ValueError, match="C must be one of"):
        fm3dist.localize(m.startend_row_indices[..., [0, 0, 0]], True, [0, 1], 4)
    with pytest.raises(TypeError, match="causal must be a bool"):
        fm3dist.localize(m.startend_row_indices, 1, [0, 1], 4)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: masks.FAMILIES["document"](0, np.random.default_rng(0)), ValueError, "seqlen must be >= 1"),
    (lambda: masks.FAMILIES["document"](10, None), TypeError, "rng must be a numpy.random.Generator"),
    (lambda: masks.FAMILIES["share_question"](10, np.random.default_rng(0), batch=0), ValueError, "batch"),
    (lambda: masks.density(np.zeros((0, 1, 4, 1), np.int32), True), ValueError, "empty mask"),
    (lambda: masks.window_to_startend(np.array(3), 10), TypeError, "window_size must be an int"),
    (lambda: fm3dist.hcc_ipo(np.arange(4), 2.0), TypeError, "num_ranks must be an integer"),
    (lambda: fm3dist.hcc_ipo(np.arange(4), 2, rel_tol=float("nan")), ValueError, "rel_tol"),
])
def test_small_argument_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_window_past_the_sequence_is_the_whole_sequence():
    """Once an OverflowError at 2**63."""
    np.testing.assert_array_equal(masks.sliding_window(10, 2**63).startend_row_indices,
                                  masks.sliding_window(10, 10).startend_row_indices)
    np.testing.assert_array_equal(masks.global_sliding_window(10, 1, 2**63).startend_row_indices,
                                  masks.global_sliding_window(10, 1, 10).startend_row_indices)


@pytest.mark.timeout(60)
def test_hcc_ipo_many_ranks_is_fast():
    """One segment per rank at P = 4096 once took 41 s (the three-way step tried every pair of ranks)."""
    w = np.random.default_rng(0).integers(0, 1000, 4096)
    assert sorted(fm3dist.hcc_ipo(w, 4096).ravel().tolist()) == list(range(4096))


def test_cp_planning_rejects_empty_masks():
    """Once an OSError from the C++ op (batch 0) and 'segment_size must be <= 0' (seqlen 0)."""
    from paddle_fm3.distributed.plan import check_segment_sizes

    with pytest.raises(ValueError, match="batch and mask heads >= 1"):
        fm3dist.build_layout(np.zeros((0, 1, 256, 1), np.int32), True, 2)
    with pytest.raises(ValueError, match="seqlen must be >= 1"):
        check_segment_sizes(0, 1, 1)


def test_cp_plan_more_argument_errors():
    sri = masks.causal(16).startend_row_indices
    plan = fm3dist.make_cp_plan(sri, causal=True)
    with pytest.raises(ValueError, match="cover this plan's sequence"):  # once 'segments must have shape ...'
        plan.for_mask(masks.causal(32).startend_row_indices, causal=True)
    with pytest.raises(ValueError, match="bytes_per_token must be >= 1"):
        plan.stats(bytes_per_token=0)
    with pytest.raises(TypeError, match="plan must be a CPPlan"):  # once an AttributeError
        fm3dist.cp_flashmask_attention(*qkv(grad=False), None)
    with pytest.raises(TypeError, match="return_softmax_lse must be a bool"):
        fm3dist.cp_flashmask_attention(*qkv(grad=False), plan, return_softmax_lse=1)
    with pytest.raises(TypeError, match="masks must be a non-empty list"):  # once 'truth value ... ambiguous'
        fm3dist.make_cp_plans(np.zeros((2, 2)))
    with pytest.raises(TypeError, match=r"masks\[0\] must be a \(startend_row_indices, causal\) pair"):
        fm3dist.make_cp_plans([(sri,)])
    with pytest.raises(TypeError, match="rank must be an integer"):  # once accepted as rank 0
        fm3dist.PlanOnlyCommunicator(0.5, 4)
    with pytest.raises(ValueError, match="exact_limit must be >= 1"):  # once a ZeroDivisionError
        fm3dist.hcc_ipo(np.array([10, 10, 10, 1, 1, 1, 9, 9]), 2, exact_limit=0)
    assert fm3dist.segment_summary is not None  # listed in plan.__all__, once missing from the package


@pytest.mark.parametrize("spec_sri,kw,match", [
    ([None, None, None, 1], {}, "must be static"),  # once 'bool(Tensor) is not supported'
    (None, {"window_size": 4}, "window_size needs static"),  # once 'batch must be an integer, got Value'
])
def test_to_static_unknown_dims_that_must_be_static(spec_sri, kw, match):
    def f(q, k, v, sri=None):
        return fm3.flashmask_attention(q, k, v, sri, causal=True, **kw)

    spec = [InputSpec([None, None, 2, 8], "float32")] * 3 + ([InputSpec(spec_sri, "int32")] if spec_sri else [])
    sf = paddle.jit.to_static(f, input_spec=spec, full_graph=True)
    q = paddle.randn([1, 16, 2, 8])
    args = (q, q, q) + ((paddle.full([1, 1, 16, 1], 16, "int32"),) if spec_sri else ())
    with pytest.raises(ValueError, match=match):
        sf(*args)


def test_no_grad_records_no_backward():
    """Under paddle.no_grad() the output carries no gradient (Paddle records a backward for a custom
    op in any grad mode; the built-in ops do not, and q, k, v must not be kept alive by it)."""
    q, k, v = qkv()
    with paddle.no_grad():
        out = fm3.flashmask_attention(q, k, v, causal=True)
    assert out.stop_gradient
    assert not fm3.flashmask_attention(q, k, v, causal=True).stop_gradient  # grad mode back on


def test_second_backward_without_retain_graph_says_so():
    q, k, v = qkv()
    out = fm3.flashmask_attention(q, k, v, causal=True)
    out.sum().backward()
    with pytest.raises(Exception, match="retain_graph=True"):
        out.sum().backward()
    out = fm3.flashmask_attention(q, k, v, causal=True)
    out.sum().backward(retain_graph=True)
    out.sum().backward()  # through the graph twice, as asked


def test_nan_inputs_with_a_scale_above_one_are_not_blamed_on_the_scale():
    q, k, v = qkv(grad=False)
    q[0, 5, 0, 0] = float("nan")
    out = fm3.flashmask_attention(q, k, v, causal=True, softmax_scale=2.0).numpy()
    assert np.isnan(out[0, 5]).any()  # the NaN propagates to its row, as in Paddle


def test_cp_backend_forward_in_a_pylayer_records_no_backward():
    """The CP PyLayer runs its forward with grad off; the op inside must not record a backward either."""
    q, k, v = qkv()
    mask = fm3dist.executor.PaddleAttention().prepare_mask(np.full([1, 1, 16, 2], [16, 16], np.int32), 16)
    with paddle.no_grad():
        out, lse = fm3dist.executor.PaddleAttention().fwd(q, k, v, mask, 0.35)
    assert out.stop_gradient and lse.stop_gradient


NO_SECOND = "flashmask_attention has no second derivative"


def test_no_second_derivative_is_an_error_not_a_silent_zero():
    q, k, v = qkv()
    (g,) = paddle.grad(causal_attention(q, k, v).sum(), [q], create_graph=True)
    assert g.shape == q.shape  # taking the gradient with create_graph=True works ...
    with pytest.raises(NotImplementedError, match=NO_SECOND):  # ... differentiating it does not
        paddle.grad(g.sum(), [q])


@pytest.mark.parametrize("through", ["q", "k", "v", "sink"])
def test_gradient_penalty_is_an_error_not_a_dropped_term(through):
    """loss = out + |d out / d x|^2, the gradient-penalty pattern: backward() must not treat the
    gradient as a constant (which would give q.grad without the penalty's term)."""
    q, k, v = qkv()
    sink = paddle.to_tensor([0.3, -0.2])
    sink.stop_gradient = False
    out = fm3.flashmask_attention(q, k, v, causal=True, learnable_sink=sink)
    grads = paddle.grad(out.sum(), [q, k, v, sink], create_graph=True)
    g = grads["q k v sink".split().index(through)]
    with pytest.raises(NotImplementedError, match=NO_SECOND):
        (out.sum() + (g ** 2).sum()).backward()


@pytest.mark.parametrize("flag", [False, True])
def test_backward_follows_paddles_deterministic_flag(flag, monkeypatch):
    """What _ops.deterministic_requested() reads (FLAGS_cudnn_deterministic, the switch Paddle's own
    flash-attention backward follows; a CPU Paddle has no such flag, so it is set through the reader
    here) reaches the generated backward op as its `deterministic` attribute, the GPU kernel's dQ order."""
    from paddle_fm3 import _ops
    assert _ops.deterministic_requested() is False  # a CPU Paddle lacks the flag; a GPU one has it off by default
    monkeypatch.setattr(_ops, "deterministic_requested", lambda: flag)
    paddle.enable_static()
    try:
        prog = paddle.static.Program()
        with paddle.static.program_guard(prog):
            q, k, v = (paddle.static.data(n, [1, 16, 2, 8], "float32") for n in "qkv")
            for t in (q, k, v):
                t.stop_gradient = False
            out = fm3.flashmask_attention(q, k, v, causal=True)
            paddle.static.append_backward(out.sum())
        attrs = {op.name(): op.attrs() for op in prog.global_block().ops if "fm3_flashmask" in op.name()}
    finally:
        paddle.disable_static()
    assert sorted(attrs) == ["custom_op.fm3_flashmask_attention", "custom_op.fm3_flashmask_attention_grad"], attrs
    assert all(a["deterministic"] is flag for a in attrs.values())
