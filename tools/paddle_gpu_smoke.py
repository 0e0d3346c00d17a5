#!/usr/bin/env python3
"""Smoke test of the Paddle op on a GPU, for a machine with a CUDA build of Paddle 3.x and
paddle_fm3 installed with its CUDA branch (README, Install).

For each case (mask family, head dim, dtype), on the same Paddle tensors:
  - the op (paddle_fm3.flashmask_attention, forward + backward through autograd) against the float64
    reference (paddle_fm3.reference): relative error of out, dq, dk, dv;
  - the op against the DLPack entry (paddle_fm3.kernels, handed the tensors through
    paddle.utils.dlpack, on Paddle's current stream): the same kernels, so out must agree to
    rounding (dq may differ in the order of its fp32 reductions);
  - the op against Paddle's own paddle.nn.functional.flashmask_attention, where that runs.
With FLAGS_cudnn_deterministic set, the op's backward must be bitwise repeatable (and equal to the
DLPack entry's deterministic mode). With two or more GPUs it also runs a case on the second GPU
while the first is current (the result must match the same case on the first GPU, and the first
must stay current), and checks that inputs on two devices are refused. Prints one line per check;
exit 1 on any failure, 2 when it cannot run here.

    python tools/paddle_gpu_smoke.py [--seqlens 1000 4096] [--head-dims 64 128] [--dtypes bf16 fp16]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # relative Frobenius error vs float64 (tests/gpu)
FAMILIES = ("causal", "causal_document", "share_question", "document", "random_eviction")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seqlens", type=int, nargs="+", default=[1000, 4096], help="sequence lengths (S_q = S_k)")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], help="head dims (64, 128, 256)")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=["bf16", "fp16"])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), help="mask families of paddle_fm3.masks.FAMILIES")
    p.add_argument("--heads", type=int, default=4, help="query heads (key/value heads: half of them, GQA)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> int:
    args = parse_args()
    try:
        import paddle
    except ImportError:
        print("paddle_gpu_smoke: needs Paddle with CUDA (paddlepaddle-gpu)")
        return 2
    if not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
        print("paddle_gpu_smoke: needs a CUDA build of Paddle and a GPU; this Paddle has "
              f"{'no CUDA' if not paddle.is_compiled_with_cuda() else 'no visible GPU'}")
        return 2
    import paddle.nn.functional as F
    import paddle.utils.dlpack

    import paddle_fm3
    from paddle_fm3 import kernels, masks, reference

    class ViaPaddleDLPack:
        """Hands a Paddle tensor to paddle_fm3.kernels through paddle.utils.dlpack."""

        def __init__(self, t):
            self.t = t
            self.shape = t.shape  # the entry checks shapes before it takes the capsule

        def __dlpack__(self, stream=None):
            return paddle.utils.dlpack.to_dlpack(self.t)

    dlpack_ok = kernels.available()
    if not dlpack_ok:
        print("note: paddle_fm3.kernels is not built here (scripts/gpu_build.sh && scripts/build_dlpack_ext.sh): "
              "the op-vs-DLPack checks are skipped")
    failures = 0

    def check(label: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{label:58s} {detail} {'ok' if ok else 'FAIL'}", flush=True)

    def run_op(q, k, v, sri, causal, dout):
        qs, ks, vs = (x.detach().clone() for x in (q, k, v))
        for x in (qs, ks, vs):
            x.stop_gradient = False
        out, lse = paddle_fm3.flashmask_attention(qs, ks, vs, sri, causal=causal, return_softmax_lse=True)
        out.backward(dout)
        return out, lse, qs.grad, ks.grad, vs.grad

    rng = np.random.default_rng(args.seed)
    gpu0 = paddle.CUDAPlace(0)
    for s in args.seqlens:
        for d in args.head_dims:
            for dt in args.dtypes:
                dtype = {"bf16": "bfloat16", "fp16": "float16"}[dt]
                for family in args.families:
                    fm = masks.FAMILIES[family](s, rng)
                    sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
                    h, hk = args.heads, max(1, args.heads // 2)
                    q, k, v, dout = (paddle.to_tensor(rng.standard_normal((1, s, n, d)).astype(np.float32), place=gpu0)
                                     .astype(dtype) for n in (h, hk, hk, h))
                    sri = paddle.to_tensor(sri_np, place=gpu0)
                    name = f"{family} S={s} D={d} {dt}"
                    out, lse, dq, dk, dv = run_op(q, k, v, sri, fm.causal, dout)
                    f64 = [x.astype("float32").numpy() for x in (q, k, v, dout)]
                    ro, _ = reference.attention_forward(*f64[:3], sri_np, causal=fm.causal)
                    rdq, rdk, rdv = reference.attention_backward(*f64, sri_np, causal=fm.causal)
                    got = [x.astype("float32").numpy() for x in (out, dq, dk, dv)]
                    errs = [rel(g, r) for g, r in zip(got, (ro, rdq, rdk, rdv))]
                    check(f"op vs float64 reference  {name}", all(np.isfinite(g).all() for g in got)
                          and errs[0] < TOL[dtype] and max(errs[1:]) < 2 * TOL[dtype],
                          "out/dq/dk/dv " + " ".join(f"{e:.1e}" for e in errs))

                    if dlpack_ok:
                        stream = paddle.device.current_stream(gpu0).stream_base.cuda_stream
                        o2, l2 = paddle.empty_like(q), paddle.empty_like(lse)
                        dq2, dk2, dv2 = paddle.empty_like(q), paddle.empty_like(k), paddle.empty_like(v)
                        kernels.flashmask_fwd(*(ViaPaddleDLPack(x) for x in (q, k, v, sri, o2, l2)),
                                              causal=fm.causal, stream=stream)
                        kernels.flashmask_bwd(*(ViaPaddleDLPack(x) for x in (q, k, v, o2, l2, dout, sri, dq2, dk2, dv2)),
                                              causal=fm.causal, stream=stream)
                        got2 = [x.astype("float32").numpy() for x in (o2, dq2, dk2, dv2)]
                        e2 = [rel(a, b) for a, b in zip(got, got2)]
                        lse_same = np.array_equal(lse.numpy(), l2.numpy())
                        check(f"op vs DLPack entry       {name}", e2[0] == 0.0 and lse_same and max(e2[1:]) < 1e-2,
                              "out/dq/dk/dv " + " ".join(f"{e:.1e}" for e in e2) + f" lse identical={lse_same}")

                    try:
                        qp, kp, vp = (x.detach().clone() for x in (q, k, v))
                        for x in (qp, kp, vp):
                            x.stop_gradient = False
                        op = F.flashmask_attention(qp, kp, vp, startend_row_indices=sri, causal=fm.causal)
                        op.backward(dout)
                        got3 = [x.astype("float32").numpy() for x in (op, qp.grad, kp.grad, vp.grad)]
                    except Exception as exc:  # noqa: BLE001 - Paddle's kernel has its own limits
                        print(f"{'op vs Paddle flashmask   ' + name:58s} skipped: Paddle's op raised "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    else:
                        e3 = [rel(a, b) for a, b in zip(got, got3)]
                        check(f"op vs Paddle flashmask   {name}", e3[0] < 2 * TOL[dtype] and max(e3[1:]) < 4 * TOL[dtype],
                              "out/dq/dk/dv " + " ".join(f"{e:.1e}" for e in e3))

    # FLAGS_cudnn_deterministic, the switch Paddle's own flash-attention backward follows: the op's
    # backward must then be bitwise repeatable, and equal to the DLPack entry's deterministic mode.
    s, d = args.seqlens[0], args.head_dims[0]
    fm = masks.FAMILIES["causal_document"](s, rng)
    sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
    q, k, v, dout = (paddle.to_tensor(rng.standard_normal((1, s, args.heads, d)).astype(np.float32), place=gpu0)
                     .astype("bfloat16") for _ in range(4))
    sri = paddle.to_tensor(sri_np, place=gpu0)
    flag = paddle.get_flags(["FLAGS_cudnn_deterministic"])
    paddle.set_flags({"FLAGS_cudnn_deterministic": True})
    try:
        runs = [[x.astype("float32").numpy() for x in run_op(q, k, v, sri, fm.causal, dout)] for _ in range(2)]
    finally:
        paddle.set_flags(flag)
    check(f"FLAGS_cudnn_deterministic: bitwise repeatable  S={s} D={d}",
          all(np.array_equal(a, b) for a, b in zip(*runs)), "out/lse/dq/dk/dv of two runs")
    if dlpack_ok:
        stream = paddle.device.current_stream(gpu0).stream_base.cuda_stream
        out, lse = (paddle.to_tensor(runs[0][i], place=gpu0) for i in (0, 1))
        dq2, dk2, dv2 = paddle.empty_like(q), paddle.empty_like(q), paddle.empty_like(q)
        kernels.flashmask_bwd(*(ViaPaddleDLPack(x) for x in (q, k, v, out.astype("bfloat16"), lse, dout, sri,
                                                             dq2, dk2, dv2)),
                              causal=fm.causal, deterministic=True, stream=stream)
        got = [x.astype("float32").numpy() for x in (dq2, dk2, dv2)]
        check(f"FLAGS_cudnn_deterministic: op = DLPack deterministic  S={s} D={d}",
              all(np.array_equal(a, b) for a, b in zip(got, runs[0][2:])), "dq/dk/dv bitwise")

    if paddle.device.cuda.device_count() >= 2:
        paddle.device.set_device("gpu:0")
        s, d, fm = args.seqlens[0], args.head_dims[0], masks.causal_document([args.seqlens[0] // 2, args.seqlens[0] - args.seqlens[0] // 2])
        host = [rng.standard_normal((1, s, args.heads, d)).astype(np.float32) for _ in range(4)]
        sri_np = np.ascontiguousarray(fm.startend_row_indices, dtype=np.int32)
        results = []
        for dev in (0, 1):
            place = paddle.CUDAPlace(dev)
            q, k, v, dout = (paddle.to_tensor(x, place=place).astype("bfloat16") for x in host)
            out, _, dq, dk, dv = run_op(q, k, v, paddle.to_tensor(sri_np, place=place), fm.causal, dout)
            results.append([x.astype("float32").numpy() for x in (out, dq, dk, dv)])
        current = paddle.device.get_device()
        e = [rel(a, b) for a, b in zip(results[1], results[0])]
        check("inputs on gpu:1 while gpu:0 is current", e[0] == 0.0 and max(e[1:]) < 1e-2 and current == "gpu:0",
              f"vs gpu:0 out/dq/dk/dv {' '.join(f'{x:.1e}' for x in e)}, current after: {current}")
        q0 = paddle.to_tensor(host[0], place=paddle.CUDAPlace(0)).astype("bfloat16")
        k1 = paddle.to_tensor(host[1], place=paddle.CUDAPlace(1)).astype("bfloat16")
        try:
            paddle_fm3.flashmask_attention(q0, k1, k1, paddle.to_tensor(sri_np, place=paddle.CUDAPlace(0)), causal=True)
        except ValueError as exc:
            check("q on gpu:0, k/v on gpu:1 refused", True, f"ValueError: {str(exc).splitlines()[0][:80]}")
        except Exception as exc:  # noqa: BLE001
            check("q on gpu:0, k/v on gpu:1 refused", False, f"{type(exc).__name__} (expected ValueError): {exc}")
        else:
            check("q on gpu:0, k/v on gpu:1 refused", False, "no error")
    else:
        print("note: one GPU: the multi-device checks are skipped")
    print(f"paddle_gpu_smoke: {'FAILED' if failures else 'ok'} ({failures} failed)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
