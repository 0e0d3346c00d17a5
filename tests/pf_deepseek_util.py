"""A tiny PaddleFormers DeepSeek-V3 (MLA: q/k head dim 192 = 128 nope + 64 rope, v head dim 128) on
the packed documents of pf_llama_util, trained one step with a chosen attention backend; the check
that tests/test_paddleformers.py runs in a fresh interpreter.

PaddleFormers 1.2.0's deepseek_v3/modeling.py cannot be imported without ``paddlefleet_ops``
(moe_layer -> token_dispatcher -> fused_a2a: ``from paddlefleet_ops import is_deep_ep_available``,
unconditionally), a GPU package that is not on PyPI. Where it is missing, ``allow_import_without_deep_ep``
puts in its place a module that answers ``is_deep_ep_available() -> False``, what fused_a2a asks of
a machine without DeepEP, and raises on anything else: DeepEP dispatches tokens of expert-parallel
MoE layers, and the dense tiny model has none (it is never called)."""

from __future__ import annotations

import importlib.util
import sys
import types

import paddle

import pf_llama_util as L

HEAD_DIM, HEAD_DIM_V = 192, 128  # qk_nope_head_dim + qk_rope_head_dim, v_head_dim


def allow_import_without_deep_ep() -> None:
    if "paddlefleet_ops" in sys.modules or importlib.util.find_spec("paddlefleet_ops") is not None:
        return
    stub = types.ModuleType("paddlefleet_ops")
    stub.is_deep_ep_available = lambda: False

    def missing(name):
        raise AttributeError(f"paddlefleet_ops.{name}: paddlefleet_ops is not installed (only "
                             "is_deep_ep_available() -> False is answered for the tests)")

    stub.__getattr__ = missing
    sys.modules["paddlefleet_ops"] = stub


def tiny_deepseek_v3(seed: int = 0):
    """2 dense layers (no MoE: n_routed_experts None), 2 heads, q and kv LoRA ranks 32 / 16, YaRN rope
    whose mscale makes the softmax scale differ from head_dim ** -0.5 (as DeepSeek-V3's config does);
    fuse_rms_norm=False (GPU-only kernel)."""
    allow_import_without_deep_ep()
    from paddleformers.transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=L.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=HEAD_DIM_V, n_routed_experts=None, first_k_dense_replace=2, max_position_embeddings=L.SEQLEN,
        seq_length=L.SEQLEN, use_cache=False, fuse_rms_norm=False,
        # PaddleFormers 1.2.0 reads rope_parameters["factor"] unconditionally: a rope scaling is required
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L.SEQLEN // 4,
                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
    paddle.seed(seed)
    return DeepseekV3ForCausalLM(cfg)


def check_train_step(name: str) -> None:
    """With attention ``name`` through paddle_fm3, the tiny DeepSeek-V3 matches the eager backend through
    forward, backward and one SGD step; records the head dims that reached paddle_fm3: under "fm3" the
    MLA pair as it is (192 / 128), under "flashmask" value zero-padded by PaddleFormers to 192."""
    import paddle_fm3.integrations.paddleformers as fm3_pf

    fm3_pf.install()
    seen = []
    real = fm3_pf.flashmask_attention

    def recording(query, key, value, *args, **kwargs):  # the real function; only the shapes are noted
        seen.append((query.shape[-1], key.shape[-1], value.shape[-1]))
        return real(query, key, value, *args, **kwargs)

    fm3_pf.flashmask_attention = recording
    try:
        eager, fm3 = tiny_deepseek_v3(), tiny_deepseek_v3()
        fm3.set_state_dict(eager.state_dict())
        assert fm3.model.layers[0].self_attn.softmax_scale != HEAD_DIM ** -0.5  # the scale path is exercised
        L.assert_matches_eager(L.train_step(fm3, name), L.train_step(eager, "eager"))
    finally:
        fm3_pf.flashmask_attention = real
    want = (HEAD_DIM, HEAD_DIM, HEAD_DIM_V if name == "fm3" else HEAD_DIM)
    assert seen and set(seen) == {want}, (name, set(seen))

