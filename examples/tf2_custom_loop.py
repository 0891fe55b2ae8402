"""The SageMaker data-parallel TF2 training-step pattern, on scikit-learn's digits.

Written the way ``smdistributed.dataparallel.tensorflow`` scripts are, with
``import smdist_tf as sdp``: initialise, pin the GPU by local rank, scale the
learning rate by the number of ranks, wrap the tape, broadcast the model and
optimizer after the first step, average the loss out of band, checkpoint on rank 0.
Run with:

    smdistrun -np 2 python examples/tf2_custom_loop.py
"""

from __future__ import annotations

import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import smdist_tf as sdp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="scaled by the number of ranks")
    parser.add_argument("--checkpoint-dir", default=None, help="where rank 0 writes the checkpoint (default: a temp dir)")
    args = parser.parse_args()

    sdp.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per process
        tf.config.experimental.set_memory_growth(gpus[sdp.local_rank()], True)
        tf.config.set_visible_devices(gpus[sdp.local_rank()], "GPU")

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shard(sdp.size(), sdp.rank())
        .repeat()
        .shuffle(1000, seed=sdp.rank())
        .batch(args.batch_size)
    )
    steps_per_epoch = len(x_train) // (args.batch_size * sdp.size())

    keras.utils.set_random_seed(42 + sdp.rank())  # the first-step broadcast makes all ranks agree
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(args.lr * sdp.size())
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss_fn(labels, probs)
        tape = sdp.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            sdp.broadcast_variables(model.variables, root_rank=0)
            sdp.broadcast_variables(optimizer.variables, root_rank=0)
        return sdp.oob_allreduce(loss_value)  # the loss averaged over ranks, for logging

    step = 0
    for epoch in range(args.epochs):
        losses = []
        for images, labels in dataset.take(steps_per_epoch):
            losses.append(float(training_step(images, labels, step == 0)))
            step += 1
        if sdp.rank() == 0:
            print(f"epoch {epoch + 1:2d}: loss {np.mean(losses):.4f}", flush=True)

    # Each rank scores a disjoint slice of the test set; the counts are summed.
    mine = slice(sdp.rank(), None, sdp.size())
    right = np.sum(np.argmax(model(x_test[mine]), 1) == y_test[mine])
    totals = sdp.allreduce(tf.constant([float(right), float(len(y_test[mine]))]), op=sdp.Sum, name="test.accuracy")
    if sdp.rank() == 0:
        print(f"test accuracy: {float(totals[0] / totals[1]):.4f}", flush=True)
        if args.checkpoint_dir:
            path = checkpoint.save(os.path.join(args.checkpoint_dir, "ckpt"))
            print(f"checkpoint written by rank 0: {path}", flush=True)
        else:  # a demonstration of the save only: nothing left behind
            with tempfile.TemporaryDirectory(prefix="tf2_custom_loop_") as directory:
                path = checkpoint.save(os.path.join(directory, "ckpt"))
                print(f"checkpoint written by rank 0: {path} (removed: pass --checkpoint-dir to keep it)",
                      flush=True)


if __name__ == "__main__":
    main()
