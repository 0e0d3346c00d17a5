"""Smoke tests of the main job, examples/train_packed_lm.py: tiny settings, --check, as a subprocess."""

import csv
import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_packed_lm.py"
TINY = ["--steps", "3", "--seq-len", "128", "--batch-size", "2", "--n-layers", "2", "--d-model", "64",
        "--max-doc-len", "200", "--eval-rows", "4", "--check", "--no-progress"]


def run_train(run_dir, *extra, timeout=120):
    proc = subprocess.run([sys.executable, str(TRAIN), *TINY, "--run-dir", str(run_dir), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"train_packed_lm.py exited {proc.returncode}:\n{out[-4000:]}"
    return out


def assert_healthy(out):
    assert "CHECK PASSED" in out, out[-4000:]
    m = re.search(r"SUMMARY .*loss_first=(\S+) loss_last=(\S+)", out)
    assert m, out[-4000:]
    first, last = float(m.group(1)), float(m.group(2))
    assert math.isfinite(first) and math.isfinite(last), (first, last)
    losses = [float(x) for x in re.findall(r"step \d+/\d+ loss (\S+)", out)]
    assert losses and all(math.isfinite(x) for x in losses), losses


def assert_run_folder(run_dir, steps):
    """metrics.csv (one row per step), loss.png, checkpoint/, samples.txt, summary.json."""
    with open(run_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
    assert all(math.isfinite(float(r["loss"])) and float(r["tokens_per_s"]) > 0 for r in rows)
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in (run_dir / "checkpoint").iterdir()} == {"model.pdparams", "optimizer.pdopt", "state.json"}
    assert (run_dir / "samples.txt").read_text(encoding="utf-8").count("--- continuation ---") == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    cmp = summary["dense_comparison"]
    assert cmp["fm3"]["step_s"] > 0 and cmp["dense"]["step_s"] > 0
    assert cmp["mask_bytes"]["dense_float32"] > cmp["mask_bytes"]["startend_row_indices"] > 0
    assert cmp["loss_rel_diff"] <= 1e-5 and cmp["grad_max_rel_diff"] <= 1e-5
    assert summary["steps"]["end"] == steps
    return rows, summary


def summary_fields(out):
    """The SUMMARY line's key=value fields."""
    lines = [ln for ln in out.splitlines() if ln.startswith("SUMMARY ")]
    assert len(lines) == 1, out[-4000:]
    return dict(f.split("=", 1) for f in lines[0].split()[1:])


def assert_one_dense_mask_size(out, summary, b=2, s=128):
    """The dense mask's size is one number everywhere: the float32 additive [B, 1, S, S] mask that
    Paddle's attention reads (stdout once gave a bool [B, H, S, S] size, summary.json a bool
    [B, 1, S, S] one)."""
    dense = 4 * b * s * s
    assert int(summary_fields(out)["dense_mask_bytes_float32"]) == dense
    assert summary["dense_comparison"]["mask_bytes"]["dense_float32"] == dense
    human = f"{dense / 1024:.1f} KiB"
    mask_line = next(ln for ln in out.splitlines() if ln.startswith("mask: "))
    assert f"[{b}, 1, {s}, {s}] mask Paddle's attention reads = {human} " in mask_line, mask_line
    step_line = next(ln for ln in out.splitlines() if ln.startswith("one step vs "))
    assert f" vs {human} float32;" in step_line, step_line
    assert "bool" not in mask_line and "bool" not in summary["dense_comparison"]["mask_bytes"]


@pytest.mark.parametrize("mask", ["causal-document", "share-question", "prefix-lm-document"])
def test_train_stdlib_check(mask, tmp_path):
    out = run_train(tmp_path / "run", "--mask", mask)
    assert_healthy(out)
    assert "Python stdlib" in out
    assert "tokens/s" in out
    _, summary = assert_run_folder(tmp_path / "run", 3)
    assert_one_dense_mask_size(out, summary)
    assert re.search(r"held-out loss: \S+ at step 0 -> \S+ at step 3 \(4 rows\)", out), out[-4000:]


def test_train_jsonl(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "docs.jsonl"
    with open(path, "w") as fh:
        for i in range(40):
            n = int(rng.integers(5, 120))
            fh.write(json.dumps({"body": f"doc {i}: " + "hello world " * n}) + "\n")
    out = run_train(tmp_path / "run", "--data", str(path), "--text-field", "body")
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
    tokens, labels, positions, sri = data.rows(np.arange(2))
    batch = tuple(paddle.to_tensor(x) for x in (tokens, labels, positions, sri))
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
        tokens, labels, _, sri = d.rows(np.arange(d.n_rows))
        vis = train.masks.to_dense(sri, d.causal, 64)
        b, s = np.nonzero(labels != train.IGNORE)
        assert len(b) > 0
        assert not vis[b, 0, s, s + 1].any(), mode  # no labelled position sees its own target
        assert (labels[b, s] == tokens[b, s + 1]).all(), mode
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


def test_nothing_to_train_on_is_an_error(tmp_path):
    """One-byte documents have no next-token targets: once trained on nothing and reported loss 0."""
    proc = subprocess.run([sys.executable, str(TRAIN), *TINY, "--max-doc-len", "1", "--run-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing to train on" in proc.stderr, proc.stderr[-2000:]


def metric_losses(run_dir):
    with open(run_dir / "metrics.csv", newline="") as fh:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(fh)}


def assert_no_held_out_evaluation(out, summary, why):
    """Without held-out rows the output says so (it once printed eval=nan->nan) and summary.json
    holds nulls."""
    assert not re.search(r"\bnan\b", out, re.I), out[-4000:]
    assert f"held-out loss: none (no held-out rows: {why})" in out, out[-4000:]
    assert summary_fields(out)["eval"] == "none"
    assert summary["held_out_loss"]["before"] is None and summary["held_out_loss"]["after"] is None


def test_resume_continues_the_run(tmp_path):
    """2 steps, then --resume to 4, gives the losses of an uninterrupted 4-step run (same data order,
    weights, AdamW moments and LR schedule), and the same loss summary: it covers the run from
    step 1, not just the resumed steps."""
    quick = ["--samples", "0", "--eval-rows", "0", "--checkpoint-every", "0"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    out_whole = run_train(whole, *quick, "--steps", "4")
    run_train(split, *quick, "--steps", "2")
    assert sorted(metric_losses(split)) == [1, 2]
    out = run_train(split, *quick, "--steps", "4", "--resume")
    assert "resumed from" in out and "at step 2" in out
    a, b = metric_losses(whole), metric_losses(split)
    assert sorted(b) == [1, 2, 3, 4]
    np.testing.assert_allclose([b[k] for k in range(1, 5)], [a[k] for k in range(1, 5)], rtol=1e-5)
    summary = json.loads((split / "summary.json").read_text())
    summary_whole = json.loads((whole / "summary.json").read_text())
    assert summary["steps"] == {"start": 2, "end": 4}
    # 4 steps: first/last are single steps (mean_of_steps 1), so loss_first is step 1's loss
    assert summary["loss"]["mean_of_steps"] == summary_whole["loss"]["mean_of_steps"] == 1
    np.testing.assert_allclose(summary["loss"]["first"], a[1], rtol=1e-5)
    assert summary["loss"]["from_step"] == summary_whole["loss"]["from_step"] == 1
    np.testing.assert_allclose([summary["loss"]["first"], summary["loss"]["last"]],
                               [summary_whole["loss"]["first"], summary_whole["loss"]["last"]], rtol=1e-5)
    fields, fields_whole = summary_fields(out), summary_fields(out_whole)
    assert "loss_from_step" not in fields
    assert abs(float(fields["loss_first"]) - float(fields_whole["loss_first"])) <= 2e-4, (fields, fields_whole)
    assert re.search(r"^loss: first 1 steps \S+ -> last 1 steps", out, re.M), out[-4000:]
    assert "steps 3-4 run now" in out  # the throughput is this session's
    for o, s in ((out, summary), (out_whole, summary_whole)):
        assert_no_held_out_evaluation(o, s, "--eval-rows 0")


def test_too_little_data_for_held_out_rows(tmp_path):
    """4 packed rows: none can be held out (at most a fifth), so there is no held-out evaluation."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"document {i}: " + "abc " * 30}) + "\n" for i in range(4)))
    out = run_train(tmp_path / "run", "--data", str(path), "--steps", "1", "--samples", "0",
                    "--checkpoint-every", "0")
    assert "4 rows of 128 (" in out and "4 train, 0 held out" in out, out[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert_no_held_out_evaluation(out, summary, "4 rows of data, and at most a fifth are held out")


@pytest.mark.parametrize("extra,msg", [
    (["--d-model", "32"], "--d-model 32 (checkpoint: 64)"),
    (["--steps", "3"], "the checkpoint is at step 3, --steps is 3"),
])
def test_resume_refuses_a_mismatch(tmp_path, extra, msg):
    run_train(tmp_path, "--samples", "0", "--checkpoint-every", "0")
    train = _load_train()
    with pytest.raises(SystemExit, match=msg.replace("(", r"\(").replace(")", r"\)")):
        train.main([*TINY, "--run-dir", str(tmp_path), "--resume", *extra])


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    """A run folder that holds a checkpoint is continued with --resume or left alone (it was overwritten)."""
    run_train(tmp_path, "--samples", "0", "--checkpoint-every", "0")
    before = (tmp_path / "metrics.csv").read_text()
    train = _load_train()
    assert train.main([*TINY, "--run-dir", str(tmp_path), "--steps", "1"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.csv").read_text() == before


def test_resume_without_checkpoint_is_an_error(tmp_path):
    train = _load_train()
    with pytest.raises(SystemExit, match="no checkpoint"):
        train.main([*TINY, "--run-dir", str(tmp_path / "empty"), "--resume"])


def test_train_llama_through_the_integration(tmp_path):
    if not os.environ.get("CI"):
        pytest.importorskip("paddleformers")
    out = run_train(tmp_path / "run", "--model", "llama", "--n-kv-heads", "2", "--mask", "prefix-lm-document")
    assert "CHECK PASSED: Llama through paddle_fm3 vs PaddleFormers eager attention" in out
    assert_healthy(out)
    _, summary = assert_run_folder(tmp_path / "run", 3)
    assert_one_dense_mask_size(out, summary)
    assert summary["model"] == "llama" and "PaddleFormers eager" in summary["dense_comparison"]["dense_attention"]


def test_llama_without_paddleformers_says_so(tmp_path):
    """PaddleFormers made unimportable in the child (sys.modules entry None): a clear message, exit 2."""
    code = ("import sys, runpy; sys.modules['paddleformers'] = None; "
            f"sys.argv = [{str(TRAIN)!r}, *{TINY!r}, '--model', 'llama', '--run-dir', {str(tmp_path)!r}]; "
            f"runpy.run_path({str(TRAIN)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--model llama needs PaddleFormers: pip install paddleformers" in proc.stderr


# Input robustness: read_documents in-process


def test_non_utf8_file_names_file_and_line(tmp_path):
    train = _load_train()
    (tmp_path / "a.txt").write_text("fine\n", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("line one\nline two caf\u00e9\n".encode("latin-1"))
    with pytest.raises(SystemExit, match=r"b\.txt: line 2: not UTF-8 \(byte 0xe9 at column 13"):
        train.read_documents(str(tmp_path), "text", 0)
    got = train.read_documents(str(tmp_path), "text", 0, skip_bad=True)
    assert got.docs == [b"fine\n"] and got.skipped == 1


def test_binary_file_is_an_error(tmp_path):
    train = _load_train()
    (tmp_path / "blob.bin").write_bytes(b"text\nmore\n\x00\x01\x02")
    with pytest.raises(SystemExit, match=r"blob\.bin: line 3: binary data"):
        train.read_documents(str(tmp_path), "text", 0)


def test_jsonl_bad_lines(tmp_path):
    train = _load_train()
    path = tmp_path / "d.jsonl"
    lines = [b'{"text": "ok one"}', b'{"text": 5}', b'{"text": "caf\xe9"}', b"not json", b'{"other": "x"}',
             b'{"text": "ok two"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(SystemExit, match=r"d\.jsonl:2: field 'text' holds int, expected a string"):
        train.read_documents(str(path), "text", 0)
    got = train.read_documents(str(path), "text", 0, skip_bad=True)
    assert got.docs == [b"ok one", b"ok two"] and got.skipped == 4
    path.write_bytes(lines[0] + b"\n" + lines[2] + b"\n")
    with pytest.raises(SystemExit, match=r"d\.jsonl:2: not UTF-8 \(byte 0xe9 at column 14"):
        train.read_documents(str(path), "text", 0)


def test_jsonl_lone_surrogate_is_a_bad_line(tmp_path):
    """A JSON string escape of half a surrogate pair decodes to text UTF-8 cannot encode: once a
    UnicodeEncodeError traceback, also under --skip-bad."""
    train = _load_train()
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"text": "ok one"}\n{"text": "\\ud800 x"}\n{"text": "ok two"}\n')
    with pytest.raises(SystemExit, match=r"s\.jsonl:2: field 'text' holds '\\ud800' at character 1, not Unicode"):
        train.read_documents(str(path), "text", 0)
    got = train.read_documents(str(path), "text", 0, skip_bad=True)
    assert got.docs == [b"ok one", b"ok two"] and got.skipped == 1


def test_utf8_bom_is_accepted(tmp_path):
    train = _load_train()
    (tmp_path / "d.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "hello"}\n')
    assert train.read_documents(str(tmp_path / "d.jsonl"), "text", 0).docs == [b"hello"]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.txt").write_bytes(b"\xef\xbb\xbfhello\n")
    assert train.read_documents(str(tmp_path / "dir"), "text", 0).docs == [b"hello\n"]


def test_token_memory_stays_near_the_input_size(tmp_path):
    """One 16 MB document (--max-doc-len 0): reading and packing peak within a few times the input
    (int64 token lists once took ~44x)."""
    import tracemalloc

    train = _load_train()
    size = 16 * 2**20
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"text": "abcdefgh" * (size // 8)}) + "\n")
    tracemalloc.start()
    try:
        docs = train.read_documents(str(path), "text", 0).docs
        data = train.pack(docs, 512, "causal-document", question_frac=0.25, answer_len=96, prefix_frac=0.25)
        del docs
        data.rows(np.arange(8))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert data.n_rows == size // 512
    assert peak < 5 * size, f"peak {peak / size:.1f}x the input"
