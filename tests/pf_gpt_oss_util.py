"""A tiny PaddleFormers gpt-oss (learnable attention sinks, one logit per query head; sliding-window
and full layers alternating; GQA) on the packed documents of pf_llama_util, trained one step with a
chosen attention backend; the check that tests/test_paddleformers.py runs in a fresh interpreter."""

from __future__ import annotations

import numpy as np
import paddle

import pf_llama_util as L

SLIDING_WINDOW = 8  # shorter than every document of pf_llama_util.DOCS: the window masks keys


def tiny_gpt_oss(seed: int = 0):
    """2 layers (sliding_attention, full_attention), 4 query / 2 kv heads of head dim 16, 2 experts
    (1 per token), YaRN rope as gpt-oss's config has it; fuse_rms_norm=False (GPU-only kernel)."""
    from paddleformers.transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(
        vocab_size=L.VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
        sliding_window=SLIDING_WINDOW, max_position_embeddings=L.SEQLEN, use_cache=False, fuse_rms_norm=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": L.SEQLEN // 4})
    paddle.seed(seed)
    model = GptOssForCausalLM(cfg)
    # Sinks of both signs and sizes, so that they move the softmax visibly (the default init is U(-1, 1)).
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.sinks.set_value(paddle.to_tensor(np.array([2.0, -1.0, 0.5, 3.0], np.float32) - i))
    return model


def check_train_step(name: str) -> None:
    """With attention ``name`` through paddle_fm3, the tiny gpt-oss matches PaddleFormers' eager
    attention (the sink appended as a key column of the dense softmax) through forward, backward
    (the sinks' gradients included) and one SGD step; every layer's call reached paddle_fm3 with its
    sink, and the sliding-window layer's mask is narrower than the full layer's."""
    import paddle_fm3.integrations.paddleformers as fm3_pf

    fm3_pf.install()
    seen = []
    real = fm3_pf.flashmask_attention

    def recording(query, key, value, startend_row_indices=None, **kwargs):  # the real function; noted
        seen.append((kwargs.get("learnable_sink") is not None, startend_row_indices.numpy().copy()))
        return real(query, key, value, startend_row_indices, **kwargs)

    fm3_pf.flashmask_attention = recording
    try:
        eager, fm3 = tiny_gpt_oss(), tiny_gpt_oss()
        fm3.set_state_dict(eager.state_dict())
        fm3_run, eager_run = L.train_step(fm3, name), L.train_step(eager, "eager")
    finally:
        fm3_pf.flashmask_attention = real
    L.assert_matches_eager(fm3_run, eager_run)
    sink_grads = [g for n, g in fm3_run["grads"].items() if n in {p.name for p in _sinks(fm3)}]
    assert len(sink_grads) == 2 and all(np.abs(g).max() > 1e-4 for g in sink_grads), sink_grads
    # 2 layers x 2 forwards (train_step's, and the one after its SGD step)
    assert len(seen) == 4 and all(has_sink for has_sink, _ in seen), [s for s, _ in seen]
    sliding, full = seen[0][1], seen[1][1]
    assert (sliding[..., 0] <= full[..., 0]).all() and (sliding[..., 0] < full[..., 0]).any()


def _sinks(model):
    return [layer.self_attn.sinks for layer in model.model.layers]
