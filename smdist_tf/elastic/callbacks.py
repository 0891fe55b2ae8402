"""Keras callbacks that keep an elastic state's ``epoch`` and ``batch`` current and commit it."""

from __future__ import annotations

from typing import Optional

from smdist_tf.elastic.state import State
from smdist_tf.keras_api import keras_api

keras = keras_api()


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of every epoch.

    The commit happens just before the next batch (or epoch, or the end of training)
    starts, so every callback has seen the finished batch by then: the committed
    ``state.batch``/``state.epoch`` always match the committed weights, wherever the
    callback is in the list.

    Args:
        state: the state to commit, usually a ``TensorFlowKerasState``.
        batches_per_commit: batches between commits.
    """

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._batches_left = batches_per_commit
        self._due = False

    def _commit_if_due(self) -> None:
        if self._due:
            self._due = False
            self.state.commit()

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._batches_left = self.batches_per_commit
        self._due = False

    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None:
        self._commit_if_due()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._batches_left -= 1
        if self._batches_left == 0:
            self._batches_left = self.batches_per_commit
            self._due = True

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._commit_if_due()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._due = True

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        self._commit_if_due()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` = the number of batches finished in the current epoch (0 at its end).

    After a restart, give ``fit`` the resumed epoch's data without its first
    ``state.batch`` batches (``dataset.skip(state.batch)``): Keras 3 has no way to start
    an epoch part-way. The count continues from ``state.batch`` in such an epoch.

    Args:
        state: a state with a ``batch`` attribute.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._skipped = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._skipped = self.state.batch  # finished before this fit() started the epoch

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = self._skipped + batch + 1

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` = the number of epochs finished.

    Works whether ``fit`` counts epochs from 0 (``epochs=total - state.epoch``, as
    Horovod's examples do) or from ``initial_epoch=state.epoch``.

    Args:
        state: a state with an ``epoch`` attribute.
    """

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self._start = 0
        self._first_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        self._start = self.state.epoch
        self._first_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self.state.epoch = self._start + (epoch - self._first_epoch) + 1
