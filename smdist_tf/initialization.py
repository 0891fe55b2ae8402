"""``init``: starts the engine and registers the process sets, on every rank."""

from __future__ import annotations

import atexit
from typing import Any

from smdist_tf import peer_failure, process_sets as _process_sets
from smdist_tf._native import runtime as _rt

_owner_exit_hook_registered = False


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Starts the collective engine. Every process of the job must call it.

    Works without a launcher too: a lone process becomes a job of size 1.

    At exit the engine shuts down with the other ranks and finalizes MPI. A rank
    that exits with a non-zero status (an exception, ``sys.exit(3)``) instead tells
    the others why, so their collectives fail at once naming it, and leaves without
    waiting for them.

    Args:
        comm: accepted for Horovod compatibility; only ``None`` (all processes) is supported.
        process_sets: ``ProcessSet`` objects to register (the same on every rank, or
            each rank's own group's communicator), or ``"dynamic"`` to allow
            ``add_process_set``/``remove_process_set`` later (see docs/process-sets.md).

    Raises:
        ValueError: if ``comm`` is given, or ``process_sets`` while already initialized with process sets.
        ValueError: if an ``SMDIST_*``/``HOROVOD_*`` setting is malformed (the message names it).
        ValueError: on every rank, if the ranks register different or invalid process sets.
        RuntimeError: if MPI cannot be started.
    """
    if comm is not None:
        raise ValueError("smdist_tf.init(comm=...) is not supported: the job always spans all processes")
    if process_sets is not None and _rt.is_initialized() and len(_rt.process_set_ids()) > 1:
        raise ValueError("smdist_tf is already initialized with process sets: add more with add_process_set()")
    _rt.init()
    peer_failure.install()
    if not _rt.owns_mpi():
        _stop_before_mpi_owner_exits()
    if _rt.process_set_ids() == [0]:  # a fresh engine (a running one keeps its sets)
        _process_sets.setup(process_sets, _allgather_ranks)


def _allgather_ranks(ranks: list) -> list:
    # TensorFlow is loaded only when some set was made from a communicator.
    from smdist_tf.objects import allgather_object

    return allgather_object(ranks)


def _stop_before_mpi_owner_exits() -> None:
    """Stops the engine at exit before the library that started MPI (mpi4py) finalizes it.

    The engine's own exit handler runs later, inside ``exit()``, when MPI would be gone.
    Python runs exit handlers last-registered first, and the MPI owner registered its own
    when it started MPI, before ``init()``.
    """
    global _owner_exit_hook_registered
    if not _owner_exit_hook_registered:
        atexit.register(_rt.shutdown)
        _owner_exit_hook_registered = True
