"""FlashMask mask builders and conversions (numpy only).

A FlashMask is a column-wise sparse attention mask, stored as
``startend_row_indices``: an integer array of shape ``[B, H_mask, S_k, C]``
(``int32`` when produced here), indexed by **key column** ``j``, whose values
are **query row** indices in ``[0, S_q]`` (any other int32 value is read as Paddle's kernels
read it: above ``S_q`` as ``S_q``, negative as 0; see :func:`validate_startend_row_indices`).
Its meaning is the one of
``paddle.nn.functional.flashmask_attention`` (Paddle >= 3.0 docs) and of the
FlashMask paper (Wang et al., "FlashMask: Efficient and Rich Mask Extension of
FlashAttention", arXiv:2410.01359, section 3):

======  ===  ======================  ==========================================
causal   C   vectors                 query rows masked for key column ``j``
======  ===  ======================  ==========================================
True     1   LTS                     ``row >= LTS[j]`` (plus the causal part)
True     2   LTS, LTE                ``LTS[j] <= row < LTE[j]`` (plus causal)
False    2   LTS, UTE                ``row >= LTS[j]`` or ``row < UTE[j]``
False    4   LTS, LTE, UTS, UTE      ``LTS[j] <= row < LTE[j]`` or
                                     ``UTS[j] <= row < UTE[j]``
======  ===  ======================  ==========================================

The causal part is bottom-right aligned when ``S_q != S_k`` (as in
FlashAttention >= 2.1): key ``j`` is visible to query row ``i`` only if
``j <= i + (S_k - S_q)``.

Dense masks produced here are boolean arrays of shape ``[B, H_mask, S_q, S_k]``
where ``True`` means *visible* (the query row may attend to the key column).

This module gathers the public names of the modules that hold them, by role:
:mod:`paddle_fm3.mask_semantics` (the container, validation, the normalizer mirroring
``fm3::load_column``, dense conversion, density), :mod:`paddle_fm3.mask_builders` (the family
builders, ``window_to_startend``) and :mod:`paddle_fm3.mask_samples` (``FAMILIES``: a random instance of
each family).
All import nothing but numpy at module level (the GPU test machine has no Paddle).
"""

from __future__ import annotations

from ._checks import MAX_SEQLEN
from .mask_builders import (causal, causal_blockwise, causal_document, causal_document_padded, document, full,
                            global_sliding_window, prefix_lm_causal, prefix_lm_document, qk_sparse, random_eviction,
                            share_question, sliding_window, window_to_startend)
from .mask_semantics import FlashMask, column_bounds, density, from_dense, to_dense, validate_startend_row_indices
from .mask_samples import FAMILIES

__all__ = [
    "FlashMask",
    "full",
    "causal",
    "sliding_window",
    "causal_document",
    "causal_document_padded",
    "document",
    "share_question",
    "global_sliding_window",
    "causal_blockwise",
    "prefix_lm_causal",
    "prefix_lm_document",
    "qk_sparse",
    "random_eviction",
    "window_to_startend",
    "to_dense",
    "from_dense",
    "density",
    "column_bounds",
    "validate_startend_row_indices",
    "FAMILIES",
    "MAX_SEQLEN",
]
