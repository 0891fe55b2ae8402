"""``BestModelCheckpoint``: Horovod's save-the-best-model callback, writing from rank 0 only."""

from __future__ import annotations

import os
from typing import Optional, Union

from smdist_tf.keras_api import keras_api, uses_tf_keras
from smdist_tf.runtime import rank

keras = keras_api()

# Keras checks the path when the callback is made; Horovod lets it be set afterwards.
_PATH_SET_LATER = {False: "unset.keras", True: "unset.weights.h5"}


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model (or its weights) to ``filepath`` whenever ``monitor`` improves, on rank 0 only.

    ``keras.callbacks.ModelCheckpoint`` with ``save_best_only=True`` (and, as Horovod's,
    ``save_weights_only`` as given). Rank 0 alone tracks the best value and writes; the other
    ranks do nothing, so no rank waits on another. Rank 0 judges by its own logs: put
    ``MetricAverageCallback`` before this callback so they are the global values.

    As in Horovod, ``filepath`` may be set after construction (``callback.filepath =
    ...``) and must be set before ``fit``. It may contain ``{epoch}`` and log keys, like
    ``ModelCheckpoint``'s, and must end in ``.keras`` (or ``.h5``); weights only, in ``.weights.h5``.

    Args:
        monitor: the log value to watch, e.g. ``"val_loss"`` or ``"val_accuracy"``.
        verbose: 1 prints a line when rank 0 saves or skips.
        save_weights_only: save the weights only (``filepath`` must then end in ``.weights.h5``).
        mode: ``"min"``, ``"max"``, or ``"auto"`` (from the metric's name).
        save_freq: ``"epoch"``, or a number of batches between checks.
        filepath: where to save (an smdist_tf addition; Horovod's estimator sets the attribute).
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        verbose: int = 0,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: Union[str, int] = "epoch",
        filepath: Optional[Union[str, os.PathLike]] = None,
    ) -> None:
        path = _PATH_SET_LATER[bool(save_weights_only)] if filepath is None else filepath
        super().__init__(path, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no filepath: pass filepath= or set callback.filepath "
                             "before fit()")
        self.filepath = os.fspath(self.filepath)
        if self.save_weights_only:
            suffix = ".h5" if uses_tf_keras() else ".weights.h5"  # what each Keras' save_weights takes
            if not self.filepath.endswith(suffix):
                raise ValueError(f"BestModelCheckpoint(save_weights_only=True): filepath must end in {suffix}, "
                                 f"got {self.filepath}")
        elif not self.filepath.endswith((".keras", ".h5")):
            raise ValueError("BestModelCheckpoint saves whole models: filepath must end in .keras (or .h5), "
                             f"got {self.filepath}")
        super().on_train_begin(logs)

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if rank() == 0:
            super().on_epoch_end(epoch, logs)
