"""examples/paddleformers_llama_packed.py, the PaddleFormers example (docs/paddleformers.md): it runs as a file, its
loss is finite, the step changes the weights, and the attention ran on paddle_fm3.

Each check runs in a fresh interpreter outside the checkout (importing PaddleFormers patches Paddle
process-wide; see tests/test_paddleformers.py), so the installed package is the one tested."""

import importlib.util
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

if importlib.util.find_spec("paddleformers") is None and not os.environ.get("CI"):  # CI installs it: never skip there
    pytest.skip("PaddleFormers is not installed (pip install paddleformers)", allow_module_level=True)

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "paddleformers_llama_packed.py"


def run(args):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def test_example_runs_as_a_file_and_prints_a_finite_loss():
    out = run([str(EXAMPLE)])
    m = re.search(r"^loss (\S+) over (\d+) labelled of (\d+) tokens; after one AdamW step (\S+); "
                  r"largest weight change (\S+)$", out, re.M)
    assert m, out[-2000:]
    loss, labelled, tokens, after, change = (float(g) for g in m.groups())
    assert math.isfinite(loss) and math.isfinite(after) and 0 < loss < 2 * math.log(128)
    assert (labelled, tokens) == (113, 128)  # 2 rows of 64: 5 document ends and 10 padding tokens unlabelled
    assert change > 0


CHECK = f"""
import math, runpy
import numpy as np
import paddle_fm3.integrations.paddleformers as fm3_pf
calls = []
inner = fm3_pf.flashmask_attention
def counted(*args, **kwargs):
    calls.append(1)
    return inner(*args, **kwargs)
fm3_pf.flashmask_attention = counted
ns = runpy.run_path({str(EXAMPLE)!r}, run_name="example")
r = ns["main"]()
assert math.isfinite(r["loss"]) and math.isfinite(r["loss_after"]), r["loss"]
assert r["loss_after"] < r["loss"], (r["loss"], r["loss_after"])
before, after = r["params_before"], r["params_after"]
assert before.keys() == after.keys() and len(before) > 0
assert all(np.isfinite(a).all() for a in after.values())
changed = [k for k in before if not np.array_equal(before[k], after[k])]
assert len(changed) == len(before), sorted(set(before) - set(changed))  # AdamW moves every parameter
assert len(calls) == 2 * 2, len(calls)  # 2 layers, 2 forwards (the step's and the loss after it)
print("EXAMPLE OK")
"""


def test_example_step_trains_every_weight_through_paddle_fm3():
    assert "EXAMPLE OK" in run(["-c", CHECK])
