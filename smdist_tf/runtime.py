"""The running engine: ``rank``, ``size`` and friends, ``shutdown`` and the engine's settings.

``init`` lives in ``smdist_tf.initialization``: it registers process sets, which sit above this module.
"""

from __future__ import annotations

from typing import Optional

from smdist_tf._native import build_info, runtime as _rt

def shutdown() -> None:
    """Stops the engine on every rank; pending collectives fail. ``init()`` may be called again."""
    _rt.shutdown()


def is_initialized() -> bool:
    """Whether ``init()`` has been called (and ``shutdown()`` has not)."""
    return _rt.is_initialized()


def size() -> int:
    """Number of processes in the job."""
    return _rt.size()


def rank() -> int:
    """This process's index in the job, ``0 <= rank() < size()``."""
    return _rt.rank()


def local_size() -> int:
    """Number of processes on this host."""
    return _rt.local_size()


def local_rank() -> int:
    """This process's index among the processes on its host (pin a device with it)."""
    return _rt.local_rank()


def cross_size() -> int:
    """Number of hosts that have a process with this process's local rank."""
    return _rt.cross_size()


def cross_rank() -> int:
    """Index of this process's host among those of ``cross_size()``."""
    return _rt.cross_rank()


def is_homogeneous() -> bool:
    """Whether every host runs the same number of processes."""
    return _rt.is_homogeneous()


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (safe to use mpi4py beside smdist_tf)."""
    return _rt.mpi_threads_supported()


def mpi_built() -> bool:
    """Whether this build has the MPI transport (always true today)."""
    return _rt.mpi_built()


def nccl_built() -> int:
    """NCCL's version code (``NCCL_VERSION_CODE``, 22809 for 2.28.9) when NCCL and the CUDA runtime load here, else 0.

    As Horovod's: truthy exactly when GPU tensors can travel over NCCL. The engine loads NCCL
    at run time, so this says whether it loads on this machine (see docs/gpus.md).
    """
    return _rt.nccl_built()


def cuda_built() -> bool:
    """Whether the CUDA runtime loads here (the engine loads it at run time for GPU tensors)."""
    return _rt.cuda_built()


def gloo_built() -> bool:
    """Horovod compatibility: smdist_tf has no Gloo transport."""
    return False


def mpi_enabled() -> bool:
    """Horovod compatibility: whether collectives run over MPI (always, in smdist_tf)."""
    return mpi_built()


def gloo_enabled() -> bool:
    """Horovod compatibility: smdist_tf has no Gloo transport."""
    return False


def ddl_built() -> bool:
    """Horovod compatibility: smdist_tf has no IBM DDL transport."""
    return False


def ccl_built() -> bool:
    """Horovod compatibility: smdist_tf has no oneCCL transport."""
    return False


def rocm_built() -> bool:
    """Horovod compatibility: smdist_tf has no ROCm kernels."""
    return False


def engine_config() -> dict:
    """The engine settings in force (fusion threshold, cycle time, stall timeouts, host name).

    ``intra_host_allreduce`` says which path large allreduces between ranks of
    one host take: ``cross_memory_attach``, ``shared_memory`` or ``mpi``;
    ``cross_memory_min_bytes`` the size from which single-host allreduces take
    cross-memory attach, and ``cross_memory_min_measured`` whether ``init()``
    measured it on this host (see ``SMDIST_CROSS_MEMORY_MIN_BYTES``). With
    ``SMDIST_AUTOTUNE=1`` (``autotune``) the fusion threshold, cycle time and the
    two intra-host minimums are the ones in force now, and ``autotune_finished``
    says whether tuning has made its choice. ``negotiation_busy_poll_us`` is how
    long a rank waiting for its peers' negotiation polls without pause before it
    yields and then sleeps between polls: 2000, or 100 where some host runs more
    ranks than it has cores (polling there takes the core a peer needs).
    """
    return dict(_rt.config())


def get_build_info() -> dict:
    """What the native build recorded: TensorFlow version, MPI flavour and compiler wrapper."""
    return dict(build_info)


def start_timeline(file_path: str, mark_cycles: Optional[bool] = None) -> None:
    """Starts writing this rank's Chrome-trace timeline to ``file_path``.

    Open it in chrome://tracing or https://ui.perfetto.dev: one row per tensor,
    with negotiation, fusion copy-in/out and the transfer. Each rank writes its
    own file, named as for ``SMDIST_TIMELINE`` (or ``HOROVOD_TIMELINE``), which
    starts one at ``init()`` instead: ``{rank}`` in the path is replaced by the
    rank, otherwise jobs of more than one rank append ``.<rank>``.

    Args:
        file_path: where this rank's trace goes (see above for ``{rank}``).
        mark_cycles: whether to mark the start of every engine cycle that ran
            collectives with an instant event ``CYCLE_START``; ``None`` takes
            ``SMDIST_TIMELINE_MARK_CYCLES`` (``smdistrun --timeline-mark-cycles``).

    Raises:
        ValueError: if the file cannot be written, or the path is a symbolic
            link (never followed) or an existing non-regular file. An existing
            regular file is overwritten, with a warning.
    """
    if mark_cycles is None:
        mark_cycles = _rt.config()["timeline_mark_cycles"]  # raises ValueError before init()
    _rt.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Finishes and closes the timeline file (a no-op when none is being written)."""
    _rt.stop_timeline()


def require_initialized() -> None:
    """Raises a clear error when a collective is used before ``init()``."""
    if not _rt.is_initialized():
        raise ValueError("smdist_tf has not been initialized: call smdist_tf.init() before any collective")
