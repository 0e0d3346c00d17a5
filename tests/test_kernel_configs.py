"""The code generator's kernel-config contract (paddle_fm3_build/codegen.py; the rule:
paddle_fm3_build/kernel_rules.py): each Hopper config names the kernel that serves it, and a config no
kernel serves correctly stops the generator (so the build) naming the head dim."""

import copy
import pathlib

import pytest
import yaml

from paddle_fm3_build import codegen, kernel_rules  # (from the checkout: conftest.py)

ROOT = pathlib.Path(__file__).resolve().parent.parent

CFG = yaml.safe_load((ROOT / "yaml" / "kernel_configs.yaml").read_text())


def with_head_dim(fwd=None, bwd=None):
    cfg = copy.deepcopy(CFG)
    if fwd is not None:
        cfg["sm90"].append(fwd)
    if bwd is not None:
        cfg["sm90_bwd"].append(bwd)
    return cfg


def fwd(hd, bm=128, bn=64, st=2, wg=2, overlap=False, hdv=None):
    c = {"head_dim": hd, "block_m": bm, "block_n": bn, "stages": st, "consumer_warpgroups": wg,
         "intra_wg_overlap": overlap}
    return c if hdv is None else {**c, "head_dim_v": hdv}


def bwd(hd, bm=64, bn=64, st=2, hdv=None):
    c = {"head_dim": hd, "block_m": bm, "block_n": bn, "stages": st}
    return c if hdv is None else {**c, "head_dim_v": hdv}


def test_shipped_configs_state_their_kernel():
    cfg = codegen.check_kernel_configs(copy.deepcopy(CFG))
    pairs = [(64, 64), (80, 80), (96, 96), (128, 128), (192, 192), (192, 128), (256, 256)]
    assert [(c["head_dim"], c["head_dim_v"]) for c in cfg["sm90"]] == pairs
    assert [(c["head_dim"], c["head_dim_v"]) for c in cfg["sm90_bwd"]] == pairs
    assert all(c["kernel"] == "wgmma" for c in cfg["sm90"] + cfg["sm90_bwd"])
    # The mma.sync kernels are built beside the WGMMA ones only for equal head dims that are multiples of 64.
    assert {(c["head_dim"], c["head_dim_v"]) for c in cfg["sm90"] if c["fallback"]} == {(64, 64), (128, 128),
                                                                                         (192, 192), (256, 256)}
    assert [c["tile_dim"] for c in cfg["sm90_bwd"]] == [64, 128, 128, 128, 192, 192, 256]
    assert [(c["tile_dim"], c["tile_dim_v"]) for c in cfg["sm90"]] == [
        (64, 64), (128, 128), (128, 128), (128, 128), (192, 192), (192, 128), (256, 256)]
    header = codegen.gen_config_header(cfg)
    assert "{64, 64, 192, 128, 3, 3, 128, false, true, true}," in header
    assert "{128, 128, 128, 128, 2, 2, 128, true, true, true}," in header
    assert "{96, 96, 128, 128, 2, 2, 128, true, true, false},  // head_dim 96: wgmma\n" in header  # WGMMA only
    # the forward at 192: FlashAttention-4's 128 x 112 tiles; the mma.sync kernel on 64 keys
    assert "{192, 192, 128, 112, 2, 2, 64, true, true, true}," in header
    # the backward at 192 and 192/128: tile head dim 192, 64 x 96, two stages; the mma.sync kernels (192 only) on 64 keys
    assert "{192, 192, 192, 64, 96, 2, 64, true, true}," in header
    assert "{192, 128, 192, 64, 96, 2, 64, true, false}," in header
    assert "std::array<Sm90Config, 7> kSm90Configs" in header and "std::array<Sm90BwdConfig, 7> kSm90BwdConfigs" in header
    ns = {}
    exec(codegen.gen_py_config(cfg), ns)  # noqa: S102 - our own generated module
    assert ns["SM90_HEAD_DIMS"] == tuple(sorted(pairs))
    assert ns["HEAD_DIM_V_PAIRS"] == ((192, 128),)


def test_backward_split_d_stages_the_wgmma_kernel_takes():
    """The split-D backward: one stage at tile head dim 256, one or two at 192 (shared memory)."""
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(256, st=2) if c["head_dim"] == 256 else c for c in cfg["sm90_bwd"]]
    assert codegen.check_kernel_configs(cfg)["sm90_bwd"][-1]["kernel"] == "mma_sync"  # two stages do not fit
    cfg["sm90_bwd"] = [bwd(192, st=3) if c["head_dim"] == 192 and c.get("head_dim_v", 192) == 192 else c
                       for c in cfg["sm90_bwd"]]
    only_mma_sync = [c for c in codegen.check_kernel_configs(cfg)["sm90_bwd"] if c["head_dim_v"] == 192][0]
    assert only_mma_sync["kernel"] == "mma_sync" and only_mma_sync["tile_dim"] == 192  # three stages do not fit
    cfg["sm90_bwd"] = [bwd(256, st=17) if c["head_dim"] == 256 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(codegen.ConfigError, match=r"sm90_bwd head_dim 256: stages must be in \[1, 16\]"):
        codegen.check_kernel_configs(cfg)
    # 192/128 runs at tile head dim 192 too, and nothing else serves a value head dim of its own.
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(192, st=3, hdv=128) if c.get("head_dim_v") == 128 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(codegen.ConfigError, match=r"sm90_bwd head_dim 192/128: no kernel serves it: the WGMMA kernel: "
                                                  r"at tile head dim 192 .*one or two stages.*the mma.sync kernels: "
                                                  r"head_dim_v 128 != head_dim 192"):
        codegen.check_kernel_configs(cfg)


def test_backward_64x96_tiles_only_at_tile_head_dim_192():
    """FlashAttention-4's 64 x 96 backward tiles (bwd/mainloop_swap_dkv.cuh) serve 192 and 192/128 only."""
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(192, bn=96, st=1) if c["head_dim"] == 192 and c.get("head_dim_v", 192) == 192 else c
                       for c in cfg["sm90_bwd"]]
    served = [c for c in codegen.check_kernel_configs(cfg)["sm90_bwd"] if c["head_dim"] == 192]
    assert [c["kernel"] for c in served] == ["wgmma", "wgmma"]
    # the mma.sync fallback (192 only: one head dim) keeps 64-key blocks under them
    assert [(c["fallback"], c["fallback_block_n"]) for c in served] == [(True, 64), (False, 64)]
    cfg["sm90_bwd"] = [bwd(128, bn=96) if c["head_dim"] == 128 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(codegen.ConfigError, match=r"sm90_bwd head_dim 128: no kernel serves it: the WGMMA kernel: "
                                                  r"at tile head dim 128 .*; the mma.sync kernels: block_n must be 64 "
                                                  r"or 128, got 96"):
        codegen.check_kernel_configs(cfg)
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(256, bn=96, st=1) if c["head_dim"] == 256 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(codegen.ConfigError, match=r"sm90_bwd head_dim 256: no kernel serves it: the WGMMA kernel: "
                                                  r"at tile head dim 256 it takes 64 x 64 tiles and one stage"):
        codegen.check_kernel_configs(cfg)


def test_forward_112_key_blocks_keep_the_mma_sync_kernel_on_64():
    """Under the forward's 112-key blocks (FlashAttention-4's at 192) the mma.sync kernel keeps 64-key blocks,
    where it serves the head dim (the rule: a block_n that is not a multiple of 64 falls back to 64; at 192
    it could not take 112 itself)."""
    cfg = copy.deepcopy(CFG)
    cfg["sm90"] = [fwd(128, bn=112, overlap=True) if c["head_dim"] == 128 else c for c in cfg["sm90"]]
    served = [c for c in codegen.check_kernel_configs(cfg)["sm90"] if c["head_dim"] in (128, 192)]
    assert [(c["head_dim"], c["block_n"], c["kernel"], c["fallback"], c["fallback_block_n"]) for c in served] == [
        (128, 112, "wgmma", True, 64), (192, 112, "wgmma", True, 64), (192, 128, "wgmma", False, 128)]
    assert kernel_rules.fwd_mma_sync_error({**fwd(192, bn=112), "head_dim_v": 192}) is not None  # 112 keys: no


def test_installed_config_is_the_generated_one():
    from paddle_fm3 import _config
    cfg = codegen.check_kernel_configs(copy.deepcopy(CFG))
    assert _config.SM90_CONFIGS == cfg["sm90"] and _config.SM90_BWD_CONFIGS == cfg["sm90_bwd"]


@pytest.mark.parametrize("hd", [112, 160, 32, 48])
def test_a_head_dim_the_templates_serve_is_one_yaml_line(hd):
    """Any multiple of 16 up to 256 is served by the WGMMA kernels (padded to 64-column sub-tiles)."""
    cfg = codegen.check_kernel_configs(with_head_dim(fwd(hd), bwd(hd, bn=128 if hd <= 128 else 64,
                                                                 st=2 if hd <= 192 else 1)))
    assert cfg["sm90"][-1]["kernel"] == "wgmma" and cfg["sm90_bwd"][-1]["kernel"] == "wgmma"
    assert cfg["sm90"][-1]["fallback"] == (hd % 64 == 0)


@pytest.mark.parametrize("hd", [72, 100, 8, 272])
def test_head_dim_no_kernel_serves_is_rejected(hd):
    with pytest.raises(codegen.ConfigError, match=rf"sm90 head_dim {hd}: head_dim {hd}: no kernel serves it; "
                                                  r"the Hopper kernels serve multiples of 16 up to 256"):
        codegen.check_kernel_configs({**with_head_dim(fwd(hd), bwd(hd)), "cpu": {**CFG["cpu"], "max_head_dim": 512}})


def test_value_head_dim_no_kernel_serves_is_rejected_naming_both():
    with pytest.raises(codegen.ConfigError, match=r"sm90 head_dim 128/72: head_dim_v 72: no kernel serves it"):
        codegen.check_kernel_configs(with_head_dim(fwd(128, hdv=72), bwd(128, hdv=72)))


def test_backward_query_tile_of_128_is_the_wgmma_kernel_at_tile_head_dim_64_only():
    # The WGMMA backward takes 128-query tiles at head dim 64 (two 64-query sub-tiles of dS^T); at
    # head dim 128 its accumulators would not fit, and the mma.sync kernels take 64-row tiles only.
    cfg = copy.deepcopy(CFG)
    cfg["sm90_bwd"] = [bwd(64, bm=128, bn=128) if c["head_dim"] == 64 else c for c in cfg["sm90_bwd"]]
    assert codegen.check_kernel_configs(cfg)["sm90_bwd"][0]["kernel"] == "wgmma"
    cfg["sm90_bwd"] = [bwd(128, bm=128, bn=128) if c["head_dim"] == 128 else c for c in cfg["sm90_bwd"]]
    with pytest.raises(codegen.ConfigError, match="sm90_bwd head_dim 128: no kernel serves it: .*block_m must be 64"):
        codegen.check_kernel_configs(cfg)


def test_every_forward_head_dim_needs_a_backward():
    with pytest.raises(codegen.ConfigError, match="sm90 head_dim 160 has no sm90_bwd config"):
        codegen.check_kernel_configs(with_head_dim(fwd(160), None))
    with pytest.raises(codegen.ConfigError, match=r"sm90_bwd head_dim 160 has no sm90 \(forward\) config"):
        codegen.check_kernel_configs(with_head_dim(None, bwd(160, st=1)))
    with pytest.raises(codegen.ConfigError, match="sm90 head_dim 128/64 has no sm90_bwd config"):
        codegen.check_kernel_configs(with_head_dim(fwd(128, hdv=64), None))


@pytest.mark.parametrize("cfg, match", [
    (with_head_dim(fwd(256, bn=128), bwd(256 + 0, bn=64)), "sm90 head_dim 256 is listed twice"),
    (with_head_dim(fwd(160, bn=256), bwd(160)), r"sm90 head_dim 160: no kernel serves it: the WGMMA kernel: block_n "
                                                r"must be 64, 112 or 128, got 256; the mma.sync kernel: its XOR swizzle"),
    (with_head_dim(fwd(160, bm=64, wg=2), bwd(160)), r"sm90 head_dim 160: no kernel serves it: the WGMMA kernel: "
                                                     r"block_m \(64\) must be 64 rows per consumer warpgroup"),
    (with_head_dim(fwd(160, st=1), bwd(160)), r"sm90 head_dim 160: no kernel serves it: the WGMMA kernel: stages "
                                              r"must be in \[2, 16\]"),
    (with_head_dim(fwd(160), bwd(160, bm=128)), "sm90_bwd head_dim 160: no kernel serves it"),
    (with_head_dim(fwd(160), bwd(160, bn=32)), "sm90_bwd head_dim 160: no kernel serves it"),
    (with_head_dim(fwd(512), bwd(512)), "sm90 head_dim 512 exceeds cpu.max_head_dim 256"),
    (with_head_dim(fwd(0), bwd(192)), "sm90 head_dim 0: head_dim must be a positive integer"),
    (with_head_dim({"head_dim": 192}, bwd(192)), r"sm90: every entry needs exactly the keys .* \(head_dim_v optional\)"),
    (with_head_dim(fwd(160, overlap=1), bwd(160)), "sm90 head_dim 160: intra_wg_overlap must be true or false"),
])
def test_configs_no_kernel_serves_are_rejected(cfg, match):
    with pytest.raises(codegen.ConfigError, match=match):
        codegen.check_kernel_configs(cfg)


def test_generator_stops_before_writing(tmp_path):
    ydir = tmp_path / "yaml"
    ydir.mkdir()
    for name in ("ops.yaml", "backward.yaml"):
        (ydir / name).write_text((ROOT / "yaml" / name).read_text())
    (ydir / "kernel_configs.yaml").write_text(yaml.safe_dump(with_head_dim(fwd(100), bwd(100))))
    out = tmp_path / "gen"
    with pytest.raises(SystemExit, match="sm90 head_dim 100: head_dim 100: no kernel serves it"):
        codegen.generate(out, py_config=tmp_path / "c.py", yaml_dir=ydir)
    assert not out.exists() and not (tmp_path / "c.py").exists()
