"""smdist_tf: fast, Horovod-compatible distributed training for TensorFlow 2 and Keras 3.

Change ``import horovod.tensorflow as hvd`` to ``import smdist_tf as hvd`` and run
the script under ``mpirun``.
"""

from smdist_tf._native import build_info as _build_info  # checks the build first
from smdist_tf.collectives import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_variables,
    grouped_allreduce,
    grouped_broadcast,
    oob_allreduce,
    reducescatter,
)
from smdist_tf.compression import Compression
from smdist_tf.gradient_tape import DistributedGradientTape
from smdist_tf.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from smdist_tf.runtime import (
    cross_rank,
    cross_size,
    cuda_built,
    engine_config,
    get_build_info,
    gloo_built,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
)

__version__ = "0.1.0"

__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "Max", "Min", "Product", "Sum",
    "allgather", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_variables",
    "cross_rank", "cross_size", "cuda_built", "engine_config", "get_build_info", "gloo_built",
    "grouped_allreduce", "grouped_broadcast", "init", "is_homogeneous", "is_initialized",
    "local_rank", "local_size", "mpi_built", "mpi_threads_supported", "nccl_built",
    "oob_allreduce", "rank", "reducescatter", "shutdown", "size",
]
