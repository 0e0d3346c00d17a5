"""Smoke tests of the main job, scripts/train.py: tiny settings, --check, as a subprocess."""

import importlib.util
import json
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "scripts" / "train.py"
TINY = ["--steps", "3", "--seq-len", "128", "--batch-size", "2", "--n-layers", "2", "--d-model", "64",
        "--max-doc-len", "200", "--eval-rows", "4", "--check", "--no-progress"]


def run_train(*extra, timeout=60):
    proc = subprocess.run([sys.executable, str(TRAIN), *TINY, *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"train.py exited {proc.returncode}:\n{out[-4000:]}"
    return out


def assert_healthy(out):
    assert "CHECK PASSED" in out, out[-4000:]
    m = re.search(r"SUMMARY .*loss_first=(\S+) loss_last=(\S+)", out)
    assert m, out[-4000:]
    first, last = float(m.group(1)), float(m.group(2))
    assert math.isfinite(first) and math.isfinite(last), (first, last)
    losses = [float(x) for x in re.findall(r"step \d+/\d+ loss (\S+)", out)]
    assert losses and all(math.isfinite(x) for x in losses), losses


@pytest.mark.parametrize("mask", ["causal-document", "share-question", "prefix-lm-document"])
def test_train_stdlib_check(mask):
    out = run_train("--mask", mask)
    assert_healthy(out)
    assert "Python stdlib" in out
    assert "tokens/s" in out


def test_train_jsonl(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "docs.jsonl"
    with open(path, "w") as fh:
        for i in range(40):
            n = int(rng.integers(5, 120))
            fh.write(json.dumps({"body": f"doc {i}: " + "hello world " * n}) + "\n")
    out = run_train("--data", str(path), "--text-field", "body")
    assert_healthy(out)
    assert "JSONL" in out


def _load_train():
    spec = importlib.util.spec_from_file_location("fm3_train_script", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_fails_loudly_on_mismatch(monkeypatch, capsys):
    """--check must catch a mask disagreement: make the dense side see one document too few boundaries."""
    train = _load_train()
    import paddle

    docs = [b"a" * 50, b"b" * 30, b"c" * 80]
    data = train.pack(docs, 64, "causal-document", question_frac=0.25, answer_len=16, prefix_frac=0.25)
    paddle.seed(0)
    model = train.ByteLM(32, 2, 1, 64)
    idx = np.arange(2)
    batch = (paddle.to_tensor(data.tokens[idx]), paddle.to_tensor(data.labels[idx]),
             paddle.to_tensor(data.positions[idx]), paddle.to_tensor(data.sri[idx]))
    assert train.check_against_dense(model, batch, data.causal, 1e-5, 0)
    real_to_dense = train.masks.to_dense

    def plain_causal(sri, causal, seqlen_q=None):  # ignores the document boundaries
        return real_to_dense(np.full_like(sri, sri.shape[2]), causal, seqlen_q)

    monkeypatch.setattr(train.masks, "to_dense", plain_causal)
    assert not train.check_against_dense(model, batch, data.causal, 1e-5, 0)
    assert "CHECK FAILED" in capsys.readouterr().err


def test_pack_labels_never_cross_segments():
    train = _load_train()
    docs = [bytes([65 + i % 26]) * n for i, n in enumerate([5, 70, 3, 200, 1, 40, 90])]
    for mode in ("causal-document", "share-question", "prefix-lm-document"):
        d = train.pack(docs, 64, mode, question_frac=0.3, answer_len=7, prefix_frac=0.4)
        vis = train.masks.to_dense(d.sri, d.causal, 64)
        b, s = np.nonzero(d.labels != train.IGNORE)
        assert len(b) > 0
        assert not vis[b, 0, s, s + 1].any(), mode  # no labelled position sees its own target
        assert (d.labels[b, s] == d.tokens[b, s + 1]).all(), mode
        assert vis[:, 0].any(axis=-1).all(), mode  # no fully masked query row


@pytest.mark.parametrize("args,msg", [
    (["--n-heads", "0"], "--n-heads must be >= 1"),  # once a ZeroDivisionError
    (["--n-layers", "0"], "--n-layers must be >= 1"),  # once trained a model without blocks
    (["--eval-rows", "-50"], "--eval-rows and --threads must be >= 0"),  # once an IndexError mid-run
    (["--check-rtol", "nan"], "--check-rtol must be a finite number > 0"),  # once a check that passed anything
])
def test_bad_arguments_are_argparse_errors(args, msg, capsys):
    train = _load_train()
    with pytest.raises(SystemExit):
        train.parse_args(args)
    assert msg in capsys.readouterr().err


def test_nothing_to_train_on_is_an_error():
    """One-byte documents have no next-token targets: once trained on nothing and reported loss 0."""
    proc = subprocess.run([sys.executable, str(TRAIN), *TINY, "--max-doc-len", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "nothing to train on" in proc.stderr, proc.stderr[-2000:]
