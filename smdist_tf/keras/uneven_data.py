"""Keras ``fit`` with uneven data: ranks that run out of batches ``join()`` instead of hanging.

With ``DistributedOptimizer`` or ``DataParallelStrategy``, every training step is a
collective. When ranks hold different numbers of batches, a rank whose epoch is over
would otherwise meet the others' next gradient allreduce with its own epoch-end
collectives (metric reads under the strategy, ``MetricAverageCallback``, ...) and every
rank would wait forever. So, for every such ``fit``, without the user asking:

* right after this rank's last training step of an epoch (before Keras reads the
  metrics, validates or calls ``on_epoch_end``) it calls ``join()``: the other ranks'
  remaining steps complete without it, averaging over the ranks that contributed;
* once every rank has joined, the ranks compare batch counts. If they differ, every
  rank takes the model and optimizer variables of the rank that joined last (it ran
  the most steps), so the weights are identical again. If some rank also ran out of
  data before the ``steps_per_epoch`` it was given, every rank raises ``ValueError``
  naming each rank's batch count and the fixes;
* after the callbacks' ``on_epoch_end``, ``model.stop_training`` is agreed: if any rank
  stops (a rank-local ``EarlyStopping``, say), all stop.

Under ``DataParallelStrategy`` every ``evaluate`` (validation too) also joins after its
last step, as its metric reads are collectives.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from smdist_tf import _compat
from smdist_tf.collectives import allgather, allreduce, broadcast_variables, join
from smdist_tf.keras.xla_fallback import keep_jit_compile_where_lowered
from smdist_tf.keras_api import keras_api
from smdist_tf.reduce_ops import Max
from smdist_tf.runtime import is_initialized, size
from smdist_tf.sharding.optimizer import unsharded_variables
from smdist_tf.strategy_kind import OneReplicaPerRank

keras = keras_api()  # the hooks and their callback belong to the Keras tf.keras is


def _multi_rank() -> bool:
    # The hooks see every model's fit, also in processes whose engine is down.
    return is_initialized() and size() > 1


def _under_strategy(model: Any) -> bool:
    return isinstance(model.distribute_strategy, OneReplicaPerRank)


def _steps_are_collective(model: Any) -> bool:
    """True when every training step of ``model`` communicates with all the other ranks.

    Not for a ``DistributedOptimizer`` on a process set: ``join()`` spans every rank, so
    such a model's ranks must hold equal batch counts (as in Horovod).
    """
    if not _multi_rank():
        return False
    if _under_strategy(model):
        return model.distribute_strategy.process_set is None
    optimizer = getattr(model, "optimizer", None)
    # A LossScaleOptimizer (mixed precision) wraps the DistributedOptimizer.
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    reduces = bool(getattr(inner, "_smdist_reduces_in_apply", False))
    return reduces and inner.smdist_process_set is None


class _EpochSync(keras.callbacks.Callback):
    """Counts this rank's batches and agrees ``stop_training``; the join runs from ``end_of_training_loop``.

    Placed after the user's callbacks, so their ``on_epoch_end`` (``EarlyStopping``)
    has decided before the ranks agree.
    """

    def __init__(self) -> None:
        super().__init__()
        self._epoch = 0
        self._batches = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch = epoch
        self._batches = 0

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._batches = batch + 1

    def end_of_training_loop(self) -> None:
        """Joins, then re-syncs the variables or raises if the ranks' epochs differed."""
        last = join()
        steps = _compat.epoch_steps(self.params)
        # Short of the announced steps without being stopped: the data ended before steps_per_epoch.
        ran_out = steps is not None and self._batches < steps and not self.model.stop_training
        row = [self._batches, int(ran_out), -1 if steps is None else steps]
        table = allgather(tf.constant([row], tf.int64), name="smdist.fit.epoch_batches").numpy()
        if len(set(table[:, 0].tolist())) == 1:
            return
        if table[:, 1].any():
            raise ValueError(_ran_out_message(self._epoch, table))
        variables = list(self.model.variables) + unsharded_variables(self.model.optimizer)
        # Local variables (PartialDistributedOptimizer, register_local_var) differ per rank by design.
        local = _local_variable_ids(self.model.optimizer)
        variables = [v for v in variables if id(v) not in local]
        broadcast_variables(variables, root_rank=last, name="smdist.fit.resync")

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        stop = allreduce(tf.constant(int(bool(self.model.stop_training)), tf.int32), op=Max,
                         name="smdist.fit.stop_training")
        self.model.stop_training = bool(stop.numpy())


def _local_variable_ids(optimizer: Any) -> set[int]:
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under a LossScaleOptimizer
    sources = getattr(inner, "smdist_local_sources", None)
    return {id(v) for v in sources().resolved()} if sources is not None else set()


def _ran_out_message(epoch: int, table: np.ndarray) -> str:
    counts = ", ".join(
        f"rank {r}: {batches} batches" + (f" (ran out before {steps})" if ran_out else "")
        for r, (batches, ran_out, steps) in enumerate(table.tolist())
    )
    return (
        f"uneven data in epoch {epoch + 1}: the ranks ran different numbers of batches and some ran out of data "
        f"before steps_per_epoch ({counts}). Give every rank the same number of batches per epoch: add .repeat() "
        f"to the dataset so every rank always has steps_per_epoch batches, or pass a steps_per_epoch no larger "
        f"than the smallest rank's batch count, or shard evenly (equal-sized shards, batched with "
        f"drop_remainder=True)."
    )


def _prepare_fit(model: Any, callbacks: Any) -> tuple[Any, Optional[_EpochSync]]:
    # fit's one start hook also keeps XLA off a GPU the collectives are not lowered for.
    keep_jit_compile_where_lowered(model)
    if not _steps_are_collective(model):
        return callbacks, None
    sync = _EpochSync()
    if isinstance(callbacks, keras.callbacks.CallbackList):
        _compat.append_callback(callbacks, sync)  # replaces the one an earlier fit left there
        sync.set_model(model)
        return callbacks, sync
    user = list(callbacks) if isinstance(callbacks, (list, tuple)) else [] if callbacks is None else [callbacks]
    return user + [sync], sync


def _loop_end(model: Any, loop: str, sync: Optional[_EpochSync]) -> None:
    if sync is not None:
        sync.end_of_training_loop()
    elif loop == "evaluate" and _multi_rank() and _under_strategy(model) and model.distribute_strategy.process_set is None:
        join()  # the metric reads that follow are collectives


def patch_training_loops() -> None:
    """Hooks Keras ``fit``/``evaluate`` (installed by smdist_tf/keras/patches.py); see the module docstring."""
    _compat.hook_training_loops(keras.Model, _prepare_fit, _loop_end)
