"""The main job's checkpoints and --resume (issue 45, items 1-3): a damaged, interrupted or mismatched
checkpoint is found and named in a one-line error, never trained on; an interrupted save is recovered;
a run that died after its last checkpoint can be finished; the dense comparison is skipped where it
would not fit in memory. Tiny CPU runs of examples/train_packed_lm.py (a few seconds each)."""

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train_packed_lm.py"
QUICK = ["--seq-len", "64", "--batch-size", "2", "--n-layers", "1", "--d-model", "32", "--max-doc-len", "100",
         "--eval-rows", "0", "--samples", "0", "--no-progress", "--checkpoint-every", "0", "--threads", "1"]


def write_data(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True)
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_text(f"document {i}: " + "the quick brown fox jumps. " * (3 + i % 5))
    return folder


def train(run_dir, data, *extra, cwd=ROOT, kill_between_renames=False):
    argv = [str(TRAIN), *QUICK, "--data", str(data), "--run-dir", str(run_dir), *extra]
    if kill_between_renames:  # the real script, killed between a save's two renames (checkpoint.old exists)
        code = ("import os, pathlib, runpy, sys\n"
                "rename = pathlib.Path.rename\n"
                "def killing_rename(self, target):\n"
                "    if self.name == 'checkpoint.tmp' and (self.parent / 'checkpoint.old').exists():\n"
                "        os._exit(137)\n"
                "    return rename(self, target)\n"
                "pathlib.Path.rename = killing_rename\n"
                f"sys.argv = {argv!r}\n"
                f"runpy.run_path({str(TRAIN)!r}, run_name='__main__')\n")
        cmd = [sys.executable, "-c", code]
        cwd = pathlib.Path(run_dir).parent  # not the checkout: "-c" puts the cwd first on sys.path
    else:
        cmd = [sys.executable, *argv]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def assert_clean_error(proc, *needles):
    """Non-zero exit, no traceback, and one "error: ..." line holding every needle."""
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), proc.stderr[-4000:]


def load_train():
    spec = importlib.util.spec_from_file_location("fm3_train_script", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def folder_digest(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def state_of(run_dir, name="checkpoint"):
    return json.loads((run_dir / name / "state.json").read_text())


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished 2-step run: (data folder, run folder). Tests work on copies."""
    root = tmp_path_factory.mktemp("base")
    data = write_data(root / "data")
    ok(train(root / "run", data, "--steps", "2"))
    return data, root / "run"


@pytest.fixture
def run(base, tmp_path):
    data, run_dir = base
    shutil.copytree(run_dir, tmp_path / "run")
    return data, tmp_path / "run"


# ---------------------------------------------------------------------------
# 1. A damaged or foreign checkpoint file is refused, naming the file
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.pdparams", "optimizer.pdopt"])
def test_damaged_checkpoint_file_is_refused(run, name):
    """Random bytes written into the middle of the file: it once resumed with garbage weights, exit 0."""
    data, run_dir = run
    path = run_dir / "checkpoint" / name
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 2
    raw[mid: mid + 64] = os.urandom(64)
    path.write_bytes(bytes(raw))
    proc = train(run_dir, data, "--steps", "3", "--resume")
    assert_clean_error(proc, f"checkpoint/{name}", "sha256")
    assert "resumed" not in proc.stdout


@pytest.mark.parametrize("name,damage,msg", [
    ("model.pdparams", lambda raw: raw[: len(raw) // 2], "its sha256 differs"),  # once an EOFError
    ("optimizer.pdopt", lambda raw: raw[: len(raw) // 2], "its sha256 differs"),
    ("optimizer.pdopt", None, "missing"),
])
def test_truncated_or_missing_checkpoint_file_is_refused(run, name, damage, msg):
    data, run_dir = run
    path = run_dir / "checkpoint" / name
    if damage is None:
        path.unlink()
    else:
        path.write_bytes(damage(path.read_bytes()))
    train_mod = load_train()
    with pytest.raises(SystemExit, match=rf"no usable checkpoint .*checkpoint/{name}: {msg}"):
        train_mod.main([*QUICK, "--data", str(data), "--run-dir", str(run_dir), "--steps", "3", "--resume"])


def test_model_file_of_another_run_is_refused(run, tmp_path):
    """model.pdparams of a --d-model 64 run copied in: once only Paddle's "Skip loading" warnings."""
    data, run_dir = run
    ok(train(tmp_path / "other", data, "--steps", "2", "--d-model", "64"))
    shutil.copy2(tmp_path / "other" / "checkpoint" / "model.pdparams", run_dir / "checkpoint" / "model.pdparams")
    assert_clean_error(train(run_dir, data, "--steps", "3", "--resume"), "checkpoint/model.pdparams")


def test_tensors_are_checked_against_the_fresh_model(tmp_path):
    """A file whose checksum matches but whose tensors do not (names, shapes, dtypes): the error names
    the file and the tensor."""
    train_mod = load_train()
    import paddle

    path = tmp_path / "model.pdparams"
    paddle.save(train_mod.ByteLM(64, 2, 1, 64).state_dict(), str(path))
    expected = train_mod.ByteLM(32, 2, 1, 64).state_dict()
    with pytest.raises(SystemExit, match=r"model\.pdparams: .*tok\.weight: float32 \[256, 64\] \(expected float32 "
                                         r"\[256, 32\]\)"):
        train_mod.load_tensors(path, expected)
    paddle.save(train_mod.ByteLM(32, 2, 2, 64).state_dict(), str(path))
    with pytest.raises(SystemExit, match=r"model\.pdparams: .*unexpected blocks\.1\."):
        train_mod.load_tensors(path, expected)
    sd = train_mod.ByteLM(32, 2, 1, 64).state_dict()
    sd["ln_f.weight"] = sd["ln_f.weight"].astype("float64")
    paddle.save(sd, str(path))
    with pytest.raises(SystemExit, match=r"ln_f\.weight: float64 \[32\] \(expected float32 \[32\]\)"):
        train_mod.load_tensors(path, expected)
    paddle.save(train_mod.ByteLM(32, 2, 1, 64).state_dict(), str(path))
    assert set(train_mod.load_tensors(path, expected)) == set(expected)


# ---------------------------------------------------------------------------
# 2. A kill between the two renames of a save
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed(base, tmp_path_factory):
    """Killed between the renames of the step-2 save: checkpoint.old (step 1), checkpoint.tmp (step 2),
    no checkpoint/."""
    data, _ = base
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    proc = train(run_dir, data, "--steps", "2", "--checkpoint-every", "1", kill_between_renames=True)
    assert proc.returncode == 137, (proc.stdout + proc.stderr)[-4000:]
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint.old", "checkpoint.tmp"]
    assert state_of(run_dir, "checkpoint.old")["step"] == 1 and state_of(run_dir, "checkpoint.tmp")["step"] == 2
    return data, run_dir


def test_run_without_resume_keeps_an_interrupted_save(killed, tmp_path):
    """It once started from step 0 and deleted both folders."""
    data, killed_dir = killed
    run_dir = tmp_path / "run"
    shutil.copytree(killed_dir, run_dir)
    before = folder_digest(run_dir)
    proc = train(run_dir, data, "--steps", "2")
    assert proc.returncode == 2 and "already holds a run (checkpoint.tmp/, checkpoint.old/)" in proc.stderr, \
        proc.stderr[-3000:]
    assert folder_digest(run_dir) == before


@pytest.mark.parametrize("tmp_complete,step", [(True, 2), (False, 1)])
def test_resume_takes_the_newest_complete_checkpoint(killed, tmp_path, tmp_complete, step):
    """--resume once said "no checkpoint". checkpoint.tmp without its state.json (a save killed while
    writing) is passed over for checkpoint.old."""
    data, killed_dir = killed
    run_dir = tmp_path / "run"
    shutil.copytree(killed_dir, run_dir)
    name = "checkpoint.tmp" if tmp_complete else "checkpoint.old"
    if not tmp_complete:
        (run_dir / "checkpoint.tmp" / "state.json").unlink()
    out = ok(train(run_dir, data, "--steps", "3", "--resume"))
    assert f"resumed from {run_dir / name} at step {step}" in out, out[-3000:]
    if not tmp_complete:
        assert "checkpoint.tmp/state.json: missing" in out, out[-3000:]
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    assert state_of(run_dir)["step"] == 3
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == {"start": step, "end": 3}


# ---------------------------------------------------------------------------
# 3. state.json, the data, a finished checkpoint, the dense comparison
# ---------------------------------------------------------------------------


def signed(state: dict) -> bytes:
    """state.json with its own sha256 recomputed, as the script writes it: the edits below test the
    checks of the fields behind that one."""
    return json.dumps({**state, "sha256": load_train().state_digest(state)}).encode()


def set_step(value):
    def edit(raw):
        return signed({**json.loads(raw), "step": value})
    return edit


def drop(key):
    def edit(raw):
        return signed({k: v for k, v in json.loads(raw).items() if k != key})
    return edit


@pytest.mark.parametrize("edit,msg", [
    (lambda raw: raw[: len(raw) // 2], r"state\.json: not valid JSON"),  # once an EOFError / JSONDecodeError
    (lambda raw: b"\xff\xfe\x00garbage" + raw, r"state\.json: not valid JSON"),  # once a UnicodeDecodeError
    (lambda raw: b"[1, 2]", r"state\.json: not a JSON object"),
    (drop("step"), r"state\.json: 'step' is None, not a positive integer"),  # once a KeyError
    (set_step(-3), r"state\.json: 'step' is -3, not a positive integer"),  # once "resumed at step -3"
    (set_step("1"), r"state\.json: 'step' is '1', not a positive integer"),
    (set_step(True), r"state\.json: 'step' is True, not a positive integer"),
    (drop("files"), r"state\.json: no sha256 of model\.pdparams, optimizer\.pdopt"),
    (drop("data"), r"state\.json: no digest of the data"),
    (set_step(99), r"the checkpoint is at step 99, --steps is 3"),
])
def test_bad_state_json_is_a_clear_error(run, edit, msg):
    data, run_dir = run
    path = run_dir / "checkpoint" / "state.json"
    path.write_bytes(edit(path.read_bytes()))
    train_mod = load_train()
    with pytest.raises(SystemExit, match=msg):
        train_mod.main([*QUICK, "--data", str(data), "--run-dir", str(run_dir), "--steps", "3", "--resume"])


@pytest.mark.parametrize("field,value", [("step", 1), ("args", {}), ("data", {"sha256": "0" * 64, "rows": 1})])
def test_edited_state_json_is_refused(run, field, value):
    """A field changed by hand (or by damage that keeps the JSON valid) no longer matches the file's
    own sha256: once "step": 2 -> 1 resumed the step-2 weights as step 1 and trained a step again."""
    data, run_dir = run
    path = run_dir / "checkpoint" / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    assert_clean_error(train(run_dir, data, "--steps", "3", "--resume"), "checkpoint/state.json",
                       "its fields differ from their sha256")
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "sha256"}))
    assert_clean_error(train(run_dir, data, "--steps", "3", "--resume"), "no sha256 of its own fields")


@pytest.mark.parametrize("content", [b"\xff\xfe\x00\x01garbage", b"step,loss\nx,y\n", b"a,b\n1,2\n"])
def test_unreadable_metrics_on_resume_is_a_clear_error(run, content):
    """Once a raw UnicodeDecodeError / ValueError / KeyError traceback."""
    data, run_dir = run
    (run_dir / "metrics.csv").write_bytes(content)
    assert_clean_error(train(run_dir, data, "--steps", "3", "--resume"), "metrics.csv")


@pytest.mark.parametrize("lr", ["1e4", "1e30"])
def test_diverged_training_is_an_error_without_a_checkpoint(tmp_path, lr):
    """Weights gone NaN: once exit 0, a "falling" loss of ln(256) (Paddle's CPU cross_entropy of NaN
    logits) and an all-NaN checkpoint."""
    data = write_data(tmp_path / "data")
    proc = train(tmp_path / "run", data, "--steps", "30", "--lr", lr)
    assert_clean_error(proc, "non-finite")
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_checkpoint_of_non_finite_weights_is_refused(tmp_path):
    """The last update's weights are not seen by any step's loss: save_checkpoint checks them and
    writes nothing when one is NaN."""
    import paddle

    train_mod = load_train()
    model = paddle.nn.Linear(2, 2)
    model.weight.set_value(paddle.to_tensor([[1.0, float("nan")], [0.0, 1.0]]))
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    with pytest.raises(SystemExit, match=r"error: non-finite weights after step 7 \(weight\); no checkpoint"):
        train_mod.save_checkpoint(tmp_path, model, opt, 7, None, {})
    assert not any(tmp_path.iterdir())


def test_bad_state_json_is_one_line_without_traceback(run):
    data, run_dir = run
    (run_dir / "checkpoint" / "state.json").write_bytes(os.urandom(40))
    assert_clean_error(train(run_dir, data, "--steps", "3", "--resume"), "no usable checkpoint",
                       "checkpoint/state.json")


def test_changed_data_is_refused(run, tmp_path):
    """The files under the same --data path changed (here: one shortened): once accepted."""
    data, run_dir = run
    moved = shutil.copytree(data, tmp_path / "moved")
    doc = moved / "doc03.txt"
    doc.write_text(doc.read_text()[:20])
    train_mod = load_train()
    with pytest.raises(SystemExit, match=r"the packed data differ from the checkpoint's: \d+ rows, sha256 \w+ "
                                         r"\(checkpoint: \d+ rows, sha256 \w+\)"):
        train_mod.main([*QUICK, "--data", str(moved), "--run-dir", str(run_dir), "--steps", "3", "--resume"])


def test_same_data_by_a_relative_path_resumes(run):
    """The same folder given by a relative path: once refused as a different --data."""
    data, run_dir = run
    out = ok(train(run_dir, data.name, "--steps", "3", "--resume", cwd=data.parent))
    assert "at step 2" in out


def test_finish_a_run_killed_after_its_last_checkpoint(run):
    """The last checkpoint written, then the run died (no summary.json): --resume with the same --steps
    finishes it (it once refused: "pass a larger --steps"). A finished run is still refused."""
    data, run_dir = run
    (run_dir / "summary.json").unlink()
    out = ok(train(run_dir, data, "--steps", "2", "--resume"))
    assert "no steps left to run" in out and "tokens_per_s=none" in out, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == {"start": 2, "end": 2} and summary["tokens_per_s"] is None
    assert summary["loss"]["from_step"] == 1
    assert_clean_error(train(run_dir, data, "--steps", "2", "--resume"), "the checkpoint is at step 2, --steps is 2")


def test_dense_comparison_skipped_where_it_would_not_fit(tmp_path, monkeypatch, capsys):
    """--seq-len 16384 --batch-size 2 once trained and checkpointed, then died in the dense comparison
    (MemoryError, 8 GiB, no summary.json). Here the available memory is made small instead."""
    train_mod = load_train()
    assert train_mod.dense_attention_bytes(2, 16384, 4, 4) > 8 * 2**30
    monkeypatch.setattr(train_mod, "available_memory_bytes", lambda: 2**16)
    data = write_data(tmp_path / "data")
    assert train_mod.main([*QUICK, "--data", str(data), "--run-dir", str(tmp_path / "run"), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "one step vs dense attention: skipped (it would need ~" in out and "64.0 KiB available" in out, out
    cmp = json.loads((tmp_path / "run" / "summary.json").read_text())["dense_comparison"]
    assert cmp["skipped"].startswith("it would need ~") and cmp["available_bytes"] == 2**16
    assert cmp["estimated_bytes"] == train_mod.dense_attention_bytes(2, 64, 4, 1)
    assert cmp["mask_bytes"]["dense_float32"] == 4 * 2 * 64 * 64
