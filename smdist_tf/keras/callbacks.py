"""Keras callbacks for data-parallel training: broadcast, metric averaging, LR warm-up, rank-0 checkpoints."""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from smdist_tf.collectives import broadcast_variables, grouped_allreduce
from smdist_tf.distribute.checkpoint import scratch_path
# Re-exported: Horovod's callbacks module has them.
from smdist_tf.keras.checkpoint_callbacks import BestModelCheckpoint  # noqa: F401
from smdist_tf.keras.schedule_callbacks import LearningRateScheduleCallback  # noqa: F401
from smdist_tf.keras.schedule_callbacks import set_learning_rate
from smdist_tf.keras_api import keras_api, uses_tf_keras
from smdist_tf.process_sets import ProcessSet
from smdist_tf.reduce_ops import Average
from smdist_tf.runtime import rank, size
from smdist_tf.sharding.checkpoint import gathered_state
from smdist_tf.sharding.optimizer import unsharded_variables

# Callbacks of the Keras tf.keras is: Keras 2's fit only takes its own.
keras = keras_api()


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from ``root_rank``'s model and optimizer state.

    Broadcasts the model's variables when training begins and, once the first batch has
    created the optimizer's slots, the model's and optimizer's variables again.

    Args:
        root_rank: the rank whose values everyone takes.
        device: accepted for Horovod's signature; unused (the engine moves each variable
            from where it lives).
        local_variables: a variable, or variables, each rank keeps as it is (Horovod's
            ``local_variables``): ``tf.Variable`` or Keras variables.
        process_set: broadcast only among this ``ProcessSet``'s members (``root_rank`` one of them).

    Raises:
        ValueError: a ``local_variables`` entry is not a variable.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None,
                 process_set: Optional[ProcessSet] = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        local_variables = list(local_variables)
        if not all(_is_variable(v) for v in local_variables):
            raise ValueError("BroadcastGlobalVariablesCallback: every local variable must be a tf.Variable or a "
                             "Keras variable")
        self._local_ids = {id(v) for v in local_variables}
        self._done = False

    def _broadcast(self, variables: list) -> None:
        shared = [v for v in variables if id(v) not in self._local_ids]
        broadcast_variables(shared, root_rank=self.root_rank, process_set=self.process_set)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.model.built:
            self._broadcast(list(self.model.variables))

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if self._done:
            return
        self._broadcast(list(self.model.variables) + unsharded_variables(self.model.optimizer))
        self._done = True


def _is_variable(value: Any) -> bool:
    # Keras 2's variables are tf.Variables; Keras 3 has its own class.
    return isinstance(value, tf.Variable) or (not uses_tf_keras() and isinstance(value, keras.Variable))


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each numeric epoch-end log value by its average over all ranks (or a process set's).

    Keras runs user callbacks before its progress bar and History, so those see the
    averages. Keys are reduced in sorted order in one request, so every rank must log
    the same keys.

    Args:
        device: accepted for Horovod's signature; unused (the averages are computed on the host).
        process_set: average only over this ``ProcessSet``'s members.
    """

    def __init__(self, device: str = "", process_set: Optional[ProcessSet] = None) -> None:
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        ranks = size() if self.process_set is None else self.process_set.size()
        if logs is None or ranks == 1:
            return
        keys = sorted(k for k, v in logs.items() if isinstance(v, (int, float)) or (hasattr(v, "shape") and len(getattr(v, "shape", ())) == 0))
        if not keys:
            return
        values = [tf.constant(float(logs[k]), tf.float64) for k in keys]
        averaged = grouped_allreduce(values, op=Average, name=f"smdist.metric_average.{epoch}",
                                     process_set=self.process_set)
        for k, v in zip(keys, averaged):
            logs[k] = float(v.numpy())


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramps the learning rate from ``initial_lr / size()`` up to ``initial_lr`` over the first epochs.

    Large data-parallel runs scale the learning rate by the number of ranks; starting
    lower avoids early divergence (Goyal et al., 2017). The rate is set before every
    batch of the warm-up through ``optimizer.learning_rate``.

    Args:
        initial_lr: the learning rate after warm-up (usually the base rate × ``size()``).
        warmup_epochs: number of epochs the ramp lasts.
        momentum_correction: scale a variable ``momentum`` by new_lr/old_lr at each change.
            Keras' built-in optimizers mostly keep momentum as a Python float baked into
            the compiled step, so for them this has no effect.
        steps_per_epoch: batches per epoch; taken from ``fit`` when ``None``.
        verbose: print the rate at the end of the warm-up when > 0.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True, steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        super().__init__()
        if warmup_epochs < 0:
            raise ValueError("warmup_epochs must be >= 0")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0
        self._restore_momentum: Optional[float] = None

    def _steps(self) -> int:
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError("LearningRateWarmupCallback needs steps_per_epoch when fit() cannot tell it")
        return int(steps)

    def learning_rate_at(self, epoch: int, batch: int) -> float:
        """The warm-up rate at ``batch`` of ``epoch`` (both from 0).

        As in Horovod, the batch counts as done, so the last batch of the warm-up runs at
        ``initial_lr``; from then on the rate is left to the optimizer and other callbacks.
        """
        if self.warmup_epochs == 0:
            return self.initial_lr
        progress = min((epoch + (batch + 1) / self._steps()) / self.warmup_epochs, 1.0)
        return self.initial_lr / size() * (1.0 + progress * (size() - 1))

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        if self._epoch >= self.warmup_epochs:  # a schedule starting here must not be overridden
            return
        self._restore_momentum = set_learning_rate(self.model.optimizer, self.learning_rate_at(self._epoch, batch),
                                                   self.momentum_correction)

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if self._restore_momentum is not None:
            self.model.optimizer.momentum.assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if epoch == self.warmup_epochs - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished learning rate warm-up to {self.initial_lr:g}.")


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """``keras.callbacks.ModelCheckpoint`` whose files appear only from rank 0.

    Every rank still runs the save (reading distributed variables can involve
    collectives, so all ranks must take part), but ranks other than 0 write into a
    private temporary directory that is removed right away. Sharded optimizer state is
    gathered first (every rank takes part), so the file holds the full state. Arguments
    are those of ``keras.callbacks.ModelCheckpoint``.
    """

    def _save_model(self, epoch: int, batch: Any, logs: Any) -> None:
        with gathered_state(self.model):
            self._save_model_here(epoch, batch, logs)

    def _save_model_here(self, epoch: int, batch: Any, logs: Any) -> None:
        if rank() == 0:
            return super()._save_model(epoch, batch, logs)
        real = self.filepath
        with scratch_path(real) as self.filepath:
            try:
                return super()._save_model(epoch, batch, logs)
            finally:
                self.filepath = real
