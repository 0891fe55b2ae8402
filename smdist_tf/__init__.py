"""smdist_tf: fast, Horovod-compatible distributed training for TensorFlow 2 and Keras 3.

Change ``import horovod.tensorflow as hvd`` to ``import smdist_tf as hvd`` and run
the script under ``smdistrun`` or ``mpirun``.

Names are resolved lazily (PEP 562): ``import smdist_tf`` alone does not import
TensorFlow, so the launcher (``smdistrun``, ``smdist_tf.run``) starts in a fraction
of a second. The first use of any TensorFlow-bound name (``sd.init``,
``sd.allreduce``, ...) loads TensorFlow and checks the native build.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# TensorFlow's default CPU allocator returns large tensors to the OS when they
# die, so every step faults fresh pages back in for gradients and collective
# outputs (on VMs that costs more than the allreduce itself). Its BFC pool keeps
# them mapped. TF creates the allocator at its first allocation, so this works
# unless the script allocated tensors before importing smdist_tf; set the
# variable to "false" beforehand to keep TF's default.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# Public name -> module that defines it.
_EXPORTS: dict[str, str] = {
    **{name: "smdist_tf.collectives" for name in (
        "allgather", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_variables",
        "broadcast_", "broadcast_global_variables", "grouped_allgather", "grouped_allreduce", "grouped_broadcast", "grouped_reducescatter",
        "join", "oob_allreduce", "reducescatter",
    )},
    **{name: "smdist_tf.topology_ops" for name in (
        "local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "size_op",
    )},
    "Compression": "smdist_tf.compression",
    "DistributedGradientTape": "smdist_tf.gradient_tape",
    "GradientReducer": "smdist_tf.gradient_reducer",
    "PartialDistributedGradientTape": "smdist_tf.gradient_tape",
    "allgather_object": "smdist_tf.objects",
    "broadcast_object": "smdist_tf.objects",
    "broadcast_object_fn": "smdist_tf.objects",
    # Horovod's horovod.tensorflow.DistributedOptimizer takes Keras optimizers too.
    "DistributedOptimizer": "smdist_tf.keras.optimizer",
    **{name: "smdist_tf.reduce_ops" for name in ("Adasum", "Average", "Max", "Min", "Product", "Sum")},
    **{name: "smdist_tf.runtime" for name in (
        "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "engine_config", "get_build_info",
        "gloo_built", "gloo_enabled", "is_homogeneous", "is_initialized", "local_rank", "local_size",
        "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "rocm_built", "shutdown", "size",
        "start_timeline", "stop_timeline",
    )},
    "init": "smdist_tf.initialization",
    **{name: "smdist_tf.process_sets" for name in (
        "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    )},
    # Horovod's scripts and tests call hvd._executing_eagerly() and hvd.util._executing_eagerly().
    "_executing_eagerly": "smdist_tf.util",
    "DataParallelStrategy": "smdist_tf.distribute",
    "SyncBatchNormalization": "smdist_tf.sync_batch_norm",
    "apply_sharded_gradients": "smdist_tf.sharding",
}
# Subpackages reachable as attributes. ``run`` is callable: smdist_tf.run(fn, np=2)
# runs fn on every rank (see smdist_tf/run/__init__.py).
_SUBMODULES = ("run", "keras", "distribute", "elastic", "sharding", "util")

__all__ = sorted([*(n for n in _EXPORTS if not n.startswith("_")), "run"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        importlib.import_module("smdist_tf._native")  # checks the build against this TensorFlow first
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"smdist_tf.{name}")
    raise AttributeError(f"module 'smdist_tf' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_SUBMODULES])
