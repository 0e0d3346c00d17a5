"""Which tile configs the Hopper kernels (ops/hopper/) serve: the one home of that rule.

codegen.py reads it to check yaml/kernel_configs.yaml and to state, in the generated
fm3_generated_config.h and paddle_fm3/_config.py, which kernel serves each entry, the padded tile
head dims the launchers instantiate and the constants below that the C++ side needs; the kernel
traits (fwd/traits.cuh, bwd/traits.cuh, mma_sync/fwd_kernel.cuh, mma_sync/bwd_kernel.cuh) only
assert the structural facts their code relies on.

Head dims. The WGMMA kernels keep Q, K, V, dO in 128-byte-swizzled sub-tiles of 64 columns; a head
dim that is not a multiple of 64 (80, 96) is served by the next multiple of 64, the TMA loads filling
the columns past it with zeros (exact: they add 0 to every product) and the stores writing only the
real ones. The forward reduces S = Q K^T over the real head dim only (k16 steps). The backward's tile
head dim (its shared-memory layout and the dQ accumulator's rows) is the smallest it is built for (64,
128, 192, 256) that holds both head dims; its products run at the larger head dim itself (80 and 96
reduce and accumulate over 80 and 96 columns), and at 192 and 256 (the split-D path) its two consumer
warpgroups split the row in halves, there the products of V and dO (dP^T, dV) at v's head dim rounded
up to 64 (192/128: 128).
The mma.sync kernels (fallback, and FM3_FWD_KERNEL / FM3_BWD_KERNEL=mma_sync) have no zero fill:
they serve equal head dims that are multiples of 64.
"""

from __future__ import annotations

SMEM_LIMIT = 227 * 1024  # shared memory per block on sm90 (fm3::kSm90SmemLimit in the generated header)
MAX_HEAD_DIM = 256
HEAD_DIM_STEP = 16  # k16 steps of the tensor-core products; TMA rows of 16-byte multiples
MMA_SYNC_MAX_BLOCK_M = 128  # the forward mma.sync kernel takes min(block_m, this) rows per tile
MMA_SYNC_BLOCK_M_BWD = 64  # the backward mma.sync kernels' warp layouts take 64 query rows
BWD_WGMMA_TILE_DIMS = (64, 128, 192, 256)  # head dims the WGMMA backward's layouts are built for
WGMMA = "wgmma"  # warp-specialized TMA + WGMMA kernel (fwd/kernel.cuh / bwd/kernel.cuh)
MMA_SYNC = "mma_sync"  # mma.sync kernel (mma_sync/fwd_kernel.cuh / mma_sync/bwd_kernel.cuh)


class ConfigError(ValueError):
    """A kernel config that no kernel serves correctly."""


def dims_name(hd: int, hdv: int) -> str:
    """How messages and generated comments name head dims: "192", or "192/128" for v's own."""
    return f"{hd}" if hdv == hd else f"{hd}/{hdv}"


def round64(d: int) -> int:
    return (d + 63) // 64 * 64


def head_dims_error(where: str, hd: int, hdv: int) -> str | None:
    """Why no Hopper kernel serves the head dims (q/k hd, v hdv), or None."""
    for name, d in (("head_dim", hd), ("head_dim_v", hdv)):
        if d % HEAD_DIM_STEP or not HEAD_DIM_STEP <= d <= MAX_HEAD_DIM:
            return (f"{where}: {name} {d}: no kernel serves it; the Hopper kernels serve multiples of "
                    f"{HEAD_DIM_STEP} up to {MAX_HEAD_DIM}")
    return None


def bwd_tile_dim(hd: int, hdv: int) -> int:
    """The WGMMA backward's tile head dim for head dims (hd, hdv)."""
    return next(t for t in BWD_WGMMA_TILE_DIMS if t >= max(hd, hdv))


# ---- forward ----------------------------------------------------------------------------------

def fwd_wgmma_error(c: dict) -> str | None:
    """Why the forward WGMMA kernel (FwdWgmmaTraits, fwd/traits.cuh) cannot serve config c, or None. (A tile
    past the 227 KiB of shared memory stops the build at FwdWgmmaTraits' static_assert.)"""
    bm, bn, st, wg = c["block_m"], c["block_n"], c["stages"], c["consumer_warpgroups"]
    if bn not in (64, 112, 128):
        return f"block_n must be 64, 112 or 128, got {bn}"
    if not (1 <= wg <= 3 and bm == 64 * wg):
        return f"block_m ({bm}) must be 64 rows per consumer warpgroup (1 to 3 of them)"
    if not 2 <= st <= 16:
        return f"stages must be in [2, 16], got {st}"
    return None


def fwd_mma_sync_error(c: dict) -> str | None:
    """Why the forward mma.sync kernel (FwdMmaSyncTraits in mma_sync/fwd_kernel.cuh) cannot serve c, on its
    tiles of min(block_m, MMA_SYNC_MAX_BLOCK_M) rows, or None."""
    hd, hdv, bn, wg = c["head_dim"], c["head_dim_v"], c["block_n"], c["consumer_warpgroups"]
    if hd != hdv:
        return f"head_dim_v {hdv} != head_dim {hd}: the mma.sync kernel takes one head dim"
    if hd % 64:
        return "its XOR swizzle of 16-byte chunks needs head_dim % 64 == 0"
    if c["block_m"] != 64 * wg:
        return f"block_m ({c['block_m']}) must be 64 rows per consumer warpgroup (64 x consumer_warpgroups = {64 * wg})"
    bm = min(c["block_m"], MMA_SYNC_MAX_BLOCK_M)
    if bn % 16:
        return f"block_n ({bn}) must be a multiple of 16"
    threads = 2 * bm  # bm / 16 warps
    if (bn * hd // 8) % threads:
        return (f"a {bn}-row K/V tile does not divide among {threads} threads "
                f"(block_n * head_dim / 8 must be a multiple of 2 * block_m)")
    smem = 2 * (bm * hd + 4 * bn * hd) + 4 * (threads + 32) + 4 * 2 * 4 * bn
    if smem > SMEM_LIMIT:
        return f"the mma.sync kernel needs {smem} bytes of shared memory, more than {SMEM_LIMIT}"
    return None


def serve_fwd(c: dict) -> dict:
    """c with ``kernel`` (the kernel that serves it), ``fallback`` (whether the mma.sync kernel is
    built for it too), ``fallback_block_n`` (the mma.sync kernel's key blocks: block_n where it is a
    multiple of 64, else 64: under the WGMMA kernel's 112-key blocks at 192 a 112-row tile's 16-byte
    chunks do not divide among the mma.sync kernel's threads; the block summary is made for the kernel
    that runs) and its padded tile head dims; ConfigError when neither kernel serves it."""
    where = f"sm90 head_dim {dims_name(c['head_dim'], c['head_dim_v'])}"
    if (e := head_dims_error(where, c["head_dim"], c["head_dim_v"])) is not None:
        raise ConfigError(e)
    wgmma_e = fwd_wgmma_error(c)
    fallback_block_n = 64 if wgmma_e is None and c["block_n"] % 64 else c["block_n"]
    mma_e = fwd_mma_sync_error({**c, "block_n": fallback_block_n})
    if wgmma_e is not None and mma_e is not None:
        raise ConfigError(f"{where}: no kernel serves it: the WGMMA kernel: {wgmma_e}; the mma.sync kernel: {mma_e}")
    return {**c, "kernel": WGMMA if wgmma_e is None else MMA_SYNC, "fallback": mma_e is None,
            "fallback_block_n": fallback_block_n,
            "tile_dim": round64(c["head_dim"]), "tile_dim_v": round64(c["head_dim_v"])}


# ---- backward ---------------------------------------------------------------------------------

def bwd_wgmma_error(c: dict) -> str | None:
    """Why the backward WGMMA kernel (BwdWgmmaTraits, bwd/traits.cuh) cannot serve config c, or None:
    64 x 128 tiles at tile head dims 64 / 128 (or 128 x 128 at 64), 64 x 64 tiles at 192 (one or two
    stages) or 64 x 96 (FlashAttention-4's shape there; whether two stages fit is BwdWgmmaTraits'
    shared-memory assert), and 256 (one stage: the 227 KiB hold no second)."""
    tile, bm, bn, st = bwd_tile_dim(c["head_dim"], c["head_dim_v"]), c["block_m"], c["block_n"], c["stages"]
    if tile == 192 and (bm, bn) == (64, 96) and 1 <= st <= 2:
        return None
    if tile in (192, 256):
        most = 2 if tile == 192 else 1
        if (bm, bn) == (64, 64) and 1 <= st <= most:
            return None
        shapes = "64 x 64 tiles (one or two stages) or 64 x 96" if tile == 192 else "64 x 64 tiles and one stage"
        return f"at tile head dim {tile} it takes {shapes}"
    if bn != 128 or not (bm == 64 or (bm == 128 and tile == 64)):
        return f"at tile head dim {tile} it takes 64 x 128 tiles (or 128 x 128 at 64)"
    return None if 2 <= st <= 16 else f"stages must be in [2, 16], got {st}"


def bwd_mma_sync_error(c: dict) -> str | None:
    """Why the backward mma.sync kernels (BwdMmaSyncTraits in mma_sync/bwd_kernel.cuh) cannot serve c, or None."""
    hd, hdv, bn = c["head_dim"], c["head_dim_v"], c["block_n"]
    if hd != hdv:
        return f"head_dim_v {hdv} != head_dim {hd}: the mma.sync kernels take one head dim"
    if hd % 64:
        return "their XOR swizzle of 16-byte chunks needs head_dim % 64 == 0"
    if bn not in (64, 128):
        return f"block_n must be 64 or 128, got {bn}"
    bm = MMA_SYNC_BLOCK_M_BWD
    ints = 4 * (4 * bn + 256 + 32)
    col = 2 * (2 * bn * hd + 4 * bm * hd + 2 * bm * bn) + ints
    row = 2 * (2 * bm * hd + 4 * bn * hd + bm * bn) + ints
    if max(col, row) > SMEM_LIMIT:
        return f"the mma.sync kernels need {max(col, row)} bytes of shared memory, more than {SMEM_LIMIT}"
    return None


def serve_bwd(c: dict) -> dict:
    """c with ``kernel``, ``fallback``, ``fallback_block_n`` and ``tile_dim``, the head dim of the kernel's
    tiles and of the dQ accumulator's rows: the WGMMA kernel's padded one, or head_dim where only the
    mma.sync kernels serve (they take no padding). fallback_block_n: the mma.sync kernels' key blocks,
    block_n, or 64 under the WGMMA kernel's 96-key blocks (their swizzled rows take multiples of 64; the
    block summary is made for the kernel that runs). A config only the mma.sync kernels serve must have
    block_m 64 (their warp layouts)."""
    where = f"sm90_bwd head_dim {dims_name(c['head_dim'], c['head_dim_v'])}"
    if (e := head_dims_error(where, c["head_dim"], c["head_dim_v"])) is not None:
        raise ConfigError(e)
    if not 1 <= c["stages"] <= 16:
        raise ConfigError(f"{where}: stages must be in [1, 16], got {c['stages']}")
    wgmma_e = bwd_wgmma_error(c)
    fallback_block_n = 64 if wgmma_e is None and c["block_n"] % 64 else c["block_n"]
    mma_e = bwd_mma_sync_error({**c, "block_n": fallback_block_n})
    if wgmma_e is not None and mma_e is None and c["block_m"] != MMA_SYNC_BLOCK_M_BWD:
        mma_e = f"block_m must be {MMA_SYNC_BLOCK_M_BWD} (their warp layouts), got {c['block_m']}"
    if wgmma_e is not None and mma_e is not None:
        raise ConfigError(f"{where}: no kernel serves it: the WGMMA kernel: {wgmma_e}; the mma.sync kernels: {mma_e}")
    return {**c, "kernel": WGMMA if wgmma_e is None else MMA_SYNC, "fallback": mma_e is None,
            "tile_dim": bwd_tile_dim(c["head_dim"], c["head_dim_v"]) if wgmma_e is None else c["head_dim"],
            "fallback_block_n": fallback_block_n}
