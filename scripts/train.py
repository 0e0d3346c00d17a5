#!/usr/bin/env python
"""Train a small byte-level causal LM on packed real documents with FlashMask attention.

The main job of paddle_fm3: documents are packed back to back into fixed-length training
sequences, and every attention layer is ``paddle_fm3.flashmask_attention`` with the packed
document mask, expressed in O(S) ``startend_row_indices`` instead of a dense O(S^2) mask.

Default input (no download): the Python standard library's own ``*.py`` source files
(``sysconfig.get_paths()['stdlib']``, sorted by relative path, then shuffled with ``--seed``).
Other inputs: ``--data DIR`` (every text file under DIR, recursively, sorted) or
``--data FILE.jsonl`` (one JSON object per line, text in ``--text-field``).

Examples::

    python scripts/train.py                         # defaults: ~2-3 min on 2 CPU cores
    python scripts/train.py --check                 # + one-step check against Paddle's dense SDPA
    python scripts/train.py --mask share-question --steps 100
    python scripts/train.py --data corpus.jsonl --text-field content --seq-len 1024
"""

from __future__ import annotations

import argparse
import json
import math
import os
import importlib.util
import pathlib
import sys
import sysconfig
import time
from typing import List, NamedTuple, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if importlib.util.find_spec("paddle_fm3") is None:  # not installed: use this checkout
    sys.path.insert(0, str(ROOT))

import paddle  # noqa: E402
import paddle.nn as nn  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

import paddle_fm3  # noqa: E402
from paddle_fm3 import masks, reference  # noqa: E402

IGNORE = -100
VOCAB = 256  # byte-level tokens

MASK_HELP = """\
how documents are packed and masked (default: causal-document).
  causal-document:   documents are packed back to back; each token attends causally within
                     its own document only (causal FlashMask, C=1, LTS = end of the document).
  share-question:    each packed document is read as one question followed by several answers:
                     question = its first --question-frac of tokens, answers = the rest cut into
                     consecutive chunks of --answer-len tokens. Every answer attends to the
                     question and (causally) to itself, never to sibling answers, as in packed
                     RLHF/DPO batches where several responses share one prompt (causal, C=1).
                     Position ids of each answer restart right after the question.
  prefix-lm-document: the first --prefix-frac of each document is a bidirectional prefix
                     (attends to the whole prefix of its document), the rest is causal within
                     the document (non-causal FlashMask, C=2). No loss on prefix tokens whose
                     target is visible to them (that would be copying, not prediction).
In every mode the loss ignores positions whose next token lies in another document / answer."""


# ---------------------------------------------------------------------------
# Data: read documents, pack them into rows
# ---------------------------------------------------------------------------


def stdlib_files() -> List[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in root.rglob("*.py")
             if not ({"site-packages", "dist-packages", "__pycache__"} & set(f.relative_to(root).parts))]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def read_documents(data: Optional[str], text_field: str, max_doc_len: int) -> tuple[List[bytes], str]:
    """Return (documents as UTF-8 bytes, a description of the source), in deterministic order."""
    cap = max_doc_len if max_doc_len > 0 else None
    docs: List[bytes] = []
    if data is None:
        root = sysconfig.get_paths()["stdlib"]
        for f in stdlib_files():
            with open(f, "rb") as fh:
                docs.append(fh.read(cap) if cap else fh.read())
        source = f"Python stdlib *.py under {root}"
    else:
        path = pathlib.Path(data)
        if path.is_dir():
            for f in sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.relative_to(path).as_posix()):
                raw = f.read_bytes()
                if b"\x00" in raw[:8192]:  # binary, not text
                    continue
                docs.append(raw[:cap] if cap else raw)
            source = f"text files under {path}"
        elif path.is_file():
            with open(path, "r", encoding="utf-8") as fh:
                for ln, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SystemExit(f"error: {path}:{ln}: not valid JSON ({e})")
                    if not isinstance(rec, dict) or text_field not in rec:
                        raise SystemExit(f"error: {path}:{ln}: no field {text_field!r} (use --text-field)")
                    raw = str(rec[text_field]).encode("utf-8")
                    docs.append(raw[:cap] if cap else raw)
            source = f"JSONL {path} (field {text_field!r})"
        else:
            raise SystemExit(f"error: --data {data!r} is neither a directory nor a file")
    docs = [d for d in docs if len(d) > 0]
    if not docs:
        raise SystemExit("error: no non-empty documents found")
    return docs, source


class Packed(NamedTuple):
    tokens: np.ndarray       # int64 [N, S]
    labels: np.ndarray       # int64 [N, S], IGNORE where no valid target
    positions: np.ndarray    # int64 [N, S], position ids
    sri: np.ndarray          # int32 [N, 1, S, C] startend_row_indices
    causal: bool
    segments_per_row: float  # mean number of packed pieces per row


def _split_share_question(n: int, question_frac: float, answer_len: int):
    q = min(n, max(1, int(round(n * question_frac))))
    rest = n - q
    answers = [answer_len] * (rest // answer_len)
    if rest % answer_len:
        answers.append(rest % answer_len)
    return q, answers


def pack(docs: List[bytes], seq_len: int, mode: str, *, question_frac: float, answer_len: int,
         prefix_frac: float) -> Packed:
    """Pack documents back to back into rows of ``seq_len`` tokens.

    A document that does not fit in the rest of a row is cut; its remainder starts the next row
    as a new piece (the mask keeps the two pieces apart, so nothing leaks across rows). The tail
    of the last row is dropped if incomplete.
    """
    stream = np.frombuffer(b"".join(docs), dtype=np.uint8).astype(np.int64)
    n_rows = len(stream) // seq_len
    if n_rows == 0:
        raise SystemExit(f"error: only {len(stream)} tokens of data, less than one row of --seq-len {seq_len}")
    doc_ends = np.cumsum([len(d) for d in docs])
    tokens = stream[: n_rows * seq_len].reshape(n_rows, seq_len)
    labels = np.full((n_rows, seq_len), IGNORE, dtype=np.int64)
    positions = np.zeros((n_rows, seq_len), dtype=np.int64)
    rows_lens, rows_sq, rows_prefix = [], [], []
    di = 0
    for r in range(n_rows):
        lo, hi = r * seq_len, (r + 1) * seq_len
        lens = []
        start = lo
        while start < hi:
            while doc_ends[di] <= start:
                di += 1
            end = min(int(doc_ends[di]), hi)
            lens.append(end - start)
            start = end
        rows_lens.append(lens)
        t = tokens[r]
        off = 0
        sq_row, pre_row = [], []
        for n in lens:
            seg = slice(off, off + n)
            if mode == "share-question":
                q, answers = _split_share_question(n, question_frac, answer_len)
                sq_row.append((q, answers))
                positions[r, off: off + q] = np.arange(q)
                # question: next-token targets inside the question, and the last question token
                # predicts the first token of the first answer (visible chain: question -> answer 1)
                labels[r, off: off + q - 1] = t[off + 1: off + q]
                a0 = off + q
                if answers:
                    labels[r, off + q - 1] = t[a0]
                for a in answers:
                    positions[r, a0: a0 + a] = q + np.arange(a)
                    labels[r, a0: a0 + a - 1] = t[a0 + 1: a0 + a]  # within the answer only
                    a0 += a
            else:
                positions[r, seg] = np.arange(n)
                first = 0
                if mode == "prefix-lm-document":
                    p = int(n * prefix_frac)
                    pre_row.append(p)
                    # a prefix token sees the whole prefix: the target of positions < p-1 is
                    # visible to them, so they carry no loss. Position p-1 predicts token p (causal).
                    first = max(p - 1, 0)
                labels[r, off + first: off + n - 1] = t[off + first + 1: off + n]
            off += n
        rows_sq.append(sq_row)
        rows_prefix.append(pre_row)
    if mode == "causal-document":
        fm = masks.causal_document(rows_lens, seq_len)
    elif mode == "share-question":
        fm = masks.share_question(rows_sq, seq_len)
    elif mode == "prefix-lm-document":
        fm = masks.prefix_lm_document(rows_lens, rows_prefix, seq_len)
    else:
        raise ValueError(mode)
    return Packed(tokens, labels, positions, fm.startend_row_indices, fm.causal,
                  float(np.mean([len(x) for x in rows_lens])))


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


class Attention(nn.Layer):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.captured = None  # (q, k, v) when capturing for --check

    def forward(self, x, sri, causal: bool, capture: bool = False):
        b, s, _ = x.shape
        qkv = self.qkv(x).reshape([b, s, 3, self.h, self.d])
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, S, H, D] each
        if capture:
            self.captured = tuple(t.detach().clone() for t in (q, k, v))
        o = paddle_fm3.flashmask_attention(q, k, v, sri, causal=causal)
        return self.proj(o.reshape([b, s, self.h * self.d]))


class Block(nn.Layer):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, sri, causal, capture=False):
        x = x + self.attn(self.ln1(x), sri, causal, capture)
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Layer):
    def __init__(self, d_model: int, n_heads: int, n_layers: int, max_pos: int):
        super().__init__()
        init = nn.initializer.Normal(std=0.02)
        self.tok = nn.Embedding(VOCAB, d_model, weight_attr=paddle.ParamAttr(initializer=init))
        self.pos = nn.Embedding(max_pos, d_model, weight_attr=paddle.ParamAttr(initializer=init))
        self.blocks = nn.LayerList([Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, tokens, positions, sri, causal: bool, capture: bool = False):
        x = self.tok(tokens) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x, sri, causal, capture)
        return paddle.matmul(self.ln_f(x), self.tok.weight, transpose_y=True)  # tied output embedding


# ---------------------------------------------------------------------------
# --check: our attention vs Paddle's dense-mask SDPA
# ---------------------------------------------------------------------------


def check_against_dense(model: ByteLM, batch, causal: bool, rtol: float, seed: int) -> bool:
    """Compare out, dq, dk, dv of every layer's attention on one real batch with Paddle's SDPA.

    q, k, v are the real activations of the first training step. Paddle's
    ``scaled_dot_product_attention`` takes the same [B, S, H, D] layout and a boolean mask
    (True = attend) broadcastable to [B, H, S_q, S_k]; masks.to_dense gives exactly that
    ([B, 1, S, S]). Both see the same upstream gradient. Error metric per tensor:
    max|ours - dense| / max|dense| <= rtol, a scale-relative bound (elementwise relative error is
    meaningless for entries near 0). Two fp32 implementations with different summation orders
    can each be ~rtol/2 from the exact value (dq accumulates the most); where they differ by more
    than rtol, both are compared with the float64 reference (paddle_fm3.reference) and ours must
    satisfy err(ours) <= 2 err(dense) + rtol, the criterion of FlashAttention's own tests (rows
    that see one key make dq cancel to ~0, where dO.O and rowsum(P dP) round differently). Any
    mask error (a wrong row or column) shows up as O(1e-1) either way.
    """
    tokens, labels, positions, sri = batch
    with paddle.no_grad():
        model(tokens, positions, sri, causal, capture=True)
    sri_np = sri.numpy()
    dense = masks.to_dense(sri_np, causal, sri_np.shape[2])  # bool [B, 1, S, S], True = visible
    # leakage check: a labelled position must not see its own target
    b_idx, s_idx = np.nonzero(labels.numpy() != IGNORE)
    leaks = int(dense[b_idx, 0, s_idx, s_idx + 1].sum())
    ok = True
    if leaks:
        print(f"CHECK FAILED: {leaks} labelled positions can see their own target token", file=sys.stderr)
        ok = False
    empty_rows = ~dense.any(axis=-1)  # [B, 1, S]: fully masked rows (SDPA gives NaN there, we give 0)
    keep = paddle.to_tensor(~empty_rows[:, 0, :, None, None].astype(bool)).astype("float32")  # [B,S,1,1]
    dense_t = paddle.to_tensor(dense)
    rng = np.random.default_rng(seed)
    worst = 0.0
    exact_cache = {}

    def exact_of(li, q, k, v, dout):
        """float64 out, dq, dk, dv of layer li (paddle_fm3.reference)."""
        if li not in exact_cache:
            args = [t.numpy().astype(np.float64) for t in (q, k, v)]
            out, _ = reference.attention_forward(*args, sri_np, causal=causal)
            dq, dk, dv = reference.attention_backward(*args, dout.numpy().astype(np.float64), sri_np, causal=causal)
            exact_cache[li] = {"out": out, "dq": dq, "dk": dk, "dv": dv}
        return exact_cache[li]

    for li, blk in enumerate(model.blocks):
        q0, k0, v0 = blk.attn.captured
        blk.attn.captured = None
        dout = paddle.to_tensor(rng.standard_normal(q0.shape).astype("float32"))
        results = {}
        for name in ("fm3", "dense"):
            q, k, v = (t.clone() for t in (q0, k0, v0))
            for t in (q, k, v):
                t.stop_gradient = False
            if name == "fm3":
                o = paddle_fm3.flashmask_attention(q, k, v, sri, causal=causal)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_t, is_causal=False)
                o = paddle.where(keep > 0, o, paddle.zeros_like(o))
            (o * dout).sum().backward()
            results[name] = [o.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]
        for tname, a, ref in zip(("out", "dq", "dk", "dv"), results["fm3"], results["dense"]):
            if not (np.isfinite(a).all() and np.isfinite(ref).all()):
                print(f"CHECK FAILED: layer {li} {tname}: non-finite values "
                      f"(ours finite={np.isfinite(a).all()}, dense finite={np.isfinite(ref).all()})", file=sys.stderr)
                ok = False
                continue
            scale = float(np.abs(ref).max()) or 1.0
            err = float(np.abs(a - ref).max()) / scale
            if err > rtol:
                # Two fp32 implementations can each be ~rtol/2 off: then judge both against float64
                # and require ours to be no less accurate than (twice) Paddle's dense attention.
                exact = exact_of(li, q0, k0, v0, dout)[tname]
                e_ours = float(np.abs(a - exact).max()) / scale
                e_dense = float(np.abs(ref - exact).max()) / scale
                if e_ours > 2 * e_dense + rtol:
                    print(f"CHECK FAILED: layer {li} {tname}: max|ours-dense|/max|dense| = {err:.3e} > {rtol:.0e}, "
                          f"and vs float64 ours {e_ours:.2e} > 2 x dense {e_dense:.2e} + {rtol:.0e}",
                          file=sys.stderr)
                    ok = False
                err = e_ours
            worst = max(worst, err)
    n = len(model.blocks)
    if ok:
        print(f"CHECK PASSED: flashmask_attention matches Paddle dense-mask SDPA on {n} layers "
              f"(out, dq, dk, dv; worst scale-relative error {worst:.2e}; no label leakage)")
    return ok


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawTextHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=None,
                   help="folder of text files, or a .jsonl file; default: the Python stdlib's *.py sources")
    g.add_argument("--text-field", default="text", help="JSONL field holding the text (default: text)")
    g.add_argument("--max-doc-len", type=int, default=1024,
                   help="keep the first N bytes of each document, 0 = whole documents (default: 1024;\n"
                        "stdlib files have a median of ~6.5 KB, so this keeps several documents per row)")
    g.add_argument("--mask", choices=("causal-document", "share-question", "prefix-lm-document"),
                   default="causal-document", help=MASK_HELP)
    g.add_argument("--question-frac", type=float, default=0.25,
                   help="share-question: fraction of each document that is the question (default 0.25)")
    g.add_argument("--answer-len", type=int, default=96,
                   help="share-question: tokens per answer chunk (default 96)")
    g.add_argument("--prefix-frac", type=float, default=0.25,
                   help="prefix-lm-document: fraction of each document that is the prefix (default 0.25)")
    g = p.add_argument_group("model and training")
    g.add_argument("--seq-len", type=int, default=512, help="tokens per packed row (default 512)")
    g.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8)")
    g.add_argument("--steps", type=int, default=150, help="optimizer steps (default 150)")
    g.add_argument("--d-model", type=int, default=128)
    g.add_argument("--n-heads", type=int, default=4)
    g.add_argument("--n-layers", type=int, default=4)
    g.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    g.add_argument("--warmup", type=int, default=15, help="linear warm-up steps, then cosine decay")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--eval-rows", type=int, default=16,
                   help="held-out rows (the last ones packed) scored before and after training (0 = off)")
    g.add_argument("--seed", type=int, default=0, help="document order, init and batch order (default 0)")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="CPU math threads for Paddle's dense ops (default: all cores)")
    g = p.add_argument_group("checking")
    g.add_argument("--check", action="store_true",
                   help="before training, compare one step's attention output and dq/dk/dv of every\n"
                        "layer with paddle.nn.functional.scaled_dot_product_attention on the\n"
                        "equivalent dense mask (masks.to_dense); exit 1 on mismatch")
    g.add_argument("--check-rtol", type=float, default=1e-5,
                   help="--check tolerance: max|ours-dense| / max|dense| per tensor (default 1e-5, fp32)")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bar (for logs)")
    args = p.parse_args(argv)
    for name in ("seq_len", "batch_size", "steps", "answer_len", "d_model", "n_heads", "n_layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.d_model % args.n_heads:
        p.error("--d-model must be divisible by --n-heads")
    if args.eval_rows < 0 or args.threads < 0:
        p.error("--eval-rows and --threads must be >= 0")
    if not (math.isfinite(args.check_rtol) and args.check_rtol > 0):
        p.error("--check-rtol must be a finite number > 0")
    if not (math.isfinite(args.lr) and args.lr > 0) or not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        p.error("--lr must be a finite number > 0 and --weight-decay a finite number >= 0")
    if not 0.0 <= args.question_frac <= 1.0 or not 0.0 <= args.prefix_frac <= 1.0:
        p.error("--question-frac and --prefix-frac must be in [0, 1]")
    if args.warmup < 0 or args.max_doc_len < 0:
        p.error("--warmup and --max-doc-len must be >= 0")
    if not 0 <= args.seed < 2**32:
        p.error("--seed must be in [0, 2^32)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    paddle.set_device("cpu")
    if args.threads > 0 and hasattr(paddle.base.core, "set_num_threads"):
        paddle.base.core.set_num_threads(args.threads)
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    docs, source = read_documents(args.data, args.text_field, args.max_doc_len)
    order = rng.permutation(len(docs))
    docs = [docs[i] for i in order]
    data = pack(docs, args.seq_len, args.mask, question_frac=args.question_frac,
                answer_len=args.answer_len, prefix_frac=args.prefix_frac)
    n_rows = len(data.tokens)
    n_eval = min(args.eval_rows, n_rows // 5)
    train_idx = np.arange(n_rows - n_eval)
    eval_idx = np.arange(n_rows - n_eval, n_rows)
    if not np.any(data.labels[train_idx] != IGNORE):
        print("error: the packed training rows have no next-token targets (documents of one byte, --seq-len 1, "
              "or a prefix/question covering every document): nothing to train on", file=sys.stderr)
        return 2
    print(f"data: {len(docs)} documents from {source}; {n_rows * args.seq_len:,} byte tokens packed into "
          f"{n_rows} rows of {args.seq_len} ({data.segments_per_row:.2f} pieces/row; {len(train_idx)} train, "
          f"{n_eval} held out) in {time.perf_counter() - t0:.1f}s")

    b, s, h = args.batch_size, args.seq_len, args.n_heads
    sri_bytes = b * data.sri.shape[1] * s * data.sri.shape[3] * 4
    dense_bool = b * h * s * s
    print(f"mask: {args.mask} (causal={data.causal}, C={data.sri.shape[3]}); per step startend_row_indices "
          f"[{b}, {data.sri.shape[1]}, {s}, {data.sri.shape[3]}] int32 = {human_bytes(sri_bytes)} vs dense "
          f"[{b}, {h}, {s}, {s}] mask = {human_bytes(dense_bool)} bool / {human_bytes(4 * dense_bool)} fp32 "
          f"({dense_bool / sri_bytes:,.0f}x / {4 * dense_bool / sri_bytes:,.0f}x smaller); density "
          f"{masks.density(data.sri[:b], data.causal):.3f}")

    model = ByteLM(args.d_model, args.n_heads, args.n_layers, args.seq_len)
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"model: {args.n_layers} blocks, d_model {args.d_model}, {args.n_heads} heads, {n_params:,} parameters; "
          f"{args.steps} steps x {b} x {s} tokens")

    def batch_of(idx):
        return (paddle.to_tensor(data.tokens[idx]), paddle.to_tensor(data.labels[idx]),
                paddle.to_tensor(data.positions[idx]), paddle.to_tensor(np.ascontiguousarray(data.sri[idx])))

    def loss_of(batch):
        tokens, labels, positions, sri = batch
        logits = model(tokens, positions, sri, data.causal)
        # Mean over labelled positions only (Paddle 3.3's reduction='mean' with ignore_index
        # divides by all positions).
        flat = labels.reshape([-1])
        per_token = F.cross_entropy(logits.reshape([-1, VOCAB]), flat, ignore_index=IGNORE, reduction="none")
        n_labelled = (flat != IGNORE).astype("float32").sum().clip(min=1.0)
        return per_token.sum() / n_labelled

    def evaluate():
        if n_eval == 0:
            return float("nan")
        model.eval()
        with paddle.no_grad():
            vals = [float(loss_of(batch_of(eval_idx[i: i + b]))) for i in range(0, n_eval, b)]
        model.train()
        return float(np.mean(vals))

    # batch order: epochs over the training rows, each shuffled
    need = args.steps * b
    perm = np.concatenate([rng.permutation(train_idx) for _ in range(need // max(len(train_idx), 1) + 1)])[:need]

    if args.check:
        if not check_against_dense(model, batch_of(perm[:b]), data.causal, args.check_rtol, args.seed):
            print("CHECK FAILED: paddle_fm3.flashmask_attention disagrees with Paddle's dense-mask attention",
                  file=sys.stderr)
            return 1

    eval_before = evaluate()
    def lr_factor(st: int) -> float:  # linear warm-up, then cosine decay to 10% of the peak
        if st < args.warmup:
            return (st + 1) / args.warmup
        frac = min(1.0, (st - args.warmup) / max(args.steps - args.warmup, 1))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = paddle.optimizer.lr.LambdaDecay(args.lr, lr_factor)
    opt = paddle.optimizer.AdamW(sched, parameters=model.parameters(), weight_decay=args.weight_decay,
                                 grad_clip=nn.ClipGradByGlobalNorm(1.0))

    losses, step_times = [], []
    bar = tqdm(range(args.steps), desc="train", unit="step", disable=args.no_progress, dynamic_ncols=True)
    t_train = time.perf_counter()
    for step in bar:
        ts = time.perf_counter()
        loss = loss_of(batch_of(perm[step * b: (step + 1) * b]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        lv = float(loss)
        step_times.append(time.perf_counter() - ts)
        if not math.isfinite(lv):
            bar.close()
            print(f"error: non-finite loss {lv} at step {step + 1}", file=sys.stderr)
            return 1
        losses.append(lv)
        bar.set_postfix(loss=f"{lv:.3f}", tok_s=f"{b * s / step_times[-1]:,.0f}")
        if args.no_progress and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"step {step + 1}/{args.steps} loss {lv:.4f}")
    bar.close()
    train_s = time.perf_counter() - t_train
    eval_after = evaluate()

    k = max(1, min(10, len(losses) // 5))
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    steady = step_times[1:] if len(step_times) > 1 else step_times
    tok_s = b * s * len(steady) / sum(steady)
    print(f"loss: first {k} steps {first:.4f} -> last {k} steps {last:.4f} "
          f"({'falling' if last < first else 'NOT falling'}; ln(256) = {math.log(256):.3f} is chance)")
    if n_eval:
        print(f"held-out loss: {eval_before:.4f} before -> {eval_after:.4f} after ({n_eval} rows)")
    print(f"throughput: {tok_s:,.0f} tokens/s (excluding the first step); {train_s:.1f}s training, "
          f"{time.perf_counter() - t0:.1f}s total")
    print(f"SUMMARY mask={args.mask} steps={args.steps} loss_first={first:.4f} loss_last={last:.4f} "
          f"eval={eval_before:.4f}->{eval_after:.4f} tokens_per_s={tok_s:.0f} train_s={train_s:.1f} "
          f"mask_bytes={sri_bytes} dense_mask_bytes_bool={dense_bool} check={'passed' if args.check else 'off'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
