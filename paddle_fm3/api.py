"""paddle_fm3.flashmask_attention: a drop-in for paddle.nn.functional.flashmask_attention."""

from __future__ import annotations

import numpy as np
import paddle

from . import _checks, masks
from . import _validation as V
from ._ops import attention_forward


def _unmasked(seqlen_q, seqlen_k, batch, causal, place):
    """startend_row_indices that masks nothing: causal C=1 LTS=S_q; else C=2 (S_q, 0)."""
    row = [seqlen_q] if causal else [seqlen_q, 0]
    return paddle.to_tensor(row, dtype="int32", place=place).reshape([1, 1, 1, len(row)]).expand(
        [batch, 1, seqlen_k, len(row)]).contiguous()


class _ZeroSizeAttention(paddle.autograd.PyLayer):
    """Output of a zero-size call, without a kernel (as in Paddle): no key is visible to any query
    row, so the output is zeros of ``V.zero_size_output_shape`` (empty if that has no elements),
    and the gradients of query, key, value (and the learnable sink, whose gradient
    ``-sum p_sink * sum(dout * out)`` is 0 with out 0) are zeros of their shapes."""

    @staticmethod
    def forward(ctx, query, key, value, *learnable_sink):
        # (shape, dtype, needs a gradient) per input: PyLayer wants None for stop_gradient inputs
        ctx.inputs = [(x.shape, x.dtype, not x.stop_gradient) for x in (query, key, value, *learnable_sink)]
        return paddle.zeros(V.zero_size_output_shape(query, key, value), dtype=query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(paddle.zeros(shape, dtype=dtype) if needs else None for shape, dtype, needs in ctx.inputs)


def _zero_size_result(query, key, value, learnable_sink):
    """``(out, lse)`` of a zero-size call: zeros (see ``_ZeroSizeAttention``) and the lse of rows
    that see no key: ``-inf``, or with a sink ``learnable_sink[h]``."""
    b, sq, h, _ = V.zero_size_output_shape(query, key, value)
    if learnable_sink is None:
        return _ZeroSizeAttention.apply(query, key, value), paddle.full([b, h, sq], -np.inf, dtype="float32")
    lse = learnable_sink.detach().astype("float32").reshape([1, h, 1]).expand([b, h, sq])
    return _ZeroSizeAttention.apply(query, key, value, learnable_sink), lse


def _seed_offset(fixed_seed_offset):
    """Paddle's ``seed_offset`` output: int64 ``[2]`` (seed, offset) on the CPU. Without dropout no
    random number is drawn: ``fixed_seed_offset`` when given, else ``[0, 0]``."""
    if fixed_seed_offset is not None:
        return fixed_seed_offset
    if paddle.in_dynamic_mode():
        return paddle.zeros([2], dtype="int64").cpu()
    return paddle.zeros([2], dtype="int64")


def flashmask_attention(
    query: paddle.Tensor,
    key: paddle.Tensor,
    value: paddle.Tensor,
    startend_row_indices: paddle.Tensor | None = None,
    *,
    dropout: float = 0.0,
    causal: bool = False,
    window_size: int | tuple[int, int] | None = None,
    return_softmax_lse: bool = False,
    return_seed_offset: bool = False,
    fixed_seed_offset: paddle.Tensor | None = None,
    rng_name: str = "",
    training: bool = True,
    name: str | None = None,
    softmax_scale: float | None = None,
    block_mask: paddle.Tensor | None = None,
    learnable_sink: paddle.Tensor | None = None,
) -> paddle.Tensor | list[paddle.Tensor]:
    """FlashMask attention with O(N) column-boundary masks, forward and backward.

    Same signature and meaning as ``paddle.nn.functional.flashmask_attention``
    (Paddle 3.3), but it also runs on CPU tensors (Paddle's own does not), with
    tiled kernels that skip fully masked (query tile, key block) pairs and do no
    mask work on unmasked ones. Algorithm: FlashMask (Wang et al., 2024,
    arXiv:2410.01359, §4) over FlashAttention-2's online softmax (Dao, 2023).

    Args:
        query: ``[batch, seqlen_q, num_heads, head_dim]``, float32/float16/bfloat16.
        key: ``[batch, seqlen_k, num_heads_k, head_dim]``, query's dtype and head_dim;
            ``num_heads % num_heads_k == 0`` (GQA/MQA).
        value: ``[batch, seqlen_k, num_heads_k, head_dim_v]``, same dtype. ``head_dim_v`` is
            ``head_dim``, or, as in Paddle, differs for MLA (DeepSeek-V3): ``(head_dim, head_dim_v)``
            in ``_config.HEAD_DIM_V_PAIRS``, i.e. (192, 128). Any other pair is a ValueError.
        startend_row_indices: int32 ``[batch, H_mask, seqlen_k, C]``, ``H_mask`` in
            ``{1, num_heads_k, num_heads}``; per key column the query-row bounds of
            the masked rows (see ``paddle_fm3.masks``): causal ``C`` in {1 (LTS),
            2 (LTS, LTE)}; non-causal ``C`` in {2 (LTS, UTE), 4 (LTS, LTE, UTS, UTE)}.
            Values are query rows in ``[0, seqlen_q]``; as in Paddle, any other int32 value
            is accepted (above ``seqlen_q`` reads as ``seqlen_q``, "to the end"; negative as 0)
            and an interval whose start is past its end is empty. Values are not checked,
            so no device-to-host copy is made. ``None``: plain (causal) attention.
        dropout: a probability in [0, 1). Dropout is not implemented: with ``training=True`` it
            must be 0.0 (``NotImplementedError``); with ``training=False`` it is not applied, as in
            Paddle, whatever its value.
        causal: add the causal mask, bottom-right aligned when seqlen_q != seqlen_k.
        window_size: int or ``(left, right)``: sliding-window attention, converted
            to ``startend_row_indices`` exactly as Paddle does (query ``i`` sees keys
            ``[i - left, i + right]``, ``[i - left, i]`` with ``causal``); excludes
            ``startend_row_indices``. Where seqlen_q != seqlen_k (which Paddle refuses) the
            window is aligned bottom-right, as the causal mask: ``i`` counts from
            ``seqlen_k - seqlen_q`` (``masks.window_to_startend``).
        return_softmax_lse: also return the float32 ``[batch, num_heads, seqlen_q]``
            natural-log softmax normalizer (``-inf`` on fully masked rows; with a sink it includes
            ``exp(learnable_sink[h])``, and is ``learnable_sink[h]`` on fully masked rows); it is
            returned with ``stop_gradient=True``: no gradient flows back through it.
        return_seed_offset: also return Paddle's dropout ``seed_offset``, int64 ``[2]`` on the
            CPU: ``fixed_seed_offset`` when given, else ``[0, 0]`` (no dropout, so no random
            number is drawn).
        fixed_seed_offset: optional int64 ``[2]`` tensor, dropout seed and offset (no effect
            without dropout; returned as ``seed_offset``).
        rng_name: name of the dropout generator (no effect without dropout).
        training: bool; False means no dropout (as in Paddle), so any ``dropout`` is accepted.
        name: unused, for compatibility.
        softmax_scale: scale of ``q @ k^T``; default ``head_dim ** -0.5`` (query's head dim). The float32 scores
            must not overflow: a scale above ``float32 max / log2(e)`` is a ValueError, and so
            (checked in dynamic mode, for scales above 1) is one where
            ``softmax_scale * log2(e) * head_dim * max|q| * max|k|`` passes float32's maximum.
            As in FlashAttention, the backward recomputes the probabilities from float32 scores
            and the float32 log-sum-exp. Once the scores reach ~1e5, the recomputed scores
            differ from the forward's by more than float32 can absorb, and the gradients are
            wrong; around 1e8 they are off by orders of magnitude or inf/NaN, while the
            forward output stays accurate.
        block_mask: optional int32 ``[batch, H_mask, ceil(seqlen_q/128),
            ceil(seqlen_k/128)]``, 1 = keep the 128x128 block, 0 = mask it; AND-ed
            with ``startend_row_indices`` (which it requires).
        learnable_sink: optional ``[num_heads]`` tensor, one learnable sink logit per query head
            (gpt-oss's attention sinks), in the units of the scaled scores: a virtual key of score
            ``learnable_sink[h]`` and value 0 in every row's softmax, so each row's denominator
            gains ``exp(learnable_sink[h])``. The output sums over the real keys only; a row that
            sees no key gives output 0. float32, or float16/bfloat16 (cast to float32 for the
            kernels; its gradient comes back in its own dtype). Gradient: ``-sum over batch and
            rows of exp(learnable_sink[h] - lse_row) * sum(dout_row * out_row)``. Values must be
            finite (not checked).

    Returns:
        ``out`` (``[batch, seqlen_q, num_heads, head_dim_v]``: value's head dim; query's dtype); with ``return_softmax_lse`` and/or
        ``return_seed_offset`` the list ``[out, softmax_lse, seed_offset]`` of those asked for,
        in that order (as Paddle). Fully masked query rows give 0 and zero gradients. With
        Paddle's ``FLAGS_cudnn_deterministic`` set (as for Paddle's own flash attention), the GPU
        backward adds dQ in a fixed order: bitwise repeatable, slower; the CPU kernel always is.
        Zero-size inputs (a 0 in any dim of query, key or value) run no kernel, as in Paddle:
        ``out`` is zeros ``[batch, seqlen_q, num_heads, head_dim_v]`` (batch 0 when key's or
        value's is; empty when that has no elements), the lse ``-inf``, and the gradients zeros;
        their shapes may disagree where one side is 0, as Paddle allows. Inputs
        must be finite: a NaN in q, k or v propagates to the rows it can reach (and, as
        in any dense kernel, a NaN in v reaches every row of a partially masked tile).

    Raises:
        TypeError / ValueError: bad tensors, dtypes, shapes, mask values or
            arguments (the message names the argument), before any kernel runs.
        NotImplementedError: ``dropout`` in (0, 1) with ``training=True`` (a value outside [0, 1)
            is a ValueError).
    """
    V.check_dropout(dropout, training, rng_name)
    causal = _checks.check_bool("causal", causal)
    return_softmax_lse = _checks.check_bool("return_softmax_lse", return_softmax_lse)
    return_seed_offset = _checks.check_bool("return_seed_offset", return_seed_offset)
    if fixed_seed_offset is not None:
        V.check_seed_offset(fixed_seed_offset)
    zero_size = V.check_qkv(query, key, value)
    batch, seqlen_q, num_heads, head_dim = query.shape
    seqlen_k = key.shape[1]
    scale = _checks.check_softmax_scale(softmax_scale, head_dim)
    V.check_scores_fit_float32(scale, query, key)

    if window_size is not None:
        window = V.check_window_size(window_size, startend_row_indices, query, key)
        if not zero_size:
            startend_row_indices = paddle.to_tensor(
                masks.window_to_startend(window, seqlen_q, seqlen_k, batch, causal), place=query.place)
    if startend_row_indices is not None:
        V.check_startend_row_indices(startend_row_indices, query, key, causal)
    if block_mask is not None:
        V.check_block_mask(block_mask, startend_row_indices, query, key)
    if learnable_sink is not None:
        V.check_learnable_sink(learnable_sink, num_heads)

    if zero_size:
        out, softmax_lse = _zero_size_result(query, key, value, learnable_sink)
    else:
        if startend_row_indices is None:  # nothing masked beyond the causal triangle
            startend_row_indices = _unmasked(seqlen_q, seqlen_k, batch, causal, query.place)
        sink = learnable_sink
        if sink is not None and sink.dtype != paddle.float32:
            sink = sink.astype("float32")  # the kernels' dtype; the cast takes the gradient back to the sink's
        out, softmax_lse = attention_forward(query, key, value, startend_row_indices, block_mask, scale, causal,
                                             sink)
    outputs = [out]
    if return_softmax_lse:
        softmax_lse.stop_gradient = True  # no gradient flows back through the lse (as in Paddle's op)
        outputs.append(softmax_lse)
    if return_seed_offset:
        outputs.append(_seed_offset(fixed_seed_offset))
    return outputs[0] if len(outputs) == 1 else outputs
