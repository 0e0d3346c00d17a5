"""The communication interface of the CP executor, and its implementations.

The executor and the plan only call :class:`Communicator`; a backend is a small class:

- :class:`PaddleCommunicator`: ``paddle.distributed`` on a process group. On NCCL one
  ``batch_isend_irecv`` per exchange; on gloo (CPU) ordered blocking ``send``/``recv`` (Paddle
  3.3's ProcessGroupGloo has no all-to-all, and its ``isend``/``irecv`` block until matched).
- :class:`TorchCommunicator`: the same over ``torch.distributed`` (for the GPU benchmark machines,
  which have PyTorch but no Paddle).
- :class:`PlanOnlyCommunicator`: rank and world size only, for planning and simulation without a
  process group (any communication raises).
"""

from __future__ import annotations

import abc
from typing import List, Sequence, Tuple

__all__ = ["Communicator", "Pending", "PaddleCommunicator", "TorchCommunicator", "PlanOnlyCommunicator",
           "default_communicator"]


class Pending:
    """Handles of one posted exchange. ``wait_recv(i)`` blocks until the i-th receive is complete."""

    def __init__(self, send_tasks: Sequence, recv_tasks: Sequence):
        self._send = list(send_tasks)
        self._recv = list(recv_tasks)

    def wait_recv(self, i: int) -> None:
        t = self._recv[i] if i < len(self._recv) else None  # absent: completed when posted
        if t is not None:
            t.wait()
            self._recv[i] = None

    def wait_all(self) -> None:
        for i in range(len(self._recv)):
            self.wait_recv(i)
        for t in self._send:
            if t is not None:
                t.wait()
        self._send = []


class Communicator(abc.ABC):
    """What the CP plan and executor need from a process group.

    Ranks are indices ``0 .. world_size - 1`` inside the CP group.
    """

    rank: int
    world_size: int

    @abc.abstractmethod
    def exchange(self, sends: Sequence[Tuple[int, object]], recvs: Sequence[Tuple[int, object]]) -> Pending:
        """Post all point-to-point ``sends`` (peer, tensor) and ``recvs`` (peer, preallocated tensor)
        at once, without blocking; at most one message per direction per peer. Every rank must
        post the matching operations in the same call (both ends derive them from the plan).

        Every rank of the group calls ``exchange`` at the same points of the step, also a rank
        with nothing to send or receive: a backend may implement it with collectives (Paddle's
        gloo) or need the whole group at its first call (NCCL creates the group's communicator)."""

    @abc.abstractmethod
    def all_gather(self, tensor) -> List:
        """Blocking all-gather of same-shaped tensors; returns the list in rank order."""

    def all_gather_ints(self, values: Sequence[int]) -> List[List[int]]:
        """All-gather a short list of int64 values (the plan-agreement check)."""
        raise NotImplementedError


class PlanOnlyCommunicator(Communicator):
    """A (rank, world_size) pair without a process group: plans, stats, simulation."""

    def __init__(self, rank: int, world_size: int):
        from .. import _checks  # noqa: PLC0415 - numpy only

        world_size = _checks.check_int("world_size", world_size, lo=1)
        rank = _checks.check_int("rank", rank, lo=0, hi=world_size - 1)
        self.rank, self.world_size = rank, world_size

    def exchange(self, sends, recvs):
        if sends or recvs:
            raise RuntimeError("PlanOnlyCommunicator cannot communicate; build the plan on a process group")
        return Pending([], [])

    def all_gather(self, tensor):
        if self.world_size != 1:
            raise RuntimeError("PlanOnlyCommunicator cannot communicate; build the plan on a process group")
        return [tensor]

    def all_gather_ints(self, values):
        if self.world_size != 1:
            raise RuntimeError("PlanOnlyCommunicator cannot communicate")
        return [list(values)]


class PaddleCommunicator(Communicator):
    """``paddle.distributed`` on ``group`` (None: the world)."""

    def __init__(self, group=None):
        import paddle.distributed as dist  # noqa: PLC0415

        self._dist = dist
        self.group = group
        if group is None:
            self.world_size = dist.get_world_size()
            self.rank = dist.get_rank()
            self._global = list(range(self.world_size))
        else:
            self.world_size = group.nranks
            self.rank = group.rank
            self._global = list(group.ranks)
        if self.rank < 0:
            raise ValueError("this process is not a member of the CP group")
        try:
            backend = dist.get_backend(group)
        except Exception:  # noqa: BLE001 - older Paddle
            backend = "NCCL"
        self.backend = str(backend).upper()

    def exchange(self, sends, recvs):
        dist = self._dist
        if self.backend != "NCCL":
            # gloo (CPU): Paddle 3.3's ProcessGroupGloo has no batched p2p and no all-to-all, and
            # its isend/irecv block until matched and deadlock on irregular patterns (measured:
            # pairwise and shift-round schedules with barriers both time out at 4 ranks). So on
            # gloo the exchange is two all-gathers, which every rank joins, idle or not: the [P]
            # per-destination element counts of every rank, then every rank's outgoing messages
            # (fp32, concatenated by destination, padded to the largest rank). Each rank cuts its
            # own messages out. Same result; P x the bytes (CPU CI only).
            return self._exchange_by_all_gather(sends, recvs)
        _join_group_once(self)
        if not sends and not recvs:
            return Pending([], [])
        ops = [dist.P2POp(dist.isend, t, self._global[p], self.group) for p, t in sends]
        ops += [dist.P2POp(dist.irecv, t, self._global[p], self.group) for p, t in recvs]
        tasks = dist.batch_isend_irecv(ops)
        return Pending(tasks[:len(sends)], tasks[len(sends):])

    def _exchange_by_all_gather(self, sends, recvs):
        import numpy as np  # noqa: PLC0415
        import paddle  # noqa: PLC0415

        p_ = self.world_size
        counts = [0] * p_
        for p, t in sends:
            counts[p] = int(np.prod(t.shape))
        table = np.array(self.all_gather_ints(counts), dtype=np.int64)  # [src, dst]
        longest = max(1, int(table.sum(axis=1).max()))
        flat = [t.astype("float32").reshape([-1]) for _, t in sorted(sends, key=lambda x: x[0])]
        pad = longest - sum(counts)
        if pad:
            flat.append(paddle.zeros([pad], dtype="float32"))
        buf = paddle.concat(flat) if len(flat) > 1 else flat[0]
        gathered = self.all_gather(buf)
        for p, t in recvs:
            off = int(table[p, :self.rank].sum())
            n = int(table[p, self.rank])
            if n != int(np.prod(t.shape)):
                raise RuntimeError(f"CP exchange: rank {p} sends {n} elements to rank {self.rank}, "
                                   f"which expects {int(np.prod(t.shape))}: the ranks' plans differ")
            paddle.assign(gathered[p][off:off + n].reshape(t.shape).astype(t.dtype), output=t)
        return Pending([], [])

    def all_gather(self, tensor):
        out = []
        self._dist.all_gather(out, tensor, group=self.group)
        return out

    def all_gather_ints(self, values):
        import paddle  # noqa: PLC0415

        t = paddle.to_tensor(list(values), dtype="int64")
        return [x.numpy().tolist() for x in self.all_gather(t)]


class TorchCommunicator(Communicator):
    """``torch.distributed`` on ``group`` (None: the default group), for the GPU machines without
    Paddle (``tools/cp_torch_run.py``; checked there on gloo, not in CI, which has no torch)."""

    def __init__(self, group=None):
        import torch.distributed as tdist  # noqa: PLC0415

        self._dist = tdist
        self.group = group
        self.world_size = tdist.get_world_size(group)
        self.rank = tdist.get_rank(group)
        self._global = [tdist.get_global_rank(group, r) if group is not None else r
                        for r in range(self.world_size)]

    def exchange(self, sends, recvs):
        d = self._dist
        _join_group_once(self)
        ops = [d.P2POp(d.isend, t, self._global[p], self.group) for p, t in sends]
        ops += [d.P2POp(d.irecv, t, self._global[p], self.group) for p, t in recvs]
        if not ops:
            return Pending([], [])
        # torch completes a batch as a whole: every receive (and the sends) wait on all requests, and
        # each request is waited once (on gloo a second wait() of a completed request never returns)
        every = _AllOf(d.batch_isend_irecv(ops))
        return Pending([every] if sends else [], [every] * len(recvs))

    def all_gather(self, tensor):
        out = [tensor.new_empty(tensor.shape) for _ in range(self.world_size)]
        self._dist.all_gather(out, tensor.contiguous(), group=self.group)
        return out

    def all_gather_ints(self, values):
        import torch  # noqa: PLC0415

        dev = "cuda" if self._dist.get_backend(self.group) == "nccl" else "cpu"
        t = torch.tensor(list(values), dtype=torch.int64, device=dev)
        return [x.cpu().tolist() for x in self.all_gather(t)]


def _join_group_once(comm: Communicator) -> None:
    """Before a communicator's first point-to-point batch, one collective of the whole group (every
    rank calls ``exchange``, idle or not): ``batch_isend_irecv`` as the first operation on an NCCL
    group needs every rank of the group (torch.distributed documents it; Paddle's coalesced NCCL
    p2p creates the group's communicator there too), and later batches may then leave ranks out."""
    if not getattr(comm, "_joined", False):
        comm.all_gather_ints([0])
        comm._joined = True


class _AllOf:
    """Waits a list of requests, once: later calls return at once."""

    def __init__(self, reqs):
        self._reqs = list(reqs)

    def wait(self):
        reqs, self._reqs = self._reqs, []
        for r in reqs:
            r.wait()


def default_communicator(group=None) -> Communicator:
    """The CP group.

    ``group`` if given (a Paddle group or a Communicator). Else, when fleet is initialized
    (``fleet.init``; PaddleFormers does it), fleet's context-parallel axis (``cp_degree``, which
    PaddleFormers' ``context_parallel_size`` sets) or its ``sep`` axis, whichever is > 1; neither:
    a group of one rank (each data-parallel rank keeps its own sequence; no exchange). Without
    fleet, the world (a group of one rank when ``paddle.distributed`` is not initialized).

    Raises:
        TypeError: ``group`` is not a process group, a Communicator or None.
        ValueError: fleet has both ``cp_degree`` and ``sep_degree`` > 1 and no ``group`` is given.
    """
    if isinstance(group, Communicator):
        return group
    import paddle.distributed as dist  # noqa: PLC0415

    if group is not None:
        if not hasattr(group, "nranks") or not hasattr(group, "rank"):
            raise TypeError(f"group must be a paddle.distributed process group, a Communicator or None, "
                            f"got {type(group).__name__}")
        return PaddleCommunicator(group)
    hcg = _fleet_hcg()
    if hcg is not None:
        get_cp_size = getattr(hcg, "get_context_parallel_world_size", None)  # absent in older Paddle
        axis = fleet_cp_axis(get_cp_size() if get_cp_size else 1, hcg.get_sep_parallel_world_size())
        if axis == "cp":
            return PaddleCommunicator(hcg.get_context_parallel_group())
        if axis == "sep":
            return PaddleCommunicator(hcg.get_sep_parallel_group())
        return PlanOnlyCommunicator(0, 1)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return PlanOnlyCommunicator(0, 1)
    return PaddleCommunicator(None)


def fleet_cp_axis(cp_degree: int, sep_degree: int):
    """Which of fleet's axes carries context parallelism: ``"cp"``, ``"sep"`` or None (neither > 1).

    Raises:
        ValueError: both are > 1 (pass ``group=`` to choose).
    """
    if cp_degree > 1 and sep_degree > 1:
        raise ValueError(f"fleet has both cp_degree ({cp_degree}) and sep_degree ({sep_degree}) > 1: pass "
                         f"group= (e.g. hcg.get_context_parallel_group()) to say which axis the CP plan uses")
    if cp_degree > 1:
        return "cp"
    return "sep" if sep_degree > 1 else None


def _fleet_hcg():
    """Fleet's HybridCommunicateGroup, or None when fleet is not initialized."""
    try:
        from paddle.distributed import fleet  # noqa: PLC0415

        return fleet.get_hybrid_communicate_group()
    except (ImportError, AssertionError, AttributeError):  # fleet asserts that it was initialized
        return None
