"""Process sets: collectives among a subset of the ranks (Horovod's ``ProcessSet`` API).

Each registered set is its own stream in the engine: its own negotiation,
response cache, fusion buffer and communicators among its members, so
collectives of two sets run at the same time without waiting on each other.

Sets are registered collectively: every rank passes the same sets to
``init(process_sets=[...])``, or calls ``add_process_set`` / ``remove_process_set``
with the same arguments in the same order (dynamic sets need
``SMDIST_DYNAMIC_PROCESS_SETS=1``, also read as ``HOROVOD_DYNAMIC_PROCESS_SETS``,
or ``init(process_sets="dynamic")``). A disagreement fails on every rank.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence, Union

from smdist_tf._native import runtime as _rt

_DYNAMIC_VARIABLES = ("SMDIST_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS")


class ProcessSet:
    """A set of ranks that run collectives together.

    Make one from a list of ranks, or from an mpi4py communicator (its members,
    as ranks of ``MPI.COMM_WORLD``), then pass it to ``init(process_sets=[...])`` or
    ``add_process_set``; collectives take it as ``process_set=``.

    Attributes:
        process_set_id: the engine's id once registered (0 is every rank), else ``None``.
        ranks: the member ranks, ascending.
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]):
        self.process_set_id: Optional[int] = None
        self.mpi_comm: Any = None
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator
            self.mpi_comm = ranks_or_comm
            self.ranks: Optional[list[int]] = _world_ranks_of(ranks_or_comm)
            return
        ranks = list(ranks_or_comm)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet takes a list of integer ranks or an mpi4py communicator, "
                             f"got {ranks_or_comm!r}")
        self.ranks = sorted(ranks)

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or ``None`` when it is not registered."""
        return None if self.process_set_id is None else len(self._membership()[0])

    def rank(self) -> Optional[int]:
        """This process's index in the set (-1 when not a member), or ``None`` when not registered."""
        return None if self.process_set_id is None else self._membership()[1]

    def included(self) -> Optional[bool]:
        """Whether this process is a member, or ``None`` when the set is not registered."""
        return None if self.process_set_id is None else self._membership()[1] >= 0

    def _membership(self) -> tuple[list[int], int]:
        return _rt.process_set_membership(self.process_set_id)

    def _invalidate(self) -> None:
        self.process_set_id = None

    def __repr__(self) -> str:
        # Horovod's spelling, which scripts and tests compare against.
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


def _world_ranks_of(comm: Any) -> list[int]:
    from mpi4py import MPI  # only for sets made from a communicator

    world = MPI.COMM_WORLD.Get_group()
    return sorted(comm.Get_group().Translate_ranks(list(range(comm.Get_size())), world))


#: Every rank of the job (id 0); its ranks are filled in by ``init()``.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_registered: dict[int, list[ProcessSet]] = {0: [global_process_set]}
_dynamic = False


def _dynamic_requested() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in _DYNAMIC_VARIABLES)


def setup(process_sets: Union[None, str, Sequence[ProcessSet]], allgather_ranks: Callable[[list], list]) -> None:
    """Registers ``init()``'s static sets, in order, and fills in the global set (internal).

    Sets made from communicators may differ per rank (each rank passes its own
    group's communicator): every rank's are gathered and registered in order of
    their lowest rank, so all ranks register the same sets; ``allgather_ranks`` gathers
    every rank's list (a collective, passed in because collectives sit above this module).
    """
    global _dynamic
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(f"init(process_sets=...) takes a list of ProcessSet or 'dynamic', got {process_sets!r}")
        _dynamic, process_sets = True, []
    else:
        _dynamic = _dynamic_requested()
    for ps in list(_registered.get(0, [])):
        ps.ranks = list(range(_rt.size()))
    for pid in [pid for pid in _registered if pid != 0]:
        for ps in _registered.pop(pid):
            ps._invalidate()
    sets = list(process_sets or [])
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"init(process_sets=...) takes ProcessSet objects, got {ps!r}")
    from_comms = [ps for ps in sets if ps.mpi_comm is not None]
    if from_comms:
        everyone = allgather_ranks([ps.ranks for ps in from_comms])
        union = sorted({tuple(r) for lists in everyone for r in lists}, key=lambda r: (r[0], r))
        for ranks in union:
            _register(ProcessSet(list(ranks)))
    for ps in sets:
        if ps.mpi_comm is not None:
            match = next(pid for pid, known in _registered.items() if known[0].ranks == ps.ranks)
            ps.process_set_id = match
            _registered[match].append(ps)
        else:
            _register(ps)


def _register(ps: ProcessSet) -> ProcessSet:
    ps.process_set_id = int(_rt.add_process_set(list(ps.ranks)))
    _registered.setdefault(ps.process_set_id, []).append(ps)
    return ps


def _require_dynamic(what: str) -> None:
    if not _rt.is_initialized():
        raise ValueError("smdist_tf has not been initialized: call smdist_tf.init() first")
    if not _dynamic:
        raise ValueError(f"{what} needs dynamic process sets: set SMDIST_DYNAMIC_PROCESS_SETS=1 (or "
                         "HOROVOD_DYNAMIC_PROCESS_SETS=1) or call init(process_sets='dynamic'); static sets go "
                         "to init(process_sets=[...])")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a process set after ``init()``; collective over every rank.

    Args:
        process_set: a ``ProcessSet`` or a list of ranks.

    Returns:
        The registered ``ProcessSet`` (the one given, or a new one for a list).

    Raises:
        ValueError: on every rank, when dynamic sets are off, the ranks are out of range
            or repeated, a set with the same ranks exists, or the ranks disagree on the call.
    """
    _require_dynamic("add_process_set")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.mpi_comm is not None:
        raise NotImplementedError("add_process_set takes a list of ranks; sets from a communicator go to "
                                  "init(process_sets=[...])")
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    return _register(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters a process set; collective over every rank.

    Returns:
        ``True`` when removed; ``False`` for the global set, which cannot be removed.

    Raises:
        ValueError: on every rank, when dynamic sets are off, the set is not registered,
            the ranks disagree on the call, or collectives of the set are still in flight.
    """
    _require_dynamic("remove_process_set")
    if process_set.process_set_id == 0:
        return False
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered")
    pid = process_set.process_set_id
    _rt.remove_process_set(pid)
    for ps in _registered.pop(pid, []):
        ps._invalidate()
    process_set._invalidate()
    return True


def ensure_registered(ranks: Sequence[int]) -> ProcessSet:
    """The registered set with these ranks, registering it if there is none (internal).

    For sets the library itself needs (pipeline groups): works without dynamic sets
    enabled; collective over every rank, like ``add_process_set``.
    """
    ranks = sorted(ranks)
    for known in _registered.values():
        if known[0].ranks == ranks:
            return known[0]
    return _register(ProcessSet(ranks))


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered ``ProcessSet`` with this id."""
    if process_set_id not in _registered:
        raise ValueError(f"no process set with id {process_set_id} is registered")
    return _registered[process_set_id][0]


def process_set_id(process_set: Optional[ProcessSet]) -> int:
    """The engine id a collective's ``process_set=`` argument names (internal).

    Raises:
        ValueError: for a set that is not registered (or was removed).
    """
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {process_set!r}")
    pid = process_set.process_set_id
    if pid is None or pid not in _registered:
        raise ValueError(f"{process_set} is not registered: pass it to init(process_sets=[...]) or add_process_set()")
    return pid


def membership(process_set: Optional[ProcessSet]) -> tuple[int, list[int], int]:
    """``(id, ranks, this rank's index or -1)`` of a collective's ``process_set=`` (internal)."""
    if not _rt.is_initialized():
        raise ValueError("smdist_tf has not been initialized: call smdist_tf.init() first")
    pid = process_set_id(process_set)
    ranks, index = _rt.process_set_membership(pid)
    return pid, list(ranks), index
