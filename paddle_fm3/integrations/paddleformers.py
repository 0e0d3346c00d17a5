"""Run PaddleFormers attention through paddle_fm3.

Two lines, before or after PaddleFormers is imported::

    import paddle_fm3.integrations.paddleformers as fm3_pf
    fm3_pf.install()

Afterwards every PaddleFormers model whose ``config._attn_implementation`` is ``"flashmask"``
(the SFT/DPO default) or ``"fm3"`` computes attention with ``paddle_fm3.flashmask_attention``,
which also runs on CPU tensors. PaddleFormers selects the attention function at call time by
that name in its ``AttentionInterface``; ``install`` registers ours under both names there
(the class-wide mapping, so every instance sees it), ``uninstall`` restores PaddleFormers' own.

The two names differ in the softmax scale, as PaddleFormers' models are written for them:

- ``"flashmask"`` (:func:`flashmask_attention_forward`) is a drop-in for PaddleFormers' own
  flashmask function, which ignores ``scaling`` (Paddle's default ``head_dim ** -0.5``): models
  that need another scale fold it into the query for that name. DeepSeek-V3 (MLA) does, and also
  zero-pads value from 128 to the query's 192 columns for it (and slices the output back), so
  under this name its calls arrive as 192 / 192.
- ``"fm3"`` (:func:`attention_forward`) applies ``scaling``; models take no flashmask-specific
  path for it, so DeepSeek-V3's calls arrive as they are: q, k 192, v 128, computed as MLA.

Calls with a ``sink`` (gpt-oss: one learnable logit per query head) run on paddle_fm3's learnable
sink under both names, ``scaling`` applied as PaddleFormers' own flashmask function does for them.
"""

from __future__ import annotations

import paddle

from ..api import flashmask_attention

NAMES = ("flashmask", "fm3")  # the functions registered under them: _functions()
_saved: dict = {}  # name -> PaddleFormers' function (None: the name was not registered), while installed


def _interface():
    try:
        from paddleformers.nn.attention.interface import AttentionInterface
    except ImportError as e:
        raise ImportError("paddle_fm3.integrations.paddleformers needs PaddleFormers: "
                          "pip install paddleformers") from e
    return AttentionInterface


def attention_forward(module, query, key, value, attention_mask=None, dropout: float = 0.0, sink=None,
                      scaling: float | None = None, is_causal: bool | None = None,
                      attn_mask_startend_row_indices=None, **kwargs):
    """PaddleFormers attention function (the ``AttentionInterface`` signature) on paddle_fm3;
    registered as ``"fm3"``.

    Args:
        module: the calling attention layer (``is_causal`` attribute read as in PaddleFormers).
        query: ``[batch, num_heads, seqlen_q, head_dim]``; key: ``[batch, num_kv_heads, seqlen_k,
            head_dim]``; value: ``[batch, num_kv_heads, seqlen_k, head_dim_v]`` (PaddleFormers'
            layout; ``head_dim_v`` as :func:`paddle_fm3.flashmask_attention` accepts it, e.g.
            DeepSeek-V3's 128 under 192).
        attention_mask: must be None: paddle_fm3 takes its masks as
            ``attn_mask_startend_row_indices``.
        dropout: must be 0 while ``module.training`` (no attention dropout in paddle_fm3); not
            applied otherwise (:func:`paddle_fm3.flashmask_attention`'s rule).
        sink: optional ``[num_heads]`` learnable sink logits (gpt-oss), passed to
            :func:`paddle_fm3.flashmask_attention` as ``learnable_sink`` (its gradient flows back).
        scaling: softmax scale (default ``head_dim ** -0.5``).
        is_causal: as in PaddleFormers' flashmask backend: C=1 masks are causal, C=4 not, C=2
            causal unless ``is_causal=False``.
        attn_mask_startend_row_indices: int32 ``[batch, H_mask, seqlen_k, C]`` (or
            ``[batch, H_mask, seqlen_k]`` for C=1); None = plain causal attention.

    Returns:
        ``(out [batch, seqlen_q, num_heads * head_dim_v], None)``.

    Raises:
        ValueError: a dense ``attention_mask`` without ``attn_mask_startend_row_indices``.
        NotImplementedError: ``dropout > 0`` while ``module.training``.
        TypeError / ValueError: from ``paddle_fm3.flashmask_attention``'s checks.
    """
    return _forward(module, query, key, value, attention_mask, dropout, sink, scaling, is_causal,
                    attn_mask_startend_row_indices, scale=scaling, **kwargs)


def flashmask_attention_forward(module, query, key, value, attn_mask_startend_row_indices=None,
                                dropout: float = 0.0, sink=None, scaling: float | None = None,
                                is_causal: bool | None = None, attention_mask=None, **kwargs):
    """:func:`attention_forward` with the contract of PaddleFormers' own flashmask function, which
    it replaces as ``"flashmask"`` (same signature): without ``sink``, ``scaling`` is not applied
    (Paddle's default ``head_dim ** -0.5``). DeepSeek-V3 relies on it: for this name it multiplies
    the query by ``scaling * sqrt(head_dim)`` itself and passes that factor as ``scaling``, so
    applying it too would scale the scores twice. With ``sink`` PaddleFormers' function applies
    ``scaling`` (its sink path), and so does this one. Arguments and result as there."""
    return _forward(module, query, key, value, attention_mask, dropout, sink, scaling, is_causal,
                    attn_mask_startend_row_indices, scale=None if sink is None else scaling, **kwargs)


def _forward(module, query, key, value, attention_mask, dropout, sink, scaling, is_causal,
             attn_mask_startend_row_indices, *, scale, **kwargs):
    """Both names' work; ``scale`` is the softmax scale applied (None: the default)."""
    sri = attn_mask_startend_row_indices
    if sri is None and attention_mask is not None:
        raise ValueError("paddle_fm3 takes masks as attn_mask_startend_row_indices, not a dense "
                         "attention_mask: pass attn_mask_startend_row_indices (paddle_fm3.masks builds "
                         "them; a padded batch is a causal_document mask with the padding as a document)")
    if sri is not None and sri.ndim == 3:
        sri = sri.unsqueeze(-1)
    # PaddleFormers' flashmask backend: C=1 is causal, C=4 bidirectional, otherwise causal
    # unless said otherwise.
    if sri is not None and sri.shape[-1] == 1:
        is_causal = True
    elif sri is not None and sri.shape[-1] == 4:
        is_causal = False
    elif is_causal is None and sri is None:
        is_causal = query.shape[2] > 1 and getattr(module, "is_causal", True)
    out = flashmask_attention(query.transpose([0, 2, 1, 3]), key.transpose([0, 2, 1, 3]),
                              value.transpose([0, 2, 1, 3]), sri,
                              causal=True if is_causal is None else bool(is_causal), softmax_scale=scale,
                              learnable_sink=sink, dropout=dropout or 0.0,
                              training=bool(getattr(module, "training", True)))
    return paddle.reshape(out, [0, 0, out.shape[2] * out.shape[3]]), None


def _functions() -> dict:
    return {"flashmask": flashmask_attention_forward, "fm3": attention_forward}


def install() -> None:
    """Register :func:`flashmask_attention_forward` as PaddleFormers' ``"flashmask"`` attention and
    :func:`attention_forward` as ``"fm3"``.

    Idempotent. Works whether PaddleFormers was imported before or after (it imports
    PaddleFormers' attention interface itself; models look the function up at call time).

    Raises:
        ImportError: PaddleFormers is not installed.
    """
    interface = _interface()
    mapping = interface._global_mapping  # noqa: SLF001 - what AttentionInterface.register writes
    for name, fn in _functions().items():
        if mapping.get(name) is not fn:
            _saved[name] = mapping.get(name)
            interface.register(name, fn)


def uninstall() -> None:
    """Restore PaddleFormers' own ``"flashmask"`` attention and remove ``"fm3"``. Idempotent;
    a no-op when not installed."""
    if not _saved:
        return
    mapping = _interface()._global_mapping  # noqa: SLF001
    for name, original in list(_saved.items()):
        if mapping.get(name) is _functions()[name]:
            if original is None:
                del mapping[name]
            else:
                mapping[name] = original
        del _saved[name]


def is_installed() -> bool:
    """Whether PaddleFormers' ``"flashmask"`` attention is currently paddle_fm3's."""
    return bool(_saved) and _interface()._global_mapping.get("flashmask") is flashmask_attention_forward  # noqa: SLF001
