"""PaddleFormers integration: install()/uninstall() and patch_paddle()/unpatch_paddle().

A tiny Llama (2 layers, GQA), a tiny DeepSeek-V3 (MLA: q/k head dim 192, v 128) and a tiny gpt-oss
(learnable attention sinks, sliding-window layers), on packed documents with a padding tail, through
``attn_mask_startend_row_indices``: forward, backward and one optimizer step through paddle_fm3
equal PaddleFormers' eager backend on the equivalent dense mask (real rows; the padding rows see
no key: ours gives 0 there, eager attends to every key, and no real row reads them).

The checks (tests/pf_llama_util.py) run in fresh interpreters: importing PaddleFormers patches
Paddle process-wide, and in the pytest process it made later ``paddle.jit.to_static`` tests hang."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import paddle
import pytest

import paddle_fm3
from fm3_testutil import RTOL

if importlib.util.find_spec("paddleformers") is None and not os.environ.get("CI"):  # CI installs it: never skip there
    pytest.skip("PaddleFormers is not installed (pip install paddleformers)", allow_module_level=True)

TESTS = pathlib.Path(__file__).resolve().parent


def run_check(name, *args, util="pf_llama_util"):
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import {util} as U; U.{name}(*sys.argv[1:])"
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("order,name", [("install-first", "flashmask"), ("paddleformers-first", "flashmask"),
                                        ("install-first", "fm3")])
def test_llama_train_step_matches_eager(order, name):
    run_check("check_train_step", order, name)


@pytest.mark.parametrize("name", ["flashmask", "fm3"])
def test_deepseek_v3_mla_train_step_matches_eager(name):
    """MLA (q/k 192, v 128; tests/pf_deepseek_util.py): under "fm3" the 192 / 128 call reaches
    paddle_fm3 as it is; under "flashmask" PaddleFormers zero-pads value to 192 and folds the
    softmax scale into the query. Both match eager through one SGD step."""
    run_check("check_train_step", name, util="pf_deepseek_util")


@pytest.mark.parametrize("name", ["flashmask", "fm3"])
def test_gpt_oss_sinks_train_step_matches_eager(name):
    """gpt-oss (tests/pf_gpt_oss_util.py): learnable sinks, sliding-window and full layers, GQA; its
    calls reach paddle_fm3 with the sink under both names and match eager, the sinks' gradients
    included, through one SGD step."""
    run_check("check_train_step", name, util="pf_gpt_oss_util")


def test_scaling_fm3_applies_it_flashmask_keeps_paddleformers_contract():
    run_check("check_scaling_by_name")


def test_install_is_idempotent_and_uninstall_restores():
    run_check("check_install_uninstall")


def test_fully_masked_rows_give_zero_where_eager_attends_to_every_key():
    run_check("check_fully_masked_rows")


def test_attention_forward_argument_errors():
    run_check("check_argument_errors")


@pytest.mark.parametrize("order", ["patch-first", "patch-after"])
def test_patch_paddle_import_order_rule(order):
    run_check("check_patch_paddle_order", order)


def test_trainer_and_collate_import():
    """What a PaddleFormers training script imports besides the models: once an ImportError (pyarrow
    26 needs NumPy 2; PaddleFormers pins 1.26), so its Trainer and data pipeline could not be used."""
    code = ("from paddleformers.trainer import Trainer\n"
            "from paddleformers.datasets.collate import gen_attn_mask_startend_row_indices\n"
            "import datasets\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_patch_paddle_routes_both_names_and_unpatch_restores():
    import paddle.nn.functional as F
    import paddle.nn.functional.flash_attention as FA

    original = F.flashmask_attention
    assert FA.flashmask_attention is original
    try:
        paddle_fm3.patch_paddle()
        paddle_fm3.patch_paddle()
        assert F.flashmask_attention is paddle_fm3.flashmask_attention
        assert FA.flashmask_attention is paddle_fm3.flashmask_attention
        # Paddle's own has no CPU kernel; through the patch a CPU call runs and matches the reference.
        rng = np.random.default_rng(2)
        q, k, v = (rng.standard_normal((1, 16, 2, 8)).astype("float32") for _ in range(3))
        sri = paddle_fm3.masks.causal_document([6, 10], 16).startend_row_indices
        out = F.flashmask_attention(*(paddle.to_tensor(x) for x in (q, k, v)), paddle.to_tensor(sri), causal=True)
        ref, _ = paddle_fm3.reference.attention_forward(*(x.astype(np.float64) for x in (q, k, v)), sri,
                                                        causal=True)
        err = float(np.abs(out.numpy() - ref).max()) / float(np.abs(ref).max())
        assert err <= RTOL["float32"]
    finally:
        paddle_fm3.unpatch_paddle()
        paddle_fm3.unpatch_paddle()
    assert F.flashmask_attention is original and FA.flashmask_attention is original
