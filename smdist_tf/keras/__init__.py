"""Keras 3 integration: ``DistributedOptimizer``, callbacks and object helpers (Horovod spelling)."""

from smdist_tf.keras import callbacks
from smdist_tf.keras.optimizer import DistributedOptimizer
from smdist_tf.objects import allgather_object, broadcast_object

__all__ = ["DistributedOptimizer", "allgather_object", "broadcast_object", "callbacks"]
