"""A model saved with ``paddle.jit.save`` runs in a fresh process that only imports paddle_fm3:
``paddle.jit.load`` and a Paddle Inference predictor. The custom op must be registered by
``import paddle_fm3`` itself (without it, loading crashed or raised ``PreconditionNotMet: op []
kernel output args (0) defs should equal op outputs (2)``). Every step runs in its own interpreter."""

import subprocess
import sys

import pytest

SAVE = r"""
import sys
import numpy as np
import paddle
import paddle_fm3
from paddle_fm3 import masks

class Block(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(16, 16)

    def forward(self, x, startend_row_indices):
        q = self.proj(x)
        return paddle_fm3.flashmask_attention(q, x, x, startend_row_indices, causal=True)

paddle.seed(0)
layer = Block()
layer.eval()
spec = [paddle.static.InputSpec([1, 32, 2, 16], "float32"), paddle.static.InputSpec([1, 1, 32, 1], "int32")]
x = np.random.default_rng(0).standard_normal((1, 32, 2, 16)).astype(np.float32)
sri = masks.causal_document([10, 22]).startend_row_indices
np.save(sys.argv[1] + "_x.npy", x)
np.save(sys.argv[1] + "_sri.npy", sri)
np.save(sys.argv[1] + "_out.npy", layer(paddle.to_tensor(x), paddle.to_tensor(sri)).numpy())
paddle.jit.save(layer, sys.argv[1], input_spec=spec)
"""

LOAD = r"""
import sys
import numpy as np
import paddle
import paddle_fm3  # all that a deployment does: no call of the op before loading

prefix, how = sys.argv[1], sys.argv[2]
x, sri = np.load(prefix + "_x.npy"), np.load(prefix + "_sri.npy")
if how == "jit.load":
    out = paddle.jit.load(prefix)(paddle.to_tensor(x), paddle.to_tensor(sri)).numpy()
else:
    from paddle import inference
    config = inference.Config(prefix + ".json", prefix + ".pdiparams")
    config.disable_gpu()
    predictor = inference.create_predictor(config)
    for name, value in zip(predictor.get_input_names(), (x, sri)):
        predictor.get_input_handle(name).copy_from_cpu(value)
    predictor.run()
    out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
np.testing.assert_allclose(out, np.load(prefix + "_out.npy"), rtol=1e-5, atol=1e-6)
print("loaded and matched")
"""


def _run(code, *args, cwd):
    script = cwd / "script.py"  # a file: dy2static reads the layer's source
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}"
    return res.stdout


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("saved")
    _run(SAVE, d / "model", cwd=d)  # cwd outside the checkout: the installed package
    return d


@pytest.mark.parametrize("how", ["jit.load", "predictor"])
def test_saved_model_runs_in_a_fresh_process(saved, how):
    assert "loaded and matched" in _run(LOAD, saved / "model", how, cwd=saved)


def test_import_registers_the_ops(tmp_path):
    """``import paddle_fm3`` alone loads the compiled ops (Paddle installed); without Paddle the
    numpy-only modules still import (tests/test_packaging.py)."""
    code = "import sys, paddle_fm3\nprint('paddle_fm3._ops' in sys.modules)\n"
    assert _run(code, cwd=tmp_path).strip().splitlines()[-1] == "True"
