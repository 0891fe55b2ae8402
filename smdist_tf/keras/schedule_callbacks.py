"""``LearningRateScheduleCallback``: Horovod's piecewise learning-rate schedule, and how callbacks set the rate."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import tensorflow as tf

from smdist_tf.keras_api import keras_api

keras = keras_api()


def current_value(value: Any) -> float:
    """A learning rate or momentum (a variable of either Keras, a tensor or a number) as a float."""
    return float(tf.convert_to_tensor(value).numpy())


def set_learning_rate(optimizer: Any, new: float, momentum_correction: bool) -> Optional[float]:
    """Sets ``optimizer``'s learning rate to ``new``; returns the momentum to restore after this batch.

    With ``momentum_correction``, a variable ``momentum`` is scaled by new/old for this
    batch only (the velocity was accumulated at the old rate; Goyal et al., 2017), and its
    value before is returned; otherwise ``None``. Keras' built-in optimizers mostly keep
    ``momentum`` as a Python float compiled into the step, which is left alone.
    """
    old = current_value(optimizer.learning_rate)
    optimizer.learning_rate = new
    momentum = getattr(optimizer, "momentum", None)
    if not (momentum_correction and hasattr(momentum, "assign") and old > 0 and new != old):
        return None
    before = current_value(momentum)
    momentum.assign(before * (new / old))
    return before


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier`` during epochs ``[start_epoch, end_epoch)``.

    Outside those epochs the rate is left alone, so several callbacks make a piecewise
    schedule (``start_epoch=5, end_epoch=30, multiplier=1.0``, then
    ``start_epoch=30, multiplier=0.1``, ...). With ``staircase=True`` the rate is set at
    the first batch of each epoch to ``initial_lr * multiplier(epoch)``; with
    ``staircase=False`` at every batch to ``initial_lr * multiplier(epoch + batch /
    steps_per_epoch)``. A constant ``multiplier`` always works as a staircase. At each
    epoch end the current rate is written to the logs as ``lr``.

    Args:
        initial_lr: the base rate the multiplier scales (usually the single-rank rate × ``size()``).
        multiplier: a number, or a function of the (fractional) epoch, counted from 0.
        start_epoch: first epoch the schedule sets the rate in.
        end_epoch: epoch at which it stops (exclusive); ``None``: it does not stop.
        staircase: change the rate once per epoch (``True``) or at every batch.
        momentum_correction: when the rate changes, scale a variable ``momentum`` by
            new_rate/old_rate for that batch (Goyal et al., 2017). Keras' built-in
            optimizers mostly keep ``momentum`` as a Python float compiled into the step,
            so for them this does nothing.
        steps_per_epoch: batches per epoch, for ``staircase=False``; taken from ``fit`` when ``None``.
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: Union[float, Callable[[float], float]],
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
    ) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("LearningRateScheduleCallback needs initial_lr")
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        if callable(multiplier):
            self.multiplier = multiplier
            self.staircase = staircase
        else:
            constant = float(multiplier)
            self.multiplier = lambda epoch: constant
            self.staircase = True
        self._epoch = 0
        self._restore_momentum: Optional[float] = None

    def _in_schedule(self) -> bool:
        return self._epoch >= self.start_epoch and (self.end_epoch is None or self._epoch < self.end_epoch)

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError("LearningRateScheduleCallback(staircase=False) needs steps_per_epoch when fit() "
                                 "cannot tell it")

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        if not self._in_schedule():
            return
        if self.staircase:
            if batch == 0:
                self._set_learning_rate(self.initial_lr * self.multiplier(self._epoch))
        else:
            self._set_learning_rate(self.initial_lr * self.multiplier(self._epoch + batch / self.steps_per_epoch))

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if self._restore_momentum is not None:
            self.model.optimizer.momentum.assign(self._restore_momentum)
            self._restore_momentum = None

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs["lr"] = current_value(self.model.optimizer.learning_rate)

    def _set_learning_rate(self, new: float) -> None:
        self._restore_momentum = set_learning_rate(self.model.optimizer, new, self.momentum_correction)
