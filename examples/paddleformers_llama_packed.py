"""One training step of a tiny PaddleFormers Llama on a packed batch, attention by paddle_fm3 (CPU).

Each row of the batch packs documents back to back and ends in padding. The mask is built from the
document lengths with ``paddle_fm3.masks.causal_document_padded``: causal attention within each
document, nothing to or from the padding, in O(seqlen) int32 instead of a dense [seqlen, seqlen]
mask. PaddleFormers reads it as ``attn_mask_startend_row_indices``, and after
``paddle_fm3.integrations.paddleformers.install()`` its "flashmask" attention runs on paddle_fm3,
which has a CPU kernel (Paddle's own flashmask_attention runs on GPUs only).

Needs paddle_fm3 installed with PaddleFormers (``pip install --no-build-isolation ".[paddleformers]"``,
or ``bash scripts/setup_env.sh``). Run from outside the repository root, or as a file:

    python examples/paddleformers_llama_packed.py
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

import paddle_fm3.integrations.paddleformers as fm3_pf
from paddle_fm3 import masks

SEQLEN = 64
VOCAB = 128
IGNORE = -100  # label of positions the loss skips: document ends and padding
PAD_ID = 0
# Per row, the lengths of the documents packed into it; the rest of the row (10 tokens in the
# first, none in the second) is padding.
DOC_LENS = [[20, 25, 9], [40, 24]]


def packed_batch(rng: np.random.Generator):
    """input_ids, position_ids, labels and attn_mask_startend_row_indices for DOC_LENS.

    The token ids are random stand-ins for tokenized documents. Positions restart at 0 in each
    document; labels are the next token within a document, IGNORE at a document's last token and
    on the padding."""
    rows = len(DOC_LENS)
    ids = np.full((rows, SEQLEN), PAD_ID, dtype=np.int64)
    positions = np.zeros((rows, SEQLEN), dtype=np.int64)
    labels = np.full((rows, SEQLEN), IGNORE, dtype=np.int64)
    for r, docs in enumerate(DOC_LENS):
        off = 0
        for n in docs:
            ids[r, off:off + n] = rng.integers(1, VOCAB, n)
            positions[r, off:off + n] = np.arange(n)
            labels[r, off:off + n - 1] = ids[r, off + 1:off + n]
            off += n
    mask = masks.causal_document_padded(DOC_LENS, SEQLEN)  # int32 [rows, 1, SEQLEN, 1], causal
    return ids, positions, labels, mask.startend_row_indices


def tiny_llama():
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,  # grouped-query attention
                         max_position_embeddings=SEQLEN,
                         fuse_rms_norm=False)  # PaddleFormers' fused RMSNorm has no CPU kernel
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "flashmask"  # PaddleFormers' name; install() routes it to paddle_fm3
    return model


def main(seed: int = 0) -> dict:
    """Build the batch and the model, take one AdamW step; returns the loss before and after it and
    the parameters before and after it (numpy arrays, by name)."""
    fm3_pf.install()  # before or after importing PaddleFormers; fm3_pf.uninstall() undoes it
    paddle.seed(seed)
    ids, positions, labels, startend_row_indices = packed_batch(np.random.default_rng(seed))
    model = tiny_llama()
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    batch = dict(input_ids=paddle.to_tensor(ids), position_ids=paddle.to_tensor(positions),
                 attn_mask_startend_row_indices=paddle.to_tensor(startend_row_indices))
    flat_labels = paddle.to_tensor(labels.reshape(-1))

    def loss_of(logits):  # mean cross-entropy over the labelled positions
        return F.cross_entropy(logits.reshape([-1, VOCAB]), flat_labels, ignore_index=IGNORE)

    before = {p.name: p.numpy().copy() for p in model.parameters()}
    loss = loss_of(model(**batch, return_dict=True).logits)
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
    with paddle.no_grad():
        loss_after = float(loss_of(model(**batch, return_dict=True).logits))
    after = {p.name: p.numpy().copy() for p in model.parameters()}
    return {"loss": float(loss), "loss_after": loss_after, "params_before": before, "params_after": after,
            "labelled": int((labels != IGNORE).sum()), "tokens": int(labels.size)}


if __name__ == "__main__":
    r = main()
    change = max(float(np.abs(r["params_after"][k] - r["params_before"][k]).max()) for k in r["params_before"])
    print(f"loss {r['loss']:.4f} over {r['labelled']} labelled of {r['tokens']} tokens; "
          f"after one AdamW step {r['loss_after']:.4f}; largest weight change {change:.2e}")
