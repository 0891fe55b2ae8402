"""Uneven data per rank never hangs: Keras fit (DistributedOptimizer, DataParallelStrategy) and the tape loop.

Run on every rank by tests/test_uneven_data_multiprocess.py, at 2 and 4 ranks. Every rank
holds ``dataset.batch(32).shard(size, rank)`` of scikit-learn's digits: 57 batches, so 29
and 28 at 2 ranks, 15, 14, 14 and 14 at 4. Every test runs on every rank in the same order,
and none depends on another. SMDIST_STALL_SHUTDOWN_TIME=60 makes a regression that hangs
fail in about a minute on every rank, well within HANG_S.
"""

from __future__ import annotations

import functools
import os
import time

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from tests.mp.sync_assertions import SyncAssertions

HANG_S = 150  # above the 60 s stall shutdown, far below a hang
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
BATCH = 32


@functools.cache
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, scaled to [0, 1]; loaded on first use (on the ranks only)."""
    from sklearn.datasets import load_digits  # noqa: PLC0415

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y


def batches_per_rank(size: int) -> list[int]:
    """Each rank's batches per epoch at ``size`` ranks."""
    global_batches = -(-len(digits_arrays()[0]) // BATCH)
    return [len(range(r, global_batches, size)) for r in range(size)]


def digits() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(digits_arrays()).batch(BATCH)


def shard() -> tf.data.Dataset:
    """This rank's batches, Horovod style."""
    return digits().shard(sd.size(), sd.rank())


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(10)])


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float64).ravel() for w in model.get_weights()])


def flat_optimizer_state(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(v.numpy(), np.float64).ravel() for v in model.optimizer.variables])


def per_rank_shards(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    """This rank's batches, for ``distribute_datasets_from_function``."""
    return digits().shard(ctx.num_input_pipelines, ctx.input_pipeline_id)


class BatchCounter(keras.callbacks.Callback):
    """Batches this rank trained in each epoch, and when each epoch began."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[int] = []
        self.epoch_started: list[float] = []

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self.counts.append(0)
        self.epoch_started.append(time.monotonic())

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.counts[-1] += 1


class StopOnLastRank(keras.callbacks.Callback):
    """Sets ``stop_training`` on the last rank only: after ``at_batch`` of the first epoch, or at its end."""

    def __init__(self, at_batch: int | None = None) -> None:
        super().__init__()
        self.at_batch = at_batch
        self.last_rank = sd.rank() == sd.size() - 1

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self.last_rank and batch == self.at_batch:
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if self.last_rank and self.at_batch is None:
            self.model.stop_training = True


class UnevenDataTest(SyncAssertions):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rank, cls.size = sd.rank(), sd.size()
        cls.batches = batches_per_rank(cls.size)  # each rank's batches per epoch
        cls.strategy = sd.DataParallelStrategy()

    def test_shards_are_uneven(self):
        self.assertEqual(self.size, int(os.environ["OMPI_COMM_WORLD_SIZE"]))  # the ranks mpirun started
        self.assertGreater(max(self.batches), min(self.batches))
        self.assertEqual(int(shard().cardinality()), self.batches[self.rank])

    def test_horovod_style_fit_with_broadcast_and_metric_average(self):
        rank, size, batches = self.rank, self.size, self.batches
        model = make_model(seed=100 + rank)  # broadcast from rank 0 makes them equal
        model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(0.05 * size, momentum=0.9)), loss=LOSS,
                      metrics=["accuracy"])
        counter = BatchCounter()
        callbacks = [sk.callbacks.BroadcastGlobalVariablesCallback(0), sk.callbacks.MetricAverageCallback(), counter]
        history = model.fit(shard(), epochs=2, callbacks=callbacks, verbose=0)
        self.assertEqual(counter.counts, [batches[rank]] * 2)
        losses = history.history["loss"]
        self.assertLess(losses[1], losses[0])
        # MetricAverageCallback ran after the join: its averages are the same everywhere.
        self.assertEqual(sd.allgather_object(losses), [losses] * size)
        # The rank that trained longest handed over its weights and optimizer state every epoch.
        self.assertEqual(int(model.optimizer.iterations.numpy()), 2 * max(batches))
        self.assert_identical_on_all_ranks(flat_weights(model))
        self.assert_identical_on_all_ranks(flat_optimizer_state(model))

    def test_fit_without_callbacks_known_and_unknown_length(self):
        rank = self.rank
        for name, data in [("known", shard()), ("unknown", shard().filter(lambda x, y: True))]:
            with self.subTest(name):
                model = make_model(seed=200 + rank)  # unequal until the first epoch's re-sync
                model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=LOSS)
                # Validation is local to each rank on this path (no collectives), also with uneven data.
                history = model.fit(data, epochs=2, validation_data=shard().take(rank + 1), verbose=0)
                self.assertEqual(len(history.history["val_loss"]), 2)
                self.assert_identical_on_all_ranks(flat_weights(model))
                # Optimizer state too (with unknown length, Keras may count the step that found no data).
                self.assert_identical_on_all_ranks(flat_optimizer_state(model))

    def test_tape_loop_with_join_averages_over_the_ranks_that_contributed(self):
        size, batches = self.size, self.batches
        lr, epochs = 0.1, 2
        model, reference = make_model(seed=7), make_model(seed=7)
        optimizer = keras.optimizers.SGD(lr)

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = LOSS(y, model(x, training=True))
            grads = sd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        for _ in range(epochs):
            for x, y in shard():
                train_step(x, y)
            last = sd.join()
            self.assertEqual(last, int(np.argmax(batches)))  # the one rank with the most batches
            sd.broadcast_variables(model.variables + optimizer.variables, root_rank=last)
        self.assert_identical_on_all_ranks(flat_weights(model))

        @tf.function
        def local_grads(x, y):
            with tf.GradientTape() as tape:
                loss = LOSS(y, reference(x, training=True))
            return tape.gradient(loss, reference.trainable_variables)

        # One process: step i averages the gradients of the ranks that still had a batch i.
        all_batches = list(digits())
        for _ in range(epochs):
            for i in range(max(batches)):
                grads = [local_grads(x, y) for x, y in all_batches[i * size:(i + 1) * size]]
                for v, *per_rank in zip(reference.trainable_variables, *grads):
                    v.assign_sub(lr * tf.add_n(per_rank) / len(per_rank))
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    def test_strategy_fit_and_evaluate_with_uneven_known_length_shards(self):
        rank, size, batches, strategy = self.rank, self.size, self.batches, self.strategy
        already_sharded = tf.data.Options()
        already_sharded.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        sources = {
            "distribute_datasets_from_function": strategy.distribute_datasets_from_function(per_rank_shards),
            "dataset.shard": shard().with_options(already_sharded),
        }
        # Uneven validation too: evaluate joins after its last step before reading the metrics.
        validation = strategy.distribute_datasets_from_function(
            lambda ctx: per_rank_shards(ctx).take(2 + ctx.input_pipeline_id))
        for name, train in sources.items():
            with self.subTest(name):
                with strategy.scope():
                    model = make_model(seed=300 + rank)
                    model.compile(optimizer=keras.optimizers.SGD(0.2, momentum=0.9), loss=LOSS, metrics=["accuracy"])
                counter = BatchCounter()
                history = model.fit(train, epochs=2, validation_data=validation, callbacks=[counter], verbose=0)
                self.assertEqual(counter.counts, [batches[rank]] * 2)  # known, and uneven
                self.assertLess(history.history["loss"][1], history.history["loss"][0])
                # Logs are global under the strategy: every rank read the same metrics after the join.
                self.assertEqual(sd.allgather_object(history.history), [history.history] * size)
                self.assert_identical_on_all_ranks(flat_weights(model))
                self.assertEqual(int(model.optimizer.iterations.numpy()), 2 * max(batches))
                result = model.evaluate(validation, verbose=0, return_dict=True)
                self.assertEqual(sd.allgather_object(result), [result] * size)

    def test_steps_per_epoch_running_out_errors_on_every_rank(self):
        size, batches, strategy = self.size, self.batches, self.strategy
        steps = (max(batches) + 1) // 2 + 1  # the first epoch is full; the second runs out on every rank
        left = [b - steps for b in batches]
        for path in ["DistributedOptimizer", "DataParallelStrategy"]:
            with self.subTest(path):
                if path == "DistributedOptimizer":
                    model, data = make_model(seed=1), shard()
                    model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=LOSS)
                else:
                    data = strategy.distribute_datasets_from_function(per_rank_shards)
                    with strategy.scope():
                        model = make_model(seed=1)
                        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=LOSS, metrics=["accuracy"])
                counter = BatchCounter()
                with self.assertRaises(ValueError) as raised:
                    model.fit(data, epochs=3, steps_per_epoch=steps, callbacks=[counter], verbose=0)
                took = time.monotonic() - counter.epoch_started[1]
                message = str(raised.exception)
                self.assertIn("uneven data in epoch 2", message)
                for r in range(size):
                    self.assertIn(f"rank {r}: {left[r]} batches (ran out before {steps})", message)
                for fix in ("steps_per_epoch", "drop_remainder=True", ".repeat()"):
                    self.assertIn(fix, message)
                self.assertLess(took, 20.0, "far less than the stall check's 60 s")
                self.assert_engine_healthy()

    def test_stop_training_on_one_rank_stops_every_rank(self):
        model = make_model(seed=400)
        model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss=LOSS)
        # The last rank alone stops at the end of the first epoch ...
        history = model.fit(shard(), epochs=3, callbacks=[StopOnLastRank()], verbose=0)
        self.assertEqual(len(history.history["loss"]), 1)
        # ... or in the middle of it: the others finish the epoch without it, then all stop.
        history = model.fit(shard(), epochs=3, callbacks=[StopOnLastRank(at_batch=3)], verbose=0)
        self.assertEqual(len(history.history["loss"]), 1)
        self.assertEqual(int(model.optimizer.iterations.numpy()), 2 * max(self.batches))
        self.assert_identical_on_all_ranks(flat_weights(model))
        self.assert_engine_healthy()



if __name__ == "__main__":
    tf.test.main()
