"""Random instances of the mask families (numpy only): :data:`FAMILIES` maps each of the 12 families
to a sampler of a representative, randomized instance for any sequence length, public as
``paddle_fm3.masks.FAMILIES``: the sweeps of the tests, benchmarks and tools draw from it."""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np

from ._checks import MAX_SEQLEN, check_batch_heads, check_int
from .mask_builders import (causal, causal_blockwise, causal_document, document, full, global_sliding_window,
                            prefix_lm_causal, prefix_lm_document, qk_sparse, random_eviction, share_question,
                            sliding_window)
from .mask_semantics import FlashMask

__all__ = ["FAMILIES"]


def _random_doc_lens(s: int, rng: np.random.Generator, max_docs: int = 6) -> List[int]:
    n = int(rng.integers(1, min(s, max_docs) + 1))
    cuts = np.sort(rng.choice(np.arange(1, s), size=n - 1, replace=False)) if n > 1 else np.zeros(0, np.int64)
    return [int(x) for x in np.diff(np.concatenate([[0], cuts, [s]]))]


def _random_share_question(s: int, rng: np.random.Generator) -> List[Tuple[int, List[int]]]:
    docs = []
    for d in _random_doc_lens(s, rng, max_docs=3):
        q = int(rng.integers(1, d + 1))
        rest = d - q
        docs.append((q, _random_doc_lens(rest, rng, max_docs=4) if rest else []))
    return docs


def _family_full(s, rng, **kw):
    return full(s, **kw)


def _family_causal(s, rng, **kw):
    return causal(s, **kw)


def _family_sliding_window(s, rng, **kw):
    return sliding_window(s, int(rng.integers(0, max(1, s // 4) + 1)), **kw)


def _family_causal_document(s, rng, batch=1, **kw):
    return causal_document([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_document(s, rng, batch=1, **kw):
    return document([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_share_question(s, rng, batch=1, **kw):
    return share_question([_random_share_question(s, rng) for _ in range(batch)], s, **kw)


def _family_global_sliding_window(s, rng, **kw):
    g = int(rng.integers(0, max(1, s // 8) + 1))
    w = int(rng.integers(0, max(1, s // 4) + 1))
    return global_sliding_window(s, g, w, **kw)


def _family_causal_blockwise(s, rng, batch=1, **kw):
    return causal_blockwise([_random_doc_lens(s, rng) for _ in range(batch)], s, **kw)


def _family_prefix_lm_causal(s, rng, **kw):
    return prefix_lm_causal(s, int(rng.integers(0, s + 1)), **kw)


def _family_prefix_lm_document(s, rng, batch=1, **kw):
    docs = [_random_doc_lens(s, rng) for _ in range(batch)]
    prefixes = [[int(rng.integers(0, d + 1)) for d in r] for r in docs]
    return prefix_lm_document(docs, prefixes, s, **kw)


def _family_qk_sparse(s, rng, **kw):
    return qk_sparse(s, num_spans=int(rng.integers(1, 4)), seed=int(rng.integers(0, 2**31)), **kw)


def _family_random_eviction(s, rng, **kw):
    return random_eviction(s, seed=int(rng.integers(0, 2**31)), **kw)


def _family(fn: Callable[..., FlashMask]) -> Callable[..., FlashMask]:
    """Checks the arguments every family instance takes, then builds it."""
    def build(seqlen, rng, *, batch=1, num_heads=1) -> FlashMask:
        seqlen = check_int("seqlen", seqlen, lo=1, hi=MAX_SEQLEN)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
        batch, num_heads = check_batch_heads(batch, num_heads)
        return fn(seqlen, rng, batch=batch, num_heads=num_heads)
    build.__name__ = build.__qualname__ = fn.__name__.lstrip("_")
    build.__doc__ = fn.__doc__
    return build


#: name -> ``callable(seqlen, rng, *, batch=1, num_heads=1) -> FlashMask``: a representative,
#: randomized instance of each of the 12 mask families of the FlashMask paper / Paddle docs, valid
#: for any ``seqlen >= 1``. Document-based families draw different document lengths per batch row.
FAMILIES: Dict[str, Callable[..., FlashMask]] = {
    "full": _family(_family_full),
    "causal": _family(_family_causal),
    "sliding_window": _family(_family_sliding_window),
    "causal_document": _family(_family_causal_document),
    "document": _family(_family_document),
    "share_question": _family(_family_share_question),
    "global_sliding_window": _family(_family_global_sliding_window),
    "causal_blockwise": _family(_family_causal_blockwise),
    "prefix_lm_causal": _family(_family_prefix_lm_causal),
    "prefix_lm_document": _family(_family_prefix_lm_document),
    "qk_sparse": _family(_family_qk_sparse),
    "random_eviction": _family(_family_random_eviction),
}
