"""The context-parallel plan: segments, balance, localized masks, which KV segments move where.

Context parallelism (docs/design.md, "Context parallelism"): the global sequence of ``S``
tokens is cut into ``n = S / segment_size`` segments; each of the ``P`` ranks owns ``n / P`` of them
(HCC-IPO balance on the block-summary workload), holds the queries and keys/values of those
segments, and receives only the remote KV segments that are not fully masked for its rows. Every
rank derives the same plan from the same global mask; the only communication of planning is one
all-gather of a digest when a plan is made (:func:`check_agreement`), so that ranks given different
masks (or sizes) fail at once instead of exchanging KV that does not fit their rows.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .. import _checks, mask_semantics
from .balance import hcc_ipo
from .comm import Communicator, PlanOnlyCommunicator, default_communicator
from .localize import _localize_checked

__all__ = ["CPLayout", "CPPlan", "make_cp_plan", "make_cp_plans", "build_layout", "segment_summary",
           "segment_workload", "check_segment_sizes", "check_agreement", "MAX_SEGMENTS", "default_segment_size"]

TILE = 128  # query tile / key block of the workload summary (the kernels' kBlockM/kBlockN scale)


def default_segment_size(seqlen: int, num_ranks: int) -> int:
    """Largest-count split with segments of at least ``min(2048, S/(2P))`` tokens: up to 16
    segments per rank (so balance has room), never fewer than 2 (dual-chunk) when S allows."""
    seqlen = _checks.check_int("seqlen", seqlen, lo=1)
    num_ranks = _checks.check_int("num_ranks", num_ranks, lo=1)
    floor = min(2048, max(1, seqlen // (2 * num_ranks)))
    for per_rank in (16, 8, 4, 2, 1):
        if seqlen % (num_ranks * per_rank) == 0 and seqlen // (num_ranks * per_rank) >= floor:
            return seqlen // (num_ranks * per_rank)
    raise ValueError(f"seqlen ({seqlen}) must be divisible by the CP group size ({num_ranks}); pad the "
                     f"sequence with masked-out tokens or choose segment_size explicitly")


def segment_workload(startend_row_indices, segment_size: int, tile: int, causal: bool):
    """Context-parallel workload per query segment, on the host (no GPU): the kernel of the Paddle
    op ``fm3_segment_workload`` (``ops/cpu/segment_workload.cc``), for planning without Paddle.

    Args:
        startend_row_indices: integer ``[B, H_mask, S, C]`` host array (numpy), a square mask
            (``S_q == S_k == S``), checked by :func:`paddle_fm3.masks.validate_startend_row_indices`.
        segment_size: tokens per segment; ``tile | segment_size | S``.
        tile: query tile / key block width of the count.
        causal: the mask's causal flag.

    Returns:
        ``(weights, needed)``: int64 ``[n]``, the not-fully-masked (query tile, key block) pairs of
        each query segment summed over batch and mask heads; int32 ``[n, n]``, 1 where query
        segment ``s`` sees some key of key segment ``t`` (``n = S / segment_size``).

    Raises:
        TypeError: a non-integer mask, non-bool ``causal``, non-integer sizes.
        ValueError: a mask that fails validation; sizes not positive or not with ``tile | segment_size | S``.
        ImportError: the DLPack module is not built.
    """
    from .. import kernels  # noqa: PLC0415 - the DLPack module, loaded on use

    arr, seqlen = mask_semantics.validate_startend_row_indices(startend_row_indices, causal)
    segment_size, tile = check_segment_sizes(seqlen, segment_size, tile)
    if segment_size % tile:
        raise ValueError(f"tile ({tile}) must divide segment_size ({segment_size})")
    return kernels._ext().segment_workload(np.ascontiguousarray(arr, dtype=np.int32), segment_size, tile,
                                           bool(causal))


MAX_SEGMENTS = 1 << 14  # the visibility matrix of CP planning is dense: [n, n] int32, 1 GiB at this n


def check_segment_sizes(seqlen: int, segment_size, tile):
    """``(segment_size, tile)`` as ints after checking them against ``seqlen`` (CP planning):
    positive integers, ``segment_size | seqlen``, at most :data:`MAX_SEGMENTS` segments.

    Raises:
        TypeError: a non-integer size. ValueError: the conditions above.
    """
    seqlen = _checks.check_int("seqlen", seqlen, lo=1, hi=_checks.MAX_SEQLEN)
    segment_size = _checks.check_int("segment_size", segment_size, lo=1, hi=seqlen)
    tile = _checks.check_int("tile", tile, lo=1)
    if seqlen % segment_size:
        raise ValueError(f"seqlen ({seqlen}) must be divisible by segment_size ({segment_size})")
    if seqlen // segment_size > MAX_SEGMENTS:
        raise ValueError(f"seqlen / segment_size = {seqlen // segment_size} segments; at most {MAX_SEGMENTS} "
                         f"(choose a larger segment_size)")
    return segment_size, tile


def _check_mask(startend_row_indices, causal) -> np.ndarray:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    sri = startend_row_indices
    if hasattr(sri, "numpy") and not isinstance(sri, np.ndarray):
        sri = sri.numpy()
    arr, _ = mask_semantics.validate_startend_row_indices(sri, bool(causal))
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"startend_row_indices must have batch and mask heads >= 1, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def segment_summary(startend_row_indices: np.ndarray, causal: bool, segment_size: int,
                    tile: int = TILE) -> Tuple[np.ndarray, np.ndarray]:
    """Workload and visibility per segment, from the block classification (ops/include/fm3/mask.h).

    Tiles and blocks are ``gcd(segment_size, tile)`` wide. Computed in O(S) per (batch, mask
    head) by the C kernel ``fm3_cpu_segment_workload`` (ops/cpu/segment_workload.cc): each key
    block's fully masked rows become ranges of whole query tiles, so no (tile, block) pair is
    visited (counting ``block_classify``'s output gives the same numbers at O((S/tile)^2) cost;
    tests/test_cp_algorithms.py checks it). It runs through the Paddle op ``fm3_segment_workload``
    when Paddle is importable, else through the DLPack module :mod:`paddle_fm3.kernels` (machines
    with torch and no Paddle).

    Returns:
        ``weights`` int64 ``[n]``: not-fully-masked (query tile, key block) pairs whose query tile
        lies in each segment, summed over batch and mask heads;
        ``needed`` bool ``[n, n]``: ``needed[s, t]`` is False iff every key block of segment ``t`` is
        fully masked for every query tile of segment ``s`` (then ``t``'s KV is never sent for ``s``).

    Raises:
        TypeError / ValueError: a mask that fails validation; sizes that fail
        :func:`check_segment_sizes`.
        ImportError: neither Paddle nor the built DLPack module is available.
    """
    sri = _check_mask(startend_row_indices, causal)
    segment_size, tile = check_segment_sizes(sri.shape[2], segment_size, tile)
    return _segment_workload(sri, bool(causal), segment_size, tile)


def _segment_workload(sri: np.ndarray, causal: bool, segment_size: int, tile: int):
    """:func:`segment_summary` on checked arguments (contiguous int32 mask, ``segment_size | S``)."""
    g = math.gcd(segment_size, tile)
    try:
        import paddle  # noqa: PLC0415
    except ImportError:
        paddle = None
    if paddle is not None:
        from .._ops import ops  # noqa: PLC0415 - needs the compiled op

        weights, needed = ops.fm3_segment_workload(paddle.to_tensor(sri, place=paddle.CPUPlace()),
                                                   segment_size, g, causal)
        weights, needed = weights.numpy(), needed.numpy()
    else:
        from .. import kernels  # noqa: PLC0415

        if not kernels.available():
            raise ImportError("CP planning needs Paddle (the fm3_segment_workload op) or the DLPack module "
                              "paddle_fm3.kernels (scripts/gpu_build.sh && scripts/build_dlpack_ext.sh); "
                              "neither is available")
        weights, needed = kernels._ext().segment_workload(sri, segment_size, g, causal)
    return weights.astype(np.int64), needed.astype(bool)


class CPLayout:
    """The rank-independent part of a plan (identical on every rank).

    Attributes:
        seqlen, segment_size, num_segments, num_ranks: sizes.
        segments: int64 ``[P, n/P]``: each rank's segments, ascending.
        owner: int64 ``[n]``; position: int64 ``[n]`` (index of the segment inside its owner).
        weights: int64 ``[n]`` workload; needed: bool ``[n, n]`` (query segment, key segment).
        recv: ``recv[r][p]``: int64 array, ascending segments owned by ``p`` whose KV rank ``r``
            receives (empty for ``p == r``).
        mask_digest: sha256 (bytes) of the masks and causal flags the layout was built from
            (:func:`mask_digest`; empty when built from a summary only).
        any_exchange: False when no rank receives any KV (then the step skips the exchange).
    """

    def __init__(self, seqlen, segment_size, num_ranks, segments, weights, needed, mask_digest: bytes = b""):
        self.seqlen, self.segment_size, self.num_ranks = int(seqlen), int(segment_size), int(num_ranks)
        self.mask_digest = bytes(mask_digest)
        self.num_segments = self.seqlen // self.segment_size
        self.segments = np.asarray(segments, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.int64)
        self.needed = np.asarray(needed, dtype=bool)
        n = self.num_segments
        self.owner = np.empty(n, dtype=np.int64)
        self.position = np.empty(n, dtype=np.int64)
        for r in range(self.num_ranks):
            self.owner[self.segments[r]] = r
            self.position[self.segments[r]] = np.arange(self.segments.shape[1])
        self.recv = []
        for r in range(self.num_ranks):
            want = self.needed[self.segments[r]].any(axis=0)  # key segments my rows need
            self.recv.append([np.zeros(0, np.int64) if p == r else
                              self.segments[p][want[self.segments[p]]] for p in range(self.num_ranks)])
        self.any_exchange = any(len(x) for row in self.recv for x in row)  # False: no rank sends KV

    def loads(self) -> np.ndarray:
        return self.weights[self.segments].sum(axis=1)

    def digest(self) -> str:
        """Hex sha256 of everything the ranks must agree on: sizes, the segment assignment, the
        workload, the needed matrix and the masks with their causal flags."""
        h = hashlib.sha256()
        h.update(np.array([self.seqlen, self.segment_size, self.num_ranks], np.int64).tobytes())
        h.update(self.segments.tobytes())
        h.update(self.weights.tobytes())
        h.update(np.packbits(self.needed).tobytes())
        h.update(self.mask_digest)
        return h.hexdigest()


def mask_digest(masks_and_flags: Sequence[Tuple[np.ndarray, bool]]) -> bytes:
    """sha256 of checked masks (contiguous int32 ``[B, H_mask, S, C]``) with their causal flags."""
    h = hashlib.sha256()
    for sri, causal in masks_and_flags:
        h.update(np.array(list(sri.shape) + [int(bool(causal))], np.int64).tobytes())
        h.update(np.ascontiguousarray(sri, dtype=np.int32).tobytes())
    return h.digest()


def build_layout(startend_row_indices, causal, num_ranks: int, segment_size: Optional[int] = None,
                 *, extra_masks: Sequence = (), segments=None, tile: int = TILE) -> CPLayout:
    """Summary + balance + communication plan, without any process group (pure function).

    ``extra_masks``: further ``(startend_row_indices, causal)`` sharing this dispatch (their
    workloads are added for the balance; their visibility is OR-ed only where noted by callers).
    ``segments``: reuse an existing assignment ``[P, n/P]`` instead of balancing.
    """
    sri = _check_mask(startend_row_indices, causal)
    extras = []
    for i, entry in enumerate(extra_masks):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise TypeError(f"extra_masks[{i}] must be a (startend_row_indices, causal) pair")
        extras.append((_check_mask(entry[0], entry[1]), bool(entry[1])))
    return _build_layout(sri, bool(causal), num_ranks, segment_size, extras, segments, tile)


def _build_layout(sri: np.ndarray, causal: bool, num_ranks, segment_size, extras, segments, tile) -> CPLayout:
    """:func:`build_layout` of masks that already passed :func:`_check_mask` (``extras``: checked pairs)."""
    b, hm, s, _ = sri.shape
    num_ranks = _checks.check_int("num_ranks", num_ranks, lo=1)
    if segment_size is None:
        segment_size = default_segment_size(s, num_ranks)
    segment_size, tile = check_segment_sizes(s, segment_size, tile)
    if s % (num_ranks * segment_size) != 0:
        raise ValueError(f"seqlen ({s}) must be divisible by num_ranks * segment_size = {num_ranks} * "
                         f"{segment_size} = {num_ranks * segment_size}; pad the sequence with masked-out "
                         f"tokens or choose another segment_size")
    weights, needed = _segment_workload(sri, bool(causal), segment_size, tile)
    checked = [(sri, bool(causal))]
    for e, extra_causal in extras:
        if e.shape[2] != s:
            raise ValueError(f"all masks sharing a dispatch need seqlen {s}, got {e.shape[2]}")
        w2, _ = _segment_workload(e, bool(extra_causal), segment_size, tile)
        weights = weights + w2
        checked.append((e, bool(extra_causal)))
    if segments is None:
        segments = hcc_ipo(weights, num_ranks)
    else:
        segments = _check_segments(segments, num_ranks, s // segment_size)
    return CPLayout(s, segment_size, num_ranks, segments, weights, needed, mask_digest(checked))


def _check_segments(segments, num_ranks: int, num_segments: int) -> np.ndarray:
    """A given assignment: int ``[num_ranks, num_segments / num_ranks]``, each segment exactly once,
    each rank's row ascending."""
    arr = np.asarray(segments)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"segments must be an integer array, got dtype {arr.dtype}")
    if arr.shape != (num_ranks, num_segments // num_ranks):
        raise ValueError(f"segments must have shape [num_ranks, num_segments / num_ranks] = "
                         f"{[num_ranks, num_segments // num_ranks]}, got {list(arr.shape)}")
    if not np.array_equal(np.sort(arr, axis=None), np.arange(num_segments)):
        raise ValueError(f"segments must hold every segment 0..{num_segments - 1} exactly once")
    if np.any(np.diff(arr, axis=1) <= 0):
        raise ValueError("each rank's segments must be in ascending order")
    return arr.astype(np.int64)


class CPPlan:
    """One rank's view of a CP layout for one mask, plus its communicator.

    Use :meth:`dispatch` / :meth:`undispatch` to move ``[B, S, ...]`` tensors between global order
    and this rank's segments, and :func:`cp_flashmask_attention` to run attention.
    """

    def __init__(self, layout: CPLayout, startend_row_indices, causal: bool, comm: Communicator):
        """``layout``: from :func:`build_layout` on the same mask; ``comm``: this rank's group
        (``comm.world_size == layout.num_ranks``). Raises TypeError / ValueError on a bad mask."""
        self._setup(layout, _check_mask(startend_row_indices, causal), bool(causal), comm)

    @classmethod
    def _from_checked(cls, layout, sri: np.ndarray, causal: bool, comm) -> "CPPlan":
        """A plan on a mask that already passed :func:`_check_mask` (checked once per plan)."""
        plan = cls.__new__(cls)
        plan._setup(layout, sri, causal, comm)
        return plan

    def _setup(self, layout, startend_row_indices, causal, comm):
        if comm.world_size != layout.num_ranks:
            raise ValueError(f"CP group has {comm.world_size} ranks, layout has {layout.num_ranks}")
        self.layout, self.comm, self.causal = layout, comm, bool(causal)
        self.rank = comm.rank
        self.startend_row_indices = startend_row_indices
        lay, r, c = layout, comm.rank, layout.segment_size
        self.my_segments = lay.segments[r]
        self.local_seqlen = len(self.my_segments) * c
        self.local_mask = _localize_checked(startend_row_indices, causal, self.my_segments, c)  # [B,Hm,S,4]
        self.recv_peers = [p for p in range(lay.num_ranks) if len(lay.recv[r][p])]
        self.send_peers = [p for p in range(lay.num_ranks) if p != r and len(lay.recv[p][r])]
        self._cache = {}
        self._agreed_calls = set()

    # ---- index helpers -------------------------------------------------------------------
    def _rows(self, segs) -> np.ndarray:
        c = self.layout.segment_size
        segs = np.asarray(segs, dtype=np.int64)
        return (segs[:, None] * c + np.arange(c)[None, :]).reshape(-1)

    def send_rows(self, peer: int) -> np.ndarray:
        """Local KV rows (in this rank's order) that ``peer`` receives from this rank."""
        segs = self.layout.recv[peer][self.rank]
        return self._rows(self.layout.position[segs])

    def kv_rows(self, source) -> np.ndarray:
        """Global rows (int64, ascending) of the KV held locally (``source='local'``: also this
        rank's query rows) or received from peer ``source``: the key columns of :meth:`local_mask_for`."""
        return self._rows(self.my_segments if source == "local" else self.layout.recv[self.rank][source])

    def local_mask_for(self, source) -> np.ndarray:
        """The localized mask (int32 ``[B, H_mask, keys, 4]``, non-causal) over the key columns of the
        KV held locally (``source='local'``) or received from peer ``source``."""
        return np.ascontiguousarray(self.local_mask[:, :, self.kv_rows(source), :])

    def prepared_mask(self, backend, source):
        """:meth:`local_mask_for` prepared by an attention ``backend`` (:class:`step.AttentionBackend`),
        cached in the plan."""
        key = ("mask", backend.name, source)
        if key not in self._cache:
            self._cache[key] = backend.prepare_mask(self.local_mask_for(source), self.local_seqlen)
        return self._cache[key]

    # ---- dispatch (paddle tensors; dispatch.py) -------------------------------------------
    def dispatch(self, x, axis: int = 1):
        """Global ``x`` (``x.shape[axis] == S``, identical on every rank) -> this rank's segments in
        ascending order (``x.shape[axis] == S / P``). Differentiable (``dispatch.take_rows``)."""
        from .dispatch import dispatch  # noqa: PLC0415 - needs paddle

        return dispatch(self, x, axis)

    def undispatch(self, x, axis: int = 1):
        """This rank's ``x`` (``x.shape[axis] == S / P``) -> the global tensor on every rank
        (all-gather). Backward keeps this rank's slice of the incoming gradient (each rank is assumed
        to compute the same loss on the global tensor)."""
        from .dispatch import undispatch  # noqa: PLC0415 - needs paddle

        return undispatch(self, x, axis)

    # ---- reuse ---------------------------------------------------------------------------
    def for_mask(self, startend_row_indices, *, causal: bool) -> "CPPlan":
        """A plan for another mask of the same sequence sharing this plan's dispatch (same segments
        on the same ranks: e.g. sliding-window and global layers of one model). Its own
        localization and KV pruning; :func:`check_agreement` (every rank of the group joins it)."""
        sri = _check_mask(startend_row_indices, causal)
        if sri.shape[2] != self.layout.seqlen:
            raise ValueError(f"startend_row_indices must cover this plan's sequence ({self.layout.seqlen} tokens), "
                             f"got {sri.shape[2]}")
        lay = _build_layout(sri, bool(causal), self.layout.num_ranks, self.layout.segment_size, (),
                            self.layout.segments, TILE)
        plan = CPPlan._from_checked(lay, sri, bool(causal), self.comm)
        check_agreement([plan])
        return plan

    # ---- introspection -------------------------------------------------------------------
    def digest(self) -> str:
        """Hex sha256 of the layout (:meth:`CPLayout.digest`) and of this plan's own mask and flag."""
        own = mask_digest([(np.ascontiguousarray(self.startend_row_indices, dtype=np.int32), self.causal)])
        return hashlib.sha256(self.layout.digest().encode() + own).hexdigest()

    def check_agreement(self) -> None:
        """:func:`check_agreement` of this plan alone (one all-gather on its group)."""
        check_agreement([self])

    def check_call_agreement(self, what: str, signature: Sequence) -> None:
        """That every rank of the group runs this plan with the same ``signature`` (as many values on
        every rank: the shapes, dtype and scale of a call; ints and bools as they are, anything else
        by the crc32 of its repr), ``what`` naming the call and the values: one all-gather the first
        time this plan sees the signature, none after (so, like any collective, the ranks make their
        calls in the same order). Ranks whose KV heads or head dims differ but multiply to the same
        sizes would otherwise exchange their blocks in different layouts and return wrong outputs
        without an error.

        Raises:
            RuntimeError: on every rank, when some rank's signature differs from the others'.
        """
        values = tuple(int(v) if isinstance(v, (int, np.integer)) else zlib.crc32(repr(v).encode())
                       for v in signature)
        if (what, values) in self._agreed_calls:
            return
        if self.comm.world_size > 1 and not isinstance(self.comm, PlanOnlyCommunicator):
            got = [tuple(g) for g in self.comm.all_gather_ints(values)]
            if len(set(got)) > 1:
                raise RuntimeError(f"CP call differs across the ranks of the group: {what} = "
                                   + ", ".join(f"rank {r}: {list(g)}" for r, g in enumerate(got))
                                   + f" (this is rank {self.comm.rank}); every rank must pass the same")
        self._agreed_calls.add((what, values))

    def stats(self, bytes_per_token: Optional[int] = None) -> dict:
        """Load balance and communication of the layout (same numbers on every rank).

        ``bytes_per_token``: KV bytes per token (``num_heads_k * (head_dim + head_dim_v) * itemsize * batch``)
        to report bytes; otherwise volumes are in tokens.
        """
        if bytes_per_token is not None:
            bytes_per_token = _checks.check_int("bytes_per_token", bytes_per_token, lo=1)
        lay = self.layout
        loads = lay.loads()
        mean = loads.mean() if loads.size else 0.0
        c, p = lay.segment_size, lay.num_ranks
        sent = np.zeros(p, np.int64)
        recv = np.zeros(p, np.int64)
        for r in range(p):
            for q in range(p):
                k = len(lay.recv[r][q]) * c
                recv[r] += k
                sent[q] += k
        ring = (p - 1) * self.local_seqlen
        pairs = p * (lay.num_segments - lay.segments.shape[1])
        sent_pairs = int(sum(len(lay.recv[r][q]) for r in range(p) for q in range(p)))
        unit = bytes_per_token or 1
        name = "bytes" if bytes_per_token else "tokens"
        return {
            "num_ranks": p, "segment_size": c, "num_segments": lay.num_segments,
            "load_per_rank": loads.tolist(),
            "max_over_mean_load": float(loads.max() / mean) if mean > 0 else 1.0,
            f"kv_{name}_sent_per_rank": (sent * unit).tolist(),
            f"kv_{name}_received_per_rank": (recv * unit).tolist(),
            f"ring_kv_{name}_sent_per_rank": ring * unit,
            "kv_sent_vs_ring": float(sent.max() / ring) if ring else 0.0,
            "remote_segments_skipped": pairs - sent_pairs, "remote_segments_total": pairs,
            "plan_digest": self.digest()[:16],
        }


def check_agreement(plans: Sequence[CPPlan]) -> None:
    """Check that every rank of the plans' group made the same plans: one all-gather of one int64,
    a hash of the plans' digests (:meth:`CPPlan.digest`: the masks and causal flags, sizes,
    segments, workload and needed segments), which every rank of the group must join.
    ``make_cp_plan``, ``make_cp_plans`` and ``CPPlan.for_mask`` call it on every plan they make.
    Without it, ranks given different masks whose plans need the same exchange sizes run without
    an error and return wrong outputs. A group of one rank, or a :class:`PlanOnlyCommunicator`
    (all ranks simulated in one process), has no one to disagree with: no communication.

    Raises:
        RuntimeError: on every rank, when some rank's plans differ from the others'.
    """
    comm = plans[0].comm
    if comm.world_size == 1 or isinstance(comm, PlanOnlyCommunicator):
        return
    h = hashlib.sha256("".join(p.digest() for p in plans).encode()).hexdigest()
    mine = int(h[:15], 16)  # 60 bits: a non-negative int64
    got = [g[0] for g in comm.all_gather_ints([mine])]
    if len(set(got)) > 1:
        groups = {}
        for rank, value in enumerate(got):
            groups.setdefault(value, []).append(rank)
        raise RuntimeError(f"CP plans differ across the ranks of the group (ranks holding the same plans: "
                           f"{sorted(groups.values())}; this is rank {comm.rank}): every rank must make its plans "
                           f"from the same global mask (values, shape and causal flag) and segment_size")


def make_cp_plan(startend_row_indices, *, causal: bool, group=None, segment_size: Optional[int] = None,
                 debug: Optional[bool] = None) -> CPPlan:
    """Build this rank's context-parallel plan for a global FlashMask. Its only communication is
    :func:`check_agreement` (one all-gather of one int64), which every rank of the group joins.

    Args:
        startend_row_indices: the **global** mask, int32 ``[B, H_mask, S, C]`` (numpy or paddle),
            identical on every rank; self-attention (``S_q == S_k == S``).
        causal: its causal flag.
        group: a Paddle process group, a :class:`Communicator`, or None: with fleet initialized,
            its ``cp_degree`` or ``sep_degree`` axis, whichever is > 1 (neither: a plan of one rank,
            no exchange); without fleet, the world (:func:`comm.default_communicator`).
        segment_size: tokens per segment (default :func:`default_segment_size`). ``S`` must be
            divisible by ``P * segment_size``.
        debug: no effect, kept for compatibility: the agreement check it turned on (with
            ``FM3_CP_DEBUG``) always runs now.

    Returns:
        :class:`CPPlan`.

    Raises:
        TypeError / ValueError: bad mask, sizes not divisible, fleet with both ``cp_degree`` and
        ``sep_degree`` > 1 and no ``group``; RuntimeError: the ranks' masks (or sizes) differ.
    """
    comm = default_communicator(group)
    sri = _check_mask(startend_row_indices, causal)
    lay = _build_layout(sri, bool(causal), comm.world_size, segment_size, (), None, TILE)
    plan = CPPlan._from_checked(lay, sri, bool(causal), comm)
    check_agreement([plan])
    return plan


def make_cp_plans(masks: Sequence[Tuple[object, bool]], *, group=None, segment_size: Optional[int] = None,
                  debug: Optional[bool] = None) -> List[CPPlan]:
    """Plans for several masks of one sequence sharing one dispatch, balanced on their summed
    workload (e.g. the sliding-window and global layers of one model). ``masks``: a sequence of
    ``(startend_row_indices, causal)``. One :func:`check_agreement` for all of them; ``debug``:
    no effect (:func:`make_cp_plan`)."""
    if not isinstance(masks, (list, tuple)) or not masks:
        raise TypeError("masks must be a non-empty list of (startend_row_indices, causal) pairs, got "
                        f"{type(masks).__name__}")
    for i, entry in enumerate(masks):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise TypeError(f"masks[{i}] must be a (startend_row_indices, causal) pair, got {type(entry).__name__}")
    comm = default_communicator(group)
    checked = [(_check_mask(m, c), bool(c)) for m, c in masks]
    first = _build_layout(checked[0][0], checked[0][1], comm.world_size, segment_size, checked[1:], None, TILE)
    plans = [CPPlan._from_checked(first, checked[0][0], checked[0][1], comm)]
    for m, c in checked[1:]:
        lay = _build_layout(m, c, comm.world_size, first.segment_size, (), first.segments, TILE)
        plans.append(CPPlan._from_checked(lay, m, c, comm))
    check_agreement(plans)
    return plans
