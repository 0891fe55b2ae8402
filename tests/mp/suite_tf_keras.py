"""Keras 2 (tf-keras with TF_USE_LEGACY_KERAS=1): DistributedOptimizer, the callbacks, DataParallelStrategy + fit, load_model.

Run on every rank by tests/test_tf_keras_multiprocess.py, at 2 and 4 ranks, with
``TF_USE_LEGACY_KERAS=1`` in the ranks' environment from the start, so ``tf.keras`` is
tf_keras there and smdist_tf serves Keras 2. Each result is compared with the same
training in one process, on every rank.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tensorflow as tf
import tf_keras

import smdist_tf as sd
import smdist_tf.keras as sk
from tests.mp.adasum_reference import adasum
from tests.mp.sync_assertions import SyncAssertions

PER_RANK_BATCH = 8
STEPS = 6
HANG_S = 150  # a test still running after this is hung (each takes seconds)


def data(size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``STEPS`` global batches of a regression problem, ``PER_RANK_BATCH`` rows per rank each."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(STEPS * PER_RANK_BATCH * size, 6)).astype(np.float32)
    y = (x @ rng.normal(size=(6, 1)) + 0.1 * rng.normal(size=(len(x), 1))).astype(np.float32)
    return x, y


def rank_rows(array: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This rank's rows: row block ``rank`` of every global batch, so global batch i is every rank's batch i."""
    blocks = array.reshape(STEPS, size, PER_RANK_BATCH, *array.shape[1:])
    return blocks[:, rank].reshape(-1, *array.shape[1:])


def make_model(seed: int = 1) -> "tf_keras.Model":
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(8, activation="tanh", input_shape=(6,)), tf_keras.layers.Dense(1)])


def flat(arrays: list) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def reference_weights(optimizer: "tf_keras.optimizers.Optimizer", size: int, epochs: int = 1) -> np.ndarray:
    """One process training on the global batches: what the ranks together must reach."""
    x, y = data(size)
    model = make_model()
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=PER_RANK_BATCH * size, epochs=epochs, shuffle=False, verbose=0)
    return flat(model.get_weights())


class TfKerasTest(SyncAssertions):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rank, cls.size = sd.rank(), sd.size()
        x, y = data(cls.size)
        cls.x, cls.y = rank_rows(x, cls.rank, cls.size), rank_rows(y, cls.rank, cls.size)

    def fit_distributed(self, optimizer, callbacks=(), epochs: int = 1, seed: int = 1):
        model = make_model(seed)
        model.compile(optimizer=sk.DistributedOptimizer(optimizer), loss="mse")
        history = model.fit(self.x, self.y, batch_size=PER_RANK_BATCH, epochs=epochs, shuffle=False,
                            callbacks=list(callbacks), verbose=0)
        return model, history

    def test_tf_keras_is_what_smdist_tf_serves(self):
        self.assertIs(tf.keras.Model, tf_keras.Model)
        self.assertTrue(issubclass(sk.callbacks.BroadcastGlobalVariablesCallback, tf_keras.callbacks.Callback))
        self.assertTrue(issubclass(sk.callbacks.ModelCheckpoint, tf_keras.callbacks.ModelCheckpoint))

    def test_distributed_optimizer_fit_equals_one_process_on_the_global_batch(self):
        optimizers = {
            "Adam": lambda: tf_keras.optimizers.Adam(0.01),
            "legacy SGD with momentum": lambda: tf_keras.optimizers.legacy.SGD(0.05, momentum=0.9),
            "legacy Adam": lambda: tf_keras.optimizers.legacy.Adam(0.01),
            "RMSprop with global_clipnorm": lambda: tf_keras.optimizers.RMSprop(0.01, global_clipnorm=0.5),
        }
        for name, make in optimizers.items():
            with self.subTest(name):
                model, _ = self.fit_distributed(make(), epochs=2)
                wrapped = model.optimizer
                self.assertEqual(type(wrapped).__name__, type(make()).__name__)
                self.assertIsInstance(wrapped, type(make()))
                self.assertEqual(int(wrapped.iterations.numpy()), 2 * STEPS)
                self.assertAllClose(flat(model.get_weights()), reference_weights(make(), self.size, epochs=2),
                                    rtol=1e-5, atol=1e-6)

    def test_custom_loop_with_apply_gradients(self):
        model = make_model()
        optimizer = sk.DistributedOptimizer(tf_keras.optimizers.SGD(0.1))

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        for i in range(STEPS):
            rows = slice(i * PER_RANK_BATCH, (i + 1) * PER_RANK_BATCH)
            step(self.x[rows], self.y[rows])
        self.assertAllClose(flat(model.get_weights()), reference_weights(tf_keras.optimizers.SGD(0.1), self.size),
                            rtol=1e-5, atol=1e-6)

    def test_distributed_optimizer_with_adasum_applies_the_adasum_of_the_gradients(self):
        lr, x, y = 0.1, self.x[:PER_RANK_BATCH], self.y[:PER_RANK_BATCH]
        model = make_model()
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        # Every rank's local gradients, combined per variable by the NumPy reference.
        expected = [adasum(list(sd.allgather(g[tf.newaxis]).numpy()), tf.float32)
                    for g in tape.gradient(loss, model.trainable_variables)]
        before = model.get_weights()
        model.compile(optimizer=sk.DistributedOptimizer(tf_keras.optimizers.SGD(lr), op=sd.Adasum), loss="mse")
        model.train_on_batch(x, y)
        self.assertAllClose(flat(model.get_weights()), flat([w - lr * g for w, g in zip(before, expected)]),
                            rtol=1e-5, atol=1e-6)

    def test_partial_distributed_optimizer_keeps_local_layers_local(self):
        model = make_model()
        local = model.layers[0]
        optimizer = sk.PartialDistributedOptimizer(tf_keras.optimizers.SGD(0.05), local_layers=local)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(self.x, self.y, batch_size=PER_RANK_BATCH, shuffle=False, verbose=0)
        self.assert_identical_on_all_ranks(flat(model.layers[1].get_weights()))
        local_weights = sd.allgather_object(flat(local.get_weights()))
        self.assertFalse(np.array_equal(local_weights[0], local_weights[1]))  # each rank's own data

    def test_loss_scale_optimizer_skips_a_step_that_overflowed_on_one_rank_only(self):
        # The reduction comes before LossScaleOptimizer's inf/NaN check, so every rank skips the step.
        x = self.x.copy()
        if self.rank == self.size - 1:
            x[:PER_RANK_BATCH] = np.inf  # the first batch, on the last rank alone
        model = make_model()
        optimizer = tf_keras.mixed_precision.LossScaleOptimizer(sk.DistributedOptimizer(tf_keras.optimizers.Adam(0.01)),
                                                                initial_scale=1024.0)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, self.y, batch_size=PER_RANK_BATCH, shuffle=False, verbose=0)
        self.assertEqual(float(optimizer.loss_scale.numpy()), 512.0)  # halved once, on every rank
        weights = flat(model.get_weights())
        self.assertTrue(np.isfinite(weights).all())
        self.assert_identical_on_all_ranks(weights)
        self.assert_engine_healthy()

    def test_broadcast_and_metric_average_callbacks(self):
        callbacks = [sk.callbacks.BroadcastGlobalVariablesCallback(0), sk.callbacks.MetricAverageCallback()]
        model, history = self.fit_distributed(tf_keras.optimizers.Adam(0.01), callbacks, epochs=2,
                                              seed=10 + self.rank)  # rank 0's weights reach everyone
        self.assert_identical_on_all_ranks(flat(model.get_weights()))
        losses = history.history["loss"]
        self.assertEqual(sd.allgather_object(losses), [losses] * self.size)
        # The average of what each rank logged: rerun rank by rank without the averaging callback.
        _, unaveraged = self.fit_distributed(tf_keras.optimizers.Adam(0.01), callbacks[:1], epochs=2,
                                             seed=10 + self.rank)
        per_rank = sd.allgather_object(unaveraged.history["loss"])
        self.assertAllClose(losses, np.mean(per_rank, axis=0), rtol=1e-6)

    def test_learning_rate_warmup_and_schedule_callbacks(self):
        base = 0.01
        warmup = sk.callbacks.LearningRateWarmupCallback(initial_lr=base * self.size, warmup_epochs=1)
        schedule = sk.callbacks.LearningRateScheduleCallback(initial_lr=base * self.size, multiplier=0.5,
                                                             start_epoch=1)
        for name, make in [("Adam", lambda: tf_keras.optimizers.Adam(base)),
                           ("legacy SGD", lambda: tf_keras.optimizers.legacy.SGD(base, momentum=0.9))]:
            with self.subTest(name):
                model, history = self.fit_distributed(make(), [warmup, schedule], epochs=2)
                lr = model.optimizer.learning_rate
                self.assertAllClose(float(tf.convert_to_tensor(lr)), base * self.size * 0.5)
                self.assertAllClose(history.history["lr"], [base * self.size, base * self.size * 0.5])
                self.assertAllClose(warmup.learning_rate_at(0, 0),
                                    base * self.size / self.size * (1 + (self.size - 1) / STEPS))

    def test_model_checkpoints_are_written_by_rank_zero_only(self):
        directory = sd.broadcast_object(tempfile.mkdtemp(prefix="smdist_tfk_") if self.rank == 0 else None)
        every = os.path.join(directory, "every-{epoch}.h5")
        best = os.path.join(directory, "best.h5")
        callbacks = [sk.callbacks.MetricAverageCallback(), sk.callbacks.ModelCheckpoint(every),
                     sk.callbacks.BestModelCheckpoint(monitor="loss", filepath=best)]
        self.fit_distributed(tf_keras.optimizers.Adam(0.01), callbacks, epochs=2)
        sd.barrier()
        written = sorted(os.listdir(directory))
        self.assertEqual(written, ["best.h5", "every-1.h5", "every-2.h5"])
        self.assertEqual(sd.allgather_object(written), [written] * self.size)

    def test_load_model_resumes_with_a_distributed_optimizer(self):
        directory = sd.broadcast_object(tempfile.mkdtemp(prefix="smdist_tfk_") if self.rank == 0 else None)
        for suffix in (".keras", ".h5"):
            with self.subTest(suffix):
                path = os.path.join(directory, "model" + suffix)
                model, _ = self.fit_distributed(tf_keras.optimizers.Adam(0.01))
                if self.rank == 0:
                    model.save(path)
                sd.barrier()
                loaded = sk.load_model(path)
                self.assertTrue(loaded.optimizer._smdist_reduces_in_apply)
                self.assertEqual(type(loaded.optimizer).__name__, "Adam")
                self.assertEqual(int(loaded.optimizer.iterations.numpy()), STEPS)
                self.assertAllClose(flat(loaded.optimizer.variables), flat(model.optimizer.variables))
                # One more epoch from the restored state equals two epochs without stopping.
                loaded.fit(self.x, self.y, batch_size=PER_RANK_BATCH, shuffle=False, verbose=0)
                self.assertAllClose(flat(loaded.get_weights()),
                                    reference_weights(tf_keras.optimizers.Adam(0.01), self.size, epochs=2),
                                    rtol=1e-5, atol=1e-6)
                unwrapped = sk.load_model(path, custom_objects={"Adam": tf_keras.optimizers.Adam})
                self.assertFalse(hasattr(unwrapped.optimizer, "_smdist_reduces_in_apply"))

    def test_data_parallel_strategy_fit_and_evaluate_equal_one_process(self):
        strategy = sd.DataParallelStrategy()
        x, y = data(self.size)
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=tf_keras.optimizers.Adam(0.01), loss="mse")
        # The global batch, sharded over the ranks by the strategy.
        model.fit(x, y, batch_size=PER_RANK_BATCH * self.size, epochs=2, shuffle=False, verbose=0)
        self.assertAllClose(flat(model.get_weights()), reference_weights(tf_keras.optimizers.Adam(0.01), self.size,
                                                                         epochs=2), rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat(model.get_weights()))
        loss = model.evaluate(x, y, batch_size=PER_RANK_BATCH * self.size, verbose=0)
        self.assertAllClose(loss, float(np.mean((model.predict(x, verbose=0) - y) ** 2)), rtol=1e-4)
        # Saving reads metric variables as collectives under the strategy: every rank takes part.
        path = os.path.join(sd.broadcast_object(tempfile.mkdtemp() if self.rank == 0 else None), "strategy.keras")
        written = sd.distribute.save_on_rank_zero(model, path)
        self.assertEqual(written, path if self.rank == 0 else None)
        self.assertAllClose(flat(tf_keras.models.load_model(path).get_weights()), flat(model.get_weights()))

    def test_uneven_batch_counts_never_hang_fit(self):
        # The last rank holds one batch fewer: it joins, the others finish, every rank re-syncs.
        keep = len(self.x) - (PER_RANK_BATCH if self.rank == self.size - 1 else 0)
        model = make_model()
        model.compile(optimizer=sk.DistributedOptimizer(tf_keras.optimizers.SGD(0.05)), loss="mse")
        model.fit(self.x[:keep], self.y[:keep], batch_size=PER_RANK_BATCH, epochs=2, shuffle=False, verbose=0)
        self.assert_identical_on_all_ranks(flat(model.get_weights()))
        self.assertEqual(int(model.optimizer.iterations.numpy()), 2 * STEPS)

    def test_data_parallel_strategy_with_uneven_per_rank_datasets(self):
        strategy = sd.DataParallelStrategy()
        rank, size = self.rank, self.size

        # Each rank's own batches (Keras 2 wants steps_per_epoch with a distributed dataset, so a plain one).
        keep = len(self.x) - (PER_RANK_BATCH if rank == size - 1 else 0)  # the last rank: one batch fewer
        already_sharded = tf.data.Options()
        already_sharded.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = tf.data.Dataset.from_tensor_slices((self.x[:keep], self.y[:keep])).batch(PER_RANK_BATCH)
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=tf_keras.optimizers.SGD(0.05), loss="mse")
        history = model.fit(dataset.with_options(already_sharded), epochs=2, verbose=0)
        self.assertEqual(len(history.history["loss"]), 2)
        self.assert_identical_on_all_ranks(flat(model.get_weights()))

    def test_bad_input_errors_on_every_rank(self):
        import keras  # Keras 3, installed beside tf-keras

        with self.assertRaisesRegex(ValueError, "Keras 3 optimizer, but tf.keras is Keras 2"):
            sk.DistributedOptimizer(keras.optimizers.Adam())
        with self.assertRaisesRegex(TypeError, "LossScaleOptimizer\\(DistributedOptimizer"):
            sk.DistributedOptimizer(tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.Adam()))
        with self.assertRaisesRegex(ValueError, "need Keras 3"):
            sk.DistributedOptimizer(tf_keras.optimizers.Adam(), shard_optimizer_state=True)
        with self.assertRaisesRegex(ValueError, "backward_passes_per_step"):
            sk.DistributedOptimizer(tf_keras.optimizers.Adam(), backward_passes_per_step=2)
        with self.assertRaisesRegex(ValueError, "needs Keras 3"):
            sd.DataParallelStrategy(shard_optimizer_state=True)
        with self.assertRaisesRegex(ValueError, r"DataParallelStrategy\(gradient_op=Adasum\) needs Keras 3"):
            sd.DataParallelStrategy(gradient_op=sd.Adasum)
        with self.assertRaisesRegex(ValueError, "PipelineModel needs Keras 3"):
            sk.PipelineModel(make_model, num_stages=1, num_microbatches=1)
        with self.assertRaisesRegex(ValueError, "SyncBatchNormalization needs Keras 3"):
            sd.SyncBatchNormalization()
        with self.assertRaisesRegex(ValueError, "TensorFlowKerasState needs Keras 3"):
            sk.elastic.TensorFlowKerasState(make_model())
        self.assert_engine_healthy()



if __name__ == "__main__":
    tf.test.main()
