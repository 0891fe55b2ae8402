"""Horovod's ``SyncBatchNormalization`` for Keras 3: batch statistics over every rank's batch.

Without a ``tf.distribute`` strategy, Keras' ``BatchNormalization(synchronized=True)``
has no one to synchronise with, so a Horovod-style script (``DistributedOptimizer`` or
``DistributedGradientTape``) normalises each rank's batch by its own statistics. This
layer normalises by the mean and variance of the global batch instead: each rank sums
its batch and the squares, one ``grouped_allreduce`` adds them up over ranks. Under
``DataParallelStrategy`` use ``BatchNormalization(synchronized=True)``.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.collectives import grouped_allreduce
from smdist_tf.keras_api import require_keras_3
from smdist_tf.reduce_ops import Sum
from smdist_tf.runtime import size


@keras.saving.register_keras_serializable(package="smdist_tf")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics span all ranks' batches.

    Takes ``BatchNormalization``'s arguments. In training, every rank must call the layer
    on a batch of the same trailing shape (batch sizes may differ); the statistics then
    equal those of the concatenated global batch, and so do the moving averages, on
    every rank. Inference uses the moving averages, as usual. Masked inputs fall back to
    per-rank statistics.
    """

    def __init__(self, **kwargs: Any) -> None:
        require_keras_3("SyncBatchNormalization")  # a Keras 3 layer cannot go into a tf_keras model
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if mask is not None or size() == 1:
            return _compat.batch_norm_local_moments(self, inputs, mask)
        axes = _compat.batch_norm_reduction_axes(self)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), inputs.dtype)
        total, total_squares, global_count = grouped_allreduce(
            [tf.reduce_sum(inputs, axis=axes), tf.reduce_sum(tf.square(inputs), axis=axes), tf.reshape(count, [1])],
            op=Sum,
        )
        mean = total / global_count
        # E[x^2] - E[x]^2 in the float32 (or wider) type the layer computes in; clipped at 0 against rounding.
        variance = tf.maximum(total_squares / global_count - tf.square(mean), 0.0)
        return mean, variance
