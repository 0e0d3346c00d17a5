"""The CPU kernels are built portable (x86-64) plus AVX2 and AVX-512 copies chosen at run time
(ops/cpu/cpu_isa.h). Each copy this CPU can run, forced with FM3_CPU_KERNEL, against the float64
reference; a CPU without a copy's instructions runs the widest narrower one."""

import numpy as np
import paddle
import pytest
from fm3_testutil import random_startend
from test_attention import run_case

import paddle_fm3 as fm
from paddle_fm3 import masks

KERNELS = ["base", "avx2", "avx512"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_each_cpu_kernel_copy_matches_the_reference(monkeypatch, kernel, dtype):
    monkeypatch.setenv("FM3_CPU_KERNEL", kernel)
    rng = np.random.default_rng(KERNELS.index(kernel) * 7 + len(dtype))
    m = masks.FAMILIES["share_question"](300, rng)
    run_case(rng, (1, 300, 4, 64), (1, 300, 2, 64), dtype, m.startend_row_indices, m.causal)
    sri = random_startend(rng, 2, 2, 200, 260, False, 4)
    run_case(rng, (2, 200, 4, 96), (2, 260, 2, 96), dtype, sri, False)
    # MLA: value head dim 128 under q/k's 192 (each copy's tiles of v, out, dV, dP)
    m = masks.FAMILIES["causal_document"](130, rng)
    run_case(rng, (1, 130, 2, 192), (1, 130, 1, 192), dtype, m.startend_row_indices, m.causal, head_dim_v=128)
    # a learnable sink per query head (each copy's add_sink and sink gradient)
    m = masks.FAMILIES["sliding_window"](200, rng, batch=2)
    run_case(rng, (2, 200, 4, 64), (2, 200, 2, 64), dtype, m.startend_row_indices, m.causal,
             learnable_sink=rng.standard_normal(4) * 2)


def test_unknown_cpu_kernel_is_an_error(monkeypatch):
    monkeypatch.setenv("FM3_CPU_KERNEL", "sse9")
    q = paddle.ones([1, 8, 1, 16])
    with pytest.raises(Exception, match="FM3_CPU_KERNEL must be base, avx2 or avx512, got 'sse9'"):
        fm.flashmask_attention(q, q, q, causal=True)
