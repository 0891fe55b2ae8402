"""Elastic training, Horovod's API: state that survives a restart of the job.

``smdistrun --max-restarts N`` (or ``--host-discovery-script``) starts the whole job
again when a rank fails; ``@elastic.run`` then starts the training function from the
state's latest commit, which rank 0 wrote to ``SMDIST_ELASTIC_DIR``::

    state = sd.elastic.TensorFlowKerasState(model, epoch=0, batch=0)

    @sd.elastic.run
    def train(state):
        ...
        state.commit()

    train(state)
"""

from smdist_tf.elastic.callbacks import CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback
from smdist_tf.elastic.runner import run
from smdist_tf.elastic.state import ObjectState, State
from smdist_tf.elastic.tensorflow_state import TensorFlowKerasState, TensorFlowState

__all__ = [
    "CommitStateCallback", "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState",
    "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run",
]
