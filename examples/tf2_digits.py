"""Data-parallel training on scikit-learn's digits with a custom loop.

The TF2 pattern Horovod and SageMaker data-parallel users know: wrap the tape,
broadcast the initial state after the first step, average the loss out of band,
evaluate globally. Run with:

    smdistrun -np 2 python examples/tf2_digits.py
"""

from __future__ import annotations

import argparse

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import smdist_tf as sd


def load_shards(rank: int, size: int, seed: int = 0):
    """The same split on every rank; each rank trains on an equal, disjoint shard."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    per_rank = len(x_train) // size  # equal shards: every rank runs the same number of steps
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    return (x_train[shard], y_train[shard]), (x_test, y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="scaled by the number of ranks")
    args = parser.parse_args()

    sd.init()
    rank, size = sd.rank(), sd.size()
    keras.utils.set_random_seed(1234 + rank)  # different initial weights per rank: the broadcast must fix them
    (x_train, y_train), (x_test, y_test) = load_shards(rank, size)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.Adam(args.lr * size)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y, first_batch: bool):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        tape = sd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            # After the first step the optimizer's slots exist, so both are synchronised.
            sd.broadcast_variables(model.variables, root_rank=0)
            sd.broadcast_variables(optimizer.variables, root_rank=0)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        return loss, correct

    if rank == 0:
        print(f"training on {size} rank(s), {len(x_train)} samples per rank, {args.epochs} epochs", flush=True)
    first = True
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch * 1000 + rank).permutation(len(x_train))
        losses, correct = [], 0.0
        for start in range(0, len(order), args.batch_size):
            idx = order[start : start + args.batch_size]
            loss, batch_correct = train_step(tf.constant(x_train[idx]), tf.constant(y_train[idx]), first)
            first = False
            losses.append(loss)
            correct += float(batch_correct)
        global_loss = float(sd.oob_allreduce(tf.reduce_mean(losses), name=f"epoch{epoch}.loss"))
        totals = sd.allreduce(tf.constant([correct, float(len(order))]), op=sd.Sum, name=f"epoch{epoch}.acc")
        if rank == 0:
            print(f"epoch {epoch + 1:2d}: loss {global_loss:.4f}  accuracy {float(totals[0] / totals[1]):.4f}", flush=True)

    # Every rank scores a disjoint slice of the test set; the counts are summed.
    test_slice = slice(rank, None, size)
    logits = model(x_test[test_slice], training=False)
    right = float(np.sum(np.argmax(logits, 1) == y_test[test_slice]))
    totals = sd.allreduce(tf.constant([right, float(len(y_test[test_slice]))]), op=sd.Sum, name="test.acc")
    checksum = tf.add_n([tf.reduce_sum(tf.cast(v, tf.float64)) for v in model.trainable_variables])
    in_sync = bool(tf.reduce_all(tf.equal(sd.allgather(checksum), checksum)))
    if rank == 0:
        print(f"test accuracy: {float(totals[0] / totals[1]):.4f}", flush=True)
        print(f"weights identical on all ranks: {in_sync}", flush=True)


if __name__ == "__main__":
    main()
