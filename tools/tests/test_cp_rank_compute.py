"""tools/cp_rank_compute.py: its per-rank inputs reassemble the global attention, and --plan-only builds
them without Paddle (through the DLPack module's segment_workload)."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

from fm3_testutil import NO_DLPACK, dlpack_available, run_without_paddle

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "cp_rank_compute.py"
needs_dlpack = pytest.mark.skipif(not dlpack_available(), reason=NO_DLPACK)


@needs_dlpack
def test_plan_only_without_paddle(tmp_path):
    """--plan-only builds every rank's inputs with ``import paddle`` failing."""
    out = tmp_path / "plan.json"
    script = str(SCRIPT)
    run_without_paddle("import runpy; sys.argv = ['x', '--plan-only', '--seqlens', '2048', '--ranks', '2', '4', "
                        f"'--out', {str(out)!r}]; runpy.run_path({script!r}, run_name='__main__')", tmp_path)
    res = json.loads(out.read_text())
    assert len(res["summary"]) == 10 and len(res["per_rank"]) == 5 * 2 * (2 + 4)


def _cp_rank_compute():
    spec = importlib.util.spec_from_file_location("cp_rank_compute", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("family", ["causal_document", "share_question", "sliding_window", "document"])
def test_cp_rank_compute_shares_reassemble_attention(family):
    """The per-rank inputs of tools/cp_rank_compute.py (query rows, KV chunks, localized masks)
    give the global attention when each chunk's result is LSE-merged, for both splits (float64
    reference standing in for the GPU kernel)."""
    from paddle_fm3 import reference

    crc = _cp_rank_compute()
    s, p = 512, 4
    fm = crc.make_mask(family, s, 0)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, s, 2, 16)) for _ in range(3))
    out_ref, lse_ref = reference.attention_forward(q, k, v, fm.startend_row_indices, causal=fm.causal)
    for scheme, (lay, _) in crc.layouts(fm.startend_row_indices, fm.causal, p).items():
        out, lse = np.zeros_like(out_ref), np.zeros_like(lse_ref)
        for share in crc.rank_shares(lay, fm.startend_row_indices, fm.causal):
            rows = share["q_rows"]
            acc = None
            for kv_rows, m in share["calls"]:
                assert m.shape == (1, 1, len(kv_rows), 4)
                o, l = reference.attention_forward(q[:, rows], k[:, kv_rows], v[:, kv_rows], m, causal=False)
                if acc is None:
                    acc = (o, l)
                else:
                    mx = np.maximum(acc[1], l)
                    sh = np.where(np.isinf(mx), 0.0, mx)
                    e1, e2 = np.exp(acc[1] - sh), np.exp(l - sh)
                    tot = np.where(np.isinf(mx), 1.0, e1 + e2)
                    w1, w2 = ((e / tot).transpose(0, 2, 1)[..., None] for e in (e1, e2))
                    acc = (acc[0] * w1 + o * w2, np.where(np.isinf(mx), mx, sh + np.log(tot)))
            out[:, rows], lse[:, :, rows] = acc
        np.testing.assert_allclose(out, out_ref, atol=1e-12)
        np.testing.assert_array_equal(np.isinf(lse), np.isinf(lse_ref))
        fin = np.isfinite(lse_ref)
        np.testing.assert_allclose(lse[fin], lse_ref[fin], atol=1e-12)
