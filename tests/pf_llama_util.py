"""A tiny PaddleFormers Llama on packed documents, trained one step with a chosen attention backend.

Used by tests/test_paddleformers.py in-process and in fresh interpreters (import orders)."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

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
