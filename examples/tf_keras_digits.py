"""A Keras 2 (tf-keras) training script, Horovod style, on scikit-learn's digits.

Teams still on Keras 2 run TensorFlow with ``TF_USE_LEGACY_KERAS=1`` and ``tf-keras``
installed, so ``tf.keras`` is Keras 2. smdist_tf then serves Keras 2: the same
``DistributedOptimizer``, callbacks and ``load_model`` a Horovod script uses. The
variable must be set before TensorFlow is imported; this script sets it for itself.
Run with:

    smdistrun -np 2 python examples/tf_keras_digits.py

``--strategy`` trains the same model with ``DataParallelStrategy`` instead.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow is imported

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import smdist_tf as sd  # noqa: E402
import smdist_tf.keras as hvd  # noqa: E402


def make_model() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.layers.Dense(128, activation="relu", input_shape=(64,)),
        tf.keras.layers.Dense(10),
    ])


def horovod_style(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tf.keras.Model:
    """Each rank trains on its shard; DistributedOptimizer averages the gradients."""
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model = make_model()
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # every rank starts from rank 0's weights
        hvd.callbacks.MetricAverageCallback(),  # logs averaged over the ranks
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=1),
    ]
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks, verbose=0)
    if hvd.rank() == 0:
        print(f"final loss {history.history['loss'][-1]:.4f}, accuracy {history.history['accuracy'][-1]:.4f}")
    return model


def with_strategy(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> tf.keras.Model:
    """The global batch is split over the ranks by the strategy."""
    strategy = sd.DataParallelStrategy()
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(args.lr),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(x, y, batch_size=args.batch_size * sd.size(), epochs=args.epochs, verbose=0)
    if sd.rank() == 0:
        print(f"final loss {history.history['loss'][-1]:.4f}, accuracy {history.history['accuracy'][-1]:.4f}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--strategy", action="store_true", help="DataParallelStrategy instead of DistributedOptimizer")
    args = parser.parse_args()

    hvd.init()
    tf.keras.utils.set_random_seed(1234 + hvd.rank())
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    if hvd.rank() == 0:
        print(f"tf.keras is {tf.keras.__name__.split('.')[0]}; {hvd.size()} rank(s)")
    model = with_strategy(x, y, args) if args.strategy else horovod_style(x, y, args)

    # Every rank calls it, rank 0 writes; then every rank resumes from the file with a distributed optimizer.
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "digits.keras") if hvd.rank() == 0 else None)
    sd.distribute.save_on_rank_zero(model, path)
    if not args.strategy:
        resumed = hvd.load_model(path)
        resumed.fit(x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()], batch_size=args.batch_size, verbose=0)
        checksum = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in resumed.get_weights()])
        in_sync = bool(tf.reduce_all(tf.equal(sd.allgather(tf.reshape(checksum, [1])), checksum)))
        if hvd.rank() == 0:
            print(f"resumed from {os.path.basename(path)}; weights identical on all ranks: {in_sync}")


if __name__ == "__main__":
    main()
