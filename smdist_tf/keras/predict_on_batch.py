"""``model.predict_on_batch(x)`` under ``DataParallelStrategy``: the predictions for this rank's ``x``.

Keras 3 runs ``predict_on_batch`` like one step of ``predict``: ``strategy.run`` on the
batch, then, under a multi-worker strategy, every worker's outputs concatenated.
``predict`` hands each rank a shard of the data, so the concatenation is the whole;
``predict_on_batch`` hands every rank its whole ``x``, so each rank got ``size()``
batches' worth of rows. The weights are the same on every rank, so a rank needs no
other to predict its own batch: under our strategy the method runs ``predict_step``
in this rank's replica and returns its outputs, without any collective.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import tensorflow as tf

from smdist_tf.strategy_kind import OneReplicaPerRank

# model -> ((strategy, run_eagerly, jit_compile), its predict function); weak, so models can be freed.
_predict_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _local_predict_function(model: Any) -> Callable[[Any], Any]:
    """This model's ``data -> outputs`` on this rank, compiled as Keras compiles ``predict``'s."""
    strategy = model.distribute_strategy
    settings = (strategy, model.run_eagerly, model.jit_compile)
    cached = _predict_functions.get(model)
    if cached is not None and cached[0] == settings:
        return cached[1]
    model_ref = weakref.ref(model)  # the function must not keep its cache key alive

    def predict_step(data: Any) -> Any:
        return model_ref().predict_step(data)

    if not model.run_eagerly and model.jit_compile:
        predict_step = tf.function(predict_step, reduce_retracing=True, jit_compile=True)

    def predict_on_this_rank(data: Any) -> Any:
        return strategy.run(predict_step, args=(data,))  # one replica per process: plain tensors

    if not model.run_eagerly:
        predict_on_this_rank = tf.function(predict_on_this_rank, reduce_retracing=True)
    _predict_functions[model] = (settings, predict_on_this_rank)
    return predict_on_this_rank


def _to_numpy(value: Any) -> Any:
    # As Keras returns them: ragged and sparse outputs stay tensors.
    return value if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)) else value.numpy()


def patch_predict_on_batch() -> None:
    """Wraps ``keras.Model.predict_on_batch`` (installed by smdist_tf/keras/patches.py).

    Models under another strategy (or none) keep Keras' own method.
    """
    import keras

    keras_predict_on_batch = keras.Model.predict_on_batch

    def predict_on_batch(self: Any, x: Any) -> Any:
        if not isinstance(self.distribute_strategy, OneReplicaPerRank):
            return keras_predict_on_batch(self, x)
        return tf.nest.map_structure(_to_numpy, _local_predict_function(self)((x,)))

    predict_on_batch.__doc__ = keras_predict_on_batch.__doc__
    keras.Model.predict_on_batch = predict_on_batch
