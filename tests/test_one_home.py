"""Each rule has one home: the C/C++ mask-shape check (params.h) behind every C/C++ entry, the
Python checks (paddle_fm3._checks), the one normalizer of mask values (mask_semantics.column_bounds,
the mirror of fm3::load_column), and no import cycle inside paddle_fm3."""

import ast
import pathlib

import numpy as np
import paddle
import pytest

from paddle_fm3 import _checks, mask_semantics, masks
from paddle_fm3._ops import ops
from paddle_fm3.distributed.localize import explicit_four_column

PKG = pathlib.Path(mask_semantics.__file__).resolve().parent


@pytest.mark.parametrize("causal, c, want", [(True, 4, "1 or 2 with causal=True"), (False, 1, "2 or 4 with causal=False")])
def test_cpu_entries_check_mask_cols(causal, c, want):
    """The raw ops reach fm3_cpu_classify / fm3_cpu_segment_workload, which apply fm3_check_mask_shape."""
    sri = paddle.full([1, 1, 64, c], 64, "int32")
    with pytest.raises(Exception, match=rf"startend_row_indices.shape\[3\] must be {want}, got {c}"):
        ops.fm3_block_classify(sri, None, 64, 16, 16, causal)
    with pytest.raises(Exception, match=rf"startend_row_indices.shape\[3\] must be {want}, got {c}"):
        ops.fm3_segment_workload(sri, 16, 16, causal)


def test_attention_op_checks_mask_shape_in_c():
    q = paddle.randn([2, 64, 4, 16])
    k = paddle.randn([2, 64, 2, 16])
    cases = [(paddle.full([1, 1, 64, 1], 64, "int32"), r"must have shape \[batch=2, mask_heads, seqlen_k=64, C\]"),
             (paddle.full([2, 3, 64, 1], 64, "int32"), r"shape\[1\] must be 1, num_heads_k \(2\) or num_heads \(4\)"),
             (paddle.full([2, 1, 64, 4], 64, "int32"), r"shape\[3\] must be 1 or 2 with causal=True, got 4")]
    for sri, match in cases:
        with pytest.raises(ValueError, match=match):
            ops.fm3_flashmask_attention(q, k, k, sri, None, 0.25, True, False)


@pytest.mark.parametrize("causal, c", [(True, 3), (False, 1), (False, 3)])
def test_python_mask_cols_check_is_shared(causal, c):
    msg = rf"shape\[3\]: with causal={causal} the last dimension C must be one of"
    with pytest.raises(ValueError, match=msg):
        _checks.check_mask_cols(c, causal)
    with pytest.raises(ValueError, match=msg):
        masks.validate_startend_row_indices(np.zeros((1, 1, 4, c), np.int32), causal)


def test_softmax_scale_and_window_checks_are_shared():
    assert _checks.check_softmax_scale(None, 64) == 0.125
    for bad, exc in [(0.0, ValueError), (1e39, ValueError), (True, TypeError), ("1", TypeError)]:
        with pytest.raises(exc, match="softmax_scale"):
            _checks.check_softmax_scale(bad, 64)
    assert _checks.normalize_window_size(3) == (3, 3)
    assert _checks.normalize_window_size(np.array([1, 2])) == (1, 2)
    for bad, exc in [(-1, ValueError), ((1, -2), ValueError), ((1, 2, 3), TypeError), (np.array(3), TypeError)]:
        with pytest.raises(exc, match="window_size"):
            _checks.normalize_window_size(bad)


def test_column_bounds_mirrors_load_column():
    """Hand cases of fm3::load_column: clamping to [0, S_q], the filled-in vectors, the causal triangle."""
    sq, sk = 4, 6  # causal offset 2: key j is first visible to row j - 2
    lts = np.array([9, -3, 2, 4, 0, 1], np.int32)
    got = mask_semantics.column_bounds(lts.reshape(1, 1, sk, 1), True, sq)[0, 0]
    np.testing.assert_array_equal(got[:, 0], [4, 0, 2, 4, 0, 1])
    np.testing.assert_array_equal(got[:, 1], [4] * sk)
    np.testing.assert_array_equal(got[:, 2], [0] * sk)
    np.testing.assert_array_equal(got[:, 3], [0, 0, 0, 1, 2, 3])
    two = np.array([[5, -1], [2, 3]], np.int32).reshape(1, 1, 2, 2)
    np.testing.assert_array_equal(mask_semantics.column_bounds(two, False, 4)[0, 0], [[4, 4, 0, 0], [2, 4, 0, 3]])


@pytest.mark.parametrize("name", sorted(masks.FAMILIES))
def test_dense_density_and_localization_derive_from_column_bounds(name):
    rng = np.random.default_rng(7)
    fm = masks.FAMILIES[name](48, rng, batch=2)
    b = mask_semantics.column_bounds(fm.startend_row_indices, fm.causal)
    rows = np.arange(48)[None, None, :, None]
    masked = ((rows >= b[:, :, None, :, 0]) & (rows < b[:, :, None, :, 1])) | \
             ((rows >= b[:, :, None, :, 2]) & (rows < b[:, :, None, :, 3]))
    dense = masks.to_dense(fm.startend_row_indices, fm.causal)
    np.testing.assert_array_equal(dense, ~masked)
    assert masks.density(fm.startend_row_indices, fm.causal) == pytest.approx(dense.mean(), abs=1e-12)
    np.testing.assert_array_equal(explicit_four_column(fm.startend_row_indices, fm.causal), b)


def _module_imports(path: pathlib.Path, module: str):
    """paddle_fm3 modules imported at module level (not inside functions) by one source file."""
    pkg = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            if base.startswith("paddle_fm3"):
                for alias in node.names:
                    out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("paddle_fm3")}
    return {m for m in out if m in MODULES and m != module}


MODULES = {}
for p in PKG.rglob("*.py"):
    rel = p.relative_to(PKG.parent).with_suffix("")
    name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
    MODULES[name] = p


def test_no_import_cycle_in_package():
    graph = {m: _module_imports(p, m) for m, p in MODULES.items()}
    state = {}

    def visit(m, stack):
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [m, n]))
            if n not in state:
                visit(n, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
    assert graph["paddle_fm3.masks"] >= {"paddle_fm3.mask_semantics", "paddle_fm3.mask_builders"}
