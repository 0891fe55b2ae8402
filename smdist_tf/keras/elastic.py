"""Elastic training under Horovod's Keras names (``horovod.tensorflow.keras.elastic``).

Everything of :mod:`smdist_tf.elastic`, plus ``KerasState``, Horovod's Keras name for
``TensorFlowKerasState``: ``hvd.elastic.KerasState(model, batch=0, epoch=0)``.
"""

from smdist_tf.elastic import (
    CommitStateCallback,
    ObjectState,
    State,
    TensorFlowKerasState,
    TensorFlowState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)

# Horovod's KerasState(model, optimizer=None, **kwargs) is TensorFlowKerasState with Keras' backend filled in.
KerasState = TensorFlowKerasState

__all__ = [
    "CommitStateCallback", "KerasState", "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState",
    "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run",
]
