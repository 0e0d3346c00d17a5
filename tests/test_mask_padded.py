"""masks.causal_document_padded: packed documents followed by a padding tail (numpy only, plus one
CPU attention call), against a dense mask written out with explicit loops."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_fm3 import masks as M


def dense_expected(doc_lens, seqlen):
    """bool [S, S], True where query row i may attend key column j: causal within a document,
    nothing to or from the padding after the last document."""
    out = np.zeros((seqlen, seqlen), dtype=bool)
    start = 0
    for n in doc_lens:
        for i in range(start, start + n):
            for j in range(start, i + 1):
                out[i, j] = True
        start += n
    return out


@pytest.mark.parametrize("doc_lens,seqlen", [([4, 3], 10), ([20, 25, 9], 64), ([40, 24], 64), ([1], 1),
                                             ([1], 5), ([3, 1, 2], 6)])
def test_dense_form_is_causal_within_documents_and_padding_sees_nothing(doc_lens, seqlen):
    m = M.causal_document_padded(doc_lens, seqlen)
    assert m.causal and m.startend_row_indices.shape == (1, 1, seqlen, 1)
    assert m.startend_row_indices.dtype == np.int32
    np.testing.assert_array_equal(M.to_dense(m.startend_row_indices, m.causal)[0, 0],
                                  dense_expected(doc_lens, seqlen))


def test_docstring_example_and_no_padding_equals_causal_document():
    lts = M.causal_document_padded([4, 3], 10).startend_row_indices[0, 0, :, 0]
    assert lts.tolist() == [4, 4, 4, 4, 7, 7, 7, 7, 7, 7]
    np.testing.assert_array_equal(M.causal_document_padded([4, 3, 3], 10).startend_row_indices,
                                  M.causal_document([4, 3, 3]).startend_row_indices)


def test_rows_of_different_lengths_batch_and_heads():
    m = M.causal_document_padded([[20, 25, 9], [40, 24]], 64, num_heads=3)
    assert m.startend_row_indices.shape == (2, 3, 64, 1)
    dense = M.to_dense(m.startend_row_indices, m.causal)
    for b, docs in enumerate([[20, 25, 9], [40, 24]]):
        for h in range(3):
            np.testing.assert_array_equal(dense[b, h], dense_expected(docs, 64))
    # one description broadcast over the batch
    np.testing.assert_array_equal(M.causal_document_padded([5, 2], 9, batch=4).startend_row_indices[:, 0],
                                  np.broadcast_to(M.causal_document_padded([5, 2], 9).startend_row_indices[0, 0],
                                                  (4, 9, 1)))


def test_same_mask_as_the_paddleformers_test_builds_by_hand():
    """tests/pf_llama_util.py: causal_document over documents + the tail, then LTS = start of the tail there."""
    docs, s = [[20, 25, 9], [40, 24]], 64
    by_hand = M.causal_document([d + ([s - sum(d)] if sum(d) < s else []) for d in docs], s,
                                batch=2).startend_row_indices.copy()
    for r, d in enumerate(docs):
        by_hand[r, :, sum(d):, 0] = sum(d)
    np.testing.assert_array_equal(M.causal_document_padded(docs, s).startend_row_indices, by_hand)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5), st.integers(0, 7))
def test_random_documents_and_padding(doc_lens, pad):
    s = sum(doc_lens) + pad
    m = M.causal_document_padded(doc_lens, s)
    np.testing.assert_array_equal(M.to_dense(m.startend_row_indices, m.causal)[0, 0], dense_expected(doc_lens, s))
    M.validate_startend_row_indices(m.startend_row_indices, m.causal)


@pytest.mark.parametrize("doc_lens,seqlen,error,fragment", [
    ([11], 10, ValueError, "sums to 11"),
    ([[3], [4, 8]], 10, ValueError, "doc_lens[1] sums to 12"),
    ([0, 3], 10, ValueError, ">= 1"),
    ([], 10, TypeError, "non-empty"),
    ([2.5], 10, TypeError, "list of ints"),
    ([3], 0, ValueError, "seqlen"),
])
def test_errors_name_the_problem(doc_lens, seqlen, error, fragment):
    with pytest.raises(error) as e:
        M.causal_document_padded(doc_lens, seqlen)
    assert fragment in str(e.value)


def test_batch_that_does_not_match_the_rows():
    with pytest.raises(ValueError, match="batch=2"):
        M.causal_document_padded([[3], [4], [5]], 8, batch=2)


def test_attention_gives_zero_on_padding_rows_and_matches_the_reference():
    paddle = pytest.importorskip("paddle")
    import paddle_fm3
    from paddle_fm3 import reference

    m = M.causal_document_padded([[6, 5], [16]], 16)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 16, 2, 8)).astype("float32") for _ in range(3))
    out = paddle_fm3.flashmask_attention(*(paddle.to_tensor(x) for x in (q, k, v)), m.to_paddle(),
                                         causal=m.causal).numpy()
    ref, _ = reference.attention_forward(*(x.astype(np.float64) for x in (q, k, v)), m.startend_row_indices,
                                         causal=m.causal)
    assert (out[0, 11:] == 0).all()  # the padding rows of the first sample
    assert np.abs(out[0, :11]).max() > 0 and np.abs(out[1]).max() > 0
    assert float(np.abs(out - ref).max()) <= 1e-5 * float(np.abs(ref).max())
