"""Keras 3 and tf.distribute integration: DataParallelStrategy, DistributedOptimizer, callbacks, checkpoints.

Run on every rank by tests/test_keras_multiprocess.py. Every test runs on every rank
in the same order, so eager collectives pair up across ranks.
"""

from __future__ import annotations

import contextlib
import io
import os

import keras
import numpy as np
import tensorflow as tf

import smdist_tf as sd
import smdist_tf.keras as sk
from tests.mp.rank_counts import at_two_ranks_only
from tests.mp.sync_assertions import SyncAssertions

RANK, SIZE = sd.rank(), sd.size()
STRATEGY = sd.DataParallelStrategy()
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def data(n: int, seed: int = 0, features: int = 8):
    """The same data on every rank (the strategy shards it)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def small_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(12, activation="tanh"), keras.layers.Dense(3)])


def flat_weights(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w, np.float64).ravel() for w in model.get_weights()])


class StrategyApiTest(SyncAssertions):
    def test_replicas_reduce_gather_and_initial_broadcast(self):
        self.assertEqual(STRATEGY.num_replicas_in_sync, SIZE)
        self.assertIsInstance(STRATEGY, tf.distribute.Strategy)
        self.assertEqual(STRATEGY.extended.should_checkpoint, RANK == 0)
        with STRATEGY.scope():
            v = tf.Variable(float(RANK) + 5.0)  # rank 0's initial value wins
        self.assertEqual(float(v.numpy()), 5.0)

        @tf.function
        def step(x):
            def replica_fn(x):
                ctx = tf.distribute.get_replica_context()
                return ctx.all_reduce("SUM", x), ctx.all_reduce("MEAN", {"a": x * 2.0}), ctx.replica_id_in_sync_group

            return STRATEGY.run(replica_fn, args=(x,))

        total, mean, replica_id = step(tf.constant(float(RANK + 1)))
        local = STRATEGY.experimental_local_results
        self.assertEqual(float(local(total)[0]), SIZE * (SIZE + 1) / 2)
        self.assertAllClose(local(mean)[0]["a"], (SIZE + 1.0))
        self.assertEqual(int(local(replica_id)[0]), RANK)

        per_replica = STRATEGY.run(lambda: tf.constant([float(RANK), 1.0]))
        self.assertAllClose(STRATEGY.reduce("MEAN", per_replica, axis=None), [(SIZE - 1) / 2, 1.0])
        self.assertAllClose(STRATEGY.reduce("SUM", per_replica, axis=0), SIZE * (SIZE - 1) / 2 + SIZE)
        # tensorflow/tensorflow#72388: a scalar with axis=0.
        scalar = STRATEGY.run(lambda: tf.constant(float(RANK)))
        self.assertAllClose(STRATEGY.reduce("MEAN", scalar, axis=0), (SIZE - 1) / 2)
        self.assertAllClose(STRATEGY.gather(per_replica, axis=0), np.ravel([[r, 1.0] for r in range(SIZE)]))
        matrix = STRATEGY.run(lambda: tf.fill([2, 1], float(RANK)))
        self.assertAllClose(STRATEGY.gather(matrix, axis=1), np.tile(np.arange(SIZE, dtype=np.float32), (2, 1)))
        values = STRATEGY.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group * 10)
        self.assertEqual(local(values)[0], RANK * 10)

    def test_unsupported_dtype_errors_on_every_rank(self):
        per_replica = STRATEGY.run(lambda: tf.constant(["x"]))
        with self.assertRaisesRegex(TypeError, "cannot reduce dtype string"):
            STRATEGY.reduce("SUM", per_replica, axis=None)
        self.assert_engine_healthy()

    def test_input_sharding_and_uneven_shards_end_together(self):
        seen = []

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.get_per_replica_batch_size(4 * SIZE)))
            # Rank 0 has one more batch than the others: without agreement the last step would hang.
            return tf.data.Dataset.range(3 if ctx.input_pipeline_id == 0 else 2).map(lambda i: tf.cast(i, tf.float32)).batch(1)

        self.assertEqual(seen, [])
        dist = STRATEGY.distribute_datasets_from_function(dataset_fn)
        self.assertEqual(seen, [(SIZE, RANK, 4)])

        @tf.function
        def step(batch):
            return STRATEGY.run(lambda b: tf.distribute.get_replica_context().all_reduce("SUM", tf.reduce_sum(b) + 1.0), args=(batch,))

        steps = 0
        for batch in dist:
            step(batch)
            steps += 1
        self.assertEqual(steps, 3)  # every rank, including those that ran out of data

        # experimental_distribute_dataset: a global batch of 2·SIZE splits into disjoint per-rank slices.
        dist = STRATEGY.experimental_distribute_dataset(tf.data.Dataset.range(4 * SIZE).batch(2 * SIZE))
        mine = [STRATEGY.experimental_local_results(b)[0].numpy().tolist() for b in dist]
        per_replica = tf.distribute.InputOptions(experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
        with self.assertRaisesRegex(NotImplementedError, "PER_REPLICA"):
            STRATEGY.experimental_distribute_dataset(tf.data.Dataset.range(4), options=per_replica)
        self.assertEqual([len(b) for b in mine], [2, 2])
        everyone = sd.allgather_object(mine)
        flat = sorted(i for rank_batches in everyone for b in rank_batches for i in b)
        self.assertEqual(flat, list(range(4 * SIZE)))


class FitTest(SyncAssertions):
    def test_fit_equals_single_process_with_k_times_batch(self):
        per_rank, lr = 4, 0.2
        x, y = data(16 * SIZE, seed=1)
        with STRATEGY.scope():
            model = small_model(seed=100 + RANK)  # different seeds: the strategy must broadcast
            model.compile(optimizer=keras.optimizers.SGD(lr), loss=LOSS, metrics=["accuracy"])
        reference = small_model(seed=0)
        reference.set_weights(model.get_weights())
        reference.compile(optimizer=keras.optimizers.SGD(lr), loss=LOSS, metrics=["accuracy"])

        history = model.fit(x, y, batch_size=per_rank * SIZE, epochs=2, shuffle=False, verbose=0)
        ref_history = reference.fit(x, y, batch_size=per_rank * SIZE, epochs=2, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat_weights(model))
        # Logs are global: equal on every rank and to the single process's.
        self.assertAllClose(history.history["loss"], ref_history.history["loss"], rtol=1e-4)
        self.assertEqual(sd.allgather_object(history.history), [history.history] * SIZE)

        loss, accuracy = model.evaluate(x, y, batch_size=2 * SIZE, verbose=0)
        ref_loss, ref_accuracy = reference.evaluate(x, y, batch_size=2 * SIZE, verbose=0)
        self.assertAllClose([loss, accuracy], [ref_loss, ref_accuracy], rtol=1e-4)
        predictions = model.predict(x, batch_size=2 * SIZE, verbose=0)
        self.assertEqual(predictions.shape, (len(x), 3))
        self.assertAllClose(np.sort(predictions, axis=0), np.sort(reference.predict(x, verbose=0), axis=0), rtol=1e-4, atol=1e-5)

    def test_sparse_embedding_gradients(self):
        # Embedding gradients are IndexedSlices: they travel as allgathers.
        rng = np.random.default_rng(3)
        ids = rng.integers(0, 20, size=(8 * SIZE, 3))
        labels = (ids.sum(1) % 2).astype(np.int64)

        def build(seed):
            keras.utils.set_random_seed(seed)
            model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(20, 4), keras.layers.Flatten(), keras.layers.Dense(2)])
            return model

        with STRATEGY.scope():
            model = build(7 + RANK)
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        reference = build(0)
        reference.set_weights(model.get_weights())
        reference.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
        model.fit(ids, labels, batch_size=2 * SIZE, epochs=1, shuffle=False, verbose=0)
        reference.fit(ids, labels, batch_size=2 * SIZE, epochs=1, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat_weights(model))

    @at_two_ranks_only("Keras' loss scaling and accumulation happen per rank, before the allreduce the other fit tests run at 4 ranks")
    def test_mixed_precision_fit_with_gradient_accumulation(self):
        # Keras wraps the optimizer in a LossScaleOptimizer and accumulates 2 steps inside tf.cond.
        x, y = data(8 * SIZE, seed=6)

        def build():
            keras.utils.set_random_seed(5)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3, dtype="float32")])
            model.compile(optimizer=keras.optimizers.SGD(0.3, gradient_accumulation_steps=2), loss=LOSS)
            return model

        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            with STRATEGY.scope():
                model = build()
            reference = build()
            reference.set_weights(model.get_weights())
            history = model.fit(x, y, batch_size=2 * SIZE, epochs=2, shuffle=False, verbose=0)
            reference.fit(x, y, batch_size=2 * SIZE, epochs=2, shuffle=False, verbose=0)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        self.assertIsInstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        self.assertTrue(np.all(np.isfinite(history.history["loss"])))
        self.assertEqual(int(model.optimizer.iterations.numpy()), int(reference.optimizer.iterations.numpy()))
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-2, atol=1e-3)  # float16 compute: sums differ in rounding
        self.assert_identical_on_all_ranks(flat_weights(model))

    def test_overflow_on_one_rank_skips_the_step_everywhere(self):
        # Only the last rank's gradients overflow. Each rank's LossScaleOptimizer must take
        # the same branch, or the all-reduce in the "finite" branch mis-pairs or hangs.
        with STRATEGY.scope():
            var = tf.Variable([1.0, 2.0])
            optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=8.0)

        @tf.function
        def step(poison):
            def replica_fn():
                grad = tf.constant([1.0, 1.0]) * tf.where(poison, np.inf, 1.0)
                optimizer.apply([grad], [var])

            STRATEGY.run(replica_fn)

        step(tf.constant(RANK == SIZE - 1))
        self.assertAllEqual(var.numpy(), [1.0, 2.0])
        self.assertEqual(float(optimizer.dynamic_scale.numpy()), 4.0)
        step(tf.constant(False))
        # Keras sums replica gradients (it divides losses by the replica count), then unscales by 4.
        self.assertAllClose(var.numpy(), [1.0 - 0.1 * SIZE / 4.0, 2.0 - 0.1 * SIZE / 4.0])
        self.assert_engine_healthy()


class DistributedOptimizerTest(SyncAssertions):
    def test_keeps_class_name_and_config_round_trips(self):
        optimizer = sk.DistributedOptimizer(keras.optimizers.Adam(0.003, beta_1=0.8), name="dist_adam")
        self.assertEqual(type(optimizer).__name__, "Adam")
        self.assertIsInstance(optimizer, keras.optimizers.Adam)
        config = optimizer.get_config()
        self.assertEqual(config["name"], "dist_adam")
        self.assertAlmostEqual(config["beta_1"], 0.8)
        clone = type(optimizer).from_config(config)
        self.assertEqual(clone.get_config(), config)
        self.assertTrue(clone._smdist_reduces_in_apply)
        # Serialised, it is a plain Adam: saved models load without smdist_tf.
        plain = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        self.assertEqual(type(plain), keras.optimizers.Adam)
        self.assertEqual(plain.get_config(), config)

    def test_invalid_arguments_error_on_every_rank(self):
        with self.assertRaisesRegex(ValueError, "backward_passes_per_step"):
            sk.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
        with self.assertRaisesRegex(ValueError, "Average or op=Sum"):
            sk.DistributedOptimizer(keras.optimizers.SGD(), op=sd.Max)
        with STRATEGY.scope(), self.assertRaisesRegex(ValueError, "inside a tf.distribute strategy"):
            sk.DistributedOptimizer(keras.optimizers.SGD())
        self.assert_engine_healthy()

    def test_horovod_style_fit_equals_single_process(self):
        per_rank, lr = 4, 0.2
        x, y = data(8 * per_rank * SIZE, seed=8)
        model = small_model(seed=300 + RANK)
        reference = small_model(seed=300)  # rank 0's initial weights
        model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(lr)), loss=LOSS)
        reference.compile(optimizer=keras.optimizers.SGD(lr), loss=LOSS)
        # Rank r takes rows r, r+SIZE, ...: step i of all ranks together covers global batch i.
        order = np.arange(len(x)).reshape(-1, SIZE, per_rank).transpose(1, 0, 2)[RANK].ravel()
        model.fit(x[order], y[order], batch_size=per_rank, epochs=1, shuffle=False, verbose=0,
                  callbacks=[sk.callbacks.BroadcastGlobalVariablesCallback(0)])
        reference.fit(x, y, batch_size=per_rank * SIZE, epochs=1, shuffle=False, verbose=0)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat_weights(model))

    def test_backward_passes_per_step_accumulates(self):
        per_rank = 4
        x, y = data(2 * per_rank * SIZE, seed=9)
        model = small_model(seed=10)
        reference = small_model(seed=10)
        optimizer = sk.DistributedOptimizer(keras.optimizers.SGD(0.3), backward_passes_per_step=2, average_aggregated_gradients=True,
                                            sparse_as_dense=True)
        model.compile(optimizer=optimizer, loss=LOSS)
        reference.compile(optimizer=keras.optimizers.SGD(0.3), loss=LOSS)
        mine = np.arange(len(x))[RANK::SIZE]
        model.fit(x[mine], y[mine], batch_size=per_rank, epochs=1, shuffle=False, verbose=0)
        # Two local passes averaged, then averaged over ranks: one update on the whole data.
        reference.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
        self.assertEqual(int(optimizer.iterations.numpy()), 1)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    def test_loss_scale_around_distributed_optimizer_agrees_on_overflow(self):
        var = tf.Variable([1.0, 2.0])
        optimizer = keras.optimizers.LossScaleOptimizer(sk.DistributedOptimizer(keras.optimizers.SGD(0.1)), initial_scale=8.0)

        @tf.function
        def step(poison):
            grad = tf.constant([8.0, 8.0]) * tf.where(poison, np.inf, 1.0)
            optimizer.apply([grad], [var])

        step(tf.constant(RANK == 0))
        self.assertAllEqual(var.numpy(), [1.0, 2.0])
        step(tf.constant(False))  # unscaled gradient: 8 / 4 = 2
        self.assertAllClose(var.numpy(), [0.8, 1.8])
        self.assert_engine_healthy()


class CallbackTest(SyncAssertions):
    def test_metric_average_callback(self):
        logs = {"loss": float(RANK), "accuracy": 2.0 * RANK, "note": "text"}
        sk.callbacks.MetricAverageCallback().on_epoch_end(0, logs)
        self.assertAlmostEqual(logs["loss"], (SIZE - 1) / 2)
        self.assertAlmostEqual(logs["accuracy"], float(SIZE - 1))
        self.assertEqual(logs["note"], "text")

    def test_learning_rate_warmup(self):
        x, y = data(8 * SIZE, seed=11)
        model = small_model(seed=12)
        model.compile(optimizer=sk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS)
        seen = []
        record = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate.numpy())))
        warmup = sk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
        model.fit(x[RANK::SIZE], y[RANK::SIZE], batch_size=4, epochs=3, shuffle=False, verbose=0, callbacks=[warmup, record])
        self.assertEqual(len(seen), 6)  # 2 batches per epoch
        # Horovod's ramp: full rate at the last batch of the warm-up, then left alone.
        want = [0.4 / SIZE * (1 + min((step + 1) / 4, 1.0) * (SIZE - 1)) for step in range(6)]
        self.assertAllClose(seen, want, rtol=1e-6)
        with self.assertRaisesRegex(ValueError, "warmup_epochs"):
            sk.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=-1)
        unknown_length = sk.callbacks.LearningRateWarmupCallback(0.1)
        unknown_length.set_model(model)
        unknown_length.set_params({"steps": None})
        with self.assertRaisesRegex(ValueError, "needs steps_per_epoch"):
            unknown_length.on_train_batch_begin(0)
        self.assert_engine_healthy()



class CheckpointTest(SyncAssertions):
    @at_two_ranks_only("one rank writes and a broadcast restores, whatever the rank count")
    def test_rank_zero_checkpoints_and_restore_broadcast(self):
        directory = sd.broadcast_object(self.get_temp_dir() if RANK == 0 else None)
        path = os.path.join(directory, "model-{epoch}.weights.h5")
        x, y = data(4 * SIZE, seed=13)
        with STRATEGY.scope():
            model = small_model(seed=14)
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss=LOSS)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            model.fit(x, y, batch_size=2 * SIZE, epochs=2, verbose=1, callbacks=[sk.callbacks.ModelCheckpoint(path, save_weights_only=True)])
        # The progress bar shows on rank 0 only.
        self.assertEqual("Epoch 2/2" in printed.getvalue(), RANK == 0, printed.getvalue())
        sd.barrier()
        self.assertEqual(sorted(f for f in os.listdir(directory) if f.startswith("model-")), ["model-1.weights.h5", "model-2.weights.h5"])
        restored = small_model(seed=15)
        restored.load_weights(os.path.join(directory, "model-2.weights.h5"))
        self.assertAllEqual(flat_weights(restored), flat_weights(model))

        checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        written = sd.distribute.save_on_rank_zero(checkpoint, os.path.join(directory, "ckpt"))
        self.assertEqual(written is not None, RANK == 0)
        saved = flat_weights(model)
        saved_iterations = int(model.optimizer.iterations.numpy())
        model.fit(x, y, batch_size=2 * SIZE, epochs=1, verbose=0)
        self.assertNotAllClose(flat_weights(model), saved)
        sd.distribute.restore_and_broadcast(checkpoint, os.path.join(directory, "ckpt"), model.variables + model.optimizer.variables)
        self.assertAllEqual(flat_weights(model), saved)
        self.assertEqual(int(model.optimizer.iterations.numpy()), saved_iterations)
        self.assert_identical_on_all_ranks(flat_weights(model))
        sd.barrier()  # nobody deletes the directory while others still read


class ObjectTest(SyncAssertions):
    def test_broadcast_and_allgather_objects(self):
        self.assertEqual(sd.broadcast_object({"rank": RANK, "pad": "x" * (RANK * 100)}, root_rank=SIZE - 1), {"rank": SIZE - 1, "pad": "x" * ((SIZE - 1) * 100)})
        self.assertEqual(sk.allgather_object(("r", RANK) if RANK % 2 else [RANK] * 50), [("r", r) if r % 2 else [r] * 50 for r in range(SIZE)])
        self.assertIsNone(sd.broadcast_object(None))
        with self.assertRaisesRegex(ValueError, "out of range"):
            sd.broadcast_object(1, root_rank=SIZE)
        bcast = sd.broadcast_object_fn(root_rank=SIZE - 1, name="obj.fn")  # Horovod's spelling
        self.assertEqual(bcast({"from": RANK}), {"from": SIZE - 1})
        self.assertEqual(bcast([RANK]), [SIZE - 1])
        self.assert_engine_healthy()

    def test_objects_while_a_graph_is_built(self):
        # Horovod's graph-mode use: the exchange happens eagerly, when the graph is built or traced.
        with tf.Graph().as_default():
            self.assertEqual(sd.broadcast_object({"r": RANK}, root_rank=SIZE - 1, name="obj.graph"), {"r": SIZE - 1})
            self.assertEqual(sd.allgather_object(RANK, name="obj.graph.all"), list(range(SIZE)))
        traced = []

        @tf.function
        def trace():
            traced.append(sd.allgather_object(RANK * 2, name="obj.trace"))
            return tf.constant(0)

        trace()
        self.assertEqual(traced, [[2 * r for r in range(SIZE)]])

    def test_horovod_build_and_transport_flags(self):
        self.assertTrue(sd.mpi_enabled())
        self.assertFalse(any(f() for f in (sd.gloo_enabled, sd.ddl_built, sd.ccl_built, sd.rocm_built)))


class OnBatchTest(SyncAssertions):
    """``*_on_batch`` take each rank's batch whole: predict is local, train and test combine ranks."""

    def test_predict_on_batch_returns_this_ranks_batch_predictions(self):
        def two_output_model(seed: int) -> keras.Model:
            keras.utils.set_random_seed(seed)
            inputs = keras.Input((8,))
            hidden = keras.layers.Dense(6, activation="tanh")(inputs)
            return keras.Model(inputs, {"logits": keras.layers.Dense(3)(hidden), "score": keras.layers.Dense(1)(hidden)})

        x, _ = data(5 + RANK, seed=20 + RANK)  # every rank its own batch, of its own size
        with STRATEGY.scope():
            model = two_output_model(seed=21 + RANK)  # different seeds: the strategy must broadcast
        reference = two_output_model(seed=0)
        reference.set_weights(model.get_weights())
        want = reference.predict_on_batch(x)

        got = model.predict_on_batch(x)
        self.assertEqual(sorted(got), ["logits", "score"])
        self.assertEqual(got["logits"].shape, (len(x), 3))
        self.assertEqual(got["score"].shape, (len(x), 1))
        self.assertAllClose(got, want, rtol=1e-6, atol=1e-6)
        with STRATEGY.scope():
            model.compile(run_eagerly=True)
        self.assertAllClose(model.predict_on_batch(x), want, rtol=1e-6, atol=1e-6)
        with STRATEGY.scope():
            model.compile()
        # No collective: one rank alone may call it on a built model.
        if RANK == 0:
            self.assertAllClose(model.predict_on_batch(x[:2]), reference.predict_on_batch(x[:2]), rtol=1e-6, atol=1e-6)

        # predict() is unchanged: the global data is sharded and every rank gets all of it.
        everything, _ = data(6 * SIZE, seed=22)
        predictions = model.predict(everything, batch_size=2 * SIZE, verbose=0)
        self.assertAllClose(predictions, reference.predict(everything, verbose=0), rtol=1e-5, atol=1e-6)
        self.assert_engine_healthy()

    def test_train_and_test_on_batch_combine_every_ranks_batch(self):
        shard = 4
        x, y = data(shard * SIZE, seed=23)
        mine = slice(RANK * shard, (RANK + 1) * shard)
        with STRATEGY.scope():
            model = small_model(seed=24 + RANK)
            model.compile(optimizer=keras.optimizers.SGD(0.3), loss=LOSS, metrics=["accuracy"])
        reference = small_model(seed=0)
        reference.set_weights(model.get_weights())
        reference.compile(optimizer=keras.optimizers.SGD(0.3), loss=LOSS, metrics=["accuracy"])

        # Equal shards: the same as one process on all the shards together.
        logs = model.test_on_batch(x[mine], y[mine], return_dict=True)
        self.assertAllClose(logs, reference.test_on_batch(x, y, return_dict=True), rtol=1e-5)
        self.assertEqual(sd.allgather_object(logs), [logs] * SIZE)
        logs = model.train_on_batch(x[mine], y[mine], return_dict=True)
        self.assertAllClose(logs, reference.train_on_batch(x, y, return_dict=True), rtol=1e-5)
        for got, want in zip(model.get_weights(), reference.get_weights()):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
        self.assert_identical_on_all_ranks(flat_weights(model))

        # Unequal shards: each rank's loss and metrics count once (the mean over ranks of per-rank values).
        sizes = [1 + r for r in range(SIZE)]
        starts = np.cumsum([0] + sizes)
        mine = slice(starts[RANK], starts[RANK + 1])
        per_rank = [reference.test_on_batch(x[starts[r] : starts[r + 1]], y[starts[r] : starts[r + 1]]) for r in range(SIZE)]
        self.assertAllClose(model.test_on_batch(x[mine], y[mine]), np.mean(per_rank, axis=0), rtol=1e-5)
        self.assert_engine_healthy()


if __name__ == "__main__":
    tf.test.main()
