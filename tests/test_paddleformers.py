"""PaddleFormers integration: install()/uninstall() and patch_paddle()/unpatch_paddle().

A tiny Llama (2 layers, GQA) on packed documents with a padding tail, through
``attn_mask_startend_row_indices``: forward, backward and one optimizer step through paddle_fm3
equal PaddleFormers' eager backend on the equivalent dense mask (real rows; the padding rows see
no key: ours gives 0 there, eager attends to every key, and no real row reads them)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

if os.environ.get("CI"):  # CI installs PaddleFormers (requirements-dev.txt): never skip there
    import paddleformers  # noqa: F401
else:
    pytest.importorskip("paddleformers")

import paddle  # noqa: E402

import paddle_fm3  # noqa: E402
import paddle_fm3.integrations.paddleformers as fm3_pf  # noqa: E402
import pf_llama_util as U  # noqa: E402
from fm3_testutil import RTOL  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parent


def scaled_err(a, ref):
    return float(np.abs(a - ref).max()) / max(float(np.abs(ref).max()), 1e-30)


def assert_matches_eager(fm3_run, eager_run):
    rows = U.real_rows()
    assert scaled_err(fm3_run["logits"][rows], eager_run["logits"][rows]) <= RTOL["float32"]
    assert abs(fm3_run["loss"] - eager_run["loss"]) <= RTOL["float32"] * abs(eager_run["loss"])
    assert abs(fm3_run["loss_after"] - eager_run["loss_after"]) <= RTOL["float32"] * abs(eager_run["loss_after"])
    assert fm3_run["loss_after"] < fm3_run["loss"]  # the step trained something
    assert len(fm3_run["grads"]) == len(eager_run["grads"]) > 0
    for key in ("grads", "params"):
        for (name_f, a), (name_e, ref) in zip(fm3_run[key].items(), eager_run[key].items()):
            assert scaled_err(a, ref) <= RTOL["float32"], (key, name_f, name_e, scaled_err(a, ref))


@pytest.fixture
def installed():
    fm3_pf.install()
    yield
    fm3_pf.uninstall()


def twin_models():
    eager, fm3 = U.tiny_llama(), U.tiny_llama()
    fm3.set_state_dict(eager.state_dict())
    return eager, fm3


@pytest.mark.parametrize("name", ["flashmask", "fm3"])
def test_llama_train_step_matches_eager(installed, name):
    eager, fm3 = twin_models()
    eager_run = U.train_step(eager, "eager")
    fm3_run = U.train_step(fm3, name)
    assert_matches_eager(fm3_run, eager_run)


def test_install_is_idempotent_and_uninstall_restores():
    from paddleformers.nn.attention.flashmask_attention import flashmask_attention_forward
    from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is flashmask_attention_forward
    assert "fm3" not in AttentionInterface._global_mapping
    fm3_pf.install()
    fm3_pf.install()
    assert fm3_pf.is_installed()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is fm3_pf.attention_forward
    assert ALL_ATTENTION_FUNCTIONS["fm3"] is fm3_pf.attention_forward
    assert AttentionInterface()["flashmask"] is fm3_pf.attention_forward  # any instance, class-wide
    fm3_pf.uninstall()
    fm3_pf.uninstall()
    assert not fm3_pf.is_installed()
    assert ALL_ATTENTION_FUNCTIONS["flashmask"] is flashmask_attention_forward
    assert "fm3" not in AttentionInterface._global_mapping


def test_fully_masked_rows_give_zero_where_eager_gives_uniform(installed):
    """Our convention for a query row that sees no key (output 0) against eager's (every key)."""
    from paddleformers.nn.attention.eager_attention import eager_attention_forward

    rng = np.random.default_rng(1)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 2, 8, 16)).astype("float32")) for _ in range(3))
    sri = paddle.to_tensor(np.full((1, 1, 8, 1), 5, dtype=np.int32))  # rows 5.. see no key
    module = paddle.nn.Layer()
    ours, _ = fm3_pf.attention_forward(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=0.25)
    eager, weights = eager_attention_forward(module, q, k, v, attn_mask_startend_row_indices=sri, scaling=0.25)
    ours, eager, weights = ours.numpy().reshape(8, 2, 16), eager.numpy().reshape(8, 2, 16), weights.numpy()
    assert scaled_err(ours[:5], eager[:5]) <= RTOL["float32"]
    assert (ours[5:] == 0).all()
    # eager adds the same large negative bias to every score of such a row, which cancels in the
    # softmax: the row attends to every key, future ones included
    assert (weights[0, :, 5:] > 1e-4).all() and np.allclose(weights[0, :, 5:].sum(-1), 1, atol=1e-5)
    assert np.isfinite(eager[5:]).all() and (np.abs(eager[5:]) > 0).any()


def test_attention_forward_argument_errors(installed):
    q = paddle.zeros([1, 2, 8, 16])
    with pytest.raises(ValueError, match="attn_mask_startend_row_indices"):
        fm3_pf.attention_forward(paddle.nn.Layer(), q, q, q, attention_mask=paddle.zeros([1, 1, 8, 8]))
    with pytest.raises(NotImplementedError, match="dropout"):
        fm3_pf.attention_forward(paddle.nn.Layer(), q, q, q, dropout=0.1)


IMPORT_ORDER_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
order = sys.argv[1]
if order == "install-first":
    import paddle_fm3.integrations.paddleformers as fm3_pf
    fm3_pf.install()
    import paddleformers.transformers
else:
    import paddleformers.transformers
    import paddle_fm3.integrations.paddleformers as fm3_pf
    fm3_pf.install()
import numpy as np
import pf_llama_util as U
eager, fm3 = U.tiny_llama(), U.tiny_llama()
fm3.set_state_dict(eager.state_dict())
e, f = U.train_step(eager, "eager"), U.train_step(fm3, "flashmask")
rows = U.real_rows()
err = np.abs(f["logits"][rows] - e["logits"][rows]).max() / np.abs(e["logits"][rows]).max()
gerr = max(np.abs(a - b).max() / np.abs(b).max() for a, b in zip(f["grads"].values(), e["grads"].values()))
print("ERRORS", err, gerr)
"""


@pytest.mark.parametrize("order", ["install-first", "paddleformers-first"])
def test_import_orders(order):
    proc = subprocess.run([sys.executable, "-c", IMPORT_ORDER_SCRIPT.format(tests=str(TESTS)), order],
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = [float(x) for x in proc.stdout.split("ERRORS")[1].split()]
    assert all(e <= RTOL["float32"] for e in errs), errs


PATCH_SCRIPT = """
import sys
import paddle
import paddle.nn.functional as F
import paddle_fm3
order = sys.argv[1]
if order == "patch-first":
    paddle_fm3.patch_paddle()
import paddleformers.nn.attention.flashmask_attention as pf_flashmask
if order == "patch-after":
    paddle_fm3.patch_paddle()
print("PF_USES_FM3", pf_flashmask.flashmask_attention is paddle_fm3.flashmask_attention)
"""


@pytest.mark.parametrize("order,reaches", [("patch-first", True), ("patch-after", False)])
def test_patch_paddle_import_order_rule(order, reaches):
    """The documented rule: patch_paddle() reaches modules that import the function after it."""
    proc = subprocess.run([sys.executable, "-c", PATCH_SCRIPT, order], capture_output=True, text=True,
                          timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"PF_USES_FM3 {reaches}" in proc.stdout, proc.stdout[-2000:]


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
        assert scaled_err(out.numpy(), ref) <= RTOL["float32"]
    finally:
        paddle_fm3.unpatch_paddle()
        paddle_fm3.unpatch_paddle()
    assert F.flashmask_attention is original and FA.flashmask_attention is original
