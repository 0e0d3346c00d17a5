"""tools/doc_tile_count.py: its tile-pair counts equal a brute-force count over the dense mask."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "doc_tile_count.py"
spec = importlib.util.spec_from_file_location("doc_tile_count", SCRIPT)
dtc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dtc)


def brute_force(docs, causal, tile_q, tile_k, aligned):
    """(backward, forward) pairs: (query tile, key block) pairs holding a visible element, the tiles on
    the global grid or restarting at every document's start."""
    if aligned:
        counts = [brute_force([n], causal, tile_q, tile_k, False) for n in docs]
        return tuple(int(x) for x in np.sum(counts, axis=0))
    s = sum(docs)
    doc = np.repeat(np.arange(len(docs)), docs)
    vis = doc[:, None] == doc[None, :]
    if causal:
        vis &= np.arange(s)[:, None] >= np.arange(s)[None, :]
    n = sum(vis[i:i + tile_q, j:j + tile_k].any() for i in range(0, s, tile_q) for j in range(0, s, tile_k))
    return int(n), int(n)  # both passes compute the same pairs, walked by key block or by query tile


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tiles", [(64, 128), (128, 128), (64, 64)])
def test_counts_match_the_dense_mask(causal, tiles):
    rng = np.random.default_rng(7)
    for _ in range(20):
        docs = [int(x) for x in rng.integers(1, 300, size=rng.integers(1, 6))]
        for aligned in (False, True):
            assert dtc.pairs(docs, causal, *tiles, aligned) == brute_force(docs, causal, *tiles, aligned), (docs, aligned)
