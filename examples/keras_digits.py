"""Data-parallel ``model.fit`` on scikit-learn's digits with ``smdist_tf.DataParallelStrategy``.

Create and compile the model inside ``strategy.scope()`` and call ``fit``: each rank
trains on its shard of every global batch, gradients are averaged over all ranks in
one fused allreduce, and the logs Keras returns are global. Run with:

    smdistrun -np 2 python examples/keras_digits.py
    smdistrun -np 2 python examples/keras_digits.py --jit-compile   # the train step compiled by XLA
    smdistrun -np 4 python examples/keras_digits.py --adasum        # gradients combined with Adasum
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import smdist_tf as sd


def load_data(seed: int = 0):
    """The same split on every rank; the strategy gives each rank its part of every batch."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


class PrintEpoch(keras.callbacks.Callback):
    """One line per epoch on rank 0 (the logs are already averaged over all ranks)."""

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if sd.rank() == 0:
            print(f"epoch {epoch + 1:2d}: loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--jit-compile", action="store_true", help="compile the steps with XLA (docs/xla.md)")
    parser.add_argument("--adasum", action="store_true",
                        help="combine the gradients with Adasum, not their average (power-of-two ranks; docs/api.md#adasum)")
    args = parser.parse_args()

    # Initialises smdist_tf if needed. Only the gradients use Adasum: the logs stay global averages.
    strategy = sd.DataParallelStrategy(gradient_op=sd.Adasum if args.adasum else sd.Average)
    rank, size = sd.rank(), sd.size()
    keras.utils.set_random_seed(1234 + rank)  # different per rank on purpose: the strategy broadcasts rank 0's weights
    x_train, x_test, y_train, y_test = load_data()

    # The same shuffle seed everywhere, so the per-rank shards of a batch never overlap.
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=7, reshuffle_each_iteration=True)
        .batch(args.batch_size, drop_remainder=True)
    )
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size)

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dropout(0.2), keras.layers.Dense(10)]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(args.lr),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=args.jit_compile,
        )

    if rank == 0:
        print(f"training on {size} rank(s), global batch {args.batch_size}, {args.epochs} epochs", flush=True)
    model.fit(train, epochs=args.epochs, verbose=0, shuffle=False, callbacks=[PrintEpoch()])
    _, test_accuracy = model.evaluate(test, verbose=0)  # every rank scores its shard; the result is global

    checksum = tf.add_n([tf.reduce_sum(tf.cast(w, tf.float64)) for w in model.get_weights()])
    in_sync = bool(tf.reduce_all(tf.equal(sd.allgather(checksum), checksum)))
    if rank == 0:
        print(f"test accuracy: {test_accuracy:.4f}", flush=True)
        print(f"weights identical on all ranks: {in_sync}", flush=True)


if __name__ == "__main__":
    main()
