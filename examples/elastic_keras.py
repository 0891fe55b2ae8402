"""Elastic training with Keras 3: a rank fails, ``smdistrun`` restarts the job, training resumes.

The model, its optimizer and the position in the data (``epoch``, ``batch``) live in a
``smdist_tf.elastic.TensorFlowKerasState``; every few batches every rank commits it
together and rank 0 writes it to ``SMDIST_ELASTIC_DIR``. When a rank dies, smdistrun
starts the whole job again and ``@sd.elastic.run`` restores the last commit before
training goes on. Each epoch's data order is a function of the epoch alone, and a
resumed epoch skips the batches already done, so the result equals an uninterrupted
run's bit for bit. Run with:

    smdistrun -np 2 --max-restarts 1 python examples/elastic_keras.py --kill-at 1:3

``--kill-at 1:3`` makes rank 1 kill itself (SIGKILL) after batch 3 of epoch 1 on the
first attempt only, to show the restart; ``--loop tape`` trains with a custom loop and
``DistributedGradientTape`` instead of ``fit`` with ``DistributedOptimizer``.
"""

from __future__ import annotations

import argparse
import os
import signal

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import smdist_tf as sd


def epoch_batches(epoch: int, seed: int, rank: int, size: int, batch_size: int, count: int) -> np.ndarray:
    """This rank's sample indices for every batch of ``epoch``, shape ``(batches, batch_size)``.

    Depends only on its arguments, so a restarted job sees the same order.
    """
    order = np.random.default_rng([seed, epoch]).permutation(count)
    steps = count // (size * batch_size)  # the same on every rank
    return order[rank::size][: steps * batch_size].reshape(steps, batch_size)


def kill_point(text: str | None) -> tuple[int, int] | None:
    """``"1:3"`` -> (epoch 1, after 3 batches)."""
    if not text:
        return None
    epoch, batch = text.split(":")
    return int(epoch), int(batch)


class KillOnce(keras.callbacks.Callback):
    """Rank 1 kills itself at the kill point, on the first attempt only (a simulated crash)."""

    def __init__(self, state: sd.elastic.State, point: tuple[int, int] | None) -> None:
        super().__init__()
        self.state, self.point = state, point

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        maybe_kill(self.state, self.point)


def maybe_kill(state: sd.elastic.State, point: tuple[int, int] | None) -> None:
    first_attempt = os.environ.get("SMDIST_RESTART_COUNT", "0") == "0"
    if point == (state.epoch, state.batch) and sd.rank() == 1 and first_attempt:
        print(f"rank 1: killing myself after batch {state.batch} of epoch {state.epoch}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batches-per-commit", type=int, default=2)
    parser.add_argument("--loop", choices=("fit", "tape"), default="fit")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--kill-at", metavar="EPOCH:BATCH", help="rank 1 SIGKILLs itself there on the first attempt")
    parser.add_argument("--weights-out", help="rank 0 saves the final model and optimizer variables here (.npz)")
    args = parser.parse_args()

    tf.config.experimental.enable_op_determinism()
    sd.init()
    rank, size = sd.rank(), sd.size()
    keras.utils.set_random_seed(args.seed)

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.loop == "fit":
        model.compile(optimizer=sd.keras.DistributedOptimizer(keras.optimizers.Adam(args.lr)), loss=loss_fn)
        optimizer = model.optimizer
    else:
        optimizer = keras.optimizers.Adam(args.lr)
    state = sd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)
    point = kill_point(args.kill_at)

    @tf.function
    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = sd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @sd.elastic.run
    def train(state: sd.elastic.TensorFlowKerasState) -> None:
        if rank == 0:
            print(f"attempt {os.environ.get('SMDIST_RESTART_COUNT', '0')}: starting at epoch {state.epoch}, "
                  f"batch {state.batch}", flush=True)
        callbacks = [sd.elastic.CommitStateCallback(state, args.batches_per_commit),
                     sd.elastic.UpdateBatchStateCallback(state), sd.elastic.UpdateEpochStateCallback(state),
                     KillOnce(state, point)]
        for epoch in range(state.epoch, args.epochs):
            batches = epoch_batches(epoch, args.seed, rank, size, args.batch_size, len(x))[state.batch:]
            if args.loop == "fit":
                # One fit() per epoch: a resumed epoch gets only the batches it has not done.
                data = tf.data.Dataset.from_tensor_slices((x[batches.ravel()], y[batches.ravel()]))
                model.fit(data.batch(args.batch_size), initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                          shuffle=False, callbacks=callbacks)
                continue
            for indices in batches:
                train_step(x[indices], y[indices])
                state.batch += 1
                maybe_kill(state, point)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            state.epoch, state.batch = epoch + 1, 0
            state.commit()

    train(state)

    logits = model(x, training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y))
    if rank == 0:
        print(f"done: epoch {state.epoch}, training accuracy {accuracy:.4f}", flush=True)
        if args.weights_out:
            values = [v.numpy() for v in list(model.variables) + list(optimizer.variables)]
            np.savez(args.weights_out, *values)


if __name__ == "__main__":
    main()
