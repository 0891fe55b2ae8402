"""``DataParallelStrategy(gradient_op=Adasum)``: the optimizer's gradients combined with Adasum.

Under a ``tf.distribute`` strategy Keras' TensorFlow optimizers reduce their gradients in
``TFOptimizer._all_reduce_sum_gradients`` (private), with the replica context's
``all_reduce(SUM)``: the same call SyncBatchNormalization and users' own replica code make, so
the strategy cannot tell gradients apart where the reduction arrives. That method is wrapped on
``keras.optimizers.Optimizer`` instead (once per process, by smdist_tf/keras/patches.py): an
optimizer whose strategy asks for Adasum combines its gradients with Adasum; every other
optimizer, and every other reduction of the strategy (metrics, the loss, ``strategy.reduce``,
BatchNorm statistics), keeps Keras' sum.

What Adasum is fed: Keras divides each replica's loss by ``num_replicas_in_sync`` (N), as
``tf.nn.compute_average_loss`` does in a custom loop, so each rank's gradient is 1/N of the
gradient of its own batch, and their Sum is the global mean gradient. Adasum is no sum:
``adasum(g, g) = g``. It is scale-equivariant, ``adasum(c·a, c·b) = c·adasum(a, b)``, so each
rank's gradient is multiplied by N first: the result is the Adasum of the ranks' own gradients,
what Horovod's ``DistributedOptimizer(op=Adasum)`` gives on the same per-rank batches. N is a
power of two, so the multiplication is exact.
"""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from smdist_tf import reduce_ops
from smdist_tf.compression import Compression, Compressor
from smdist_tf.gradient_reducer import GradientReducer
from smdist_tf.keras_api import require_keras_3
from smdist_tf.reduce_ops import Adasum, Average
from smdist_tf.strategy_kind import OneReplicaPerRank


def validated_gradient_op(op: int, compression: type[Compressor], replicas: int, sharded: bool) -> int:
    """Returns ``op`` when a ``DataParallelStrategy`` can combine its gradients with it, else raises.

    Args:
        op: the ``gradient_op`` asked for.
        compression: the strategy's wire compression.
        replicas: the number of replicas (ranks, or the process set's members).
        sharded: sharding (any stage) is on.

    Raises:
        ValueError: ``op`` is neither ``Average`` nor ``Adasum``; or Adasum with Keras 2, sharding,
            wire compression or a replica count that is not a power of two.
    """
    op = reduce_ops.validate(op)
    if op == Average:
        return op
    if op != Adasum:
        raise ValueError(f"DataParallelStrategy(gradient_op=...) takes Average or Adasum, not "
                         f"{reduce_ops.op_name(op)}: Keras divides each replica's loss by num_replicas_in_sync, "
                         "so the strategy's gradients are already the global average")
    require_keras_3("DataParallelStrategy(gradient_op=Adasum)")
    if sharded:
        raise ValueError("DataParallelStrategy(gradient_op=Adasum) does not combine with shard_optimizer_state, "
                         "shard_gradients or shard_parameters: sharding reduce-scatters gradients, and Adasum is an allreduce op")
    if compression is not Compression.none:
        raise ValueError(f"DataParallelStrategy(gradient_op=Adasum) takes no wire compression "
                         f"({compression.__name__}); use Compression.none")
    if replicas & (replicas - 1):
        raise ValueError(f"DataParallelStrategy(gradient_op=Adasum) needs a power-of-two number of replicas; "
                         f"this one has {replicas}")
    return op


def _adasum_strategy(optimizer: Any) -> Optional[OneReplicaPerRank]:
    """The strategy of ``optimizer`` when it asks for Adasum and this is replica context, else ``None``."""
    strategy = optimizer._distribution_strategy
    if not isinstance(strategy, OneReplicaPerRank) or strategy.gradient_op != Adasum:
        return None
    # In cross-replica context Keras reduces nothing either.
    return strategy if tf.distribute.get_replica_context() is not None else None


def _own_gradient(grad: Any, replicas: int) -> Any:
    """This rank's gradient of its own batch: Keras' 1/N loss scaling undone; embeddings' made dense."""
    if grad is None:
        return None
    grad = tf.convert_to_tensor(grad)  # Adasum reduces no tf.IndexedSlices: as sparse_as_dense=True
    return grad * tf.cast(replicas, grad.dtype)


def patch_gradient_reduction() -> None:
    """Wraps ``keras.optimizers.Optimizer._all_reduce_sum_gradients`` (installed by smdist_tf/keras/patches.py)."""
    cls = keras.optimizers.Optimizer
    keras_sum = cls._all_reduce_sum_gradients

    def _all_reduce_sum_gradients(self: Any, grads_and_vars: Any) -> list:
        strategy = _adasum_strategy(self)
        if strategy is None:
            return keras_sum(self, grads_and_vars)
        pairs = list(grads_and_vars)
        replicas = strategy.num_replicas_in_sync
        grads = [_own_gradient(g, replicas) for g, _ in pairs]
        variables = [v for _, v in pairs]
        reduced = GradientReducer(op=Adasum, process_set=strategy.process_set).reduce(grads, variables)
        return list(zip(reduced, variables))

    _all_reduce_sum_gradients.__doc__ = keras_sum.__doc__
    cls._all_reduce_sum_gradients = _all_reduce_sum_gradients
