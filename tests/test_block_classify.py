"""The block classification (ops/include/fm3/mask.h, via paddle_fm3.block_classify)
against the dense mask, on random boundary vectors (hypothesis)."""

import numpy as np
import pytest
from fm3_testutil import random_startend
from hypothesis import given, settings
from hypothesis import strategies as st

import paddle_fm3 as fm
from paddle_fm3 import masks, reference

FORMS = [(True, 1), (True, 2), (False, 2), (False, 4)]


def dense_tiles(visible, block_m, block_n):
    """Per tile: (any visible, all visible) from a dense [B, H, S_q, S_k] mask."""
    b, h, sq, sk = visible.shape
    nm, nn = -(-sq // block_m), -(-sk // block_n)
    anyv = np.zeros((b, h, nm, nn), bool)
    allv = np.zeros((b, h, nm, nn), bool)
    for i in range(nm):
        for j in range(nn):
            t = visible[:, :, i * block_m:(i + 1) * block_m, j * block_n:(j + 1) * block_n]
            anyv[:, :, i, j] = t.any(axis=(2, 3))
            allv[:, :, i, j] = t.all(axis=(2, 3))
    return anyv, allv


@settings(max_examples=150, deadline=None)
@given(form=st.sampled_from(FORMS), sq=st.integers(1, 70), sk=st.integers(1, 70),
       block_m=st.sampled_from([1, 3, 8, 16, 64]), block_n=st.sampled_from([1, 5, 8, 32]),
       with_block_mask=st.booleans(), seed=st.integers(0, 2**31))
def test_classification_is_sound(form, sq, sk, block_m, block_n, with_block_mask, seed):
    causal, cols = form
    rng = np.random.default_rng(seed)
    sri = random_startend(rng, 2, 2, sq, sk, causal, cols)
    bm = rng.integers(0, 2, size=(2, 2, -(-sq // 128), -(-sk // 128))).astype(np.int32) if with_block_mask else None
    cls = fm.block_classify(sri, causal=causal, seqlen_q=sq, block_m=block_m, block_n=block_n, block_mask=bm)
    visible = reference.dense_visibility(2, sq, sk, 2, 2, sri, causal=causal, block_mask=bm)
    anyv, allv = dense_tiles(visible, block_m, block_n)
    assert cls.shape == anyv.shape
    # "Fully masked" and "unmasked" are exact claims; "partial" is always allowed.
    assert not np.any((cls == 0) & anyv), "a tile with visible elements was classified fully masked"
    assert not np.any((cls == 2) & ~allv), "a tile with masked elements was classified unmasked"


@pytest.mark.parametrize("causal,cols", FORMS)
def test_single_interval_masks_are_classified_exactly(causal, cols):
    """With one key column per block the summary is exact: every tile with nothing visible is skipped."""
    rng = np.random.default_rng(cols)
    sq = sk = 96
    sri = random_startend(rng, 1, 1, sq, sk, causal, cols)
    cls = fm.block_classify(sri, causal=causal, seqlen_q=sq, block_m=8, block_n=1)
    anyv, allv = dense_tiles(masks.to_dense(sri, causal, sq), 8, 1)
    # Exact whenever each column's masked rows form one run (the two intervals
    # touch or overlap); C=4 masks whose two runs jointly cover a tile with a
    # gap in another column may stay partial, which is allowed.
    if cols < 4:
        np.testing.assert_array_equal(cls == 0, ~anyv)


def test_causal_document_skips_cross_document_tiles():
    m = masks.causal_document([128, 256, 128])
    cls = fm.block_classify(m.startend_row_indices, causal=True, seqlen_q=512, block_m=64, block_n=64)
    anyv, allv = dense_tiles(m.to_dense(), 64, 64)
    np.testing.assert_array_equal(cls == 0, ~anyv)  # block-aligned documents: exact
    np.testing.assert_array_equal(cls == 2, allv)
