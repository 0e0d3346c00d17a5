"""Each rule has one home: the C/C++ mask-shape check (params.h) behind every C/C++ entry, the
Python checks (paddle_fm3._checks), the one normalizer of mask values (mask_semantics.column_bounds,
the mirror of fm3::load_column), the shape rules of block_mask, causal alignment and mask heads (one
home per language), the torch CP backends in the package, and no import cycle inside paddle_fm3."""

import ast
import io
import os
import pathlib
import re
import subprocess
import sys
import tokenize

import numpy as np
import paddle
import pytest

from paddle_fm3 import _checks, mask_semantics, masks
from paddle_fm3._ops import ops, sink_input
from paddle_fm3.distributed.localize import explicit_four_column

PKG = pathlib.Path(mask_semantics.__file__).resolve().parent


@pytest.mark.parametrize("causal, c, want", [(True, 4, r"causal=True the last dimension C must be one of \(1, 2\)"),
                                             (False, 1, r"causal=False the last dimension C must be one of \(2, 4\)")])
def test_cpu_entries_check_mask_cols(causal, c, want):
    """The raw ops reach fm3_cpu_classify / fm3_cpu_segment_workload, which apply fm3_check_mask_shape."""
    sri = paddle.full([1, 1, 64, c], 64, "int32")
    with pytest.raises(Exception, match=rf"startend_row_indices.shape\[3\]: with {want}, got {c}"):
        ops.fm3_block_classify(sri, None, 64, 16, 16, causal)
    with pytest.raises(Exception, match=rf"startend_row_indices.shape\[3\]: with {want}, got {c}"):
        ops.fm3_segment_workload(sri, 16, 16, causal)


def test_attention_op_checks_mask_shape_in_c():
    q = paddle.randn([2, 64, 4, 16])
    k = paddle.randn([2, 64, 2, 16])
    cases = [(paddle.full([1, 1, 64, 1], 64, "int32"), r"must have shape \[batch=2, mask_heads, seqlen_k=64, C\]"),
             (paddle.full([2, 3, 64, 1], 64, "int32"),
              r"shape\[1\] \(mask heads\) must be 1, num_heads_k \(2\) or num_heads \(4\)"),
             (paddle.full([2, 1, 64, 4], 64, "int32"),
              r"shape\[3\]: with causal=True the last dimension C must be one of \(1, 2\), got 4")]
    for sri, match in cases:
        with pytest.raises(ValueError, match=match):
            ops.fm3_flashmask_attention(q, k, k, sri, None, sink_input(None), 0.25, True, False)


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


# ---- the shape rules of block_mask, causal alignment and mask heads: one home per language ----

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A copy of a rule, in code (comments and string literals are dropped first: messages and docs may
# state the rule). The homes are fm3::block_mask_blocks / causal_offset_of / mask_head_of
# (ops/include/fm3/mask.h) and _checks.block_mask_blocks / causal_offset (paddle_fm3/_checks.py).
RULE_COPIES = {
    # (a sequence length or a shape entry rounded up to 128: CUDA grid sizes round other counts)
    "block_mask blocks": (re.compile(r"\b(seqlen\w*|[sS]_?[qk]|\w+\s*\[\s*\d\s*\])\s*\+\s*127\s*\)\s*//?\s*128|"
                                     r"//\s*128\s*\)|kBlockMaskSize\s*-\s*1\s*\)\s*/\s*kBlockMaskSize|"
                                     r"ceil_div\([^()]*kBlockMaskSize\)|//\s*BLOCK_MASK_SIZE\b"),
                          {"ops/include/fm3/mask.h", "paddle_fm3/_checks.py"}),
    "causal offset": (re.compile(r"\b(seqlen_k|sk|Sk|s_k)\s*-\s*(a\s*\.\s*|p\s*->\s*)?(seqlen_q|sq|Sq|s_q)\b"),
                      {"ops/include/fm3/mask.h", "paddle_fm3/_checks.py"}),
    "mask head of a query head": (re.compile(r"mask_heads\s*==\s*1\s*(\?|\)\s*return\s+0\b)"),
                                  {"ops/include/fm3/mask.h"}),
}
_C_NOISE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)


def _code_only(path: pathlib.Path) -> str:
    """The source without comments and string literals (tokens joined by spaces for Python)."""
    text = path.read_text()
    if path.suffix != ".py":
        return _C_NOISE.sub(" ", text)
    skip = (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.NEWLINE)
    return " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in skip)


def test_rule_copies_pattern_finds_the_homes():
    """The patterns match the homes themselves, so a copy written the same way would be found."""
    for name, (pattern, homes) in RULE_COPIES.items():
        for home in homes:
            assert pattern.search(_code_only(ROOT / home)), (name, home)


def test_shape_rules_have_one_home_per_language():
    sources = [p for top in ("ops", "paddle_fm3", "scripts", "tools", "examples") for p in (ROOT / top).rglob("*")
               if p.suffix in (".h", ".cc", ".cu", ".cuh", ".py") and "__pycache__" not in p.parts]
    assert len(sources) > 40
    copies = []
    for path in sources:
        code, rel = _code_only(path), path.relative_to(ROOT).as_posix()
        copies += [(name, rel) for name, (pattern, homes) in RULE_COPIES.items()
                   if rel not in homes and pattern.search(code)]
    assert copies == [], f"a rule written outside its home: {copies}"


def test_python_shape_rules():
    assert [_checks.block_mask_blocks(s) for s in (0, 1, 128, 129, 256, 257)] == [0, 1, 1, 2, 2, 3]
    assert _checks.BLOCK_MASK_SIZE == 128
    assert _checks.causal_offset(3, 5) == 2 and _checks.causal_offset(5, 3) == -2


def test_block_mask_shape_checked_alike_in_python_and_c():
    """The Python check (_validation) and the Paddle glue's (fm3::block_mask_blocks) accept the same
    shape and reject one block too few along seqlen_q."""
    from paddle_fm3 import _validation

    q, k = paddle.randn([1, 129, 2, 16]), paddle.randn([1, 257, 2, 16])
    sri = paddle.full([1, 1, 257, 1], 129, "int32")
    good = paddle.ones([1, 1, 2, 3], "int32")
    _validation.check_block_mask(good, sri, q, k)
    out, _ = ops.fm3_flashmask_attention(q, k, k, sri, good, sink_input(None), 0.25, True, False)
    assert not bool(paddle.isnan(out).any())
    bad = paddle.ones([1, 1, 1, 3], "int32")
    want = (r"block_mask must have shape \[1, 1, 2, 3\] \[batch, mask_heads, ceil\(seqlen_q/128\), "
            r"ceil\(seqlen_k/128\)\], got \[1, 1, 1, 3\]")  # one wording in Python and C
    with pytest.raises(ValueError, match=want):
        _validation.check_block_mask(bad, sri, q, k)
    with pytest.raises(ValueError, match=want):
        ops.fm3_flashmask_attention(q, k, k, sri, bad, sink_input(None), 0.25, True, False)


def test_torch_backends_live_in_the_package_and_need_no_torch_to_import():
    """paddle_fm3.distributed does not import backends.torch; that module imports without torch."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import paddle_fm3.distributed as d\n"
            "assert 'paddle_fm3.distributed.backends.torch' not in sys.modules\n"
            "from paddle_fm3.distributed.backends.torch import HopperBackend, ReferenceBackend, lse_merge\n"
            "from paddle_fm3.distributed.step import AttentionBackend\n"
            "assert issubclass(HopperBackend, AttentionBackend) and issubclass(ReferenceBackend, AttentionBackend)\n"
            "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
