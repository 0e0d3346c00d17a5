#!/usr/bin/env python
"""Train a small byte-level causal LM on packed real documents with FlashMask attention.

The main job of paddle_fm3: documents are packed back to back into fixed-length training
sequences, and every attention layer is ``paddle_fm3.flashmask_attention`` with the packed
document mask, expressed in O(S) ``startend_row_indices`` instead of a dense O(S^2) mask.

Default input (no download): the Python standard library's own ``*.py`` source files
(``sysconfig.get_paths()['stdlib']``, sorted by relative path, then shuffled with ``--seed``).
Other inputs: ``--data DIR`` (every text file under DIR, recursively, sorted) or
``--data FILE.jsonl`` (one JSON object per line, text in ``--text-field``).

Each run leaves a folder (``--run-dir``, default ``runs/<timestamp>``): ``metrics.csv`` (one row
per step), ``loss.png`` (loss and tokens/s), ``checkpoint/`` (``--resume`` continues from it, after
checking its files' sha256, its tensors and that the data and arguments are the same),
``samples.txt`` (generated continuations) and ``summary.json`` (results, and one training step
compared with Paddle's dense-mask attention: time and mask memory; skipped where it would not fit
in memory).

Run it as ``bash scripts/run_main.sh [OPTIONS]`` (which sets up ``.venv`` first), or with
``python examples/train_packed_lm.py [OPTIONS]`` where paddle_fm3 is installed with the main job's
extra (``pip install --no-build-isolation ".[train]"``: tqdm for the progress bar, matplotlib for
loss.png). Examples::

    python examples/train_packed_lm.py               # defaults: ~3 min on 2 CPU cores
    python examples/train_packed_lm.py --check       # + one-step check against Paddle's dense SDPA
    python examples/train_packed_lm.py --mask share-question --steps 100
    python examples/train_packed_lm.py --data corpus.jsonl --text-field content --seq-len 1024
    python examples/train_packed_lm.py --run-dir runs/a --steps 300 --resume   # continue runs/a to step 300
    python examples/train_packed_lm.py --model llama # a PaddleFormers Llama through the integration
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import importlib.util
import pathlib
import shutil
import sys
import sysconfig
import time
from typing import List, NamedTuple, Optional

# The options come first: --help and argument errors answer before numpy and Paddle load
# (`bash scripts/run_main.sh --help` runs this with the system python3, before any set-up).

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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawTextHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--data", default=None,
                   help="a folder (every file in it, .jsonl included, is one plain-text document) or a\n"
                        ".jsonl file (one JSON object per line); default: the Python stdlib's *.py sources")
    g.add_argument("--text-field", default="text", help="JSONL field holding the text (default: text)")
    g.add_argument("--skip-bad", action="store_true",
                   help="skip (and count) files that are not UTF-8 text and malformed JSONL lines;\n"
                        "default: stop with an error naming the file and line")
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
    g.add_argument("--model", choices=("byte", "llama"), default="byte",
                   help="byte: the built-in byte-level transformer (default); llama: a PaddleFormers\n"
                        "LlamaForCausalLM with its attention through paddle_fm3\n"
                        "(paddle_fm3.integrations.paddleformers; needs PaddleFormers installed)")
    g.add_argument("--seq-len", type=int, default=512, help="tokens per packed row (default 512)")
    g.add_argument("--batch-size", type=int, default=8, help="rows per step (default 8)")
    g.add_argument("--steps", type=int, default=150, help="optimizer steps (default 150)")
    g.add_argument("--d-model", type=int, default=128)
    g.add_argument("--n-heads", type=int, default=4)
    g.add_argument("--n-layers", type=int, default=4)
    g.add_argument("--n-kv-heads", type=int, default=0,
                   help="--model llama: key/value heads (GQA; must divide --n-heads; default 0 = --n-heads)")
    g.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    g.add_argument("--warmup", type=int, default=15, help="linear warm-up steps, then cosine decay")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--eval-rows", type=int, default=16,
                   help="held-out rows (the last ones packed) scored before and after training (0 = off)")
    g.add_argument("--seed", type=int, default=0, help="document order, init and batch order (default 0)")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="CPU math threads for Paddle's dense ops (default: all cores)")
    g = p.add_argument_group("run folder")
    g.add_argument("--run-dir", default=None,
                   help="where the run leaves metrics.csv (per step), loss.png, checkpoint/, samples.txt\n"
                        "and summary.json (default: runs/<timestamp> in the current directory)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from its newest intact checkpoint up to --steps\n"
                        "(the total; a run that died after its last checkpoint is finished). The files\n"
                        "must match their sha256 in state.json, and the data (compared by content) and\n"
                        "the data, model and batch arguments the checkpoint's; the learning-rate\n"
                        "schedule is recomputed for the new total (a warm restart)")
    g.add_argument("--checkpoint-every", type=int, default=50,
                   help="also save the checkpoint every N steps (0 = only at the end; default 50)")
    g.add_argument("--samples", type=int, default=3,
                   help="continuations to generate into samples.txt at the end (default 3; 0 = none)")
    g.add_argument("--sample-len", type=int, default=80, help="bytes per generated continuation (default 80)")
    g = p.add_argument_group("checking")
    g.add_argument("--check", action="store_true",
                   help="before training, compare one step's attention output and dq/dk/dv of every\n"
                        "layer with paddle.nn.functional.scaled_dot_product_attention on the\n"
                        "equivalent dense mask (masks.to_dense); exit 1 on mismatch")
    g.add_argument("--check-rtol", type=float, default=1e-5,
                   help="--check tolerance: max|ours-dense| / max|dense| per tensor (default 1e-5, fp32)")
    g.add_argument("--no-progress", action="store_true",
                   help="no tqdm bar, a line per tenth of the run instead (the default when stdout or\n"
                        "stderr is not a terminal)")
    args = p.parse_args(argv)
    for name in ("seq_len", "batch_size", "steps", "answer_len", "d_model", "n_heads", "n_layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.d_model % args.n_heads:
        p.error("--d-model must be divisible by --n-heads")
    if args.eval_rows < 0 or args.threads < 0:
        p.error("--eval-rows and --threads must be >= 0")
    if args.checkpoint_every < 0 or args.samples < 0 or args.sample_len < 1:
        p.error("--checkpoint-every and --samples must be >= 0, --sample-len >= 1")
    if args.n_kv_heads < 0 or (args.n_kv_heads and args.n_heads % args.n_kv_heads):
        p.error("--n-kv-heads must divide --n-heads (0 = --n-heads)")
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


if __name__ == "__main__":
    parse_args()

import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
if importlib.util.find_spec("paddle_fm3") is None:  # not installed: use this checkout
    sys.path.insert(0, str(ROOT))

import paddle  # noqa: E402
import paddle.nn as nn  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
try:
    from tqdm import tqdm  # noqa: E402
except ImportError:  # the main job's extra, not a dependency of paddle_fm3
    sys.exit("examples/train_packed_lm.py needs tqdm for its progress bar: pip install tqdm, or the package with "
             "the main job's extra (pip install --no-build-isolation \".[train]\"; scripts/setup_env.sh does)")

import paddle_fm3  # noqa: E402
from paddle_fm3 import masks, reference  # noqa: E402

IGNORE = -100
VOCAB = 256  # byte-level tokens

# ---------------------------------------------------------------------------
# Data: read documents, pack them into rows
# ---------------------------------------------------------------------------


def stdlib_files() -> List[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = [f for f in root.rglob("*.py")
             if not ({"site-packages", "dist-packages", "__pycache__"} & set(f.relative_to(root).parts))]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


BOM = b"\xef\xbb\xbf"
NEWLINE = b"\n"


def _text_problem(raw: bytes) -> Optional[str]:
    """Why ``raw`` is not UTF-8 text (naming the line and column), or None."""
    nul = raw.find(b"\x00")
    if nul >= 0:
        return f"line {raw.count(NEWLINE, 0, nul) + 1}: binary data (a NUL byte), not text"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = raw.rfind(NEWLINE, 0, e.start) + 1
        return (f"line {raw.count(NEWLINE, 0, e.start) + 1}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                f"{e.start - line_start + 1}: {e.reason})")
    return None


class Documents(NamedTuple):
    docs: List[bytes]  # UTF-8 bytes, BOM removed
    source: str        # a description of the source
    skipped: int       # files / lines skipped under --skip-bad (or stdlib files that are not UTF-8)


def read_documents(data: Optional[str], text_field: str, max_doc_len: int, skip_bad: bool = False) -> Documents:
    """Read the documents in deterministic order.

    A file that is not UTF-8 text (a NUL byte, or an invalid UTF-8 sequence), or a JSONL line that
    is not UTF-8, not a JSON object, lacks ``text_field`` or holds a non-string there, is an error
    naming the file and line (``SystemExit``), or is skipped and counted with ``skip_bad``. The
    default stdlib source always skips (a few test modules are Latin-1 on purpose). A UTF-8 BOM
    is accepted and removed."""
    cap = max_doc_len if max_doc_len > 0 else None
    docs: List[bytes] = []
    skipped = 0

    def bad(where: str, problem: str, skip: bool):
        nonlocal skipped
        if not skip:
            raise SystemExit(f"error: {where}: {problem} (--skip-bad skips such input)")
        skipped += 1

    def add_file(f: pathlib.Path, skip: bool):
        raw = f.read_bytes()
        raw = raw[len(BOM):] if raw.startswith(BOM) else raw
        problem = _text_problem(raw)
        if problem:
            bad(str(f), problem, skip)
        else:
            docs.append(raw[:cap] if cap else raw)

    if data is None:
        root = sysconfig.get_paths()["stdlib"]
        for f in stdlib_files():
            add_file(f, True)
        source = f"Python stdlib *.py under {root}"
    else:
        path = pathlib.Path(data)
        if path.is_dir():
            for f in sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.relative_to(path).as_posix()):
                add_file(f, skip_bad)
            source = f"text files under {path}"
        elif path.is_file():
            with open(path, "rb") as fh:
                for ln, raw in enumerate(fh, 1):
                    if ln == 1 and raw.startswith(BOM):
                        raw = raw[len(BOM):]
                    where = f"{path}:{ln}"
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        bad(where, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}: {e.reason})",
                            skip_bad)
                        continue
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        bad(where, f"not valid JSON ({e})", skip_bad)
                        continue
                    if not isinstance(rec, dict) or text_field not in rec:
                        bad(where, f"no field {text_field!r} (use --text-field)", skip_bad)
                        continue
                    text = rec[text_field]
                    if not isinstance(text, str):
                        bad(where, f"field {text_field!r} holds {type(text).__name__}, expected a string", skip_bad)
                        continue
                    del rec, line
                    try:
                        encoded = text.encode("utf-8")
                    except UnicodeEncodeError as e:  # a lone surrogate escape, e.g. "\ud800"
                        bad(where, f"field {text_field!r} holds {e.object[e.start:e.end]!r} at character "
                                   f"{e.start + 1}, not Unicode text", skip_bad)
                        continue
                    docs.append(encoded[:cap] if cap else encoded)
            source = f"JSONL {path} (field {text_field!r})"
        else:
            raise SystemExit(f"error: --data {data!r} is neither a directory nor a file")
    docs = [d for d in docs if len(d) > 0]
    if not docs:
        raise SystemExit("error: no non-empty documents found"
                         + (f" ({skipped} skipped as not UTF-8 text or malformed)" if skipped else ""))
    return Documents(docs, source, skipped)


def _split_share_question(n: int, question_frac: float, answer_len: int):
    q = min(n, max(1, int(round(n * question_frac))))
    rest = n - q
    answers = [answer_len] * (rest // answer_len)
    if rest % answer_len:
        answers.append(rest % answer_len)
    return q, answers


class Packed:
    """Documents packed back to back into rows of ``seq_len`` byte tokens.

    Holds the byte stream (uint8, one byte per token) and where the pieces of each row begin; the
    per-row labels, position ids and ``startend_row_indices`` are built for the rows asked for
    (``rows``), so memory stays about the size of the input."""

    def __init__(self, stream: np.ndarray, seq_len: int, piece_bounds: np.ndarray, mode: str, *,
                 question_frac: float, answer_len: int, prefix_frac: float):
        self.tokens = stream.reshape(-1, seq_len)  # uint8 [N, S]
        self.seq_len, self.mode = seq_len, mode
        self.question_frac, self.answer_len, self.prefix_frac = question_frac, answer_len, prefix_frac
        self.causal = mode != "prefix-lm-document"
        self.mask_cols = 1 if self.causal else 2
        self._bounds = piece_bounds  # int64: 0, every document end and row boundary, N * S
        self._row_first = np.searchsorted(piece_bounds, np.arange(len(self.tokens) + 1) * seq_len)

    @property
    def n_rows(self) -> int:
        return len(self.tokens)

    def identity(self) -> dict:
        """What --resume checks the data by: the sha256 of the packed bytes and of where each row's
        pieces begin (so changed files are caught, wherever --data points), and the row count."""
        h = hashlib.sha256(np.ascontiguousarray(self.tokens).reshape(-1))
        h.update(self._bounds.tobytes())
        return {"sha256": h.hexdigest(), "rows": self.n_rows}

    @property
    def segments_per_row(self) -> float:
        return (len(self._bounds) - 1) / self.n_rows

    def pieces(self, r: int) -> List[int]:
        """Lengths of the document pieces in row r (they sum to seq_len)."""
        return np.diff(self._bounds[self._row_first[r]: self._row_first[r + 1] + 1]).tolist()

    def rows(self, idx) -> tuple:
        """tokens, labels (IGNORE where no valid target), position ids: int64 [n, S];
        startend_row_indices: int32 [n, 1, S, C] of the rows ``idx``."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        s = self.seq_len
        tokens = self.tokens[idx].astype(np.int64)
        labels = np.full((len(idx), s), IGNORE, dtype=np.int64)
        positions = np.zeros((len(idx), s), dtype=np.int64)
        rows_lens, rows_sq, rows_prefix = [], [], []
        for i, r in enumerate(idx):
            lens = self.pieces(int(r))
            rows_lens.append(lens)
            t = tokens[i]
            off = 0
            sq_row, pre_row = [], []
            for n in lens:
                if self.mode == "share-question":
                    q, answers = _split_share_question(n, self.question_frac, self.answer_len)
                    sq_row.append((q, answers))
                    positions[i, off: off + q] = np.arange(q)
                    # question: next-token targets inside the question, and the last question token
                    # predicts the first token of the first answer (visible chain: question -> answer 1)
                    labels[i, off: off + q - 1] = t[off + 1: off + q]
                    a0 = off + q
                    if answers:
                        labels[i, off + q - 1] = t[a0]
                    for a in answers:
                        positions[i, a0: a0 + a] = q + np.arange(a)
                        labels[i, a0: a0 + a - 1] = t[a0 + 1: a0 + a]  # within the answer only
                        a0 += a
                else:
                    positions[i, off: off + n] = np.arange(n)
                    first = 0
                    if self.mode == "prefix-lm-document":
                        p = int(n * self.prefix_frac)
                        pre_row.append(p)
                        # a prefix token sees the whole prefix: the target of positions < p-1 is
                        # visible to them, so they carry no loss. Position p-1 predicts token p (causal).
                        first = max(p - 1, 0)
                    labels[i, off + first: off + n - 1] = t[off + first + 1: off + n]
                off += n
            rows_sq.append(sq_row)
            rows_prefix.append(pre_row)
        n = len(idx)
        if self.mode == "causal-document":
            fm = masks.causal_document(rows_lens, s, batch=n)
        elif self.mode == "share-question":
            fm = masks.share_question(rows_sq, s, batch=n)
        else:
            fm = masks.prefix_lm_document(rows_lens, rows_prefix, s, batch=n)
        return tokens, labels, positions, np.ascontiguousarray(fm.startend_row_indices)


def pack(docs: List[bytes], seq_len: int, mode: str, *, question_frac: float, answer_len: int,
         prefix_frac: float) -> Packed:
    """Pack documents back to back into rows of ``seq_len`` tokens.

    A document that does not fit in the rest of a row is cut; its remainder starts the next row
    as a new piece (the mask keeps the two pieces apart, so nothing leaks across rows). The tail
    of the last row is dropped if incomplete.
    """
    if mode not in ("causal-document", "share-question", "prefix-lm-document"):
        raise ValueError(mode)
    n_tokens = sum(len(d) for d in docs)
    n_rows = n_tokens // seq_len
    if n_rows == 0:
        raise SystemExit(f"error: only {n_tokens} tokens of data, less than one row of --seq-len {seq_len}")
    stream = np.frombuffer(b"".join(docs), dtype=np.uint8)[: n_rows * seq_len]
    total = n_rows * seq_len
    doc_ends = np.cumsum([len(d) for d in docs], dtype=np.int64)
    bounds = np.union1d(doc_ends[doc_ends < total], np.arange(0, total + 1, seq_len, dtype=np.int64))
    return Packed(stream, seq_len, bounds, mode, question_frac=question_frac, answer_len=answer_len,
                  prefix_frac=prefix_frac)


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

    def forward(self, x, sri, causal: bool, capture: bool = False, dense_mask=None):
        b, s, _ = x.shape
        qkv = self.qkv(x).reshape([b, s, 3, self.h, self.d])
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, S, H, D] each
        if capture:
            self.captured = tuple(t.detach().clone() for t in (q, k, v))
        if dense_mask is None:
            o = paddle_fm3.flashmask_attention(q, k, v, sri, causal=causal)
        else:  # Paddle's attention on the dense bool mask (packed rows have no fully masked row)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask, is_causal=False)
        return self.proj(o.reshape([b, s, self.h * self.d]))


class Block(nn.Layer):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x, sri, causal, capture=False, dense_mask=None):
        x = x + self.attn(self.ln1(x), sri, causal, capture, dense_mask)
        return x + self.mlp(self.ln2(x))


class ByteLM(nn.Layer):
    def __init__(self, d_model: int, n_heads: int, n_layers: int, max_pos: int):
        super().__init__()
        init = nn.initializer.Normal(std=0.02)
        self.tok = nn.Embedding(VOCAB, d_model, weight_attr=paddle.ParamAttr(initializer=init))
        self.pos = nn.Embedding(max_pos, d_model, weight_attr=paddle.ParamAttr(initializer=init))
        self.blocks = nn.LayerList([Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)

    def forward(self, tokens, positions, sri, causal: bool, capture: bool = False, dense_mask=None):
        x = self.tok(tokens) + self.pos(positions)
        for blk in self.blocks:
            x = blk(x, sri, causal, capture, dense_mask)
        return paddle.matmul(self.ln_f(x), self.tok.weight, transpose_y=True)  # tied output embedding


class ByteLMRunner:
    """The built-in ByteLM: logits with paddle_fm3 attention or Paddle's dense-mask attention."""

    name = "byte"

    def __init__(self, args, max_pos: int):
        self.model = ByteLM(args.d_model, args.n_heads, args.n_layers, max_pos)

    def logits(self, tokens, positions, sri, causal: bool, dense: bool = False):
        dense_mask = None
        if dense:  # bool [B, 1, S, S], True = visible
            dense_mask = paddle.to_tensor(masks.to_dense(sri.numpy(), causal, tokens.shape[1]))
        return self.model(tokens, positions, sri, causal, dense_mask=dense_mask)

    @property
    def dense_name(self) -> str:
        return ("paddle.nn.functional.scaled_dot_product_attention, bool [B, 1, S, S] mask "
                "(converted by it to a float32 additive mask)")


class LlamaRunner:
    """A PaddleFormers LlamaForCausalLM (byte vocabulary) whose "flashmask" attention is paddle_fm3
    (paddle_fm3.integrations.paddleformers.install()); dense: PaddleFormers' "eager" attention,
    which expands attn_mask_startend_row_indices to a float32 [B, 1, S, S] additive mask."""

    name = "llama"

    def __init__(self, args, max_pos: int):
        from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

        import paddle_fm3.integrations.paddleformers as fm3_pf

        fm3_pf.install()
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=args.d_model, intermediate_size=4 * args.d_model,
                             num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
                             num_key_value_heads=args.n_kv_heads or args.n_heads, max_position_embeddings=max_pos,
                             fuse_rms_norm=False)  # PaddleFormers' fused RMSNorm is GPU-only
        config._attn_implementation = "flashmask"
        self.model = LlamaForCausalLM(config)

    def logits(self, tokens, positions, sri, causal: bool, dense: bool = False):
        self.model.config._attn_implementation = "eager" if dense else "flashmask"
        if sri is not None and not causal and sri.shape[-1] == 2:
            # PaddleFormers reads C=2 as causal (LTS, LTE); the same bidirectional mask with C=4 is
            # (LTS, LTE=S, UTS=0, UTE)
            s = tokens.shape[1]
            sri = paddle.stack([sri[..., 0], paddle.full_like(sri[..., 0], s), paddle.zeros_like(sri[..., 0]),
                                sri[..., 1]], axis=-1)
        try:
            return self.model(input_ids=tokens, position_ids=positions, attn_mask_startend_row_indices=sri,
                              return_dict=True).logits
        finally:
            self.model.config._attn_implementation = "flashmask"

    @property
    def dense_name(self) -> str:
        return "PaddleFormers eager attention, float32 [B, 1, S, S] additive mask"


def make_runner(args, max_pos: int):
    """The model to train; SystemExit(2) with a clear message when --model llama lacks PaddleFormers."""
    if args.model == "byte":
        return ByteLMRunner(args, max_pos)
    try:
        import paddleformers  # noqa: F401
    except ImportError:
        print("error: --model llama needs PaddleFormers: pip install paddleformers "
              "(pip install \".[paddleformers]\" installs it; scripts/setup_env.sh does)", file=sys.stderr)
        raise SystemExit(2)
    return LlamaRunner(args, max_pos)


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
# The run folder: metrics, plot, checkpoint, samples, summary
# ---------------------------------------------------------------------------

METRIC_FIELDS = ("step", "loss", "lr", "step_s", "tokens_per_s")
# Arguments a checkpoint must agree with: they fix the data, its order and the model's shapes. The
# data themselves are checked by their digest (Packed.identity), not by the --data path.
RESUME_KEYS = ("model", "text_field", "max_doc_len", "skip_bad", "mask", "question_frac", "answer_len",
               "prefix_frac", "seq_len", "batch_size", "d_model", "n_heads", "n_kv_heads", "n_layers", "eval_rows",
               "seed")
CHECKPOINT_FILES = ("model.pdparams", "optimizer.pdopt")  # state.json holds their sha256
# A save writes checkpoint.tmp/, then renames checkpoint/ -> checkpoint.old/ and checkpoint.tmp/ ->
# checkpoint/: a kill can leave the newest complete checkpoint in any of the three.
CHECKPOINT_DIRS = ("checkpoint", "checkpoint.tmp", "checkpoint.old")


def default_run_dir() -> pathlib.Path:
    """runs/<timestamp> (with a suffix if that exists) in the current directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, i = pathlib.Path("runs") / stamp, 1
    while path.exists():
        path, i = pathlib.Path("runs") / f"{stamp}-{i}", i + 1
    return path


def sha256_of(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(run_dir: pathlib.Path, model, opt, step: int, args, data_id: dict) -> None:
    """checkpoint/ = model.pdparams, optimizer.pdopt (with the LR schedule) and state.json (the step, the
    arguments, the data's digest and both files' sha256), written last: a folder whose state.json is
    missing or disagrees with its files is an interrupted or damaged save. Written into
    checkpoint.tmp/ first and then renamed into place, so a kill at any point leaves a complete
    checkpoint in one of CHECKPOINT_DIRS (load_checkpoint takes the newest). SystemExit, and nothing
    written, when an update left a weight NaN or infinite (a step's loss is computed before its update,
    so the training loop's loss check does not see the last one)."""
    bad = [name for name, p in model.named_parameters() if not bool(paddle.isfinite(p).all())]
    if bad:
        raise SystemExit(f"error: non-finite weights after step {step} ({', '.join(bad[:3])}"
                         f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}); no checkpoint written "
                         "(a smaller --lr may help)")
    tmp = run_dir / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    paddle.save(model.state_dict(), str(tmp / "model.pdparams"))
    paddle.save(opt.state_dict(), str(tmp / "optimizer.pdopt"))
    state = {"step": step, "args": {k: getattr(args, k) for k in RESUME_KEYS}, "data": data_id,
             "files": {name: sha256_of(tmp / name) for name in CHECKPOINT_FILES}}
    state["sha256"] = state_digest(state)
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    promote_tmp_checkpoint(run_dir)


def promote_tmp_checkpoint(run_dir: pathlib.Path) -> None:
    """The complete checkpoint.tmp/ becomes checkpoint/; the previous one is kept as checkpoint.old/
    until then."""
    final, tmp, old = (run_dir / name for name in CHECKPOINT_DIRS)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def state_digest(state: dict) -> str:
    """sha256 of state.json's fields but its own ("sha256"): an edited or damaged field shows."""
    fields = {k: v for k, v in state.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def state_problem(state) -> Optional[str]:
    """What is wrong with the fields of a parsed state.json, or None."""
    if not isinstance(state, dict):
        return "not a JSON object"
    step = state.get("step")
    if type(step) is not int or step < 1:  # type(): True is an int to isinstance
        return f"'step' is {step!r}, not a positive integer"
    if not isinstance(state.get("args"), dict):
        return "no 'args' object"
    files = state.get("files")
    if not (isinstance(files, dict) and sorted(files) == sorted(CHECKPOINT_FILES)
            and all(isinstance(v, str) for v in files.values())):
        return f"no sha256 of {', '.join(CHECKPOINT_FILES)} (written by an older examples/train_packed_lm.py?)"
    data = state.get("data")
    if not (isinstance(data, dict) and isinstance(data.get("sha256"), str) and type(data.get("rows")) is int):
        return "no digest of the data (written by an older examples/train_packed_lm.py?)"
    if not isinstance(state.get("sha256"), str):
        return "no sha256 of its own fields (written by an older examples/train_packed_lm.py?)"
    if state["sha256"] != state_digest(state):
        return "its fields differ from their sha256 (the file was edited or damaged)"
    return None


def read_checkpoint(folder: pathlib.Path):
    """(state, None) for a complete, intact checkpoint folder, else (None, why not, naming the file)."""
    path = folder / "state.json"
    if not path.is_file():
        return None, f"{path}: missing (a save that did not finish)"
    try:
        state = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
        return None, f"{path}: not valid JSON ({one_line(e)})"
    problem = state_problem(state)
    if problem:
        return None, f"{path}: {problem}"
    for name, digest in state["files"].items():
        f = folder / name
        if not f.is_file():
            return None, f"{f}: missing"
        if sha256_of(f) != digest:
            return None, f"{f}: its sha256 differs from the one in state.json (the file is damaged or was replaced)"
    return state, None


def run_finished(run_dir: pathlib.Path, step: int) -> bool:
    """Whether summary.json says the run finished at `step` (a run that died after its last
    checkpoint has none, and --resume may finish it)."""
    try:
        return json.loads((run_dir / "summary.json").read_text())["steps"]["end"] == step
    except (OSError, ValueError, KeyError, TypeError):
        return False


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def tensor_layout(value) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{str(value.dtype).replace('paddle.', '')} {list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(map(str, value))) + "}"
    return type(value).__name__


def load_tensors(path: pathlib.Path, expected: dict) -> dict:
    """paddle.load(path), which must hold exactly the entries of ``expected`` (a fresh model's or
    optimizer's state_dict) with the same shapes and dtypes; SystemExit naming the file otherwise.
    (Paddle itself skips a mismatched tensor with a warning and keeps the fresh one.)"""
    try:
        loaded = paddle.load(str(path))
    except Exception as e:  # its sha256 matched, yet Paddle cannot read it
        raise SystemExit(f"error: --resume: {path}: paddle.load cannot read it ({one_line(e)})")
    if not isinstance(loaded, dict):
        raise SystemExit(f"error: --resume: {path}: holds a {type(loaded).__name__}, not a state dict")
    problems = [f"missing {k}" for k in expected if k not in loaded]
    problems += [f"unexpected {k}" for k in loaded if k not in expected]
    problems += [f"{k}: {tensor_layout(loaded[k])} (expected {tensor_layout(v)})" for k, v in expected.items()
                 if k in loaded and tensor_layout(loaded[k]) != tensor_layout(v)]
    if problems:
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise SystemExit(f"error: --resume: {path}: does not fit this model: " + "; ".join(problems[:5]) + more)
    return loaded


def optimizer_state_layout(model, opt) -> dict:
    """The optimizer's state_dict as this run will save it. AdamW creates its moments at its first
    step, so take one on zero gradients; load_checkpoint then overwrites the weights and moments."""
    (paddle.add_n([p.sum() for p in model.parameters()]) * 0.0).backward()
    opt.step()
    opt.clear_grad()
    return opt.state_dict()


def load_checkpoint(run_dir: pathlib.Path, model, opt, args, data_id: dict):
    """Restore model and optimizer from the newest complete checkpoint in CHECKPOINT_DIRS; return
    (its step, its folder). SystemExit with a one-line error naming the file on a missing or damaged
    checkpoint, arguments or data that differ from the checkpoint's, or tensors that do not fit."""
    found, passed_over = [], []
    for name in CHECKPOINT_DIRS:
        if (run_dir / name).exists():
            state, problem = read_checkpoint(run_dir / name)
            found += [(state["step"], run_dir / name, state)] if state else []
            passed_over += [problem] if problem else []
    if not found and not passed_over:
        raise SystemExit(f"error: --resume: no checkpoint in {run_dir / 'checkpoint'} (a run folder of "
                         "examples/train_packed_lm.py has one)")
    if not found:
        raise SystemExit(f"error: --resume: no usable checkpoint in {run_dir}: " + "; ".join(passed_over))
    step, folder, state = max(found, key=lambda f: f[0])  # the first of equals: checkpoint/
    for problem in passed_over:
        print(f"note: --resume: passed over {problem}", file=sys.stderr)
    diff = [f"--{k.replace('_', '-')} {getattr(args, k)!r} (checkpoint: {state['args'].get(k, 'none')!r})"
            for k in RESUME_KEYS if state["args"].get(k) != getattr(args, k)]
    if diff:
        raise SystemExit("error: --resume: arguments differ from the checkpoint's: " + "; ".join(diff))
    if state["data"] != data_id:
        raise SystemExit(f"error: --resume: the packed data differ from the checkpoint's: {data_id['rows']} rows, "
                         f"sha256 {data_id['sha256'][:12]} (checkpoint: {state['data']['rows']} rows, sha256 "
                         f"{state['data']['sha256'][:12]}): the files under --data changed since it was written")
    # A checkpoint at the last step is finished only if the run wrote its summary; otherwise the run
    # died after its last save, and resuming finishes it.
    if step > args.steps or (step == args.steps and run_finished(run_dir, step)):
        raise SystemExit(f"error: --resume: the checkpoint is at step {step}, --steps is {args.steps}: "
                         "pass a larger --steps (the total)")
    model_state = load_tensors(folder / "model.pdparams", model.state_dict())
    opt_state = load_tensors(folder / "optimizer.pdopt", optimizer_state_layout(model, opt))
    model.set_state_dict(model_state)
    opt.set_state_dict(opt_state)
    if folder.name == "checkpoint.tmp":  # the next save starts by clearing checkpoint.tmp/
        promote_tmp_checkpoint(run_dir)
    return step, folder


def open_metrics(path: pathlib.Path, start_step: int):
    """metrics.csv for appending, keeping the rows of steps <= start_step (a resumed run).

    Returns (file, csv.DictWriter, earlier losses): the losses of steps 1..start_step read back
    from the kept rows, or None when the file lacks some of them (then only the resumed steps
    can be summarised)."""
    kept, kept_losses = [], []
    if start_step and path.exists():
        try:
            with open(path, newline="", encoding="utf-8") as fh:
                kept = [row for row in csv.DictReader(fh) if int(row["step"]) <= start_step]
            kept_losses = [float(row["loss"]) for row in kept]
        except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError, ValueError) as e:
            raise SystemExit(f"error: --resume: {path}: not the metrics this script writes ({one_line(e)}); "
                             "move it away to resume without the earlier steps' losses")
    complete = [int(row["step"]) for row in kept] == list(range(1, start_step + 1))
    earlier = kept_losses if complete else None
    fh = open(path, "w", newline="")
    writer = csv.DictWriter(fh, fieldnames=METRIC_FIELDS)
    writer.writeheader()
    writer.writerows(kept)
    return fh, writer, earlier


def show_progress(no_progress: bool, streams=None) -> bool:
    """Whether to draw the tqdm bar: not with --no-progress, and only when stdout and stderr are both
    terminals (a log file, a pipe or CI gets the plain "step N/M loss" lines instead)."""
    if no_progress:
        return False
    streams = (sys.stdout, sys.stderr) if streams is None else streams
    return all(callable(getattr(f, "isatty", None)) and f.isatty() for f in streams)


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_metrics(metrics_csv: pathlib.Path, out_png: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    steps = [int(r["step"]) for r in rows]
    fig, (ax_loss, ax_tok) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_loss.plot(steps, [float(r["loss"]) for r in rows], lw=1)
    ax_loss.axhline(math.log(VOCAB), color="gray", ls=":", lw=1, label="chance, ln(256)")
    ax_loss.set_ylabel("training loss (nats/byte)")
    ax_loss.legend()
    ax_tok.plot(steps, [float(r["tokens_per_s"]) for r in rows], lw=1, color="tab:green")
    ax_tok.set_ylabel("tokens/s")
    ax_tok.set_xlabel("step")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def generate(runner, prompts: np.ndarray, n_new: int, temperature: float, seed: int) -> np.ndarray:
    """Sample n_new bytes after each prompt (uint8 [n, P]) with causal attention; returns [n, n_new]."""
    rng = np.random.default_rng(seed)
    seq = prompts.astype(np.int64)
    runner.model.eval()
    with paddle.no_grad():
        for _ in range(n_new):
            n, length = seq.shape
            positions = np.broadcast_to(np.arange(length), (n, length))
            logits = runner.logits(paddle.to_tensor(seq), paddle.to_tensor(np.ascontiguousarray(positions)), None,
                                   True)[:, -1].numpy().astype(np.float64)
            z = logits / temperature
            p = np.exp(z - z.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            nxt = np.array([rng.choice(VOCAB, p=row) for row in p])
            seq = np.concatenate([seq, nxt[:, None]], axis=1)
    runner.model.train()
    return seq[:, prompts.shape[1]:].astype(np.uint8)


def write_samples(path: pathlib.Path, runner, data: "Packed", row_ids, prompt_len: int, n_new: int, seed: int):
    prompts = data.tokens[np.asarray(row_ids)][:, :prompt_len]
    cont = generate(runner, prompts, n_new, 0.8, seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"# {len(row_ids)} continuations of {n_new} bytes (temperature 0.8) after the first {prompt_len} "
                 "bytes of held-out rows (training rows when none are held out); bytes that are not UTF-8 "
                 "show as U+FFFD\n")
        for i, (r, p, c) in enumerate(zip(row_ids, prompts, cont), 1):
            fh.write(f"\n=== sample {i} (row {int(r)}) ===\n--- prompt ---\n"
                     f"{bytes(p).decode('utf-8', 'replace')}\n--- continuation ---\n"
                     f"{bytes(c).decode('utf-8', 'replace')}\n")


def dense_mask_bytes(b: int, s: int) -> int:
    """Bytes of the dense mask Paddle's attention reads for b rows of s tokens: a float32 additive
    [b, 1, s, s] mask (0 = visible, -inf = masked). PaddleFormers' eager attention builds it from
    the row indices; Paddle's scaled_dot_product_attention converts the bool mask it is given into
    it (paddle.where into the query's dtype, float32 here)."""
    return 4 * b * s * s


def dense_attention_bytes(b: int, s: int, heads: int, layers: int) -> int:
    """Estimated peak memory of one training step with dense-mask attention: per layer the float32
    [b, heads, s, s] probabilities kept for the backward, about three more such matrices in flight
    (scores, their gradients), and the bool and float32 [b, 1, s, s] masks. Measured peaks (CPU,
    Paddle 3.3, ByteLM, 4 heads, s = 2048): 4.1 and 6.0 times b*heads*s*s*4 bytes at 2 and 4
    layers, where this says 5.3 and 7.3."""
    return (layers + 3) * b * heads * s * s * 4 + 5 * b * s * s


def available_memory_bytes() -> Optional[int]:
    """Memory available to this process now (psutil's estimate where installed, else the free
    pages), or None where unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def dense_comparison_skip(b: int, s: int, heads: int, layers: int) -> Optional[dict]:
    """Why the dense comparison is skipped (it would not fit in memory; it once ended a run that had
    trained and saved with a MemoryError), as summary.json records it, or None to run it."""
    need, free = dense_attention_bytes(b, s, heads, layers), available_memory_bytes()
    if free is None or need <= free:
        return None
    return {"skipped": f"it would need ~{human_bytes(need)} of memory, {human_bytes(free)} available",
            "estimated_bytes": need, "available_bytes": free}


def dense_comparison(runner, batch_np, causal: bool, loss_fn) -> dict:
    """One training step's forward + backward with paddle_fm3 and with Paddle's dense-mask attention
    on the same batch and weights: time (after one untimed warm-up each), loss, gradient agreement,
    and mask memory. Gradients are cleared afterwards; the weights do not change."""
    tokens, labels, positions, sri = (paddle.to_tensor(x) for x in batch_np)
    b, s = batch_np[0].shape
    result = {}
    grads = {}
    for name, dense in (("fm3", False), ("dense", True)):
        for timed in (False, True):
            runner.model.clear_gradients()
            t0 = time.perf_counter()
            loss = loss_fn(runner.logits(tokens, positions, sri, causal, dense=dense), labels)
            loss.backward()
            elapsed = time.perf_counter() - t0
        grads[name] = [p.grad.numpy() for p in runner.model.parameters() if p.grad is not None]
        result[name] = {"step_s": round(elapsed, 4), "loss": float(loss)}
    runner.model.clear_gradients()
    grad_err = max(float(np.abs(a - r).max()) / max(float(np.abs(r).max()), 1e-30)
                   for a, r in zip(grads["fm3"], grads["dense"]))
    sri_bytes = int(batch_np[3].nbytes)
    dense_bytes = dense_mask_bytes(b, s)
    result.update({
        "dense_attention": runner.dense_name,
        "batch": [b, s],
        "speedup": round(result["dense"]["step_s"] / result["fm3"]["step_s"], 3),
        "loss_rel_diff": abs(result["fm3"]["loss"] - result["dense"]["loss"]) / abs(result["dense"]["loss"]),
        "grad_max_rel_diff": grad_err,
        "mask_bytes": {"startend_row_indices": sri_bytes, "dense_float32": dense_bytes,
                       "ratio": round(dense_bytes / sri_bytes, 1)},
    })
    return result


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not have_matplotlib():
        print("note: matplotlib is not installed, so loss.png will not be written (pip install matplotlib)")
    paddle.set_device("cpu")
    if args.threads > 0 and hasattr(paddle.base.core, "set_num_threads"):
        paddle.base.core.set_num_threads(args.threads)
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    if args.resume and args.run_dir is None:
        print("error: --resume needs --run-dir (the run folder to continue)", file=sys.stderr)
        return 2
    run_dir = pathlib.Path(args.run_dir) if args.run_dir else default_run_dir()
    # Without --resume, a run never replaces a checkpoint it did not write (an interrupted save
    # leaves only checkpoint.tmp/ and checkpoint.old/): it stops instead.
    existing = [f"{name}/" for name in CHECKPOINT_DIRS if (run_dir / name).exists()]
    if not args.resume and existing:
        print(f"error: {run_dir} already holds a run ({', '.join(existing)}); pass --resume to continue it or "
              "another --run-dir", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    read = read_documents(args.data, args.text_field, args.max_doc_len, args.skip_bad)
    order = rng.permutation(len(read.docs))
    docs = [read.docs[i] for i in order]
    del read.docs[:]
    data = pack(docs, args.seq_len, args.mask, question_frac=args.question_frac,
                answer_len=args.answer_len, prefix_frac=args.prefix_frac)
    del docs
    n_rows = data.n_rows
    data_id = data.identity()
    n_eval = min(args.eval_rows, n_rows // 5)
    train_idx = np.arange(n_rows - n_eval)
    eval_idx = np.arange(n_rows - n_eval, n_rows)
    if not any((data.rows(train_idx[i: i + 256])[1] != IGNORE).any() for i in range(0, len(train_idx), 256)):
        print("error: the packed training rows have no next-token targets (documents of one byte, --seq-len 1, "
              "or a prefix/question covering every document): nothing to train on", file=sys.stderr)
        return 2
    skipped = f"; {read.skipped} skipped as not UTF-8 text or malformed" if read.skipped else ""
    print(f"data: {len(order)} documents from {read.source}{skipped}; {n_rows * args.seq_len:,} byte tokens "
          f"packed into {n_rows} rows of {args.seq_len} ({data.segments_per_row:.2f} pieces/row; "
          f"{len(train_idx)} train, {n_eval} held out) in {time.perf_counter() - t0:.1f}s")

    b, s = args.batch_size, args.seq_len
    c = data.mask_cols
    sri_bytes = b * s * c * 4
    dense_bytes = dense_mask_bytes(b, s)
    first_sri = data.rows(train_idx[:b])[3]
    print(f"mask: {args.mask} (causal={data.causal}, C={c}); per step startend_row_indices "
          f"[{b}, 1, {s}, {c}] int32 = {human_bytes(sri_bytes)} vs the dense float32 additive "
          f"[{b}, 1, {s}, {s}] mask Paddle's attention reads = {human_bytes(dense_bytes)} "
          f"({dense_bytes / sri_bytes:,.0f}x smaller); density {masks.density(first_sri, data.causal):.3f}")

    runner = make_runner(args, args.seq_len)
    model = runner.model
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    print(f"model: {runner.name}, {args.n_layers} layers, d_model {args.d_model}, {args.n_heads} heads, "
          f"{n_params:,} parameters; {args.steps} steps x {b} x {s} tokens; run folder {run_dir}")

    def batch_np(idx):
        return data.rows(idx)

    def batch_of(idx):
        return tuple(paddle.to_tensor(x) for x in batch_np(idx))

    def loss_from_logits(logits, labels):
        # Mean over labelled positions only (Paddle 3.3's reduction='mean' with ignore_index
        # divides by all positions). NaN where a logit is not finite: Paddle's CPU cross_entropy
        # gives ln(256) for NaN logits, which would pass for a loss.
        flat = labels.reshape([-1])
        per_token = F.cross_entropy(logits.reshape([-1, VOCAB]), flat, ignore_index=IGNORE, reduction="none")
        n_labelled = (flat != IGNORE).astype("float32").sum().clip(min=1.0)
        loss = per_token.sum() / n_labelled
        return paddle.where(paddle.isfinite(logits).all(), loss, paddle.full_like(loss, float("nan")))

    def loss_of(batch):
        tokens, labels, positions, sri = batch
        return loss_from_logits(runner.logits(tokens, positions, sri, data.causal), labels)

    def evaluate() -> Optional[float]:  # None without held-out rows
        if n_eval == 0:
            return None
        model.eval()
        with paddle.no_grad():
            vals = [float(loss_of(batch_of(eval_idx[i: i + b]))) for i in range(0, n_eval, b)]
        model.train()
        return float(np.mean(vals))

    # batch order: epochs over the training rows, each shuffled
    need = args.steps * b
    perm = np.concatenate([rng.permutation(train_idx) for _ in range(need // max(len(train_idx), 1) + 1)])[:need]

    def lr_factor(st: int) -> float:  # linear warm-up, then cosine decay to 10% of the peak
        if st < args.warmup:
            return (st + 1) / args.warmup
        frac = min(1.0, (st - args.warmup) / max(args.steps - args.warmup, 1))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))

    sched = paddle.optimizer.lr.LambdaDecay(args.lr, lr_factor)
    opt = paddle.optimizer.AdamW(sched, parameters=model.parameters(), weight_decay=args.weight_decay,
                                 grad_clip=nn.ClipGradByGlobalNorm(1.0))
    start_step = 0
    if args.resume:
        start_step, folder = load_checkpoint(run_dir, model, opt, args, data_id)
        print(f"resumed from {folder} at step {start_step}")
        if start_step == args.steps:
            print("no steps left to run: finishing the run (evaluation, dense comparison, samples, summary)")
    run_dir.mkdir(parents=True, exist_ok=True)

    check = "off"
    if args.check:
        if runner.name == "byte":
            ok = check_against_dense(model, batch_of(perm[:b]), data.causal, args.check_rtol, args.seed)
        else:
            cmp = dense_comparison(runner, batch_np(perm[:b]), data.causal, loss_from_logits)
            ok = cmp["loss_rel_diff"] <= args.check_rtol and cmp["grad_max_rel_diff"] <= args.check_rtol
            print(f"CHECK {'PASSED' if ok else 'FAILED'}: Llama through paddle_fm3 vs PaddleFormers eager attention: "
                  f"loss rel diff {cmp['loss_rel_diff']:.2e}, max grad rel diff {cmp['grad_max_rel_diff']:.2e} "
                  f"(tolerance {args.check_rtol:.0e})", file=sys.stdout if ok else sys.stderr)
        if not ok:
            print("CHECK FAILED: paddle_fm3.flashmask_attention disagrees with Paddle's dense-mask attention",
                  file=sys.stderr)
            return 1
        check = "passed"

    eval_before = evaluate()
    metrics_fh, metrics, earlier_losses = open_metrics(run_dir / "metrics.csv", start_step)
    if start_step == args.steps and earlier_losses is None:
        metrics_fh.close()
        print("error: --resume: no steps left to run, and metrics.csv lacks the run's losses: nothing to finish",
              file=sys.stderr)
        return 1
    losses, step_times = [], []
    progress = show_progress(args.no_progress)
    bar = tqdm(range(start_step, args.steps), desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    t_train = time.perf_counter()
    for step in bar:
        ts = time.perf_counter()
        lr = opt.get_lr()
        loss = loss_of(batch_of(perm[step * b: (step + 1) * b]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        lv = float(loss)
        step_times.append(time.perf_counter() - ts)
        if not math.isfinite(lv):
            bar.close()
            print(f"error: non-finite loss {lv} at step {step + 1} (NaN or infinite logits; a smaller --lr may "
                  "help)", file=sys.stderr)
            return 1
        losses.append(lv)
        metrics.writerow({"step": step + 1, "loss": f"{lv:.6f}", "lr": f"{lr:.6g}",
                          "step_s": f"{step_times[-1]:.4f}", "tokens_per_s": f"{b * s / step_times[-1]:.1f}"})
        metrics_fh.flush()
        bar.set_postfix(loss=f"{lv:.3f}", tok_s=f"{b * s / step_times[-1]:,.0f}")
        if not progress and (step + 1) % max(1, args.steps // 10) == 0:
            print(f"step {step + 1}/{args.steps} loss {lv:.4f}")
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < args.steps:
            save_checkpoint(run_dir, model, opt, step + 1, args, data_id)
    bar.close()
    metrics_fh.close()
    train_s = time.perf_counter() - t_train
    save_checkpoint(run_dir, model, opt, args.steps, args, data_id)
    eval_after = evaluate()

    # The loss summary covers the whole run from step 1 (a resumed run reads the earlier steps back
    # from metrics.csv); only if that file lacks some of them does it cover just the steps run now.
    loss_from_step = 1 if earlier_losses is not None else start_step + 1
    run_losses = (earlier_losses or []) + losses
    k = max(1, min(10, len(run_losses) // 5))
    first, last = float(np.mean(run_losses[:k])), float(np.mean(run_losses[-k:]))
    steady = step_times[1:] if len(step_times) > 1 else step_times
    tok_s = b * s * len(steady) / sum(steady) if steady else None  # None: finishing, no steps run now
    partial = "" if loss_from_step == 1 else f" (steps {loss_from_step}-{args.steps}; metrics.csv lacks earlier steps)"
    print(f"loss{partial}: first {k} steps {first:.4f} -> last {k} steps {last:.4f} "
          f"({'falling' if last < first else 'NOT falling'}; ln(256) = {math.log(256):.3f} is chance)")
    if n_eval:
        print(f"held-out loss: {eval_before:.4f} at step {start_step} -> {eval_after:.4f} at step {args.steps} "
              f"({n_eval} rows)")
    else:
        why = "--eval-rows 0" if args.eval_rows == 0 else f"{n_rows} rows of data, and at most a fifth are held out"
        print(f"held-out loss: none (no held-out rows: {why})")
    session = f"steps {start_step + 1}-{args.steps} run now, " if start_step else ""
    if tok_s is None:
        print(f"throughput: none (no steps run now); {time.perf_counter() - t0:.1f}s total")
    else:
        print(f"throughput: {tok_s:,.0f} tokens/s ({session}excluding the first step); {train_s:.1f}s training, "
              f"{time.perf_counter() - t0:.1f}s total")

    cmp = dense_comparison_skip(b, s, args.n_heads, args.n_layers)
    if cmp is None:
        cmp = dense_comparison(runner, batch_np(perm[:b]), data.causal, loss_from_logits)
        print(f"one step vs {cmp['dense_attention']}: {cmp['fm3']['step_s']:.3f}s vs {cmp['dense']['step_s']:.3f}s "
              f"({cmp['speedup']:.2f}x); mask {human_bytes(cmp['mask_bytes']['startend_row_indices'])} vs "
              f"{human_bytes(cmp['mask_bytes']['dense_float32'])} float32; loss rel diff {cmp['loss_rel_diff']:.1e}")
    else:
        cmp["mask_bytes"] = {"startend_row_indices": sri_bytes, "dense_float32": dense_bytes,
                             "ratio": round(dense_bytes / sri_bytes, 1)}
        print(f"one step vs dense attention: skipped ({cmp['skipped']}); mask {human_bytes(sri_bytes)} vs "
              f"{human_bytes(dense_bytes)} float32")
    plotted = have_matplotlib()
    if plotted:
        plot_metrics(run_dir / "metrics.csv", run_dir / "loss.png",
                     f"{runner.name} LM, {args.mask}, {b} x {s} tokens/step ({run_dir.name})")
    sample_rows = (eval_idx if n_eval else train_idx)[: args.samples]
    prompt_len = min(48, s // 2)
    if args.samples:
        write_samples(run_dir / "samples.txt", runner, data, sample_rows, prompt_len,
                      min(args.sample_len, s - prompt_len), args.seed)
    summary = {
        "args": vars(args), "run_dir": str(run_dir), "model": runner.name, "parameters": n_params,
        "data": {"source": read.source, "documents": len(order), "skipped": read.skipped, "rows": n_rows,
                 "train_rows": len(train_idx), "held_out_rows": n_eval, "pieces_per_row": data.segments_per_row},
        "steps": {"start": start_step, "end": args.steps},
        "loss": {"first": first, "last": last, "mean_of_steps": k, "from_step": loss_from_step},
        "held_out_loss": {"before": eval_before, "after": eval_after, "before_step": start_step},
        "tokens_per_s": tok_s, "train_s": train_s, "check": check,
        "dense_comparison": cmp,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"run folder {run_dir}: metrics.csv, {'loss.png, ' if plotted else ''}checkpoint/, "
          f"{'samples.txt, ' if args.samples else ''}summary.json")
    fields = [f"mask={args.mask}", f"steps={args.steps}", f"loss_first={first:.4f}", f"loss_last={last:.4f}"]
    if loss_from_step > 1:
        fields.append(f"loss_from_step={loss_from_step}")
    fields.append(f"eval={eval_before:.4f}->{eval_after:.4f}" if n_eval else "eval=none")
    if n_eval and start_step:
        fields.append(f"eval_from_step={start_step}")
    fields += ["tokens_per_s=none" if tok_s is None else f"tokens_per_s={tok_s:.0f}", f"train_s={train_s:.1f}",
               f"mask_bytes={sri_bytes}", f"dense_mask_bytes_float32={dense_bytes}", f"check={check}"]
    print("SUMMARY " + " ".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
