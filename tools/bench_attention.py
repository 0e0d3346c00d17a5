#!/usr/bin/env python3
"""Side-by-side forward benchmark on the GPU machine (no Paddle needed).

For each mask family of paddle_fm3.masks.FAMILIES, sequence length S and head dim D (bf16, 128K
tokens in total: batch = 128K / S; hidden 4096: heads = 4096 / D; `--head-dims 192x128` gives q and k
head dim 192 and v 128, MLA's), times in one run
  - this package's Hopper kernel (paddle_fm3.kernels.flashmask_fwd, block summary included),
  - torch.compile'd FlexAttention with a mask_mod reading the same four column vectors, on each of
    --flex-backends: "flash" (kernel_options={"BACKEND": "FLASH"}, the FlashAttention-4 CuTe DSL
    kernels; needs flash-attn-4, see ../shared/tools/fa4_anchor.sh, and FM3_EXTRA_SITE=/tmp/site) and
    "triton" (FlexAttention's default); create_block_mask time is not in the attention time,
  - cuDNN SDPA on the full and causal families,
  - FlashAttention-4's own call where the mask has one ("fa4"; needs flash-attn-4 as for "flash"):
    flash_attn_func on full, causal and causal sliding-window masks (window_size=(w, 0)),
    flash_attn_varlen_func with cu_seqlens on packed documents (document, causal_document: the
    documents read off the mask by paddle_fm3.mask_semantics.document_lengths); the row's fa4_call
    says which, and fa4_maxdiff / fa4_reldiff how far its output (backward: gradients) is from ours,
    element-wise / relative (the same mask, or one of the two is wrong: tools/check_peer_grads.py),
and the block-summary kernel alone (summary_pct: its GPU time from torch.profiler, in percent of
fm3's forward time). TFLOP/s count only visible pairs: 4 * B * H * D * pairs / t.
Each row carries family, head_dim, seqlen, batch, heads and the TFLOP/s of fm3, flex_flash,
flex_triton, cudnn and fa4 (null where a backend cannot run, with the reason under <backend>_error);
head_dim_v where it differs from head_dim. TFLOP/s with a value head dim D_v: 2 * B * H * (D + D_v) *
pairs / t.

    python3 tools/bench_attention.py --seqlens 32768 --head-dims 128 --out $OUT/bench.json

--bwd times the backward instead (paddle_fm3.kernels.flashmask_bwd, default and deterministic dQ;
FlexAttention's and cuDNN SDPA's backward through autograd). Backward FLOPs are 2.5x the forward's
(2 * B * H * (3 D + 2 D_v) * pairs: S, dP, dV, dK, dQ):

    python3 tools/bench_attention.py --bwd --total-tokens 32768 --seqlens 32768 --head-dims 128

Each call is timed alone (events around it, synchronized after it; median of --rep) unless
--back-to-back times --rep calls launched without synchronizing (mean: the host's per-call work then
overlaps the GPU's); --clocks also runs each implementation back to back for 2 s and adds its SM
clock and board power there (nvidia-smi, second half) and its TFLOP/s over those 2 s to the row as
<name>_sm_mhz / <name>_power_w / <name>_sustained, and after each row the plain bf16 GEMM's (gemm_*: the
board's reference under its power limit). --rounds N times each row's implementations N times
in alternating order and reports the medians, each round's value under <name>_rounds (for rows whose
ratio is within a run's spread of a target).

--random-params SEED [SEED ...] times every family once per seed, its parameters (document counts and
lengths, prefix lengths, window sizes, spans, evictions: paddle_fm3.masks.FAMILIES) drawn from the
seed and the family's name, so that a family is a distribution of instances and not the one instance
of seed 0; each row carries its params_seed and density. tools/bench_summary.py then gives the
worst ratio over the seeds:

    python3 tools/bench_attention.py --seqlens 8192 --head-dims 128 --random-params 1 2 3 --out rows.json
    python3 tools/bench_summary.py rows.json
"""
import argparse
import json
import os
import sys
import zlib

import numpy as np

if os.environ.get("FM3_EXTRA_SITE"):  # flash-attn-4 / CuTe DSL installed by fa4_anchor.sh (its .pth files)
    import site
    site.addsitedir(os.environ["FM3_EXTRA_SITE"])
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from paddle_fm3 import kernels, masks  # noqa: E402
from paddle_fm3.mask_semantics import column_bounds, document_lengths  # noqa: E402

torch = None  # imported by main() after argument parsing, so --help works where torch is absent
TOTAL = 128 * 1024
HIDDEN = 4096
FLEX_KERNEL_OPTIONS = {"flash": {"BACKEND": "FLASH"}, "triton": None}


# How bench() times (set from the command line): per call between synchronizations (the default,
# median; the GPU idles while the host prepares each call) or, with --back-to-back, the mean over
# `rep` calls launched without synchronizing (the host's work overlaps the previous call's, as in
# a training step). --clocks then also runs it back to back for 2 s (sustained_clocks).
TIMING = {"back_to_back": False, "clocks": False}
_last_clocks = None  # the latest bench()'s sustained_clocks() and timed seconds per call under --clocks


def kernel_times(fn, rep=20):
    """GPU seconds per call of fn in each kernel it launches (name -> seconds; torch.profiler's device
    events): for a kernel of a few microseconds, events around the call would time the host's launch
    instead."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rep):
            fn()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] = times.get(e.name, 0.0) + e.time_range.elapsed_us() / rep / 1e6
    return times


def kernel_seconds(fn, kernel_name, rep=20):
    """GPU seconds per call of fn spent in kernels whose name contains kernel_name (kernel_times)."""
    times = kernel_times(fn, rep)
    hits = [t for name, t in times.items() if kernel_name in name]
    if not hits:
        raise RuntimeError(f"the profiler recorded no kernel named *{kernel_name}*: {sorted(times)}")
    return sum(hits)


def sustained_clocks(fn, seconds=2.0):
    """fn called back to back for `seconds` while nvidia-smi samples the SM clock and board power every
    20 ms: (mean MHz, mean watts) over the second half (the clock settles under sustained load) and
    the seconds per call over the whole run."""
    import subprocess
    import threading
    import time
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "20"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    samples = []

    def read():
        for line in proc.stdout:
            try:
                samples.append((time.perf_counter(), *(float(x) for x in line.split(",")[:2])))
            except ValueError:
                continue

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not samples and proc.poll() is None:  # nvidia-smi takes a while to start sampling
        time.sleep(0.01)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(1, int(seconds / (time.perf_counter() - t0)))
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    end = time.perf_counter()
    proc.terminate()
    reader.join(1.0)
    steady = [x[1:] for x in samples if start + (end - start) / 2 <= x[0] <= end]
    if not steady:
        return None
    mhz, watts = np.mean(steady, axis=0)
    return float(mhz), float(watts), (end - start) / n


def gemm_sustained(n=16384):
    """The plain bf16 GEMM (torch.matmul, n x n x n) back to back for 2 s as sustained_clocks runs an
    attention call: gemm_sustained (TFLOP/s over those 2 s), gemm_sm_mhz, gemm_power_w."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    torch.matmul(a, b)  # cuBLAS set-up outside the call sustained_clocks sizes its run by
    torch.cuda.synchronize()
    clocks = sustained_clocks(lambda: torch.matmul(a, b))
    if clocks is None:
        return {}
    mhz, watts, t = clocks
    return {"gemm_sustained": round(2 * n**3 / t / 1e12, 1), "gemm_sm_mhz": round(mhz, 1), "gemm_power_w": round(watts, 1)}


def bench(fn, warmup=2, rep=8):
    """Seconds per call of fn (see TIMING)."""
    global _last_clocks
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if TIMING["back_to_back"]:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(rep):
            fn()
        b.record()
        b.synchronize()
        t = a.elapsed_time(b) / rep / 1e3
    else:
        ts = []
        for _ in range(rep):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        t = float(np.median(ts)) / 1e3
    clocks = sustained_clocks(fn) if TIMING["clocks"] else None
    _last_clocks = clocks + (t,) if clocks else None
    return t


def measure(row, impls, rounds=1):
    """row[name] = TFLOP/s for each name -> fn() of impls (fn None: the backend does not apply, row[name]
    None). Each is timed `rounds` times, the order reversed every other round so that none always runs
    first after the row's set-up; row[name] is the median over the rounds and, with rounds > 1,
    name_rounds lists every round's value (one machine's runs differ by several percent:
    BENCHMARKS.md). Under --clocks, the last round's clocks: name_sm_mhz, name_power_w and
    name_sustained (that round's TFLOP/s over its 2 s back to back). A peer backend that raises gets
    None and its reason under name_error; ours (fm3*) raising is a bug and stops the run."""
    names = list(impls)
    values, clocks, failed = {n: [] for n in names}, {}, set()
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            if impls[n] is None or n in failed:
                continue
            try:
                values[n].append(impls[n]())
                clocks[n] = _last_clocks
            except Exception as e:  # noqa: BLE001
                if n.startswith("fm3"):
                    raise
                failed.add(n)
                row[n + "_error"] = repr(e)[:300]
    for n in names:
        if impls[n] is None or n in failed:
            row[n] = None
            continue
        row[n] = float(np.median(values[n]))
        if rounds > 1:
            row[n + "_rounds"] = [round(v, 1) for v in values[n]]
        if clocks[n] is not None:  # (MHz, watts, seconds per call sustained, seconds per call timed)
            mhz, watts, t_sustained, t = clocks[n]
            row[n + "_sm_mhz"], row[n + "_power_w"] = round(mhz, 1), round(watts, 1)
            row[n + "_sustained"] = round(values[n][-1] * t / t_sustained, 1)


def normalized_vectors(sri, causal, sq, device="cuda"):
    """[B, Hm, S, C] -> four [B, S] int32 vectors (LTS, LTE, UTS, UTE), as fm3::load_column."""
    a = sri[:, 0]
    c = a.shape[-1]
    lts = a[..., 0]
    if causal:
        lte = a[..., 1] if c == 2 else np.full_like(lts, sq)
        uts = np.zeros_like(lts)
        ute = np.zeros_like(lts)
    elif c == 2:
        lte, uts, ute = np.full_like(lts, sq), np.zeros_like(lts), a[..., 1]
    else:
        lte, uts, ute = a[..., 1], a[..., 2], a[..., 3]
    return [torch.from_numpy(np.ascontiguousarray(x, dtype=np.int32)).to(device) for x in (lts, lte, uts, ute)]


class FlexMask:
    """FlexAttention's view of a FlashMask mask: a mask_mod reading the four column vectors from
    buffers that each family overwrites, so the compiled kernels are reused. Causal and non-causal
    are two mask_mods (the FLASH backend's CuTe DSL translation takes only tensor reads indexed by
    the mask_mod's arguments, no scalar flag)."""

    def __init__(self, b, s, device="cuda"):
        self.b, self.s, self.device = b, s, device
        self.vecs = [torch.zeros(b, s, dtype=torch.int32, device=device) for _ in range(4)]
        lts, lte, uts, ute = self.vecs

        def bidirectional(bi, hi, qi, kj):  # plain functions: create_block_mask rejects bound methods
            hidden = ((qi >= lts[bi, kj]) & (qi < lte[bi, kj])) | ((qi >= uts[bi, kj]) & (qi < ute[bi, kj]))
            return ~hidden

        def causal(bi, hi, qi, kj):
            return bidirectional(bi, hi, qi, kj) & (kj <= qi)
        self.mask_mods = {False: bidirectional, True: causal}
        self.causal = False

    def set_family(self, sri_np, causal):
        for buf, val in zip(self.vecs, normalized_vectors(sri_np, causal, self.s, self.device)):
            buf.copy_(val)
        self.causal = causal

    def block_mask(self, kv_block=128):
        """The BlockMask of the current family (128-query blocks of kv_block keys). _compile=True
        evaluates the mask_mod block by block instead of materializing the dense B x S x S mask (at S =
        128K that asks for 128 GiB)."""
        from torch.nn.attention.flex_attention import create_block_mask
        return create_block_mask(self.mask_mods[self.causal], self.b, None, self.s, self.s, device=self.device,
                                 BLOCK_SIZE=(128, kv_block), _compile=True)


def flex_call(fb, call, bmask, flex_mask, row):
    """call(block_mask) for FlexAttention backend fb. The FLASH backend takes key blocks that are a
    multiple of its tile (at head dim 192 it tiles keys by 112 and refuses the default 128-key blocks):
    then the block mask is rebuilt with key blocks of that tile, as a user would, and the row records
    it (flex_<fb>_kv_block)."""
    import re
    try:
        return call(bmask)
    except ValueError as e:
        m = re.search(r"multiple of tile_n=(\d+)", str(e))
        if fb != "flash" or m is None:
            raise
        row[f"flex_{fb}_kv_block"] = int(m.group(1))
        return call(flex_mask.block_mask(kv_block=int(m.group(1))))


def causal_window(sri_np, causal):
    """w where the mask is causal sliding-window attention (query i sees keys [i - w, i]) on every
    batch row and head, else None."""
    if not causal:
        return None
    bounds = column_bounds(sri_np, True)
    sk = bounds.shape[2]
    keys = np.arange(sk)
    lts, lte = bounds[..., 0], bounds[..., 1]
    w = int(lts.flat[0]) - 1
    if w < 0 or (lte != sk).any() or (lts != np.minimum(keys + w + 1, sk)).any():
        return None
    return w


def fa4_peer(sri_np, causal, b, s):
    """(name, fn(q, k, v) -> out) of the FlashAttention-4 call a user would make for this mask (q, k,
    v [B, S, H, D]), or None where FlashAttention-4 has none (FLASH-through-Flex is then the peer)."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731  (out, lse)
    docs = document_lengths(sri_np, causal)
    if docs is not None and max(len(r) for r in docs) > 1:
        cu = torch.tensor(np.concatenate([[0], np.cumsum([n for r in docs for n in r])]), dtype=torch.int32,
                          device="cuda")
        longest = max(n for r in docs for n in r)

        def varlen(q, k, v):
            flat = [x.reshape(b * s, *x.shape[2:]) for x in (q, k, v)]
            o = first(flash_attn_varlen_func(*flat, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                             max_seqlen_k=longest, causal=causal))
            return o.view(b, s, *o.shape[1:])
        return "flash_attn_varlen_func", varlen
    if docs is not None:
        return "flash_attn_func", lambda q, k, v: first(flash_attn_func(q, k, v, causal=causal))
    w = causal_window(sri_np, causal)
    if w is not None:
        return "flash_attn_func(window_size)", lambda q, k, v: first(flash_attn_func(q, k, v, window_size=(w, 0)))
    return None


def differences(theirs, ours):
    """(largest element-wise, largest relative Frobenius) difference over pairs of tensors: how far a
    peer's output or gradients are from ours (bench_summary.fa4_disagrees)."""
    mx = max(float((a.float() - b.float()).abs().max()) for a, b in zip(theirs, ours))
    rel = max(float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)) for a, b in zip(theirs, ours))
    return mx, rel


def with_fa4(row, sri_np, causal, b, s, use):
    """fa4_peer for the row, recording its call (fa4_call) or why it has none (fa4_error); None if
    not used (--no-fa4) or not applicable."""
    if not use:
        return None
    try:
        peer = fa4_peer(sri_np, causal, b, s)
    except ImportError as e:
        row["fa4_error"] = repr(e)[:300]
        return None
    if peer is not None:
        row["fa4_call"] = peer[0]
    return peer


def main():
    ap = argparse.ArgumentParser(description="Hopper attention benchmark vs FlexAttention and cuDNN SDPA "
                                 "(needs torch with CUDA and a Hopper GPU; see the module doc).")
    ap.add_argument("--seqlens", default="32768", help="comma-separated sequence lengths S")
    ap.add_argument("--head-dims", default="128",
                    help="comma-separated head dims D (heads = 4096 / D), or DxDV for a value head dim DV")
    ap.add_argument("--families", default=",".join(masks.FAMILIES), help="comma-separated mask families")
    ap.add_argument("--flex-backends", default="flash,triton",
                    help="comma-separated FlexAttention backends to time (flash, triton), or none")
    ap.add_argument("--no-fa4", action="store_true", help="leave out FlashAttention-4's own calls (fa4)")
    ap.add_argument("--out", default=None, help="write the result rows as JSON here")
    ap.add_argument("--bwd", action="store_true", help="benchmark the backward (see the module doc)")
    ap.add_argument("--total-tokens", type=int, default=TOTAL, help="batch = total / S")
    ap.add_argument("--rep", type=int, default=8, help="timed repetitions (median reported)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every implementation of a row this many times, in alternating order (median "
                         "reported, each round's value under <name>_rounds)")
    ap.add_argument("--back-to-back", action="store_true",
                    help="time --rep calls launched without synchronizing in between (mean), not each call alone")
    ap.add_argument("--random-params", type=int, nargs="+", metavar="SEED", default=None,
                    help="time each family once per seed, its parameters drawn from the seed (see the module doc)")
    ap.add_argument("--clocks", action="store_true",
                    help="also run each implementation back to back for 2 s: its SM clock and power there (nvidia-smi) "
                         "and its TFLOP/s over those 2 s; and the plain bf16 GEMM after each row (gemm_*)")
    args = ap.parse_args()
    if args.rounds < 1 or args.rep < 1:
        ap.error("--rounds and --rep must be at least 1")
    TIMING.update(back_to_back=args.back_to_back, clocks=args.clocks)
    if args.clocks:
        import shutil
        if shutil.which("nvidia-smi") is None:
            ap.error("--clocks needs nvidia-smi on PATH")
    global torch
    try:
        import torch as torch_module
    except ImportError:
        sys.exit("bench_attention.py needs torch with CUDA on a Hopper GPU (the device machine); "
                 "torch is not installed here")
    if not torch_module.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU (Hopper); torch sees none")
    torch = torch_module
    args.flex_backends = [] if args.flex_backends == "none" else args.flex_backends.split(",")
    for fb in args.flex_backends:
        if fb not in FLEX_KERNEL_OPTIONS:
            ap.error(f"--flex-backends: unknown backend {fb!r} (expected flash, triton or none)")
    if args.bwd:
        return main_bwd(args)
    return main_fwd(args)


def compiled_flex(backends):
    """{backend: compiled flex_attention(q, k, v, block_mask)} for the FlexAttention backends asked for."""
    from torch.nn.attention.flex_attention import flex_attention
    # The backward is timed by calling autograd.grad(retain_graph=True) repeatedly on one output; a
    # compiled backward with donated buffers refuses that (it did from the second shape on).
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    fns = {}
    for fb in backends:
        opts = FLEX_KERNEL_OPTIONS[fb]
        fns[fb] = torch.compile(
            lambda q, k, v, block_mask, opts=opts: flex_attention(q, k, v, block_mask=block_mask, kernel_options=opts),
            dynamic=False)
    return fns


def head_dim_pair(spec):
    """A head-dim argument, "D" or "DxDV" (q/k and v: 192x128 is MLA) -> (D, DV)."""
    parts = spec.split("x")
    if len(parts) > 2 or not all(x.isdigit() for x in parts):
        raise argparse.ArgumentTypeError(f"a head dim D or DxDV (e.g. 128, 192x128), got {spec!r}")
    return int(parts[0]), int(parts[-1])


def problems(args):
    """(d, dv, s, b, h) for every head dim (D or DxDV) and sequence length asked for."""
    for spec in args.head_dims.split(","):
        d, dv = head_dim_pair(spec)
        for s in [int(x) for x in args.seqlens.split(",")]:
            yield d, dv, s, max(1, args.total_tokens // s), HIDDEN // d


def dims_row(d, dv):
    """The head-dim fields of a row: head_dim, and head_dim_v where it differs."""
    return {"head_dim": d, **({"head_dim_v": dv} if dv != d else {})}


def family_rng(fam, seed):
    """The generator of a family's parameters: the benchmark's fixed instance (seed None: the
    generator of seed 0, as before --random-params), or one drawn from the seed and the family's name
    (the same instance on any machine)."""
    return np.random.default_rng(0 if seed is None else [seed, zlib.crc32(fam.encode())])


def instances(args):
    """(family, params_seed) of every row: each family once, or once per --random-params seed."""
    seeds = args.random_params or [None]
    return [(fam, seed) for fam in args.families.split(",") for seed in seeds]


def family_mask(fam, s, b, seed=None):
    """(startend_row_indices as int32 numpy, causal, visible pairs) of one family."""
    fm = masks.FAMILIES[fam](s, family_rng(fam, seed), batch=b)
    sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
    return sri_np, fm.causal, masks.density(sri_np, fm.causal) * b * s * s


def emit(rows, row, out):
    rows.append(row)
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


def print_table(rows, extra=()):
    cols = ["fm3", "fa4", "flex_flash", "flex_triton", "cudnn", *extra]
    peers = ("fa4", "flex_flash", "flex_triton", "cudnn")
    print("\n| D | S | family | density | " + " | ".join(cols) + " | " + " | ".join(f"fm3/{p}" for p in peers) + " |")
    print("|---|---|---|---|" + "---|" * (len(cols) + len(peers)))
    for r in rows:
        dims = f"{r['head_dim']}" + (f"/{r['head_dim_v']}" if "head_dim_v" in r else "")
        f = lambda key: "-" if r.get(key) is None else f"{r[key]:.0f}"  # noqa: E731
        ratio = lambda key: "-" if not r.get(key) else f"{r['fm3'] / r[key]:.2f}"  # noqa: E731
        print(f"| {dims} | {r['seqlen']} | {r['family']} | {r['density']:.3f} | "
              + " | ".join(f(c) for c in cols) + " | " + " | ".join(ratio(p) for p in peers) + " |")


def main_fwd(args):
    """Forward TFLOP/s of ours, FlexAttention (each backend) and cuDNN SDPA, in one run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flex = compiled_flex(args.flex_backends)
    rows = []
    for d, dv, s, b, h in problems(args):
        q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(v)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views
        flex_mask = FlexMask(b, s)
        for fam, seed in instances(args):
            sri_np, causal, pairs = family_mask(fam, s, b, seed)
            flops = 2.0 * h * (d + dv) * pairs
            sri = torch.from_numpy(sri_np).cuda()
            row = {"family": fam, **dims_row(d, dv), "seqlen": s, "batch": b, "heads": h,
                   "density": pairs / (b * s * s), **({"params_seed": seed} if seed is not None else {})}
            if flex:
                flex_mask.set_family(sri_np, causal)
                bmask = flex_mask.block_mask()

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return flops / bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal), rep=args.rep) / 1e12
            fa4 = with_fa4(row, sri_np, causal, b, s, not args.no_fa4)
            measure(row, {
                "fm3": lambda: flops / bench(lambda: kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal),
                                             rep=args.rep) / 1e12,
                "fa4": (lambda: flops / bench(lambda: fa4[1](q, k, v), rep=args.rep) / 1e12) if fa4 else None,
                **{"flex_" + fb: (lambda fb=fb: flex_call(fb, lambda bm: flops / bench(
                    lambda: flex[fb](qt, kt, vt, bm), rep=args.rep) / 1e12, bmask, flex_mask, row))
                   if fb in flex else None for fb in ("flash", "triton")},
                "cudnn": cudnn if fam in ("full", "causal") else None,
            }, args.rounds)
            if row.get("fa4"):
                kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
                row["fa4_maxdiff"], row["fa4_reldiff"] = differences([fa4[1](q, k, v)], [out])
            bn = kernels.block_n(d, dv)
            summ = torch.empty(b, 1, -(-s // bn), 8, dtype=torch.int32, device="cuda")
            ts = kernel_seconds(lambda: kernels.block_summary(sri, summ, causal=causal, seqlen_q=s, block_n=bn),
                                "block_summary_kernel")
            row["summary_pct"] = 100.0 * ts / (flops / row["fm3"] / 1e12)
            if args.clocks:
                row.update(gemm_sustained())
            emit(rows, row, args.out)
        del q, k, v, out, qt, kt, vt
        torch.cuda.empty_cache()
    print_table(rows)


def main_bwd(args):
    """Backward TFLOP/s (2.5x the forward's visible-pair FLOPs) of ours (default and deterministic dQ),
    FlexAttention (each backend) and cuDNN SDPA through autograd, in one run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flex = compiled_flex(args.flex_backends)
    rep = args.rep
    rows = []
    for d, d_v, s, b, h in problems(args):
        q, k = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(b, s, h, d_v, device="cuda", dtype=torch.bfloat16)
        do = torch.randn_like(v)
        out = torch.empty_like(v)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (qt, kt, vt))
        q4, k4, v4 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))  # FlashAttention-4's [B, S, H, D]
        flex_mask = FlexMask(b, s)
        for fam, seed in instances(args):
            sri_np, causal, pairs = family_mask(fam, s, b, seed)
            bwd_flops = 2.0 * h * (3 * d + 2 * d_v) * pairs
            sri = torch.from_numpy(sri_np).cuda()
            row = {"family": fam, **dims_row(d, d_v), "seqlen": s, "batch": b, "heads": h,
                   "density": pairs / (b * s * s), **({"params_seed": seed} if seed is not None else {})}

            def fm3_bwd(det=False):
                kernels.flashmask_bwd(q, k, v, out, lse, do, sri, dq, dk, dv, causal=causal, deterministic=det)
            kernels.flashmask_fwd(q, k, v, sri, out, lse, causal=causal)
            if flex:
                flex_mask.set_family(sri_np, causal)
                bmask = flex_mask.block_mask()

            def flex_bwd(fb):
                def call(bm):
                    o = flex[fb](qg, kg, vg, bm)
                    t = bench(lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True), warmup=1, rep=rep)
                    return bwd_flops / t / 1e12
                return flex_call(fb, call, bmask, flex_mask, row)

            def cudnn_bwd():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                    t = bench(lambda: torch.autograd.grad(o, (qg, kg, vg), dot, retain_graph=True),
                              warmup=1, rep=rep)
                return bwd_flops / t / 1e12
            fa4 = with_fa4(row, sri_np, causal, b, s, not args.no_fa4)

            def fa4_bwd():
                o = fa4[1](q4, k4, v4)
                t = bench(lambda: torch.autograd.grad(o, (q4, k4, v4), do, retain_graph=True), warmup=1, rep=rep)
                return bwd_flops / t / 1e12
            measure(row, {
                "fm3": lambda: bwd_flops / bench(fm3_bwd, warmup=1, rep=rep) / 1e12,
                "fa4": fa4_bwd if fa4 else None,
                "fm3_det": lambda: bwd_flops / bench(lambda: fm3_bwd(True), warmup=1, rep=rep) / 1e12,
                **{"flex_" + fb: (lambda fb=fb: flex_bwd(fb)) if fb in flex else None for fb in ("flash", "triton")},
                "cudnn": cudnn_bwd if fam in ("full", "causal") else None,
            }, args.rounds)
            if row.get("fa4"):  # the peer computes the same gradients, or it is the wrong peer
                fm3_bwd()
                grads = torch.autograd.grad(fa4[1](q4, k4, v4), (q4, k4, v4), do)
                row["fa4_maxdiff"], row["fa4_reldiff"] = differences(grads, (dq, dk, dv))
            if args.clocks:
                row.update(gemm_sustained())
            emit(rows, row, args.out)
        del q, k, v, do, out, dq, dk, dv, qt, kt, vt, dot, qg, kg, vg, q4, k4, v4
        torch.cuda.empty_cache()
    print_table(rows, extra=("fm3_det",))


if __name__ == "__main__":
    main()
