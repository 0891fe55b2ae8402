"""Keras 3's ``keras.distribution`` API, written as for JAX, trained over smdist_tf's ranks on TensorFlow.

The script never names a TensorFlow strategy: ``DataParallel`` is current while the model
is made and trained, and on TensorFlow ``smdist_tf.keras.use_keras_distribution()`` runs it
with ``DataParallelStrategy`` (docs/keras-distribution.md). The same file runs on JAX,
where that call does nothing:

    smdistrun -np 2 python examples/keras_distribution.py              # TensorFlow, 2 processes
    KERAS_DISTRIBUTION_JOB_ADDRESSES=localhost:12355 KERAS_DISTRIBUTION_NUM_PROCESSES=1 \\
        KERAS_DISTRIBUTION_PROCESS_ID=0 KERAS_BACKEND=jax python examples/keras_distribution.py
"""

from __future__ import annotations

import argparse
from typing import Optional

import keras
import numpy as np
import tensorflow as tf  # tf.data: what Keras shards per process, on either backend
from sklearn.datasets import load_digits

import smdist_tf.keras as sk


def digits(batch_size: int) -> tf.data.Dataset:
    """The whole data set on every process, in global batches: Keras gives each process its share."""
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    keep = len(x) // batch_size * batch_size  # whole batches: each splits evenly over the processes
    return tf.data.Dataset.from_tensor_slices((x[:keep], y[:keep])).batch(batch_size)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split over the processes")
    args = parser.parse_args(argv)

    sk.use_keras_distribution()  # TensorFlow: keras.distribution is smdist_tf's; JAX: nothing to do
    keras.distribution.initialize()  # starts smdist_tf (TensorFlow) or jax.distributed (JAX)
    devices = keras.distribution.list_devices()  # one per process on TensorFlow, every process's
    distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(digits(args.batch_size), epochs=args.epochs, verbose=0)
    loss, accuracy = model.evaluate(digits(args.batch_size), verbose=0)
    keras.distribution.set_distribution(None)

    print(f"backend {keras.backend.backend()}, {distribution.num_processes} process(es), devices {devices}")
    for epoch, epoch_loss in enumerate(history.history["loss"]):
        print(f"epoch {epoch + 1}: loss {epoch_loss:.4f}")
    print(f"evaluate: loss {loss:.4f}  accuracy {accuracy:.4f}", flush=True)
    return {"history": history.history, "loss": loss, "accuracy": accuracy, "model": model}


if __name__ == "__main__":
    main()
