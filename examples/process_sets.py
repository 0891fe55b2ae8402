"""Two groups of ranks train two different models at the same time, in one job.

The ranks split into process sets: the even ranks train a digit classifier on
scikit-learn's digits, the odd ranks a regression model on synthetic data. Each
group averages its gradients only among its own members
(``DistributedGradientTape(tape, process_set=group)``, or with ``--reduce
grouped_allreduce`` the same by hand), broadcasts its initial weights
from its own first rank, and shards its own data among its members. The two
groups' collectives run at the same time: each set is its own stream in the
engine, so neither group waits for the other's steps.

At the end each group checks, with an ``allgather`` on its set, that its members
hold identical weights, and the whole job meets in a global ``allreduce`` (every
rank's verdict) and ``barrier``. Run with:

    smdistrun -np 4 python examples/process_sets.py

At ``-np 2`` each group has one rank. The collectives work the same (a set of
one rank returns its own values).
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import smdist_tf as sd


def digits_task(seed: int):
    """The even ranks' task: classify 8x8 digits."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return "digits", x, y, model, loss_fn


def regression_task(seed: int):
    """The odd ranks' task: fit y = x . w + noise with a small MLP."""
    rng = np.random.default_rng(0)  # the same data on every member; each takes its shard
    x = rng.normal(size=(2048, 16)).astype(np.float32)
    w = rng.normal(size=(16, 1)).astype(np.float32)
    y = (x @ w + 0.05 * rng.normal(size=(2048, 1))).astype(np.float32)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(1)])
    return "regression", x, y, model, keras.losses.MeanSquaredError()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=2e-3, help="scaled by the group's size")
    parser.add_argument("--reduce", choices=["tape", "grouped_allreduce"], default="tape",
                        help="average the gradients with DistributedGradientTape(process_set=...) or by "
                             "grouped_allreduce(process_set=...)")
    args = parser.parse_args()

    # The sets depend on the job's size, known after init(): register them dynamically.
    # Every rank adds the same sets in the same order (a job of known size can instead
    # pass them to sd.init(process_sets=[...])).
    sd.init(process_sets="dynamic")
    size = sd.size()
    evens = sd.add_process_set(list(range(0, size, 2)))
    odds = sd.add_process_set(list(range(1, size, 2)))
    group = evens if sd.rank() % 2 == 0 else odds
    other = odds if group is evens else evens
    assert group.included() and not other.included()

    # A different seed per rank: the broadcast below makes the group's members agree.
    task = digits_task if group is evens else regression_task
    name, x, y, model, loss_fn = task(seed=100 + sd.rank())
    root = group.ranks[0]  # broadcast's root_rank is a job rank, a member of the set
    sd.broadcast_variables(model.variables, root_rank=root, process_set=group)

    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .shard(group.size(), group.rank())
               .shuffle(4096, seed=group.rank())
               .batch(args.batch_size, drop_remainder=True))
    optimizer = keras.optimizers.Adam(args.lr * group.size())
    optimizer.build(model.trainable_variables)

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        # Average over this group only (Average divides by the set's size).
        if args.reduce == "tape":
            tape = sd.DistributedGradientTape(tape, process_set=group)
            grads = tape.gradient(loss, model.trainable_variables)
        else:
            grads = tape.gradient(loss, model.trainable_variables)
            grads = sd.grouped_allreduce(grads, op=sd.Average, process_set=group)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return sd.allreduce(loss, op=sd.Average, process_set=group)

    start = time.perf_counter()
    losses = []
    for epoch in range(args.epochs):
        losses = [float(train_step(f, l)) for f, l in dataset]
        if sd.rank() == root:
            print(f"[{name} group {group.ranks}] epoch {epoch + 1}: loss {np.mean(losses):.4f}", flush=True)
    elapsed = time.perf_counter() - start

    # The group's members must hold the same weights: gather each member's on the set.
    flat = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], axis=0)
    gathered = sd.allgather(flat[tf.newaxis, :], process_set=group).numpy()
    identical = bool(np.all(gathered == gathered[0]))
    if sd.rank() == root:
        print(f"[{name} group {group.ranks}] {group.size()} ranks, {elapsed:.1f}s, final loss {np.mean(losses):.4f}, "
              f"weights identical across the group: {identical}", flush=True)

    # The whole job: every rank's verdict, summed over all ranks (the global set).
    ok = sd.allreduce(tf.constant(1 if identical else 0, tf.int32), op=sd.Sum, name="process_sets.ok")
    sd.barrier()
    if sd.rank() == 0:
        print(f"all {size} ranks: {int(ok)} report identical weights within their group", flush=True)
    if int(ok) != size:
        raise SystemExit("a group's members ended with different weights")


if __name__ == "__main__":
    main()
