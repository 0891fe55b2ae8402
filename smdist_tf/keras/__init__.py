"""Keras integration with the names of ``horovod.tensorflow.keras``: ``import smdist_tf.keras as hvd``.

It serves the Keras ``tf.keras`` is: Keras 3, or Keras 2 (``tf_keras``) when
``TF_USE_LEGACY_KERAS=1`` (see ``smdist_tf.keras_api`` and docs/tf-keras.md).

Runtime and topology (``init``, ``rank``, ``size``, ...), the collectives with Horovod's
Keras-module signatures, ``DistributedOptimizer``, ``PartialDistributedOptimizer``,
``load_model``, ``broadcast_global_variables``, ``callbacks``, ``elastic``,
``Compression``, ``PipelineModel``, ``OffloadActivations`` and ``use_keras_distribution`` (Keras 3's
``keras.distribution`` on TensorFlow, served by smdist_tf: docs/keras-distribution.md).

Names resolve lazily (PEP 562), as in ``smdist_tf``: importing this module does not
import TensorFlow, so a script's top-level ``import smdist_tf.keras as hvd`` costs the
launcher nothing. The first use of a name loads what it needs.
"""

from __future__ import annotations

import importlib
from typing import Any

# Horovod's Keras module re-exports these from horovod.tensorflow: the very objects of smdist_tf.
_FROM_SMDIST_TF = (
    "Adasum", "Average", "Compression", "Max", "Min", "ProcessSet", "Product", "Sum", "add_process_set",
    "allgather_object", "broadcast_object", "global_process_set", "remove_process_set",
    "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "init",
    "is_initialized", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "rank", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline",
)
# Public name -> module of smdist_tf.keras (or smdist_tf) that defines it.
_EXPORTS: dict[str, str] = {
    **{name: "smdist_tf.keras.collectives" for name in (
        "allgather", "allreduce", "alltoall", "broadcast", "broadcast_global_variables", "grouped_allreduce",
        "reducescatter",
    )},
    "DistributedOptimizer": "smdist_tf.keras.optimizer",
    "PartialDistributedOptimizer": "smdist_tf.keras.partial_optimizer",
    "OffloadActivations": "smdist_tf.pipeline.offload",
    "PipelineModel": "smdist_tf.pipeline.model",
    "load_model": "smdist_tf.keras.saving",
    "use_keras_distribution": "smdist_tf.keras.distribution",
}
_SUBMODULES = ("callbacks", "elastic")

__all__ = sorted([*_FROM_SMDIST_TF, *_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _FROM_SMDIST_TF:
        value = getattr(importlib.import_module("smdist_tf"), name)
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        return importlib.import_module(f"smdist_tf.keras.{name}")
    else:
        raise AttributeError(f"module 'smdist_tf.keras' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
