"""A tiny PaddleFormers Llama on packed documents, trained one step with a chosen attention backend,
and the integration checks that tests/test_paddleformers.py runs, each in a fresh interpreter."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from fm3_testutil import RTOL as FM3_RTOL
from paddle_fm3 import masks

SEQLEN = 64
VOCAB = 97
IGNORE = -100
# Per row: packed document lengths, then a padding tail (a row without padding too).
DOCS = [[20, 25, 9], [40, 24]]
# SGD, so the step is a function of the gradients that the comparison can bound: Adam's first
# step is lr * g / (|g| + eps), whose sign on near-zero gradients is rounding noise.
LR = 0.1


def packed_batch():
    """ids, position ids, labels, startend_row_indices for DOCS.

    causal_document mask with the padding tail as one more piece whose columns are masked for
    every row from the tail on (LTS = start of the tail): padding rows see no key, and no real row
    sees a padding column. Labels: next token within a document; IGNORE across documents and on
    the padding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (len(DOCS), SEQLEN))
    labels = np.full_like(ids, IGNORE)
    positions = np.zeros_like(ids)
    pieces = []
    for r, docs in enumerate(DOCS):
        real = sum(docs)
        pieces.append(docs + ([SEQLEN - real] if real < SEQLEN else []))
        off = 0
        for n in pieces[-1]:
            positions[r, off:off + n] = np.arange(n)
            if off < real:
                labels[r, off:off + n - 1] = ids[r, off + 1:off + n]
            off += n
    sri = masks.causal_document(pieces, SEQLEN, batch=len(DOCS)).startend_row_indices.copy()
    for r, docs in enumerate(DOCS):
        sri[r, :, sum(docs):, 0] = sum(docs)
    return ids, positions, labels, sri


def tiny_llama(seed: int = 0):
    """2 layers, 4 query heads over 2 key/value heads (GQA); fuse_rms_norm=False (GPU-only kernel)."""
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQLEN,
                      fuse_rms_norm=False)
    paddle.seed(seed)
    return LlamaForCausalLM(cfg)


def train_step(model, attn_implementation: str) -> dict:
    """Forward, backward and one SGD step on packed_batch(), then a second forward.

    Returns numpy arrays: logits (step 0), loss, grads and parameters after the step (by name),
    and the loss of the second forward. The loss is the mean over labelled positions."""
    ids, positions, labels, sri = packed_batch()
    model.config._attn_implementation = attn_implementation
    opt = paddle.optimizer.SGD(LR, parameters=model.parameters())
    batch = dict(input_ids=paddle.to_tensor(ids), position_ids=paddle.to_tensor(positions),
                 attn_mask_startend_row_indices=paddle.to_tensor(sri))
    flat_labels = paddle.to_tensor(labels.reshape(-1))

    def loss_of(logits):
        per_token = F.cross_entropy(logits.reshape([-1, VOCAB]), flat_labels, ignore_index=IGNORE,
                                    reduction="none")
        return per_token.sum() / (flat_labels != IGNORE).astype("float32").sum()

    logits = model(**batch, return_dict=True).logits
    loss = loss_of(logits)
    loss.backward()
    grads = {p.name: p.grad.numpy().copy() for p in model.parameters()}
    opt.step()
    opt.clear_grad()
    with paddle.no_grad():
        loss_after = float(loss_of(model(**batch, return_dict=True).logits))
    return {"logits": logits.numpy(), "loss": float(loss), "grads": grads,
            "params": {p.name: p.numpy().copy() for p in model.parameters()}, "loss_after": loss_after}


def real_rows():
    """bool [B, S]: positions that are not padding."""
    mask = np.zeros((len(DOCS), SEQLEN), dtype=bool)
    for r, docs in enumerate(DOCS):
        mask[r, :sum(docs)] = True
    return mask


# ---------------------------------------------------------------------------
# Checks, each run in a fresh interpreter by tests/test_paddleformers.py (importing PaddleFormers
# patches Paddle globally: in the pytest process it made later paddle.jit.to_static tests hang)
# ---------------------------------------------------------------------------

RTOL = FM3_RTOL["float32"]  # max |err| / max |ref|


def scaled_err(a, ref) -> float:
    return float(np.abs(a - ref).max()) / max(float(np.abs(ref).max()), 1e-30)


def assert_matches_eager(fm3_run: dict, eager_run: dict) -> None:
    rows = real_rows()
    assert scaled_err(fm3_run["logits"][rows], eager_run["logits"][rows]) <= RTOL
    assert abs(fm3_run["loss"] - eager_run["loss"]) <= RTOL * abs(eager_run["loss"])
    assert abs(fm3_run["loss_after"] - eager_run["loss_after"]) <= RTOL * abs(eager_run["loss_after"])
    assert fm3_run["loss_after"] < fm3_run["loss"]  # the step trained something
    assert len(fm3_run["grads"]) == len(eager_run["grads"]) > 0
    for key in ("grads", "params"):
        for (name_f, a), (name_e, ref) in zip(fm3_run[key].items(), eager_run[key].items()):
            assert scaled_err(a, ref) <= RTOL, (key, name_f, name_e, scaled_err(a, ref))


def check_train_step(order: str, name: str) -> None:
    """install() with PaddleFormers imported after ("install-first") or before; then the tiny Llama
    with attention `name` matches the eager backend through forward, backward and one SGD step."""
    import paddle_fm3.integrations.paddleformers as fm3_pf

    if order == "install-first":
        fm3_pf.install()
        import paddleformers.transformers  # noqa: F401
    else:
        import paddleformers.transformers  # noqa: F401

        fm3_pf.install()
    eager, fm3 = tiny_llama(), tiny_llama()
    fm3.set_state_dict(eager.state_dict())
    assert_matches_eager(train_step(fm3, name), train_step(eager, "eager"))


def check_install_uninstall() -> None:
    import paddle_fm3.integrations.paddleformers as fm3_pf
    from paddleformers.nn.attention.flashmask_attention import flashmask_attention_forward
    from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is flashmask_attention_forward
    assert "fm3" not in AttentionInterface._global_mapping
    fm3_pf.install()
    fm3_pf.install()
    assert fm3_pf.is_installed()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is fm3_pf.flashmask_attention_forward
    assert ALL_ATTENTION_FUNCTIONS["fm3"] is fm3_pf.attention_forward
    assert AttentionInterface()["flashmask"] is fm3_pf.flashmask_attention_forward  # any instance: class-wide
    fm3_pf.uninstall()
    fm3_pf.uninstall()
    assert not fm3_pf.is_installed()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is flashmask_attention_forward
    assert "fm3" not in AttentionInterface._global_mapping
    # after uninstall a model asking for "flashmask" gets PaddleFormers' own again, which has no
    # CPU kernel in Paddle: it fails where ours ran
    model = tiny_llama()
    try:
        train_step(model, "flashmask")
    except Exception:  # noqa: BLE001 - Paddle's error type for a missing CPU kernel varies
        pass
    else:
        raise AssertionError("PaddleFormers' own flashmask ran on CPU after uninstall: was ours still used?")


def check_fully_masked_rows() -> None:
    """Our convention for a query row that sees no key (output 0) against eager's (every key)."""
    import paddle_fm3.integrations.paddleformers as fm3_pf
    from paddleformers.nn.attention.eager_attention import eager_attention_forward

    rng = np.random.default_rng(1)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 2, 8, 16)).astype("float32")) for _ in range(3))
    sri = paddle.to_tensor(np.full((1, 1, 8, 1), 5, dtype=np.int32))  # rows 5.. see no key
    module = paddle.nn.Layer()
    ours, _ = fm3_pf.attention_forward(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=0.25)
    eager, weights = eager_attention_forward(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=0.25)
    ours, eager, weights = ours.numpy().reshape(8, 2, 16), eager.numpy().reshape(8, 2, 16), weights.numpy()
    assert scaled_err(ours[:5], eager[:5]) <= RTOL
    assert (ours[5:] == 0).all()
    # eager adds the same large negative bias to every score of such a row, which cancels in the
    # softmax: the row attends to every key, future ones included
    assert (weights[0, :, 5:] > 1e-4).all() and np.allclose(weights[0, :, 5:].sum(-1), 1, atol=1e-5)
    assert np.isfinite(eager[5:]).all() and (np.abs(eager[5:]) > 0).any()


def check_argument_errors() -> None:
    import paddle_fm3.integrations.paddleformers as fm3_pf

    q = paddle.zeros([1, 2, 8, 16])
    for kwargs, error, fragment in ((dict(attention_mask=paddle.zeros([1, 1, 8, 8])), ValueError,
                                     "attn_mask_startend_row_indices"),
                                    (dict(dropout=0.1), NotImplementedError, "dropout")):
        try:
            fm3_pf.attention_forward(paddle.nn.Layer(), q, q, q, **kwargs)
        except error as e:
            assert fragment in str(e), e
        else:
            raise AssertionError(f"no {error.__name__} for {kwargs}")
    evaluating = paddle.nn.Layer()
    evaluating.eval()  # as flashmask_attention with training=False: dropout accepted, not applied
    out, _ = fm3_pf.attention_forward(evaluating, q, q, q, dropout=0.1)
    np.testing.assert_array_equal(out.numpy(), fm3_pf.attention_forward(evaluating, q, q, q)[0].numpy())


def check_patch_paddle_order(order: str) -> None:
    """patch_paddle() reaches a module that imports the function after it, not one that did before."""
    import paddle_fm3

    if order == "patch-first":
        paddle_fm3.patch_paddle()
    import paddleformers.nn.attention.flashmask_attention as pf_flashmask

    if order == "patch-after":
        paddle_fm3.patch_paddle()
    reaches = pf_flashmask.flashmask_attention is paddle_fm3.flashmask_attention
    assert reaches == (order == "patch-first"), (order, reaches)


def check_scaling_by_name() -> None:
    """"fm3" applies ``scaling``; "flashmask" keeps the contract of PaddleFormers' own flashmask
    function, which does not (Paddle's default head_dim ** -0.5; DeepSeek-V3 folds its scale into the
    query for that name). Both against PaddleFormers' eager attention with the scale each applies."""
    import paddle_fm3.integrations.paddleformers as fm3_pf
    from paddleformers.nn.attention.eager_attention import eager_attention_forward

    rng = np.random.default_rng(3)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 2, 8, 16)).astype("float32")) for _ in range(3))
    sri = paddle.to_tensor(np.full((1, 1, 8, 1), 8, dtype=np.int32))  # causal, nothing else masked
    module = paddle.nn.Layer()
    for fn, applied in ((fm3_pf.attention_forward, 0.7), (fm3_pf.flashmask_attention_forward, 16 ** -0.5)):
        ours, _ = fn(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=0.7)
        want, _ = eager_attention_forward(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=applied)
        assert scaled_err(ours.numpy(), want.numpy()) <= RTOL, fn.__name__
