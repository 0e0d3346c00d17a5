"""scripts/gen_ops.py's kernel-config contract: each Hopper config names the kernel that serves it,
and a config no kernel serves correctly stops the generator (so the build) naming the head dim."""

import copy
import pathlib
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gen_ops  # noqa: E402

CFG = yaml.safe_load((ROOT / "yaml" / "kernel_configs.yaml").read_text())


def with_head_dim(fwd=None, bwd=None):
    cfg = copy.deepcopy(CFG)
    if fwd is not None:
        cfg["sm90"].append(fwd)
    if bwd is not None:
        cfg["sm90_bwd"].append(bwd)
    return cfg


def fwd(hd, bm=128, bn=64, st=2, wg=2, overlap=False):
    return {"head_dim": hd, "block_m": bm, "block_n": bn, "stages": st, "consumer_warpgroups": wg,
            "intra_wg_overlap": overlap}


def bwd(hd, bm=64, bn=64, st=2):
    return {"head_dim": hd, "block_m": bm, "block_n": bn, "stages": st}


def test_shipped_configs_state_their_kernel():
    cfg = gen_ops.check_kernel_configs(copy.deepcopy(CFG))
    assert {c["head_dim"]: c["kernel"] for c in cfg["sm90"]} == {64: "wgmma", 128: "wgmma", 256: "wgmma"}
    assert {c["head_dim"]: c["kernel"] for c in cfg["sm90_bwd"]} == {64: "wgmma", 128: "wgmma", 256: "wgmma"}
    header = gen_ops.gen_config_header(cfg)
    assert "X(64, 192, 128, 3, 3, false, 1)" in header and "X(128, 128, 128, 2, 2, true, 1)" in header
    assert "X(256, 64, 64, 1, 1)" in header  # the backward at head dim 256: WGMMA, one stage
    ns = {}
    exec(gen_ops.gen_py_config(cfg), ns)  # noqa: S102 - our own generated module
    assert ns["SM90_HEAD_DIMS"] == (64, 128, 256)
    assert [c["kernel"] for c in ns["SM90_BWD_CONFIGS"]] == ["wgmma", "wgmma", "wgmma"]


def test_backward_at_head_dim_256_is_the_wgmma_kernel_with_one_stage_only():
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(256, st=2) if c["head_dim"] == 256 else c for c in cfg["sm90_bwd"]]
    assert gen_ops.check_kernel_configs(cfg)["sm90_bwd"][-1]["kernel"] == "mma_sync"  # two stages do not fit
    cfg["sm90_bwd"] = [bwd(256, st=17) if c["head_dim"] == 256 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(gen_ops.ConfigError, match=r"sm90_bwd head_dim 256: stages must be in \[1, 16\]"):
        gen_ops.check_kernel_configs(cfg)


def test_installed_config_is_the_generated_one():
    from paddle_fm3 import _config
    cfg = gen_ops.check_kernel_configs(copy.deepcopy(CFG))
    assert _config.SM90_CONFIGS == cfg["sm90"] and _config.SM90_BWD_CONFIGS == cfg["sm90_bwd"]


@pytest.mark.parametrize("hd", [96, 160, 32])
def test_head_dim_the_mma_sync_swizzle_cannot_lay_out_is_rejected(hd):
    # head_dim 96 once built, and its first forward call was an illegal memory access on the H200.
    with pytest.raises(gen_ops.ConfigError, match=rf"sm90 head_dim {hd}: no kernel serves it.*% 64"):
        gen_ops.check_kernel_configs(with_head_dim(fwd(hd), bwd(hd)))
    with pytest.raises(gen_ops.ConfigError, match=rf"sm90_bwd head_dim {hd}: no kernel serves it.*% 64"):
        gen_ops.check_kernel_configs(with_head_dim(None, bwd(hd)))


def test_head_dim_only_the_mma_sync_kernels_serve_is_stated():
    cfg = gen_ops.check_kernel_configs(with_head_dim(fwd(192), bwd(192)))
    assert cfg["sm90"][-1]["kernel"] == "mma_sync" and cfg["sm90_bwd"][-1]["kernel"] == "mma_sync"
    assert "//   head_dim 192: mma_sync" in gen_ops.gen_config_header(cfg)
    assert "X(192, 128, 64, 2, 2, false, 0)" in gen_ops.gen_config_header(cfg)


def test_backward_query_tile_of_128_is_the_wgmma_kernel_at_head_dim_64_only():
    # The WGMMA backward takes 128-query tiles at head dim 64 (two 64-query sub-tiles of dS^T); at
    # head dim 128 its accumulators would not fit, and the mma.sync kernels take 64-row tiles only.
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(64, bm=128, bn=128) if c["head_dim"] == 64 else c for c in cfg["sm90_bwd"]]
    assert gen_ops.check_kernel_configs(cfg)["sm90_bwd"][0]["kernel"] == "wgmma"
    cfg["sm90_bwd"] = [bwd(128, bm=128, bn=128) if c["head_dim"] == 128 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(gen_ops.ConfigError, match="sm90_bwd head_dim 128: block_m must be 64"):
        gen_ops.check_kernel_configs(cfg)


def test_every_forward_head_dim_needs_a_backward():
    with pytest.raises(gen_ops.ConfigError, match="sm90 head_dim 192 has no sm90_bwd config"):
        gen_ops.check_kernel_configs(with_head_dim(fwd(192), None))
    with pytest.raises(gen_ops.ConfigError, match=r"sm90_bwd head_dim 192 has no sm90 \(forward\) config"):
        gen_ops.check_kernel_configs(with_head_dim(None, bwd(192)))


@pytest.mark.parametrize("cfg, match", [
    (with_head_dim(fwd(256, bn=128), bwd(256 + 0, bn=64)), "sm90 head_dim 256 is listed twice"),
    (with_head_dim(fwd(192, bn=256), bwd(192)), "sm90 head_dim 192: the mma.sync kernel needs .* shared memory"),
    (with_head_dim(fwd(192, bm=64, wg=2), bwd(192)), r"sm90 head_dim 192: block_m \(64\) must be 64 rows per"),
    (with_head_dim(fwd(192, bn=40), bwd(192)), r"sm90 head_dim 192: block_n \(40\) must be a multiple of 16"),
    (with_head_dim(fwd(192), bwd(192, bm=128)), "sm90_bwd head_dim 192: block_m must be 64"),
    (with_head_dim(fwd(192), bwd(192, bn=32)), "sm90_bwd head_dim 192: block_n must be 64 or 128"),
    (with_head_dim(fwd(192, st=1), bwd(192)), r"sm90 head_dim 192: stages must be in \[2, 16\]"),
    (with_head_dim(fwd(512), bwd(512)), "sm90 head_dim 512 exceeds cpu.max_head_dim 256"),
    (with_head_dim(fwd(0), bwd(192)), "sm90 head_dim 0: head_dim must be a positive integer"),
    (with_head_dim({"head_dim": 192}, bwd(192)), "sm90: every entry needs exactly the keys"),
    (with_head_dim(fwd(192, overlap=1), bwd(192)), "sm90 head_dim 192: intra_wg_overlap must be true or false"),
])
def test_configs_no_kernel_serves_are_rejected(cfg, match):
    with pytest.raises(gen_ops.ConfigError, match=match):
        gen_ops.check_kernel_configs(cfg)


def test_generator_stops_before_writing(tmp_path):
    ydir = tmp_path / "yaml"
    ydir.mkdir()
    for name in ("ops.yaml", "backward.yaml"):
        (ydir / name).write_text((ROOT / "yaml" / name).read_text())
    (ydir / "kernel_configs.yaml").write_text(yaml.safe_dump(with_head_dim(fwd(96), bwd(96))))
    out = tmp_path / "gen"
    with pytest.raises(SystemExit, match="sm90 head_dim 96: no kernel serves it"):
        gen_ops.main(["--yaml-dir", str(ydir), "--out-dir", str(out), "--py-config", str(tmp_path / "c.py")])
    assert not out.exists() and not (tmp_path / "c.py").exists()
