"""Keras 3 integration: ``DistributedOptimizer``, ``PipelineModel``, callbacks and object helpers (Horovod spelling)."""

from smdist_tf.keras import callbacks
from smdist_tf.keras.optimizer import DistributedOptimizer
from smdist_tf.objects import allgather_object, broadcast_object
from smdist_tf.pipeline.model import PipelineModel

__all__ = ["DistributedOptimizer", "PipelineModel", "allgather_object", "broadcast_object", "callbacks"]
